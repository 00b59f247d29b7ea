//! Which jobs may run, and how their output is committed: the table of
//! `docs/semantics.md` ("When commits happen") as one function.
//!
//! ```text
//!  batch,     unbounded            ─▶ refused
//!  batch,     bounded              ─▶ the final checkpoint only (the interval is ignored)
//!  streaming, checkpoints on       ─▶ periodic (or on-demand) checkpoints, then the final one
//!  streaming, off,  bounded        ─▶ the final checkpoint only
//!  streaming, off,  unbounded      ─▶ refused, unless uncommitted output is allowed
//! ```
//!
//! The refused row is the write-up's pitfall: an unbounded job with a
//! two-phase-commit sink and no checkpoints writes everything and commits
//! nothing, forever.

/// What [`admit`] is asked about. Built by `JobBuilder::build` from the
/// builder's settings; by the model checker from each world it explores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobShape {
    /// The job runs in batch mode (`RuntimeMode::Batch`).
    pub batch: bool,
    /// The source never ends (`Boundedness::Unbounded`).
    pub unbounded: bool,
    /// Periodic or on-demand checkpoints were configured.
    pub checkpointing: bool,
    /// `JobBuilder::allow_uncommitted_output` was called.
    pub allow_uncommitted: bool,
}

/// How an admitted job commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Checkpoints as configured; each completion commits; at end of input
    /// the final checkpoint commits the rest.
    Checkpoints,
    /// No checkpoint but the final one, taken once every subtask reached end
    /// of input: everything is committed once, then.
    FinalCheckpointOnly,
    /// Unbounded without checkpoints, allowed by the user: the job writes
    /// and never commits (a warning, and `records_uncommitted`).
    Uncommitted,
}

/// Why a job may not run. `JobBuilder::build` turns each into its
/// `BuildError`, which names the fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Batch mode needs input that ends.
    BatchWithUnboundedSource,
    /// Unbounded input without checkpoints would never be committed.
    UnboundedWithoutCheckpointing,
}

/// Whether a job of this shape may run, and how it commits. Called once per
/// build; pure.
pub fn admit(shape: JobShape) -> Result<Admission, Refusal> {
    match shape {
        JobShape {
            batch: true,
            unbounded: true,
            ..
        } => Err(Refusal::BatchWithUnboundedSource),
        JobShape { batch: true, .. } => Ok(Admission::FinalCheckpointOnly),
        JobShape {
            checkpointing: true,
            ..
        } => Ok(Admission::Checkpoints),
        JobShape {
            unbounded: false, ..
        } => Ok(Admission::FinalCheckpointOnly),
        JobShape {
            allow_uncommitted: true,
            ..
        } => Ok(Admission::Uncommitted),
        JobShape { .. } => Err(Refusal::UnboundedWithoutCheckpointing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_when_commits_happen() {
        let shape = |batch, unbounded, checkpointing, allow_uncommitted| JobShape {
            batch,
            unbounded,
            checkpointing,
            allow_uncommitted,
        };
        use Admission::*;
        use Refusal::*;
        for allow in [false, true] {
            for checkpointing in [false, true] {
                assert_eq!(
                    admit(shape(true, true, checkpointing, allow)),
                    Err(BatchWithUnboundedSource)
                );
                assert_eq!(
                    admit(shape(true, false, checkpointing, allow)),
                    Ok(FinalCheckpointOnly)
                );
                assert_eq!(admit(shape(false, allow, true, allow)), Ok(Checkpoints));
            }
            assert_eq!(
                admit(shape(false, false, false, allow)),
                Ok(FinalCheckpointOnly)
            );
        }
        assert_eq!(
            admit(shape(false, true, false, false)),
            Err(UnboundedWithoutCheckpointing)
        );
        assert_eq!(admit(shape(false, true, false, true)), Ok(Uncommitted));
    }
}
