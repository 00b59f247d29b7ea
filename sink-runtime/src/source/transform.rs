//! Sources whose records are changed as they are read:
//! [`Source::map`], [`filter`](Source::filter),
//! [`filter_map`](Source::filter_map), [`flat_map`](Source::flat_map),
//! [`try_map`](Source::try_map), and [`Source::transform`] for a
//! [`Transform`] of one's own.
//!
//! Each makes a [`Transformed`] source, whose reader hands every method of
//! [`SplitReader`] but the records themselves to the inner reader: splits,
//! positions and their advances, checkpoints, commits, the destination's
//! positions at a start, and the close. Nothing of the inner source's
//! exactly-once machinery is left to the user to forward. A record that is
//! dropped or refused is still read: its position advances with the
//! records around it, so a restart does not read it again.
//!
//! This is how the docs teach a user to change a source's records; writing
//! a `SplitReader` around another reader is never needed for it.

use std::sync::Arc;

use async_trait::async_trait;
use sink_api::{BadRecord, CheckpointId, PositionAdvance, SubtaskIndex};

use super::{
    Boundedness, CommitOutcome, ReadStatus, Source, SourceError, SourceStart, SplitCodec,
    SplitReader,
};

/// Turns each record of a source into zero, one or more records of another
/// type, or refuses it.
///
/// ```
/// use sink_api::BadRecord;
/// use sink_runtime::source::{Source, Transform};
/// use sink_runtime::SequenceSource;
///
/// /// Amounts in cents, refusing those above a limit it holds.
/// struct Cents {
///     limit: u64,
/// }
///
/// impl Transform<u64> for Cents {
///     type Out = u64;
///
///     fn apply(&self, euros: u64, out: &mut Vec<u64>) -> Result<(), BadRecord> {
///         if euros > self.limit {
///             return Err(BadRecord::new(format!("{euros} is above {}", self.limit)));
///         }
///         out.push(euros * 100);
///         Ok(())
///     }
/// }
///
/// let source = SequenceSource::bounded(10).transform(Cents { limit: 1_000 });
/// # let _ = source;
/// ```
///
/// Implemented by the combinators' closures ([`Map`], [`Filter`],
/// [`FilterMap`], [`FlatMap`], [`TryMap`]) and by a user's own type given
/// to [`Source::transform`]. Called by the reader of a [`Transformed`]
/// source for every record read, in order, on the subtask's task. It must
/// be deterministic (a restart reads the records after the last checkpoint
/// again, and transforms them again) and quick (it runs between reads).
pub trait Transform<In>: Send + Sync + 'static {
    /// The records it makes.
    type Out: Send + 'static;

    /// Appends what `record` becomes to `out`, or refuses it (anything it
    /// appended for the record is then dropped). The job's
    /// [bad-record policy](crate::BadRecordPolicy) decides what a refusal
    /// does: by default the job fails with the refusal, its position and
    /// its reason, as a permanent error (a restart would meet the same
    /// record again); it may skip and count it, or send it to a
    /// dead-letter destination.
    fn apply(&self, record: In, out: &mut Vec<Self::Out>) -> Result<(), BadRecord>;
}

/// Each record turned into one other. Made by [`Source::map`].
#[derive(Debug, Clone, Copy)]
pub struct Map<F>(pub(super) F);

impl<In, T, F> Transform<In> for Map<F>
where
    F: Fn(In) -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    type Out = T;

    fn apply(&self, record: In, out: &mut Vec<T>) -> Result<(), BadRecord> {
        out.push((self.0)(record));
        Ok(())
    }
}

/// The records a predicate keeps. Made by [`Source::filter`].
#[derive(Debug, Clone, Copy)]
pub struct Filter<F>(pub(super) F);

impl<In, F> Transform<In> for Filter<F>
where
    F: Fn(&In) -> bool + Send + Sync + 'static,
    In: Send + 'static,
{
    type Out = In;

    fn apply(&self, record: In, out: &mut Vec<In>) -> Result<(), BadRecord> {
        if (self.0)(&record) {
            out.push(record);
        }
        Ok(())
    }
}

