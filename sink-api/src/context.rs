//! Identifiers and the init context every writer and committer receives.
//!
//! These are the few facts a sink needs about the job it runs in: which
//! subtask it is, how many there are, which attempt of the job this is (the
//! generation, for fencing), and which checkpoint it was restored from.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Clock, SinkMetrics, SystemClock};

/// The id of a checkpoint: a consistent cut across all subtasks of a job.
///
/// Ids grow by one with every checkpoint the runtime triggers; the first is 1.
/// Committables produced at end of input are tagged with the id after the last
/// checkpoint their writer took part in, so ids are comparable across the
/// whole life of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The id before the first checkpoint: nothing has been checkpointed yet.
    pub const NONE: CheckpointId = CheckpointId(0);

    /// The id that follows this one.
    pub fn next(self) -> CheckpointId {
        CheckpointId(self.0 + 1)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Which start of the job this is (Flink's attempt number).
///
/// Every start of a job on the same state increments it. Sinks that name
/// external transactions include it, so that work of an older generation can be
/// recognised and never committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Generation(pub u64);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The life of a job on one checkpoint storage: a random id drawn by the
/// runtime at the first start on that storage, stored in every checkpoint
/// and restored with it. The storage also keeps it for starts that restore
/// no checkpoint (`CheckpointStorage::lineage`): a job killed before its
/// first checkpoint and started again keeps its lineage, so its sink's start
/// hook finds what the killed start left (its generation tells the starts
/// apart).
///
/// Generations and checkpoint ids start again at 1 when a job runs again on
/// fresh checkpoint storage (a new state directory, the in-memory default);
/// the lineage does not repeat. So a sink
/// that names what it commits (batches, transactions, files) by lineage,
/// generation, subtask and checkpoint never meets a name of an earlier life
/// of the job, and never takes new data for a replay of old data.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Lineage(String);

impl Lineage {
    /// A lineage of this id. Called by the runtime with a fresh random id
    /// (32 hex digits), and by tests of sinks.
    pub fn new(id: impl Into<String>) -> Lineage {
        Lineage(id.into())
    }

    /// The id, to put in names.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Lineage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The index of a subtask, `0..parallelism`.
pub type SubtaskIndex = usize;

/// What the runtime tells a writer or a committer when it creates one.
///
/// Created by the runtime, passed to [`Sink::create_writer`](crate::Sink::create_writer)
/// and [`Sink::create_committer`](crate::Sink::create_committer) once per
/// subtask and per start of the job. Tests of a sink make one with
/// [`InitContext::new`]. More facts may be added in later versions (it is
/// `#[non_exhaustive]`), without breaking sinks.
///
/// To name what a sink commits so that no name ever repeats, use
/// [`lineage`](Self::lineage), [`generation`](Self::generation), the subtask
/// and the checkpoint: the job name and the generation alone repeat when the
/// job runs again on fresh checkpoint storage.
///
/// For time, ask [`clock`](Self::clock) rather than the system, so that a
/// test or a simulation can move it; for counters of its own, a sink
/// registers them in [`metrics`](Self::metrics), and they show in the job's
/// metrics.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InitContext {
    /// This subtask's index, `0..parallelism`.
    pub subtask_index: SubtaskIndex,
    /// How many subtasks the job runs.
    pub parallelism: usize,
    /// Which start of the job this is in its lineage; see [`Generation`].
    pub generation: Generation,
    /// The life of the job this start belongs to; see [`Lineage`].
    pub lineage: Lineage,
    /// The checkpoint this start restored from, or `None` on a fresh start.
    pub restored_checkpoint_id: Option<CheckpointId>,
    /// The job's name, as given to the job builder.
    pub job_name: String,
    /// The runtime's clock ([`SystemClock`] unless the job was built with
    /// another).
    pub clock: Arc<dyn Clock>,
    /// The job's registry of sink counters.
    pub metrics: SinkMetrics,
    /// Whether the job promises that a commit's records are visible to the
    /// destination's readers once it returns (a pipeline's tickets do). A
    /// sink that may keep committed records out of sight for a while (a
    /// file sink rolling parts by size or time) then publishes at every
    /// commit instead, unless its user chose otherwise, in which case the
    /// job was refused at build ([`Sink::deferred_visibility`](crate::Sink::deferred_visibility)).
    pub visible_commits: bool,
}

impl InitContext {
    /// The context of subtask `subtask_index` of `parallelism`, in a fresh
    /// start (see [`restored_from`](Self::restored_from)), with the system
    /// clock and a registry of its own (see [`with_clock`](Self::with_clock)
    /// and [`with_metrics`](Self::with_metrics)). Called by the runtime, and
    /// by tests that drive a writer or a committer directly.
    pub fn new(
        job_name: impl Into<String>,
        lineage: Lineage,
        generation: Generation,
        subtask_index: SubtaskIndex,
        parallelism: usize,
    ) -> InitContext {
        InitContext {
            subtask_index,
            parallelism,
            generation,
            lineage,
            restored_checkpoint_id: None,
            job_name: job_name.into(),
            clock: Arc::new(SystemClock),
            metrics: SinkMetrics::new(),
            visible_commits: false,
        }
    }

    /// A name for what this writer prepares for checkpoint `checkpoint` that
    /// no other writer, start or life of the job ever uses:
    /// `<job>-<lineage>-g<generation>-s<subtask>-c<checkpoint>`. For sinks
    /// that commit one thing per checkpoint and writer (a batch, a
    /// transaction); one that commits several adds its own counter.
    pub fn unique_name(&self, checkpoint: CheckpointId) -> String {
        format!(
            "{}-{}-g{}-s{}-c{}",
            self.job_name, self.lineage, self.generation, self.subtask_index, checkpoint
        )
    }

    /// The same context with the runtime's clock `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> InitContext {
        self.clock = clock;
        self
    }

    /// The same context with the job's counter registry `metrics`.
    pub fn with_metrics(mut self, metrics: SinkMetrics) -> InitContext {
        self.metrics = metrics;
        self
    }

    /// The same context in a job that does (`true`) or does not promise
    /// [visible commits](Self::visible_commits).
    pub fn with_visible_commits(mut self, visible_commits: bool) -> InitContext {
        self.visible_commits = visible_commits;
        self
    }

    /// The same context in a start that restored checkpoint `checkpoint`
    /// (`None`: a fresh start).
    pub fn restored_from(mut self, checkpoint: Option<CheckpointId>) -> InitContext {
        self.restored_checkpoint_id = checkpoint;
        self
    }
}
