//! Errors of building and running a job.
//!
//! [`BuildError`] is returned by the job builder when a configuration can
//! never work (most importantly: one that would never commit); it names the
//! fix. [`JobError`] is why a running job failed.

use sink_api::{CheckpointId, SerializerError, SinkError};

use crate::core::commit_round::CommitFailure;
use crate::source::SourceError;
use crate::storage::StorageError;

/// A job configuration the builder refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// An unbounded source, a two-phase-commit sink and no checkpointing:
    /// nothing would ever be committed.
    #[error(
        "job '{job}': the source is unbounded and checkpointing is off, so the sink would never commit anything \
         (prepare_commit runs only at checkpoints or at end of input, and an unbounded input never ends). \
         Enable checkpointing with `.checkpointing(CheckpointConfig::every(Duration::from_secs(1)))`, \
         or, if uncommitted output is really what you want, call `.allow_uncommitted_output()`"
    )]
    UnboundedWithoutCheckpointing {
        /// The job's name.
        job: String,
    },
    /// Batch mode with a source that never ends.
    #[error(
        "job '{job}': batch mode needs a bounded source, because it commits once at end of input and an unbounded \
         source never ends. Use `RuntimeMode::Streaming` with checkpointing, or a bounded source"
    )]
    BatchWithUnboundedSource {
        /// The job's name.
        job: String,
    },
    /// A setting out of its range.
    #[error("job '{job}': {message}")]
    InvalidSetting {
        /// The job's name.
        job: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

/// Why a job failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// A writer, committer or global committer returned an error. Its
    /// message ends with the sink's whole cause chain.
    #[error("{task}: {action} failed: {source}")]
    Sink {
        /// Which task: "subtask 1", "global committer".
        task: String,
        /// The call that failed, for example "prepare_commit".
        action: &'static str,
        /// The sink's error.
        #[source]
        source: SinkError,
    },
    /// A source reader failed.
    #[error("subtask {subtask}: reading the source failed: {source}")]
    Source {
        /// The subtask.
        subtask: usize,
        /// The source's error.
        #[source]
        source: SourceError,
    },
    /// A commit could not succeed (an unknown failure, or retries exhausted).
    #[error("subtask {subtask}: {source}")]
    Commit {
        /// The subtask whose committer failed.
        subtask: usize,
        /// What went wrong.
        #[source]
        source: CommitFailure,
    },
    /// Checkpoints failed more often in a row than tolerated.
    #[error(
        "{consecutive} checkpoints failed in a row (tolerated: {tolerated}); the last, checkpoint {checkpoint_id}, \
         failed because {reason}. Without completed checkpoints nothing is committed: raise the checkpoint timeout, \
         fix the checkpoint storage, or raise CheckpointConfig::tolerable_failures"
    )]
    CheckpointsFailing {
        /// Consecutive failures.
        consecutive: u32,
        /// The tolerated number.
        tolerated: u32,
        /// The last failed checkpoint.
        checkpoint_id: CheckpointId,
        /// Why it failed.
        reason: String,
    },
    /// A checkpoint could not be read from or written to storage.
    #[error("checkpoint storage: {0}")]
    Storage(#[from] StorageError),
    /// A state blob could not be encoded or decoded.
    #[error("{task}: {what}: {source}")]
    Serialization {
        /// Which task.
        task: String,
        /// What was being encoded or decoded.
        what: &'static str,
        /// The serializer's error.
        #[source]
        source: SerializerError,
    },
    /// The runtime broke one of its own ordering or bookkeeping promises. A
    /// bug in the runtime (or a corrupt restore); please report it.
    #[error("{task}: internal invariant broken: {message}")]
    Invariant {
        /// Which task.
        task: String,
        /// What broke.
        message: String,
    },
    /// A task panicked.
    #[error("{task} panicked: {message}")]
    Panicked {
        /// Which task.
        task: String,
        /// The panic's message.
        message: String,
    },
    /// A crash simulated at a named crash point (the `failpoints` feature;
    /// crash tests only).
    #[error("simulated crash at failpoint {failpoint}")]
    Crash {
        /// The crash point.
        failpoint: &'static str,
    },
    /// The job was cancelled while a task was busy (a task's own way of
    /// stopping; a cancelled job reports `JobStatus::Cancelled`).
    #[error("the job was cancelled")]
    Cancelled,
    /// The job could not resume from the stored checkpoint.
    #[error("cannot resume from checkpoint {checkpoint_id}: {message}")]
    Restore {
        /// The stored checkpoint.
        checkpoint_id: CheckpointId,
        /// What does not fit and what to do.
        message: String,
    },
}

impl JobError {
    /// Whether restarting from the last completed checkpoint may help: not
    /// for a sink's permanent error ([`SinkError::permanent`]), a source's
    /// ([`SourceError::permanent`](crate::source::SourceError::permanent)), a checkpoint
    /// that cannot be restored, a state directory in use, or an instance
    /// fenced off its checkpoint storage by a newer one, which need the user
    /// (or, for the fenced instance, nothing: its successor runs).
    pub fn is_restartable(&self) -> bool {
        !matches!(self, JobError::Restore { .. })
            && !matches!(self, JobError::Storage(error) if error.is_permanent())
            && !matches!(self, JobError::Sink { source, .. } if source.is_permanent())
            && !matches!(self, JobError::Source { source, .. } if source.is_permanent())
    }

    /// Whether a commit was superseded: its source positions had moved in
    /// the destination, another owner of a split having committed those
    /// records (a committer's superseded request, or a global committer's
    /// [`SinkError::superseded`](sink_api::SinkError::superseded)). The job's restart loop restarts such a job at once (see
    /// `RestartStrategy`).
    pub fn is_superseded(&self) -> bool {
        match self {
            JobError::Commit {
                source: CommitFailure::Superseded { .. },
                ..
            } => true,
            JobError::Sink { source, .. } => source.is_superseded(),
            _ => false,
        }
    }

    pub(crate) fn invariant(task: impl Into<String>, message: impl std::fmt::Display) -> JobError {
        JobError::Invariant {
            task: task.into(),
            message: message.to_string(),
        }
    }
}
