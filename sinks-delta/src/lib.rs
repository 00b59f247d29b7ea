//! The Delta Lake sink: Parquet data files written by every subtask,
//! committed to a Delta table by a global committer in one transaction per
//! checkpoint, exactly once.
//!
//! ```text
//!  records ─▶ DeltaSinkWriter (per subtask) ── Parquet files, closed at each checkpoint
//!                 │ prepare_commit(n): DataFile { path, size, rows, partition values, stats }…
//!                 │                    (+ CarriedPositions: the source positions the files advance)
//!                 ▼
//!           DeltaFileCommitter (per subtask) ── the files durable (HEAD; fsync on local disks)
//!                 │ committed
//!                 ▼
//!           DeltaGlobalCommitter (one per job) ── one Delta transaction per checkpoint:
//!                 add(every subtask's files of n) + txn(app id = job/lineage, version = n)
//!                 + txn(split, next offset) per split read, if each is where its records start
//!                 ▼
//!           _delta_log/000…N.json   (conditional create: one writer wins each version)
//! ```
//!
//! A replayed or retried checkpoint is recognised from the table's log (the
//! application's `txn` version), never from memory. Tables live in a local
//! directory or on any object store with conditional creates
//! ([`TableLocation`]). The sink brings its global committer itself
//! (`Sink::global_committer`), so a job cannot leave it out. See the
//! project's `docs/delta-sink.md` for what holds after each kind of crash.

mod app_versions;
mod committable;
mod committer;
mod compaction;
mod derived;
mod durable_store;
mod errors;
mod format;
mod global_committer;
mod location;
mod positions;
pub mod read;
mod sink;
mod table_log;
mod writer;

pub use committable::{CarriedPositions, DataFile, DeltaCommittable};
pub use committer::DeltaFileCommitter;
pub use compaction::Compaction;
pub use derived::Derivation;
pub use errors::TableFenced;
pub use global_committer::DeltaGlobalCommitter;
pub use location::TableLocation;
pub use sink::{DeltaSink, DeltaSinkBuilder};
pub use writer::{DeltaSinkWriter, NoResume};

/// Re-exported: the Arrow schema types a table's columns are given in.
pub use arrow_schema;
/// Time units for [`DeltaSinkBuilder::timestamp`] (re-exported from `arrow-schema`).
pub use sink_arrow::TimeUnit;
