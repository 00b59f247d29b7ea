//! Sources: partitioned, replayable inputs whose positions go into
//! checkpoints.
//!
//! A [`Source`] cuts its input into splits, each a serializable description
//! of what is left to read (for example "offsets 40..80"). Every subtask owns
//! some splits and reads them through a [`SplitReader`]. At each checkpoint
//! the runtime asks the reader for its splits as they stand and stores them;
//! after a restore the splits are handed out again, so reading resumes exactly
//! after the last record of the checkpoint: no record is lost or read twice.
//!
//! A source whose splits may move to another instance of the job (a Kafka
//! consumer group) keeps its positions in the destination too, committed
//! with the data: it names a [position scope](Source::position_scope), and
//! its reader starts each split where the destination's data of it ends
//! (module `positions`: [`PositionLookup`], [`PositionTracker`]).
//!
//! Built-ins: [`SequenceSource`] (the numbers `0..n`, bounded or unbounded),
//! [`PartitionedSequence`] (the same numbers in fixed partitions whose
//! positions are committed with the data) and [`VecSource`] (the items of a
//! vector or an iterator).
//!
//! # Changing a source's records
//!
//! [`Source::map`], [`filter`](Source::filter),
//! [`filter_map`](Source::filter_map), [`flat_map`](Source::flat_map) and
//! [`try_map`](Source::try_map) change records as they are read, and
//! [`Source::transform`] takes a [`Transform`] of one's own (a type with
//! state, such as a parser with its schema). Each forwards the inner
//! source's splits, positions, checkpoints, commits and close by
//! construction: use them, not a [`SplitReader`] written around another
//! reader.
//!
//! A reader that wraps another anyway (to add something around reading)
//! must forward every method that keeps exactly-once: that is why
//! [`on_checkpoint`](SplitReader::on_checkpoint),
//! [`on_commit`](SplitReader::on_commit),
//! [`seek_committed`](SplitReader::seek_committed),
//! [`take_advances`](SplitReader::take_advances) and
//! [`close`](SplitReader::close), and the source's
//! [`position_scope`](Source::position_scope), have no defaults. A wrapper
//! that forgets one does not compile; a reader of its own input that has
//! nothing to do there says so with an empty body.

mod codec;
mod partitioned;
mod positions;
mod range;
mod sequence;
mod transform;
mod vec;

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};
use sink_api::{BadRecord, CheckpointId, PositionAdvance, SubtaskIndex};

pub use codec::{BincodeSplits, SplitCodec};
pub use partitioned::{PartitionedReader, PartitionedSequence, PartitionedSplit};
pub use positions::{PositionLookup, PositionTracker, SourceStart};
pub use range::{RangeReader, RangeRecords, RangeSplit};
pub use sequence::SequenceSource;
pub use sequence::{Numbers, SequenceReader};
pub use transform::{
    Filter, FilterMap, FlatMap, Map, Transform, Transformed, TransformedReader, TryMap,
};
pub use vec::Items;
pub use vec::VecSource;

/// Whether a source ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundedness {
    /// The source ends: its readers eventually return [`ReadStatus::Finished`].
    Bounded,
    /// The source never ends: readers that run out of data return
    /// [`ReadStatus::Idle`] and wait.
    Unbounded,
}

/// What a [`SplitReader::read_batch`] call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStatus {
    /// More records may follow at once.
    More,
    /// Nothing to read now; the runtime asks again after a short pause, and
    /// meanwhile serves checkpoints.
    Idle,
    /// This reader's input ended for good (bounded sources only).
    Finished,
}

/// A failure to read from a source.
///
/// Returned by a [`SplitReader`] (or its source); the job fails with it.
/// A transient one ([`SourceError::new`]) is restarted by the job's
/// restart strategy; a [permanent](SourceError::permanent) one (the input
/// cannot be read as it is, whatever the retries: records deleted, a
/// format that cannot be decoded) fails the job at once, with its cause.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    message: String,
    permanent: bool,
}

