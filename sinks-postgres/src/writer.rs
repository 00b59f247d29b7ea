//! The writer: one connection per subtask, one transaction per checkpoint.
//!
//! The first rows after a checkpoint open a transaction (`BEGIN`); every
//! batch goes in with `COPY ... FROM STDIN (FORMAT binary)`. At the barrier,
//! `prepare_commit` writes the commit marker row and runs `PREPARE
//! TRANSACTION` with the transaction's global id; the id is the committable.
//! A checkpoint without rows prepares nothing. After end of input nothing is
//! opened again, and `close` rolls back a transaction still open (one that
//! was never prepared).

use std::pin::pin;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, SinkError, SinkWriter};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};
use tracing::debug;

use crate::connection::MARKER_TABLE;
use crate::gid::{literal, TransactionId, MAX_GID_BYTES};
use crate::record::PgRecord;
use crate::stats::{self, Stats};

/// What a writer keeps in each checkpoint: the lineage its transaction ids
/// carried (see the `gid` module). Informational since the runtime keeps the
/// lineage itself ([`sink_api::InitContext::lineage`]); kept so that
/// checkpoints of earlier versions, whose lineage was the sink's own, still
/// read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgWriterState {
    /// The lineage the writer's transaction ids carried.
    pub lineage: String,
}

/// What a writer hands to the committer: one prepared transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgCommittable {
    /// The global id it was prepared with.
    pub gid: String,
    /// How many rows it holds.
    pub rows: u64,
}

/// Writes one subtask's rows. Made by
/// [`PostgresSink`](crate::PostgresSink)'s `create_writer`.
pub struct PostgresWriter<T> {
    pub(crate) client: Client,
    pub(crate) copy_sql: Arc<str>,
    /// `copy_sql`, prepared once on this connection.
    pub(crate) copy: Statement,
    pub(crate) types: Arc<[Type]>,
    pub(crate) job: String,
    pub(crate) generation: u64,
    pub(crate) subtask: usize,
    pub(crate) lineage: String,
    /// Rows in the open transaction; `None` when none is open.
    pub(crate) open: Option<u64>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) _records: std::marker::PhantomData<fn(T)>,
}

/// Turns a driver error met while doing `what` into the sink's error (see
/// [`sink_error`]).
pub(crate) fn failed(what: String) -> impl FnOnce(tokio_postgres::Error) -> SinkError {
    move |error| sink_error(what, error)
}

/// A driver error met while doing `what`, as the sink's error: the SQLSTATE
/// in the message, the driver's error kept as the cause. Permanent when the
/// SQLSTATE says no restart can succeed until someone changes something:
/// authorization (28), syntax or access (42: a missing table or column, no
/// privilege), an unknown database or schema (3D, 3F), bad data (22) or a
/// broken constraint (23). Transient otherwise: connections (08), rolled
/// back transactions (40), resources (53), an operator (57), the system
/// (58), and errors without a server code.
pub(crate) fn sink_error(what: impl std::fmt::Display, error: tokio_postgres::Error) -> SinkError {
    match error.as_db_error().map(|db| db.code().code().to_string()) {
        Some(code) => {
            let permanent = matches!(code.get(..2), Some("28" | "42" | "3D" | "3F" | "22" | "23"));
            let error = SinkError::other(format!("{what} (SQLSTATE {code})"), error);
            if permanent {
                error.permanent()
            } else {
                error
            }
        }
        None => SinkError::other(what.to_string(), error),
    }
}

/// The driver's error with the server's message, detail and SQLSTATE.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(&format!("; {detail}"));
            }
            if let Some(context) = db.where_() {
                text.push_str(&format!("; at {context}"));
            }
            text
        }
        None => error.to_string(),
    }
}

