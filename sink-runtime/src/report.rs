//! What a job reports when it ends.

use sink_api::{CheckpointId, Lineage};

use crate::metrics::{KnownCommitFailure, MetricsSnapshot};

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobStatus {
    /// The input ended and everything was committed.
    Finished,
    /// [`JobHandle::cancel`](crate::JobHandle::cancel) stopped it; uncommitted output stays
    /// uncommitted.
    Cancelled,
    /// [`JobControl::stop`](crate::JobControl::stop) ended its input early:
    /// everything read before the stop was committed, as at an end of
    /// input, and the checkpoint storage was left resumable: a start on it
    /// goes on from where this one stopped.
    Stopped,
    /// The checkpoint storage says this job finished before: nothing was
    /// read, written or committed.
    AlreadyFinished,
}

/// What a job reports when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobReport {
    /// How it ended.
    pub status: JobStatus,
    /// Its counters at the end, over every restart.
    pub metrics: MetricsSnapshot,
    /// The newest completed checkpoint, if any.
    pub last_checkpoint: Option<CheckpointId>,
    /// The lineage the job ran in (for [`JobStatus::AlreadyFinished`], the
    /// one its newest checkpoint names, `None` if there is none): what
    /// tells its output, such as a Delta sink's application id, from other
    /// runs'.
    pub lineage: Option<Lineage>,
    /// Every commit that failed with a known reason (the first
    /// [`MAX_KEPT_FAILURES`](crate::MAX_KEPT_FAILURES)): output this
    /// job lost, with the committers' reasons. A job can end
    /// [`JobStatus::Finished`] and still have lost output: check
    /// [`lost_output`](Self::lost_output).
    pub known_failures: Vec<KnownCommitFailure>,
}

impl JobReport {
    /// Whether the job lost output: some commit failed with a known reason
    /// (`metrics.commits_failed > 0`). A program that runs a job should say
    /// so and exit with an error, naming [`known_failures`](Self::known_failures).
    pub fn lost_output(&self) -> bool {
        self.metrics.commits_failed > 0
    }
}