impl SourceError {
    /// A failure that a restart may get past (a broker that did not
    /// answer, a connection lost).
    pub fn new(message: impl Into<String>) -> SourceError {
        SourceError {
            message: message.into(),
            permanent: false,
        }
    }

    /// The same failure, which no restart gets past: the job fails at
    /// once, whatever its restart strategy.
    pub fn permanent(mut self) -> SourceError {
        self.permanent = true;
        self
    }

    /// Whether it is [permanent](Self::permanent). Read by the job's
    /// restart loop.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// What happened.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Reads the splits one subtask owns.
///
/// Created by [`Source::create_reader`], driven by the subtask's runtime task.
///
/// # Wrapping another reader
///
/// To change records, use the combinators of [`Source`]
/// ([`map`](Source::map), [`filter`](Source::filter),
/// [`transform`](Source::transform), …): they forward everything else by
/// construction. A reader written around another (here, to count reads)
/// forwards every method but the one it changes; the methods that keep
/// exactly-once have no defaults, so the compiler names any it forgot:
///
/// ```
/// use sink_api::{async_trait, CheckpointId, PositionAdvance};
/// use sink_runtime::source::{
///     CommitOutcome, RangeSplit, ReadStatus, SequenceReader, SourceError, SourceStart,
///     SplitReader,
/// };
///
/// struct Counted {
///     inner: SequenceReader,
///     reads: u64,
/// }
///
/// #[async_trait]
/// impl SplitReader for Counted {
///     type Record = u64;
///     type Split = RangeSplit;
///
///     async fn read_batch(&mut self, max: usize, out: &mut Vec<u64>) -> Result<ReadStatus, SourceError> {
///         self.reads += 1;
///         self.inner.read_batch(max, out).await
///     }
///     fn snapshot_splits(&self) -> Vec<RangeSplit> {
///         self.inner.snapshot_splits()
///     }
///     async fn wait_for_input(&mut self) {
///         self.inner.wait_for_input().await
///     }
///     fn on_checkpoint(&mut self, checkpoint: CheckpointId) {
///         self.inner.on_checkpoint(checkpoint)
///     }
///     fn on_commit(&mut self, checkpoint: CheckpointId, outcome: CommitOutcome) {
///         self.inner.on_commit(checkpoint, outcome)
///     }
///     async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError> {
///         self.inner.seek_committed(start).await
///     }
///     fn take_advances(&mut self) -> Vec<PositionAdvance> {
///         self.inner.take_advances()
///     }
///     async fn close(&mut self) {
///         self.inner.close().await
///     }
/// }
/// ```
///
/// The same wrapper without the forwarding does not compile (error E0046:
/// `on_checkpoint`, `on_commit`, `seek_committed`, `take_advances` and
/// `close` are missing), where a default would have dropped the inner
/// reader's positions without a word:
///
/// ```compile_fail
/// use sink_api::async_trait;
/// use sink_runtime::source::{RangeSplit, ReadStatus, SequenceReader, SourceError, SplitReader};
///
/// struct Counted {
///     inner: SequenceReader,
///     reads: u64,
/// }
///
/// #[async_trait]
/// impl SplitReader for Counted {
///     type Record = u64;
///     type Split = RangeSplit;
///
///     async fn read_batch(&mut self, max: usize, out: &mut Vec<u64>) -> Result<ReadStatus, SourceError> {
///         self.reads += 1;
///         self.inner.read_batch(max, out).await
///     }
///     fn snapshot_splits(&self) -> Vec<RangeSplit> {
///         self.inner.snapshot_splits()
///     }
/// }
/// ```
#[async_trait]
pub trait SplitReader: Send + 'static {
    /// The records read.
    type Record: Send + 'static;
    /// The source's split type.
    type Split;