impl<T: PgRecord> PostgresWriter<T> {
    /// The global id of the transaction prepared for `checkpoint`.
    fn gid(&self, checkpoint: CheckpointId) -> Result<String, SinkError> {
        let gid = TransactionId {
            job: self.job.clone(),
            lineage: self.lineage.clone(),
            generation: self.generation,
            subtask: self.subtask,
            checkpoint: checkpoint.0,
        }
        .to_string();
        // Checked for the widest numbers when the writer was created.
        debug_assert!(gid.len() <= MAX_GID_BYTES);
        Ok(gid)
    }
}

#[async_trait]
impl<T: PgRecord> SinkWriter for PostgresWriter<T> {
    type Input = T;
    type Committable = PgCommittable;
    type State = PgWriterState;

    async fn write(&mut self, record: T) -> Result<(), SinkError> {
        self.write_batch(vec![record]).await
    }

    async fn write_batch(&mut self, records: Vec<T>) -> Result<(), SinkError> {
        if records.is_empty() {
            return Ok(());
        }
        if self.open.is_none() {
            self.client
                .batch_execute("BEGIN")
                .await
                .map_err(failed(format!("subtask {}: BEGIN", self.subtask)))?;
            self.open = Some(0);
        }
        let context = || format!("subtask {}: {}", self.subtask, self.copy_sql);
        let sink = self
            .client
            .copy_in(&self.copy)
            .await
            .map_err(failed(context()))?;
        let mut copy = pin!(BinaryCopyInWriter::new(sink, &self.types));
        // One buffer for the whole batch: no allocation per record.
        let mut values: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(self.types.len());
        for record in &records {
            values.clear();
            record.push_values(&mut values);
            if values.len() != self.types.len() {
                return Err(SinkError::msg(format!(
                    "subtask {}: a record gave {} values for {} columns; PgRecord::push_values \
                     must give one value per column of PgRecord::columns",
                    self.subtask,
                    values.len(),
                    self.types.len()
                )));
            }
            copy.as_mut()
                .write(&values)
                .await
                .map_err(failed(context()))?;
        }
        let rows = copy.finish().await.map_err(failed(context()))?;
        self.open = self.open.map(|open| open + rows);
        stats::add(&self.stats.rows_written, rows);
        Ok(())
    }

    async fn flush(&mut self, _end_of_input: bool) -> Result<(), SinkError> {
        // Every batch is sent as it is written.
        Ok(())
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<PgCommittable>, SinkError> {
        let Some(rows) = self.open else {
            return Ok(Vec::new());
        };
        let gid = self.gid(checkpoint_id)?;
        let rows_i64 = i64::try_from(rows).unwrap_or(i64::MAX);
        self.client
            .execute(
                &format!("INSERT INTO {MARKER_TABLE} (gid, rows) VALUES ($1, $2)"),
                &[&gid, &rows_i64],
            )
            .await
            .map_err(failed(format!(
                "subtask {}: writing the commit marker of {gid}",
                self.subtask
            )))?;
        self.client
            .batch_execute(&format!("PREPARE TRANSACTION {}", literal(&gid)))
            .await
            .map_err(failed(format!(
                "subtask {}: PREPARE TRANSACTION {gid}",
                self.subtask
            )))?;
        self.open = None;
        stats::add(&self.stats.transactions_prepared, 1);
        debug!(subtask = self.subtask, gid, rows, "transaction prepared");
        Ok(vec![PgCommittable { gid, rows }])
    }

    async fn snapshot_state(&mut self, _: CheckpointId) -> Result<Vec<PgWriterState>, SinkError> {
        Ok(vec![PgWriterState {
            lineage: self.lineage.clone(),
        }])
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        if self.open.take().is_some() && !self.client.is_closed() {
            // Written but never prepared: nothing refers to it. (On a lost
            // connection the server has rolled it back already.)
            self.client
                .batch_execute("ROLLBACK")
                .await
                .map_err(failed(format!(
                    "subtask {}: ROLLBACK on close",
                    self.subtask
                )))?;
        }
        Ok(())
    }
}
