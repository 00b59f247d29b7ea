//! The optional global committer: one per job, after every committer.

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
