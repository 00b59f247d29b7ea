//! A source whose records are turned into the sink's records as they are
//! read: `SequenceSource::bounded(n).map(|id| Order::new(id))`.

use std::sync::Arc;

use async_trait::async_trait;
use sink_api::{CheckpointId, PositionAdvance, SubtaskIndex};

use super::{
    Boundedness, CommitOutcome, ReadStatus, Source, SourceError, SourceStart, SplitReader,
};

/// The records of `S`, each passed through `F`. Made by [`Source::map`].
///
/// Positions, splits and checkpoints are those of `S`: a restore reads the
/// same records again and maps them again, so `F` must be deterministic.
#[derive(Debug)]
pub struct Mapped<S, F> {
    inner: S,
    f: Arc<F>,
}

impl<S, F> Mapped<S, F> {
    pub(super) fn new(inner: S, f: F) -> Mapped<S, F> {
        Mapped {
            inner,
            f: Arc::new(f),
        }
    }
}

impl<S, F, T> Source for Mapped<S, F>
where
    S: Source,
    F: Fn(S::Record) -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    type Record = T;
    type Split = S::Split;
    type Reader = MappedReader<S::Reader, F>;

    fn position_scope(&self) -> Option<String> {
        self.inner.position_scope()
    }

    fn boundedness(&self) -> Boundedness {
        self.inner.boundedness()
    }

    fn split_codec(&self) -> std::sync::Arc<dyn crate::source::SplitCodec<S::Split>> {
        self.inner.split_codec()
    }

    fn create_splits(&self, parallelism: usize) -> Vec<S::Split> {
        self.inner.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<S::Split>,
    ) -> Result<MappedReader<S::Reader, F>, SourceError> {
        Ok(MappedReader {
            inner: self.inner.create_reader(subtask, splits)?,
            f: self.f.clone(),
            scratch: Vec::new(),
        })
    }
}

/// Reads through the inner reader and maps each record.
pub struct MappedReader<R: SplitReader, F> {
    inner: R,
    f: Arc<F>,
    scratch: Vec<R::Record>,
}

impl<R: SplitReader, F> std::fmt::Debug for MappedReader<R, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedReader").finish_non_exhaustive()
    }
}

#[async_trait]
impl<R, F, T> SplitReader for MappedReader<R, F>
where
    R: SplitReader,
    F: Fn(R::Record) -> T + Send + Sync + 'static,
    T: Send + 'static,
{
    type Record = T;
    type Split = R::Split;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<T>,
    ) -> Result<ReadStatus, SourceError> {
        self.scratch.clear();
        let status = self.inner.read_batch(max, &mut self.scratch).await?;
        out.extend(self.scratch.drain(..).map(|record| (self.f)(record)));
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
}
