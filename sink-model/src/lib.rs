//! The exactly-once protocol checked exhaustively: models of a job and of a
//! bounded source's end of input, driven through the project's own pure
//! decision code, explored by [`stateright`] over every interleaving of a
//! small world.
//!
//! ```text
//!  JobWorld ──▶ JobModel ──(every order of every event)──▶ properties named after
//!                 │                                        the rules of docs/semantics.md
//!                 └─ sink_runtime::core: admission, checkpoints, ledger, commit_round,
//!                    lifecycle, alignment, placement, restart, retry
//!  SourceWorld ──▶ SourceModel ── sources_kafka::end::unread
//! ```
//!
//! | module | holds |
//! |---|---|
//! | [`world`] | the worlds of the job model, and the past bugs it can put back |
//! | [`job`] | the job model: subtasks, committers, the global committer, the coordinator, crashes |
//! | [`source`] | the bounded group source model: assignments dealt twice, to no one, moving |
//! | [`suite`] | the worlds the test command checks, and deeper ones |
//! | [`mod@check`] | running a model, its figures, and counterexamples printed step by step |
//!
//! The model covers the decisions, not the I/O: the destinations are
//! modelled as the contract lets them be (transactional by name, replays
//! recognised), time is abstract (a checkpoint may start whenever the
//! tracker allows one), and the destinations' own bugs are out of scope.
//! `docs/architecture.md` says what each world covers.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod check;
pub mod job;
pub mod source;
pub mod suite;
pub mod world;

pub use check::{check, Bounds, Outcome};
pub use job::JobModel;
pub use source::{SourceModel, SourceWorld};
pub use world::{Destination, Input, JobWorld, Mode, PastBug};
