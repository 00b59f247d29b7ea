//! A PostgreSQL sink with real two-phase commit: `PREPARE TRANSACTION` at
//! each checkpoint barrier, `COMMIT PREPARED` once the checkpoint completed.
//!
//! ```text
//!  records ─▶ writer[i]: BEGIN; COPY ... (binary); ...
//!               barrier n: [INSERT a step per split read]; INSERT marker;
//!                          PREPARE TRANSACTION 'eo1/job/lineage/gen/i/n' ─▶ committable
//!  checkpoint n completed ─▶ committer[i]: COMMIT PREPARED 'eo1/job/lineage/gen/i/n'
//!  every start ─▶ Sink::on_start: ROLLBACK PREPARED every transaction of the job that the
//!                 restored checkpoint does not hold
//!                   committers: COMMIT PREPARED again what n holds (a replay finds the marker)
//! ```
//!
//! - Each subtask writes through its own connection, in one transaction per
//!   checkpoint, with `COPY ... FROM STDIN (FORMAT binary)`.
//! - A commit marker row, written in the same transaction, tells a replayed
//!   commit ("already committed": the marker is there) from a lost one
//!   (neither prepared nor marked: a failure with a known reason, counted;
//!   superseded instead when it carries source positions).
//! - At every start of the job (the runtime's start hook), prepared
//!   transactions of this job that the restored checkpoint does not hold
//!   (left by a start that crashed, or by an earlier life of the job) are
//!   rolled back, so none holds locks forever.
//! - [`PostgresSink::connect`] refuses a server with
//!   `max_prepared_transactions = 0`, a missing table and a column whose type
//!   differs from the records', each with what to change. A lost connection
//!   during a commit is retried on a new connection within the job's commit
//!   retry policy, then fails the job.
//! - Source positions are committed with the rows
//!   ([`Sink::commits_positions`](sink_api::Sink::commits_positions)): each
//!   transaction adds, per split it read, a step `from → to` to
//!   [`POSITIONS_TABLE`], taken only where the split's committed steps end,
//!   so a split's position moves only with the rows read before it, and an
//!   owner of a split whose step is taken by another is superseded. A
//!   prepared transaction no live instance can commit is rolled back by
//!   the writer that needs its step. See the `positions` module for the
//!   design and the argument, and `format` for the committables' versions.
//! - No message, log line or `Debug` output shows a secret of the
//!   connection string: where the string is shown, it goes through
//!   [`redact_connection_string`] (password and secret parameters as `***`).
//!
//! The server needs `max_prepared_transactions` of at least twice the
//! parallelism. See the project's `docs/postgres-sink.md`.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod committer;
mod connection;
mod errors;
mod format;
mod gid;
mod positions;
mod record;
mod recovery;
mod redact;
mod sink;
mod stats;
mod writer;

pub use committer::PostgresCommitter;
pub use connection::{ConnectError, MARKER_TABLE, POSITIONS_TABLE};
pub use gid::TransactionId;
pub use positions::PositionError;
pub use record::{Column, PgRecord};
pub use redact::redact_connection_string;
pub use sink::PostgresSink;
pub use stats::PostgresStats;
pub use tokio_postgres::types::{ToSql, Type};
pub use writer::{PgCommittable, PgWriterState, PostgresWriter};
