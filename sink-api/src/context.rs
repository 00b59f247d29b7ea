//! Identifiers and the init context every writer and committer receives.
//!
//! These are the few facts a sink needs about the job it runs in: which
//! subtask it is, how many there are, which attempt of the job this is (the
//! generation, for fencing), and which checkpoint it was restored from.

use std::fmt;

use serde::{Deserialize, Serialize};

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

/// The index of a subtask, `0..parallelism`.
pub type SubtaskIndex = usize;

/// What the runtime tells a writer or a committer when it creates one.
///
/// Created by the runtime, passed to [`Sink::create_writer`](crate::Sink::create_writer)
/// and [`Sink::create_committer`](crate::Sink::create_committer) once per
/// subtask and per start of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitContext {
    /// This subtask's index, `0..parallelism`.
    pub subtask_index: SubtaskIndex,
    /// How many subtasks the job runs.
    pub parallelism: usize,
    /// Which start of the job this is; see [`Generation`].
    pub generation: Generation,
    /// The checkpoint this start restored from, or `None` on a fresh start.
    pub restored_checkpoint_id: Option<CheckpointId>,
    /// The job's name, as given to the job builder.
    pub job_name: String,
}