/// Each record turned into another or dropped. Made by
/// [`Source::filter_map`].
#[derive(Debug, Clone, Copy)]
pub struct FilterMap<F>(pub(super) F);

impl<In, T, F> Transform<In> for FilterMap<F>
where
    F: Fn(In) -> Option<T> + Send + Sync + 'static,
    T: Send + 'static,
{
    type Out = T;

    fn apply(&self, record: In, out: &mut Vec<T>) -> Result<(), BadRecord> {
        out.extend((self.0)(record));
        Ok(())
    }
}

/// Each record turned into any number of others. Made by
/// [`Source::flat_map`].
#[derive(Debug, Clone, Copy)]
pub struct FlatMap<F>(pub(super) F);

impl<In, I, F> Transform<In> for FlatMap<F>
where
    F: Fn(In) -> I + Send + Sync + 'static,
    I: IntoIterator,
    I::Item: Send + 'static,
{
    type Out = I::Item;

    fn apply(&self, record: In, out: &mut Vec<I::Item>) -> Result<(), BadRecord> {
        out.extend((self.0)(record));
        Ok(())
    }
}

/// Each record turned into another, or refused. Made by
/// [`Source::try_map`].
#[derive(Debug, Clone, Copy)]
pub struct TryMap<F>(pub(super) F);

impl<In, T, F> Transform<In> for TryMap<F>
where
    F: Fn(In) -> Result<T, BadRecord> + Send + Sync + 'static,
    T: Send + 'static,
{
    type Out = T;

    fn apply(&self, record: In, out: &mut Vec<T>) -> Result<(), BadRecord> {
        out.push((self.0)(record)?);
        Ok(())
    }
}

/// The records of `S`, each passed through the transform `T`. Made by the
/// combinators of [`Source`] ([`map`](Source::map),
/// [`filter`](Source::filter), …) and by [`Source::transform`].
///
/// Splits, positions, their scope and codec, and checkpoints are those of
/// `S`, forwarded whole.
#[derive(Debug)]
pub struct Transformed<S, T> {
    inner: S,
    transform: Arc<T>,
}

impl<S, T> Transformed<S, T> {
    pub(super) fn new(inner: S, transform: T) -> Transformed<S, T> {
        Transformed {
            inner,
            transform: Arc::new(transform),
        }
    }
}

impl<S, T> Source for Transformed<S, T>
where
    S: Source,
    T: Transform<S::Record>,
{
    type Record = T::Out;
    type Split = S::Split;
    type Reader = TransformedReader<S::Reader, T>;

    fn boundedness(&self) -> Boundedness {
        self.inner.boundedness()
    }

    fn position_scope(&self) -> Option<String> {
        self.inner.position_scope()
    }

    fn split_codec(&self) -> Arc<dyn SplitCodec<S::Split>> {
        self.inner.split_codec()
    }

    fn create_splits(&self, parallelism: usize) -> Vec<S::Split> {
        self.inner.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<S::Split>,
    ) -> Result<TransformedReader<S::Reader, T>, SourceError> {
        Ok(TransformedReader {
            inner: self.inner.create_reader(subtask, splits)?,
            transform: self.transform.clone(),
            scratch: Vec::new(),
        })
    }
}

/// Reads through the inner reader and transforms each record; every other
/// method is the inner reader's.
pub struct TransformedReader<R: SplitReader, T> {
    inner: R,
    transform: Arc<T>,
    scratch: Vec<R::Record>,
}

impl<R: SplitReader, T> std::fmt::Debug for TransformedReader<R, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformedReader").finish_non_exhaustive()
    }
}