    /// Appends up to `max` records to `out`, and says whether more may follow.
    /// Records appended before a call to
    /// [`snapshot_splits`](Self::snapshot_splits) are not in the splits it
    /// returns.
    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<Self::Record>,
    ) -> Result<ReadStatus, SourceError>;

    /// What is left to read, as splits: stored in the checkpoint. Called at
    /// every checkpoint, between two `read_batch` calls.
    fn snapshot_splits(&self) -> Vec<Self::Split>;

    /// Waits until [`read_batch`](Self::read_batch) has something to return.
    ///
    /// Called by the subtask after `read_batch` returned
    /// [`ReadStatus::Idle`], raced against the coordinator's messages and a
    /// short poll interval, so it must be cancel-safe: dropped before it
    /// returns, it loses nothing. The default never returns, and the subtask
    /// polls again after the interval; a reader fed by a channel returns as
    /// soon as an item arrives, so that input waits for no poll.
    async fn wait_for_input(&mut self) {
        std::future::pending::<()>().await
    }

    /// The records read so far that no earlier call covered belong to
    /// checkpoint `checkpoint_id`: they were written and prepared before its
    /// barrier, or at end of input under the tag of the commit that follows.
    ///
    /// Called by the subtask at each barrier before
    /// [`snapshot_splits`](Self::snapshot_splits), and once at end of input.
    /// A reader that answers its producers when their records are committed
    /// starts tracking them here; one that does not has an empty body; a
    /// reader that wraps another forwards it.
    fn on_checkpoint(&mut self, checkpoint_id: CheckpointId);

    /// This subtask's share of checkpoint `checkpoint_id`, and of every
    /// earlier one, has been committed, with `outcome`.
    ///
    /// Called by the subtask after each commit, in checkpoint order,
    /// including the re-commit of a restored checkpoint. When the job has a
    /// global committer, only once it committed the checkpoint too (its
    /// data becomes visible only then, as a Delta table's files do). Called once per
    /// checkpoint that held anything of this subtask; a checkpoint in which
    /// the subtask prepared nothing may be covered by a later call. A reader
    /// that wraps another forwards it.
    fn on_commit(&mut self, checkpoint_id: CheckpointId, outcome: CommitOutcome);

    /// Where the destination's data of each split of the source's
    /// [scope](Source::position_scope) ends (`start.committed`): read every
    /// owned split from there (a split absent from it from its start),
    /// whatever the splits the reader was created with say; keep
    /// `start.lookup` to ask again for splits assigned later.
    ///
    /// Called by the subtask once per start, after the restored
    /// checkpoint's committables were committed again and before the first
    /// `read_batch`; only for a source with a scope (a reader of a source
    /// without one returns `Ok(())`). A reader that wraps another forwards
    /// it.
    async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError>;

    /// Releases what the reader holds outside the process, such as its
    /// membership of a consumer group, so that others need not wait for it
    /// to time out. Called once by the subtask when it closes (the job
    /// finished, failed or was cancelled), after the writer closed; must
    /// end in bounded time. A reader that wraps another forwards it.
    async fn close(&mut self);

    /// What the records read since the last call advance, per split (see
    /// [`PositionTracker::take_advances`]): handed to the writer with the
    /// records' committables.
    ///
    /// Called by the subtask at every barrier and at end of input, before
    /// `prepare_commit` and [`on_checkpoint`](Self::on_checkpoint); only
    /// for a source with a scope (a reader of a source without one returns
    /// none). A reader that wraps another forwards it: advances it drops
    /// are positions never committed, and a split that moves is read again
    /// from an older one.
    fn take_advances(&mut self) -> Vec<PositionAdvance>;
}

/// How the commit reported to [`SplitReader::on_commit`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Every committable was committed (or found already committed).
    Committed,
    /// At least one committable failed with a known reason and was dropped:
    /// some records of this checkpoint are not in the output.
    PartlyLost,
}

