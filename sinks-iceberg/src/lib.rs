//! The Apache Iceberg sink: Parquet data files written by every subtask,
//! committed to an Iceberg table by a global committer in one fast append
//! per checkpoint, exactly once.
//!
//! ```text
//!  records ─▶ writer (per subtask) ── Parquet data files, closed at each checkpoint
//!                 │ prepare_commit(n): the files, described as Iceberg's manifests describe them
//!                 ▼
//!           global committer (one per job) ── one fast append per checkpoint:
//!                 the checkpoint's files + table properties
//!                 { eo-sink.checkpoint/<job>/<lineage> = n, eo-sink.owner/… = generation }
//!                 ▼
//!           catalog: compare-and-swap of the table's metadata location
//! ```
//!
//! A replayed or retried checkpoint is recognised from the table's
//! properties (the `marks` module), never from memory, and iceberg-rust's
//! own retry, which applies a commit again to a table that moved, is not
//! used (the `one_attempt` module).

// Work in progress (issue 36): the writer, the per-subtask committer and
// the `Sink` that bring these together come next; until then the commit
// path is reached only from its tests.
#![cfg_attr(not(test), allow(dead_code))]

mod catalog;
mod committable;
mod errors;
mod global_committer;
mod marks;
mod one_attempt;
mod table_commit;
#[cfg(test)]
mod test_table;

pub use catalog::{load_or_create, parse_table_name, SqliteCatalog, CATALOG_NAME};
pub use committable::IcebergDataFile;
pub use errors::TableFenced;
pub use global_committer::IcebergGlobalCommitter;
