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
//! Layout: [`core`] holds the pure decisions (no I/O, no tokio); `task` and
//! `coordinator` carry them out; [`source`] and [`storage`] are the edges.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod coordinator;
pub mod core;
mod error;
pub mod failpoints;
mod job;
mod metrics;
pub mod pipeline;
mod restore;
pub mod source;
pub mod storage;
mod task;

pub use crate::core::checkpoints::CheckpointConfig;
pub use crate::core::restart::RestartStrategy;
pub use crate::core::retry::RetryPolicy;
pub use error::{BuildError, JobError};
pub use job::{Job, JobBuilder, JobHandle, JobReport, JobStatus, NoticeDelivery, RuntimeMode};
pub use metrics::{KnownCommitFailure, Metrics, MetricsSnapshot, MAX_KEPT_FAILURES};
pub use pipeline::{Pipeline, PipelineBuilder};
pub use source::{Boundedness, SequenceSource, Source, VecSource};
pub use storage::{CheckpointStorage, LocalCheckpointStorage, MemoryCheckpointStorage};