/// A partitioned, replayable input.
///
/// Given to the job builder; the runtime calls
/// [`create_splits`](Self::create_splits) on a fresh start and
/// [`create_reader`](Self::create_reader) once per subtask and start.
pub trait Source: Send + Sync + 'static {
    /// The records it produces.
    type Record: Send + 'static;
    /// A serializable description of what is left of a part of the input.
    type Split: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;
    /// The reader of one subtask's splits.
    type Reader: SplitReader<Record = Self::Record, Split = Self::Split>;

    /// Whether the source ends.
    fn boundedness(&self) -> Boundedness;

    /// The scope its positions are committed under in the destination,
    /// with the data (see the `positions` module), or `None`: its positions
    /// are kept in the job's checkpoints only. No default: a source that
    /// wraps another returns the other's.
    ///
    /// Read by the job builder (the sink must
    /// [commit positions](sink_api::Sink::commits_positions)) and by every
    /// start. A source whose splits may be read by another instance of the
    /// job (on fresh checkpoint storage, or on another machine) names one,
    /// the same in every instance that shares the input: without it, each
    /// instance reads from its own checkpoint, and two instances duplicate
    /// records.
    fn position_scope(&self) -> Option<String>;

    /// How its splits are stored in checkpoints. Called once per start of
    /// a job. The default, [`BincodeSplits`], stores them whole in every
    /// checkpoint: right for splits that say where reading is; a source
    /// whose splits carry large state that changes little between
    /// checkpoints (the pipeline's idempotency keys) seals it into chunks
    /// that are stored once. A source that wraps another returns the
    /// other's.
    fn split_codec(&self) -> std::sync::Arc<dyn SplitCodec<Self::Split>> {
        std::sync::Arc::new(BincodeSplits::default())
    }

    /// Cuts the whole input into splits for a fresh start with `parallelism`
    /// subtasks. The runtime assigns split `k` to subtask `k % parallelism`.
    fn create_splits(&self, parallelism: usize) -> Vec<Self::Split>;

    /// A reader for the splits assigned to subtask `subtask`.
    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<Self::Split>,
    ) -> Result<Self::Reader, SourceError>;

    /// This source with every record turned into another by `f` as it is
    /// read, for a sink whose input is another type: for example
    /// `SequenceSource::bounded(n).map(Order::with_id)`. `f` must be
    /// deterministic: a restore reads and maps the same records again.
    fn map<T, F>(self, f: F) -> Transformed<Self, Map<F>>
    where
        Self: Sized,
        F: Fn(Self::Record) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        Transformed::new(self, Map(f))
    }

    /// This source with only the records `keep` returns `true` for. The
    /// others are read and dropped: their positions are committed with the
    /// records around them, so a restart does not read them again.
    fn filter<F>(self, keep: F) -> Transformed<Self, Filter<F>>
    where
        Self: Sized,
        F: Fn(&Self::Record) -> bool + Send + Sync + 'static,
    {
        Transformed::new(self, Filter(keep))
    }

    /// This source with each record turned into another by `f`, or dropped
    /// where `f` returns `None` (as [`filter`](Self::filter) drops).
    fn filter_map<T, F>(self, f: F) -> Transformed<Self, FilterMap<F>>
    where
        Self: Sized,
        F: Fn(Self::Record) -> Option<T> + Send + Sync + 'static,
        T: Send + 'static,
    {
        Transformed::new(self, FilterMap(f))
    }

    /// This source with each record turned into every item `f` returns for
    /// it, in order (none drops it, as [`filter`](Self::filter) drops).
    fn flat_map<I, F>(self, f: F) -> Transformed<Self, FlatMap<F>>
    where
        Self: Sized,
        F: Fn(Self::Record) -> I + Send + Sync + 'static,
        I: IntoIterator,
        I::Item: Send + 'static,
    {
        Transformed::new(self, FlatMap(f))
    }

    /// This source with each record parsed by `f` into another, or refused
    /// with a [`BadRecord`] saying why, what and where: the job then fails
    /// at once with that message.
    fn try_map<T, F>(self, f: F) -> Transformed<Self, TryMap<F>>
    where
        Self: Sized,
        F: Fn(Self::Record) -> Result<T, BadRecord> + Send + Sync + 'static,
        T: Send + 'static,
    {
        Transformed::new(self, TryMap(f))
    }

    /// This source with its records passed through `transform`: for a
    /// transform with state of its own (a parser holding its schema), or
    /// one a library ships. See [`Transform`].
    fn transform<T>(self, transform: T) -> Transformed<Self, T>
    where
        Self: Sized,
        T: Transform<Self::Record>,
    {
        Transformed::new(self, transform)
    }
}
