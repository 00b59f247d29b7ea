//! The trait family a two-phase-commit sink implements.
//!
//! A sink author implements four traits, each in its own module:
//!
//! | trait | phase | called by the runtime |
//! |---|---|---|
//! | [`Sink`] | factory | at every start of the job: cleans up after earlier starts, makes writers and committers, names serializers |
//! | [`SinkWriter`] | 1: write and prepare | for every record; at every checkpoint before the barrier; once at end of input |
//! | [`Committer`] | 2: commit | when a checkpoint completes (or at end of input without checkpoints), idempotently |
//! | [`GlobalCommitter`] | after commit, optional | once per checkpoint, with every subtask's committed committables |
//!
//! A sink may also commit its job's source positions with the data (module
//! `positions`: [`SplitKey`], [`PositionAdvance`], [`PositionTable`]), so
//! that a split of the input can move to another instance of the job
//! without a record read twice or skipped.
//!
//! ```text
//!  records ─▶ SinkWriter ── prepare_commit at checkpoint n ─▶ committables(n)
//!                                                                 │ checkpoint n completes
//!                                                                 ▼
//!                                                            Committer::commit ─▶ GlobalCommitter
//! ```
//!
//! This crate has no runtime in it and does not depend on tokio: sinks are
//! written against the API alone. The runtime lives in `sink-runtime`; the
//! contract both sides keep is in the project's `docs/semantics.md`.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod bad_record;
mod clock;
mod committer;
mod context;
mod direct;
mod error;
mod global_committer;
mod metrics;
mod positions;
mod serializer;
mod sink;
mod start;
mod writer;

pub use bad_record::BadRecord;
pub use clock::{Clock, ManualClock, SystemClock};
pub use committer::{CommitOutcome, CommitRequest, Committer};
pub use context::{CheckpointId, Generation, InitContext, Lineage, SubtaskIndex};
pub use direct::{NoCommittable, NoCommitter};
pub use error::{ErrorClass, SinkError};
pub use global_committer::{CommitSchedule, GlobalCommitter, GlobalCommitterFactory};
pub use metrics::{metric_name, Counter, CounterValue, SinkMetrics};
pub use positions::{
    CommittedPositions, PositionAdvance, PositionConflict, PositionTable, SplitKey,
};
pub use serializer::{
    decode_bincode_bounded, deserialize_versioned, encode_bincode_into, serialize_versioned,
    split_versioned, BincodeSerializer, SerializerError, VersionedSerializer, MAX_DECODED_PAYLOAD,
};
pub use sink::{CommittableOf, InputOf, Sink, WriterStateOf};
pub use start::JobStart;
pub use writer::{Durability, SinkWriter};

/// Re-exported so that sink authors use the same `async_trait` as the traits.
pub use async_trait::async_trait;
