//! The writer of one subtask: records into batches per partition, batches
//! into the subtask's open transaction, and at each checkpoint the
//! transaction's identity as the committable.
//!
//! ```text
//!  write ─▶ partition (key: murmur2; no key: the subtask's current partition)
//!        ─▶ batch of the partition; full ─▶ Produce in the open transaction
//!           (the first batch after a checkpoint takes a slot and begins one)
//!  prepare_commit(n) ─▶ the rest of the batches; the commit marker (offset n);
//!                       every Produce answered ─▶ KafkaCommittable(id, producer id, epoch, n)
//! ```
//!
//! A checkpoint without records since the last one prepares nothing: no
//! empty transactions.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, PositionAdvance, SinkError, SinkWriter};
use tracing::warn;

use crate::batcher::Batcher;
use crate::marker::Marker;
use crate::names::TransactionalIdName;
use crate::owner::Owner;
use crate::positions;
use crate::record::KafkaRecord;
use crate::settings::Settings;
use crate::slots::NoSlot;
use crate::slots::Slots;
use crate::stats::Stats;
use crate::transaction::{end, Transaction, TransactionIdentity};
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{Cluster, WireError};

/// A prepared transaction: what the committer needs to commit it, from
/// this process or another.
///
/// Made by [`KafkaWriter::prepare_commit`]; kept in checkpoints until
/// committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaCommittable {
    /// The transaction.
    pub transaction: TransactionIdentity,
    /// The checkpoint it belongs to (its commit marker's offset).
    pub checkpoint: u64,
    /// The writer subtask that wrote it.
    pub subtask: usize,
    /// The slot of the subtask's pool it holds until committed.
    pub slot: u32,
    /// Its records, for the count of records lost should it be found
    /// aborted.
    pub records: u64,
    /// The source positions it commits with its records (see the
    /// `positions` module); empty without a source whose positions the
    /// sink commits.
    pub positions: Vec<PositionAdvance>,
}

/// Writes one subtask's records into Kafka transactions. Made by
/// [`KafkaSink`](crate::KafkaSink)'s `create_writer`.
pub struct KafkaWriter {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) settings: Arc<Settings>,
    pub(crate) slots: Arc<Slots>,
    pub(crate) owner: Arc<Owner>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) topic: Topic,
    pub(crate) prefix: String,
    pub(crate) lineage: String,
    pub(crate) subtask: usize,
    pub(crate) batcher: Batcher,
    pub(crate) open: Option<Open>,
    /// The source positions handed over since the last barrier.
    pub(crate) advances: Vec<PositionAdvance>,
}

impl std::fmt::Debug for KafkaWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaWriter")
            .field("topic", &self.settings.topic)
            .field("subtask", &self.subtask)
            .field(
                "open",
                &self.open.as_ref().map(|o| o.transaction.identity()),
            )
            .finish_non_exhaustive()
    }
}

/// The subtask's open transaction.
#[derive(Debug)]
pub(crate) struct Open {
    transaction: Transaction,
    slot: u32,
    records: u64,
}

impl KafkaWriter {
    /// Sends the batch of `partition`, beginning a transaction first if
    /// none is open.
    async fn send(&mut self, partition: usize) -> Result<(), SinkError> {
        let records = self.batcher.take(partition);
        if records.is_empty() {
            return Ok(());
        }
        if self.open.is_none() {
            self.open = Some(self.begin().await?);
        }
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        open.records += records.len() as u64;
        let leader = self.topic.leaders[partition];
        let sent = open
            .transaction
            .send(partition as i32, leader, records)
            .await;
        if let Err(error) = sent {
            let doing = format!(
                "writing to {}/{partition} in transaction {}",
                self.settings.topic,
                open.transaction.identity()
            );
            return Err(self.owner.explain(doing, error).await);
        }
        Ok(())
    }

    /// Takes a free slot and begins a transaction in it, unless a newer
    /// instance of the job owns the lineage (its `InitProducerId` would
    /// abort that instance's transactions).
    async fn begin(&mut self) -> Result<Open, SinkError> {
        let slot = match self.slots.take(self.subtask) {
            Ok(slot) => slot,
            Err(NoSlot::AllTaken { size }) => {
                return Err(SinkError::msg(format!(
                    "all {size} transactional ids of subtask {} hold transactions whose commit \
                     is not settled (checkpoints failing, or commits falling behind): the job \
                     restarts from its last checkpoint before the broker's transaction timeout \
                     could abort them; raise KafkaSinkBuilder::pool_size if commits are merely slow",
                    self.subtask
                )))
            }
            Err(NoSlot::Stale { slot, age }) => {
                return Err(SinkError::msg(format!(
                    "transactional id slot {slot} of subtask {} has held its transaction for \
                     {age:?}, half the transaction timeout, without a settled commit \
                     (checkpoints failing?): the job restarts from its last checkpoint before \
                     the broker's timeout could abort it",
                    self.subtask
                )))
            }
        };
        if let Err(error) = self.owner.check().await {
            self.slots.give_back(self.subtask, slot, None);
            return Err(error);
        }
        let id = TransactionalIdName {
            prefix: self.prefix.clone(),
            lineage: self.lineage.clone(),
            subtask: self.subtask,
            slot,
        }
        .to_string();
        match Transaction::begin(
            self.cluster.clone(),
            self.settings.topic.clone(),
            &id,
            self.settings.transaction_timeout,
            self.settings.compression,
        )
        .await
        {
            Ok(transaction) => {
                let identity = transaction.identity();
                self.slots.hold(
                    self.subtask,
                    slot,
                    Some((identity.producer_id, identity.epoch)),
                );
                Ok(Open {
                    transaction,
                    slot,
                    records: 0,
                })
            }
            Err(error) => {
                self.slots.give_back(self.subtask, slot, None);
                Err(self
                    .owner
                    .explain(format!("beginning a transaction of {id}"), error)
                    .await)
            }
        }
    }
}

