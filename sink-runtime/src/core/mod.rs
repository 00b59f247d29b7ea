//! The pure decision core: every rule of the commit contract, with no I/O, no
//! clock and no tokio.
//!
//! The async task loops (the private `task` module) and the coordinator feed these
//! state machines events and carry out the actions they return, so the
//! hardest logic is tested exhaustively with plain unit and property tests.
//!
//! | module | decides |
//! |---|---|
//! | [`admission`] | which jobs may run, and whether they commit at checkpoints or only at end of input |
//! | [`alignment`] | which messages the global committer processes before its snapshot of a checkpoint, and which after |
//! | [`ledger`] | which committables wait for which checkpoint; which checkpoint may be committed (completion, subsumption, completeness) |
//! | [`commit_round`] | how one checkpoint's commit ends, through its retries |
//! | [`retry`] | backoff with jitter, and when retries are exhausted |
//! | [`lifecycle`] | what a subtask does at a barrier and at end of input; when end of stream may go to the global committer |
//! | [`placement`] | where a start puts splits, writer states and pending committables, also after a rescale |
//! | [`restart`] | whether and when a failed job restarts |
//! | [`checkpoints`] | when to trigger, when all acknowledged, what a completion means, which checkpoint is final, how failures count |

pub mod admission;
pub mod alignment;
pub mod checkpoints;
pub mod commit_round;
pub mod ledger;
pub mod lifecycle;
pub mod placement;
pub mod restart;
pub mod retry;
