//! The writer: one connection per subtask, one transaction per checkpoint.
//!
//! The first rows after a checkpoint open a transaction (`BEGIN`); every
//! batch goes in with `COPY ... FROM STDIN (FORMAT binary)`. At the barrier,
//! `prepare_commit` moves the source positions the runtime handed over
//! (`carry_positions`; see the `positions` module), writes the commit marker
//! row and runs `PREPARE TRANSACTION` with the transaction's global id; the
//! id is the committable. A split not where the advances expect (or whose
//! step a live owner is taking) rolls the whole transaction back: its
//! committable is then superseded, and nothing of it was applied. A checkpoint without rows or advances prepares
//! nothing; advances without rows prepare a transaction of positions only.
//! After end of input nothing is opened again, and `close` rolls back a
//! transaction still open (one that was never prepared).

use std::pin::pin;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, PositionAdvance, SinkError, SinkWriter};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};
use tracing::debug;

use crate::connection::MARKER_TABLE;
use crate::errors::failed;
use crate::gid::{literal, TransactionId, MAX_GID_BYTES};
use crate::positions::{self, Holders, OwnPrepared};
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

/// What a writer hands to the committer: one prepared transaction, with
/// the source positions it moves.
///
/// Made by the writer's `prepare_commit`; kept in checkpoints until
/// committed (format version 2; version 1, without positions, still reads:
/// see the `format` module); committed by
/// [`PostgresCommitter`](crate::PostgresCommitter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgCommittable {
    /// The global id it was prepared with.
    pub gid: String,
    /// How many rows it holds.
    pub rows: u64,
    /// The source positions its transaction moves (empty without a source
    /// whose positions are committed with the data). Its commit is then
    /// superseded, not lost, when the transaction is found neither prepared
    /// nor marked: its positions did not move.
    pub advances: Vec<PositionAdvance>,
    /// `Some(reason)`: a split was not where `advances` expect when the
    /// writer moved them, so the transaction was rolled back, data
    /// included, and never prepared; the committer signals it superseded.
    pub superseded: Option<String>,
    /// Transactions of the same writer, prepared earlier and not known
    /// committed when this one was prepared, whose steps `advances`
    /// continue. The committer commits this one only once a committed
    /// step ends where each of its steps starts (those transactions
    /// committed, or another owner got there); if one of them was rolled
    /// back instead, this one is superseded.
    pub chained_on: Vec<String>,
}

/// Writes one subtask's rows. Made by
/// [`PostgresSink`](crate::PostgresSink)'s `create_writer`.
pub struct PostgresWriter<T> {
    pub(crate) client: Client,
    /// The server process of `client`'s connection (`pg_backend_pid()`).
    pub(crate) backend_pid: i32,
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
    /// The advances of the coming `prepare_commit` (`carry_positions`).
    pub(crate) advances: Vec<PositionAdvance>,
    /// What settles the holders of the steps this writer waits for.
    pub(crate) holders: Holders,
    /// Where this writer's prepared steps of each split end.
    pub(crate) own: OwnPrepared,
    pub(crate) stats: Arc<Stats>,
    pub(crate) _records: std::marker::PhantomData<fn(T)>,
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

    /// Keeps `advances` for the coming `prepare_commit`, which moves them
    /// in its transaction. Refuses a position beyond the table's `bigint`.
    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        positions::check_range(&advances)?;
        self.advances = advances;
        Ok(())
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<PgCommittable>, SinkError> {
        let advances = std::mem::take(&mut self.advances);
        if self.open.is_none() && !advances.is_empty() {
            // Positions moved without rows (offsets skipped): a
            // transaction of positions only carries them.
            self.client
                .batch_execute("BEGIN")
                .await
                .map_err(failed(format!("subtask {}: BEGIN", self.subtask)))?;
            self.open = Some(0);
        }
        let Some(rows) = self.open else {
            return Ok(Vec::new());
        };
        let gid = self.gid(checkpoint_id)?;
        let mut chained_on = Vec::new();
        if !advances.is_empty() {
            let moved = positions::advance(
                &self.client,
                self.backend_pid,
                &advances,
                &self.own,
                &mut self.holders,
                &self.stats,
            )
            .await?;
            match moved {
                Ok(chained) => chained_on = chained,
                Err(reason) => {
                    // Nothing of it may be committed: its records belong to the
                    // owner that moved the split, or are read again.
                    self.client
                        .batch_execute("ROLLBACK")
                        .await
                        .map_err(failed(format!(
                            "subtask {}: ROLLBACK of {gid}, superseded",
                            self.subtask
                        )))?;
                    self.open = None;
                    stats::add(&self.stats.superseded_at_prepare, 1);
                    debug!(subtask = self.subtask, gid, reason, "superseded at prepare");
                    return Ok(vec![PgCommittable {
                        gid,
                        rows,
                        advances,
                        superseded: Some(reason),
                        chained_on: Vec::new(),
                    }]);
                }
            }
        }
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
        self.own.prepared(&advances, &gid);
        stats::add(&self.stats.transactions_prepared, 1);
        debug!(subtask = self.subtask, gid, rows, "transaction prepared");
        Ok(vec![PgCommittable {
            gid,
            rows,
            advances,
            superseded: None,
            chained_on,
        }])
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