#[async_trait]
impl SinkWriter for KafkaWriter {
    type Input = KafkaRecord;
    type Committable = KafkaCommittable;
    type State = ();

    async fn write(&mut self, record: KafkaRecord) -> Result<(), SinkError> {
        self.write_batch(vec![record]).await
    }

    async fn write_batch(&mut self, records: Vec<KafkaRecord>) -> Result<(), SinkError> {
        let now = Batcher::now_ms();
        for input in records {
            match self.batcher.push(input, now) {
                Ok(None) => {}
                Ok(Some(full)) => self.send(full).await?,
                Err(refused) => {
                    let limit = format!(
                        "{} bytes, KafkaSinkBuilder::max_record_bytes",
                        self.settings.max_record_bytes
                    );
                    return Err(
                        SinkError::msg(refused.message(&self.settings.topic, &limit)).permanent(),
                    );
                }
            }
        }
        Ok(())
    }

    async fn flush(&mut self, _end_of_input: bool) -> Result<(), SinkError> {
        for partition in 0..self.batcher.partitions() {
            self.send(partition).await?;
        }
        Ok(())
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<KafkaCommittable>, SinkError> {
        // `flush` ran right before; a direct caller may not have.
        for partition in 0..self.batcher.partitions() {
            self.send(partition).await?;
        }
        let advances = std::mem::take(&mut self.advances);
        if self.open.is_none() && !advances.is_empty() {
            // No records, but positions: they move in a transaction too.
            self.open = Some(self.begin().await?);
        }
        let Some(mut open) = self.open.take() else {
            return Ok(Vec::new());
        };
        let identity = open.transaction.identity().clone();
        let marked = async {
            for (scope, advances) in positions::by_scope(&advances) {
                let scope = positions::KafkaScope::parse(scope).map_err(WireError::Protocol)?;
                positions::claim(&self.cluster, &scope, &identity, &advances).await?;
                let offsets = positions::offsets(
                    &scope,
                    &advances,
                    &identity.transactional_id,
                    checkpoint_id.0,
                )?;
                open.transaction
                    .commit_offsets(scope.group, offsets)
                    .await?;
            }
            open.transaction
                .mark(
                    &identity.transactional_id,
                    checkpoint_id.0,
                    &Marker::metadata(&identity),
                )
                .await
        }
        .await;
        let flushed = match marked {
            Ok(()) => open.transaction.flush().await,
            Err(error) => Err(error),
        };
        if let Err(error) = flushed {
            // The slot stays taken: the transaction is open until the
            // restart aborts it, and the restart resets the pool.
            let doing = format!("preparing transaction {identity} for checkpoint {checkpoint_id}");
            return Err(self.owner.explain(doing, error).await);
        }
        self.stats.prepared(open.records);
        Ok(vec![KafkaCommittable {
            transaction: identity,
            checkpoint: checkpoint_id.0,
            subtask: self.subtask,
            slot: open.slot,
            records: open.records,
            positions: advances,
        }])
    }

    /// Keeps `advances` for the transaction prepared at the next barrier,
    /// which commits them with its records (see the `positions` module).
    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        positions::check(&advances).map_err(|why| SinkError::msg(why).permanent())?;
        for advance in advances {
            match self.advances.iter_mut().find(|a| a.key == advance.key) {
                // Two hand-overs before one barrier: from the first's
                // `from` to the last's `to`.
                Some(known) => known.to = advance.to,
                None => self.advances.push(advance),
            }
        }
        Ok(())
    }

    /// Aborts the transaction still open (its records were handed to no
    /// committable), so that it does not hold `read_committed` readers back
    /// until the broker's timeout. Best effort: a failure is logged, and
    /// the next start aborts what is left.
    async fn close(&mut self) -> Result<(), SinkError> {
        if let Some(open) = self.open.take() {
            let identity = open.transaction.identity().clone();
            if let Err(error) = end(&self.cluster, &identity, false).await {
                warn!(transaction = %identity, %error, "the open transaction could not be aborted at close");
            }
        }
        Ok(())
    }
}
