//! The Apache Iceberg sink: Parquet data files written by every subtask,
//! committed to an Iceberg table by a global committer in one fast append
//! per checkpoint, exactly once.
//!
//! ```text
//!  records ─▶ IcebergSinkWriter (per subtask) ── Parquet data files, closed (durable) at each checkpoint
//!                 │ prepare_commit(n): the files, described as Iceberg's manifests describe them
//!                 ▼
//!           IcebergFileCommitter (per subtask) ── each file there, whole
//!                 ▼
//!           IcebergGlobalCommitter (one per job) ── one fast append per checkpoint:
//!                 the checkpoint's files + table properties
//!                 { eo-sink.checkpoint/<job>/<lineage> = n, eo-sink.owner/… = generation }
//!                 ▼
//!           catalog: compare-and-swap of the table's metadata location
//! ```
//!
//! A replayed or retried checkpoint is recognised from the table's
//! properties (the `marks` module), never from memory, and iceberg-rust's
//! own retry, which applies a commit again to a table that moved, is not
//! used (the `one_attempt` module). The catalog is an SQL catalog on a
//! local SQLite database, with tables in a local warehouse written durably
//! (the `storage` module) or on S3 (the `s3` feature), or a REST catalog
//! with tables on S3 (the `rest` feature). The project's
//! `docs/iceberg-sink.md` says what holds after each kind of crash.

mod catalog;
mod committable;
mod committer;
mod errors;
mod global_committer;
mod marks;
#[cfg(feature = "s3")]
mod object_storage;
mod one_attempt;
mod partition;
pub mod read;
mod rewrite;
mod sink;
mod storage;
mod table_commit;
#[cfg(test)]
mod test_table;
mod writer;

#[cfg(feature = "rest")]
pub use catalog::RestCatalog;
pub use catalog::{
    check_table_name, load_or_create, parse_table_name, IcebergCatalog, SqliteCatalog, Warehouse,
    CATALOG_NAME,
};
pub use committable::IcebergDataFile;
pub use committer::IcebergFileCommitter;
pub use errors::TableFenced;
pub use global_committer::IcebergGlobalCommitter;
pub use partition::{parse_partition_spec, PartitionBy};
pub use sink::{IcebergSink, IcebergSinkBuilder};
/// Time units for [`IcebergSinkBuilder::timestamp`] (re-exported from `arrow-schema`).
pub use sink_arrow::TimeUnit;
pub use writer::{IcebergSinkWriter, NoResume};

/// Re-exported: the crate the table's schema and names are given in
/// (`iceberg::spec::Schema`, `iceberg::TableIdent`).
pub use iceberg;