#[async_trait]
impl<R, T> SplitReader for TransformedReader<R, T>
where
    R: SplitReader,
    T: Transform<R::Record>,
{
    type Record = T::Out;
    type Split = R::Split;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<T::Out>,
    ) -> Result<ReadStatus, SourceError> {
        self.scratch.clear();
        let status = self.inner.read_batch(max, &mut self.scratch).await?;
        for record in self.scratch.drain(..) {
            let before = out.len();
            if let Err(bad) = self.transform.apply(record, out) {
                // A refused record becomes nothing, whatever was appended.
                out.truncate(before);
                crate::bad_records::refuse(bad)?;
            }
        }
        Ok(status)
    }

    fn snapshot_splits(&self) -> Vec<R::Split> {
        self.inner.snapshot_splits()
    }

    async fn wait_for_input(&mut self) {
        self.inner.wait_for_input().await;
    }

    fn on_checkpoint(&mut self, checkpoint_id: CheckpointId) {
        self.inner.on_checkpoint(checkpoint_id);
    }

    fn on_commit(&mut self, checkpoint_id: CheckpointId, outcome: CommitOutcome) {
        self.inner.on_commit(checkpoint_id, outcome);
    }

    async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError> {
        self.inner.seek_committed(start).await
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        self.inner.take_advances()
    }

    async fn close(&mut self) {
        self.inner.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SequenceSource;

    async fn read_all<S: Source>(source: &S) -> Result<Vec<S::Record>, SourceError> {
        let splits = source.create_splits(1);
        let mut reader = source.create_reader(0, splits)?;
        let mut out = Vec::new();
        while reader.read_batch(3, &mut out).await? != ReadStatus::Finished {}
        Ok(out)
    }

    #[tokio::test]
    async fn records_are_mapped_and_positions_are_the_inner_sources() {
        let source = SequenceSource::bounded(10).map(|id| format!("row-{id}"));
        let splits = source.create_splits(1);
        let mut reader = source.create_reader(0, splits).unwrap();
        let mut out = Vec::new();
        reader.read_batch(3, &mut out).await.unwrap();
        assert_eq!(out, vec!["row-0", "row-1", "row-2"]);
        // A restore from the snapshot goes on after the third record.
        let mut restored = source.create_reader(0, reader.snapshot_splits()).unwrap();
        let mut rest = Vec::new();
        restored.read_batch(100, &mut rest).await.unwrap();
        assert_eq!(rest.first().map(String::as_str), Some("row-3"));
        assert_eq!(rest.len(), 7);
    }

    #[tokio::test]
    async fn a_dropped_record_is_read_so_a_restore_does_not_read_it_again() {
        let source = SequenceSource::bounded(10).filter(|n| n % 2 == 0);
        let splits = source.create_splits(1);
        let mut reader = source.create_reader(0, splits).unwrap();
        let mut out = Vec::new();
        reader.read_batch(3, &mut out).await.unwrap();
        assert_eq!(out, vec![0, 2]);
        let mut restored = source.create_reader(0, reader.snapshot_splits()).unwrap();
        let mut rest = Vec::new();
        restored.read_batch(100, &mut rest).await.unwrap();
        assert_eq!(
            rest,
            vec![4, 6, 8],
            "3 was read and dropped, not read again"
        );
    }

    #[tokio::test]
    async fn each_combinator_makes_what_it_says() {
        let evens = SequenceSource::bounded(6).filter_map(|n| (n % 2 == 0).then_some(n * 10));
        assert_eq!(read_all(&evens).await.unwrap(), vec![0, 20, 40]);
        let pairs = SequenceSource::bounded(3).flat_map(|n| vec![n; n as usize]);
        assert_eq!(read_all(&pairs).await.unwrap(), vec![1, 2, 2]);
        let chained = SequenceSource::bounded(5)
            .filter(|n| *n != 2)
            .map(|n| n + 100);
        assert_eq!(read_all(&chained).await.unwrap(), vec![100, 101, 103, 104]);
    }

    #[tokio::test]
    async fn a_refused_record_fails_the_read_permanently_naming_its_position() {
        let source = SequenceSource::bounded(5).try_map(|n| match n {
            3 => Err(BadRecord::new("three is not allowed").at(format!("numbers@{n}"))),
            n => Ok(n),
        });
        let error = read_all(&source).await.unwrap_err();
        assert!(error.is_permanent());
        assert!(
            error
                .message()
                .starts_with("the record at numbers@3 was refused: three is not allowed."),
            "{}",
            error.message()
        );
    }
}
