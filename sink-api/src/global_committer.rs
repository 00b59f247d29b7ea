//! The optional global committer: one per job, after every committer, and
//! the schedule it asks its commits on.

use std::num::NonZeroU32;
use std::time::Duration;

use async_trait::async_trait;

use crate::{CheckpointId, InitContext, SinkError};

/// Acts once per checkpoint on what every subtask's committer committed (for
/// example: one table snapshot or one manifest per checkpoint).
///
/// Runs with parallelism 1. Brought by the sink
/// ([`Sink::global_committer`](crate::Sink::global_committer)), as a table
/// sink does, or given to the job builder by the user.
///
/// # When it is called
///
/// - [`commit_checkpoint`](Self::commit_checkpoint) once per checkpoint, in
///   checkpoint order, only when the committables of that checkpoint have
///   arrived from **every** subtask (each subtask sends a summary with its
///   count, so a missing or partial delivery holds the call back).
/// - With a [`CommitSchedule`] other than every checkpoint
///   ([`schedule`](Self::schedule)), completed checkpoints wait in the
///   runtime's state (and are delivered again after a restart) until the
///   schedule is due, then [`commit_checkpoints`](Self::commit_checkpoints)
///   gets every waiting one at once, in order. Checkpoints up to the one a
///   start restored, and every one at end of input, are handed over at
///   once, whatever the schedule.
/// - [`end_of_input`](Self::end_of_input) once, after every subtask has
///   forwarded the committables of its final checkpoint. The runtime defers the
///   end of stream until then, so the final checkpoint's committables are never
///   dropped (Flink's FLINK-38614).
///
/// # Guarantees the global committer must give
///
/// - **Idempotence.** After recovery, the committables of checkpoints it has
///   not been recorded as handling are delivered again.
/// - **Positions.** When it is where the sink's data becomes visible and the
///   sink commits source positions (the `positions` module), it applies a
///   subtask's committables only if each split is where their advances
///   start, drops them otherwise, commits the rest, and then returns an
///   error marked [`superseded`](crate::SinkError::superseded). The runtime
///   restarts the job at once; for a checkpoint up to the restored one (a
///   recovery) it counts it and goes on, since every reader starts from the
///   destination's positions once the restored checkpoints are committed.
#[async_trait]
pub trait GlobalCommitter: Send + 'static {
    /// The committables the subtasks' committers committed.
    type Committable: Send + 'static;

    /// Acts on everything committed for checkpoint `checkpoint_id`, from all
    /// subtasks. Returning `Err` fails the job.
    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<Self::Committable>,
    ) -> Result<(), SinkError>;

    /// Acts on several completed checkpoints at once, oldest first, each
    /// with everything committed for it: called instead of
    /// [`commit_checkpoint`](Self::commit_checkpoint) when the
    /// [`schedule`](Self::schedule) held checkpoints back (checkpoints with
    /// nothing committed are left out). A committer that makes one
    /// destination commit of them (one table snapshot) must still recognise
    /// each checkpoint on replay: after a restart they are delivered again,
    /// possibly grouped otherwise. The default commits them one by one.
    async fn commit_checkpoints(
        &mut self,
        checkpoints: Vec<(CheckpointId, Vec<Self::Committable>)>,
    ) -> Result<(), SinkError> {
        for (checkpoint_id, committables) in checkpoints {
            self.commit_checkpoint(checkpoint_id, committables).await?;
        }
        Ok(())
    }

    /// How often the runtime hands this committer what completed: at every
    /// checkpoint (the default), or on a [`CommitSchedule`]. Read once per
    /// start, when the committer is made.
    fn schedule(&self) -> CommitSchedule {
        CommitSchedule::every_checkpoint()
    }

    /// The input ended and every checkpoint was delivered. Called once, last.
    /// The default does nothing.
    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Makes a global committer, once per start of the job (the first and every
/// restart), given the start's context: the job's name, lineage and
/// generation, clock and metrics (its subtask index is 0: a global
/// committer runs once per job). Returned by
/// [`Sink::global_committer`](crate::Sink::global_committer); called by the
/// runtime.
pub type GlobalCommitterFactory<C> =
    Box<dyn Fn(&InitContext) -> Box<dyn GlobalCommitter<Committable = C>> + Send + Sync>;

/// When a global committer commits: at every checkpoint (the default), or
/// once per several checkpoints, or at most once per interval, so that a
/// table does not gain a snapshot per checkpoint at short intervals (a day
/// of 1 s checkpoints is 86 400 snapshots).
///
/// Returned by [`GlobalCommitter::schedule`]; read by the runtime, which
/// hands the committer the checkpoints that completed once **both** hold:
/// at least [`checkpoints`](Self::checkpoints) of them wait (those with
/// nothing to commit count too), and at least
/// [`at_most_every`](Self::at_most_every) passed since the last commit (or
/// the start). Records are acknowledged (a pipeline's tickets resolve) at
/// that commit, not at their checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitSchedule {
    checkpoints: NonZeroU32,
    at_most_every: Duration,
}

impl CommitSchedule {
    /// A commit per checkpoint.
    pub const fn every_checkpoint() -> CommitSchedule {
        CommitSchedule {
            checkpoints: NonZeroU32::MIN,
            at_most_every: Duration::ZERO,
        }
    }

    /// A commit once `checkpoints` completed checkpoints wait.
    pub fn with_checkpoints(mut self, checkpoints: NonZeroU32) -> CommitSchedule {
        self.checkpoints = checkpoints;
        self
    }

    /// A commit no sooner than `interval` after the last one.
    pub fn with_at_most_every(mut self, interval: Duration) -> CommitSchedule {
        self.at_most_every = interval;
        self
    }

    /// How many completed checkpoints a commit waits for.
    pub fn checkpoints(&self) -> NonZeroU32 {
        self.checkpoints
    }

    /// The least time between two commits.
    pub fn at_most_every(&self) -> Duration {
        self.at_most_every
    }

    /// Whether a commit is due with `waiting` completed checkpoints held
    /// back and `since_last` passed since the last commit.
    pub fn is_due(&self, waiting: usize, since_last: Duration) -> bool {
        waiting >= self.checkpoints.get() as usize && since_last >= self.at_most_every
    }
}

impl Default for CommitSchedule {
    fn default() -> Self {
        CommitSchedule::every_checkpoint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_due_once_both_the_count_and_the_interval_are_reached() {
        let every = CommitSchedule::every_checkpoint();
        assert!(every.is_due(1, Duration::ZERO));
        assert!(!every.is_due(0, Duration::from_secs(60)));
        let ten = every.with_checkpoints(NonZeroU32::new(10).unwrap());
        assert!(!ten.is_due(9, Duration::from_secs(60)));
        assert!(ten.is_due(10, Duration::ZERO));
        let both = ten.with_at_most_every(Duration::from_secs(5));
        assert!(!both.is_due(12, Duration::from_secs(4)));
        assert!(!both.is_due(9, Duration::from_secs(6)));
        assert!(both.is_due(10, Duration::from_secs(5)));
    }
}
