//! A small tokio runtime that drives two-phase-commit sinks with exactly-once
//! semantics.
//!
//! Build a [`Job`] from a [`Source`] and a [`sink_api::Sink`]; the runtime
//! runs `parallelism` subtasks, each a chain of source reader, writer and
//! committer, plus an optional global committer, and a checkpoint
//! coordinator. It calls `prepare_commit` before each checkpoint barrier,
//! commits when a checkpoint completes, and commits everything at end of input
//! when checkpointing is off or the job is batch. The full contract is in the
//! project's `docs/semantics.md`.
//!
//! ```text
//!  source[i] ──batches──▶ writer[i] ──(summary, committables)──▶ committer[i] ──committed──▶ global committer
//!      ▲                      ▲                                       ▲
//!      └──── Trigger(n) ──────┴────── barrier n, in order ────────────┴── Complete(n)
//!                               checkpoint coordinator
//! ```
//!
//! Layout: `core` holds the pure decisions (no I/O, no tokio; public only
//! with the `testing` feature); `task` and
//! `coordinator` carry them out; [`source`] and [`storage`] are the edges.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod bad_records;
mod coordinator;
mod counters;
// The decision core and the crash points are internals: public only to this
// project's own tests and the kit, through the `testing` and `failpoints`
// features, so that no production build can reach them.
#[cfg(feature = "testing")]
pub mod core;
// Some of the core's queries serve only its tests.
#[cfg(not(feature = "testing"))]
#[allow(dead_code)]
mod core;
pub mod dead_letter;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
#[cfg(not(feature = "failpoints"))]
mod failpoints;
mod job;
mod metrics;
pub mod pipeline;
mod report;
mod restore;
pub mod source;
mod spec;
pub mod storage;
mod task;

pub use crate::core::checkpoints::{CheckpointConfig, TriggerMode};
pub use crate::core::restart::RestartStrategy;
pub use crate::core::retry::RetryPolicy;
pub use bad_records::BadRecordPolicy;
pub use counters::JobCounter;
pub use error::{BuildError, JobError};
pub use job::{Job, JobBuilder, JobControl, JobHandle};
pub use metrics::{KnownCommitFailure, Metrics, MetricsSnapshot, MAX_KEPT_FAILURES};
pub use pipeline::{Pipeline, PipelineBuilder};
pub use report::{JobReport, JobStatus};
pub use source::{Boundedness, PartitionedSequence, SequenceSource, Source, VecSource};
#[cfg(feature = "testing")]
pub use spec::NoticeDelivery;
pub use spec::RuntimeMode;
pub use storage::{CheckpointStorage, LocalCheckpointStorage, MemoryCheckpointStorage};
