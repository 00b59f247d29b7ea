//! One Kafka transaction, from `InitProducerId` to the flush before the
//! checkpoint; and the requests that end one, or ask about one, from any
//! process.
//!
//! ```text
//!  Transaction::begin   InitProducerId(id)            a new epoch: fences every older producer of the
//!                                                     id, aborts a transaction it left open
//!  Transaction::send    AddPartitionsToTxn (once per partition), then Produce batches,
//!                       pipelined, each with the producer id, epoch and its sequence number
//!  Transaction::mark    AddOffsetsToTxn + TxnOffsetCommit: the commit marker (see `marker`)
//!  Transaction::commit_offsets   the same for any group: the source positions (see `positions`)
//!  Transaction::flush   every Produce answered            ─▶ the committable: id, producer id, epoch
//!  end (committer)      EndTxn(id, producer id, epoch, commit), from this or a new process
//! ```
//!
//! Every transaction begins with its own `InitProducerId`, so each has an
//! epoch of its own: an `EndTxn` meant for an older transaction of the same
//! id can never commit a newer one (Flink's FLINK-8132, where a reused id
//! committed the wrong transaction), and sequence numbers start at 0.
//!
//! A `Produce` that fails fails the transaction: the writer reports the
//! error, the job restarts from its last checkpoint, the start aborts the
//! transaction (a new `InitProducerId`), and the source writes the records
//! again. No batch is retried inside a transaction, so no sequence gap or
//! reordering can arise.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, DescribeTransactionsRequest, EndTxnRequest,
    GroupId, InitProducerIdRequest, ProducerId, TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::records::Record;
use serde::{Deserialize, Serialize};
use tracing::debug;

use crate::session::Session;
use sink_kafka_client::{millis, str_bytes, Cluster, CompressionType, CoordinatorKind, WireError};

/// Who a transaction is: what the committer needs to end it from any
/// process.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TransactionIdentity {
    /// The transactional id (see [`TransactionalIdName`](crate::TransactionalIdName)).
    pub transactional_id: String,
    /// The producer id the coordinator gave it.
    pub producer_id: i64,
    /// The producer epoch of this transaction: one of its own.
    pub epoch: i16,
}

impl std::fmt::Display for TransactionIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (producer {}, epoch {})",
            self.transactional_id, self.producer_id, self.epoch
        )
    }
}

/// What the coordinator says of a transactional id now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TransactionState {
    /// `Ongoing`, `PrepareCommit`, `CompleteCommit`, `Empty`, …
    pub(crate) state: String,
    pub(crate) producer_id: i64,
    pub(crate) epoch: i16,
}

/// How long to go on while the coordinator answers that an earlier
/// transaction of the id is still completing, or that it is moving.
const BUSY_RETRY: Duration = Duration::from_millis(50);

/// One offset committed in a group inside a transaction.
#[derive(Debug, Clone)]
pub(crate) struct GroupOffset {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) metadata: String,
}

impl GroupOffset {
    pub(crate) fn new(
        topic: impl Into<String>,
        partition: i32,
        offset: i64,
        metadata: impl Into<String>,
    ) -> GroupOffset {
        GroupOffset {
            topic: topic.into(),
            partition,
            offset,
            metadata: metadata.into(),
        }
    }
}

/// An open transaction of one transactional id, writing to one topic.
#[derive(Debug)]
pub(crate) struct Transaction {
    session: Session,
    identity: TransactionIdentity,
    added: HashSet<i32>,
    /// The groups added for offsets (`AddOffsetsToTxn`).
    offset_groups: HashSet<String>,
}

impl Transaction {
    /// Begins a transaction of `transactional_id`: a new epoch, which
    /// fences every older producer of the id and aborts the transaction it
    /// left open, if any. `timeout` is the transaction timeout the
    /// coordinator enforces.
    pub(crate) async fn begin(
        cluster: Arc<Cluster>,
        topic: Arc<str>,
        transactional_id: &str,
        timeout: Duration,
        compression: CompressionType,
    ) -> Result<Transaction, WireError> {
        let (producer_id, epoch) = init_producer_id(&cluster, transactional_id, timeout).await?;
        Ok(Transaction {
            session: Session::new(
                cluster,
                topic,
                Some(transactional_id.to_string()),
                producer_id,
                epoch,
            )
            .compressed(compression),
            identity: TransactionIdentity {
                transactional_id: transactional_id.to_string(),
                producer_id,
                epoch,
            },
            added: HashSet::new(),
            offset_groups: HashSet::new(),
        })
    }

    /// Who this transaction is.
    pub(crate) fn identity(&self) -> &TransactionIdentity {
        &self.identity
    }

    /// Sends `records` to `partition` (led by broker `leader`), adding the
    /// partition to the transaction first. Returns once the request is
    /// queued; [`flush`](Self::flush) waits for the answers.
    pub(crate) async fn send(
        &mut self,
        partition: i32,
        leader: i32,
        records: Vec<Record>,
    ) -> Result<(), WireError> {
        if records.is_empty() {
            return Ok(());
        }
        if !self.added.contains(&partition) {
            self.add_partition(partition).await?;
        }
        self.session.send(partition, leader, records).await
    }

    /// Waits until every batch sent was written.
    pub(crate) async fn flush(&mut self) -> Result<(), WireError> {
        self.session.flush().await
    }

    fn cluster(&self) -> &Arc<Cluster> {
        &self.session.cluster
    }

    async fn add_partition(&mut self, partition: i32) -> Result<(), WireError> {
        let request = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(str_bytes(
                &self.identity.transactional_id,
            )))
            .with_v3_and_below_producer_id(ProducerId(self.identity.producer_id))
            .with_v3_and_below_producer_epoch(self.identity.epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(str_bytes(&self.session.topic)))
                .with_partitions(vec![partition])]);
        let id = self.identity.transactional_id.clone();
        let subject = format!("{id} on {}/{partition}", self.session.topic);
        self.with_coordinator(&id, |cluster, link| {
            let request = &request;
            let subject = subject.clone();
            async move {
                let answer = cluster.call(&link, request).await?;
                WireError::check("AddPartitionsToTxn", || subject.clone(), answer.error_code)?;
                let mut named = false;
                for topic in &answer.results_by_topic_v3_and_below {
                    for result in &topic.results_by_partition {
                        named |= result.partition_index == partition;
                        WireError::check(
                            "AddPartitionsToTxn",
                            || subject.clone(),
                            result.partition_error_code,
                        )?;
                    }
                }
                if !named {
                    return Err(WireError::Protocol(format!(
                        "AddPartitionsToTxn for {subject} was answered without the partition"
                    )));
                }
                Ok(())
            }
        })
        .await?;
        self.added.insert(partition);
        Ok(())
    }

    /// Adds the commit marker to the transaction: offset `checkpoint` of
    /// partition 0 of the topic, in group `group`, with `metadata`; it
    /// becomes visible (to `OffsetFetch`) when, and only when, the
    /// transaction commits.
    pub(crate) async fn mark(
        &mut self,
        group: &str,
        checkpoint: u64,
        metadata: &str,
    ) -> Result<(), WireError> {
        let offset = i64::try_from(checkpoint)
            .map_err(|_| WireError::Protocol(format!("checkpoint {checkpoint} is too large")))?;
        let topic = self.session.topic.to_string();
        self.commit_offsets(group, vec![GroupOffset::new(topic, 0, offset, metadata)])
            .await
    }

    /// Commits `offsets` in group `group` inside the transaction
    /// (`AddOffsetsToTxn` once per group, then `TxnOffsetCommit`): they
    /// become visible when, and only when, the transaction commits.
    pub(crate) async fn commit_offsets(
        &mut self,
        group: &str,
        offsets: Vec<GroupOffset>,
    ) -> Result<(), WireError> {
        let id = self.identity.transactional_id.clone();
        if !self.offset_groups.contains(group) {
            let request = AddOffsetsToTxnRequest::default()
                .with_transactional_id(TransactionalId(str_bytes(&id)))
                .with_producer_id(ProducerId(self.identity.producer_id))
                .with_producer_epoch(self.identity.epoch)
                .with_group_id(GroupId(str_bytes(group)));
            self.with_coordinator(&id, |cluster, link| {
                let request = &request;
                let id = id.clone();
                async move {
                    let answer = cluster.call(&link, request).await?;
                    WireError::check("AddOffsetsToTxn", || id, answer.error_code)
                }
            })
            .await?;
            self.offset_groups.insert(group.to_string());
        }
        let expected = offsets.len();
        let request = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(str_bytes(&id)))
            .with_group_id(GroupId(str_bytes(group)))
            .with_producer_id(ProducerId(self.identity.producer_id))
            .with_producer_epoch(self.identity.epoch)
            .with_generation_id(-1)
            .with_topics(
                offsets
                    .into_iter()
                    .map(|o| {
                        TxnOffsetCommitRequestTopic::default()
                            .with_name(TopicName(str_bytes(&o.topic)))
                            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                                .with_partition_index(o.partition)
                                .with_committed_offset(o.offset)
                                .with_committed_leader_epoch(-1)
                                .with_committed_metadata(Some(str_bytes(&o.metadata)))])
                    })
                    .collect(),
            );
        let deadline = Instant::now() + self.cluster().config.request_timeout;
        loop {
            let link = self
                .cluster()
                .coordinator(CoordinatorKind::Group, group)
                .await?;
            let result = async {
                let answer = self.cluster().call(&link, &request).await?;
                let mut named = 0;
                for topic in &answer.topics {
                    for partition in &topic.partitions {
                        named += 1;
                        WireError::check(
                            "TxnOffsetCommit",
                            || format!("group {group}"),
                            partition.error_code,
                        )?;
                    }
                }
                if named != expected {
                    return Err(WireError::Protocol(format!(
                        "TxnOffsetCommit for group {group} answered {named} of its {expected} \
                         partitions"
                    )));
                }
                Ok::<_, WireError>(())
            }
            .await;
            match result {
                Err(error) if error.is_retriable() && Instant::now() < deadline => {
                    if error.is_misdirected() {
                        self.cluster()
                            .forget_coordinator(CoordinatorKind::Group, group)
                            .await;
                    }
                    tokio::time::sleep(BUSY_RETRY).await;
                }
                other => return other,
            }
        }
    }

    /// Runs `request` against the coordinator of this transaction's id,
    /// again while it answers that it is busy or moving.
    async fn with_coordinator<F, Fut>(&self, id: &str, request: F) -> Result<(), WireError>
    where
        F: Fn(Arc<Cluster>, Arc<sink_kafka_client::Link>) -> Fut,
        Fut: std::future::Future<Output = Result<(), WireError>>,
    {
        with_transaction_coordinator(self.cluster(), id, |link| {
            request(self.cluster().clone(), link)
        })
        .await
    }
}

/// Runs `request` against the coordinator of `id`, again while the answer
/// is retriable (the coordinator moving or loading, an earlier transaction
/// of the id still completing), up to the request timeout.
async fn with_transaction_coordinator<T, F, Fut>(
    cluster: &Cluster,
    id: &str,
    request: F,
) -> Result<T, WireError>
where
    F: Fn(Arc<sink_kafka_client::Link>) -> Fut,
    Fut: std::future::Future<Output = Result<T, WireError>>,
{
    with_coordinator(cluster, CoordinatorKind::Transaction, id, request).await
}

/// Runs `request` against the coordinator of `key` (a transactional id or
/// a group), again while the answer is retriable, up to the request
/// timeout. Called by the requests of transactions and of groups (the
/// `positions` module).
pub(crate) async fn with_coordinator<T, F, Fut>(
    cluster: &Cluster,
    kind: CoordinatorKind,
    key: &str,
    request: F,
) -> Result<T, WireError>
where
    F: Fn(Arc<sink_kafka_client::Link>) -> Fut,
    Fut: std::future::Future<Output = Result<T, WireError>>,
{
    let deadline = Instant::now() + cluster.config.request_timeout;
    loop {
        let result = match cluster.coordinator(kind, key).await {
            Ok(link) => request(link).await,
            Err(error) => Err(error),
        };
        match result {
            Err(error) if error.is_retriable() && Instant::now() < deadline => {
                if error.is_misdirected() {
                    cluster.forget_coordinator(kind, key).await;
                }
                debug!(key, %error, "asking the coordinator again");
                tokio::time::sleep(BUSY_RETRY).await;
            }
            other => return other,
        }
    }
}

/// `InitProducerId` for `id`: its producer id and a new epoch. Fences
/// every older producer of the id and aborts the transaction it left
/// open. Also how a start aborts a lingering transaction.
pub(crate) async fn init_producer_id(
    cluster: &Cluster,
    id: &str,
    timeout: Duration,
) -> Result<(i64, i16), WireError> {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(str_bytes(id))))
        .with_transaction_timeout_ms(millis(timeout))
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    with_transaction_coordinator(cluster, id, |link| {
        let request = &request;
        async move {
            let answer = cluster.call(&link, request).await?;
            WireError::check("InitProducerId", || id.to_string(), answer.error_code)?;
            Ok((answer.producer_id.0, answer.producer_epoch))
        }
    })
    .await
}

/// `EndTxn` for `identity`: commits (or aborts) it. Kafka answers `NONE`
/// also to a repeated commit; noida-db answers `NONE` in more cases (an
/// aborted transaction, an unknown id), so the caller learns the outcome
/// from the commit marker, never from this answer alone.
pub(crate) async fn end(
    cluster: &Cluster,
    identity: &TransactionIdentity,
    commit: bool,
) -> Result<(), WireError> {
    let request = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(str_bytes(&identity.transactional_id)))
        .with_producer_id(ProducerId(identity.producer_id))
        .with_producer_epoch(identity.epoch)
        .with_committed(commit);
    let id = identity.transactional_id.as_str();
    with_transaction_coordinator(cluster, id, |link| {
        let request = &request;
        async move {
            let answer = cluster.call(&link, request).await?;
            WireError::check("EndTxn", || identity.to_string(), answer.error_code)
        }
    })
    .await
}

/// What the coordinator says of `id` now (`DescribeTransactions`).
pub(crate) async fn describe(cluster: &Cluster, id: &str) -> Result<TransactionState, WireError> {
    let request = DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(str_bytes(id))]);
    with_transaction_coordinator(cluster, id, |link| {
        let request = &request;
        async move {
            let answer = cluster.call(&link, request).await?;
            let state = answer
                .transaction_states
                .into_iter()
                .find(|s| s.transactional_id.0.as_str() == id)
                .ok_or_else(|| {
                    WireError::Protocol(format!("DescribeTransactions did not describe {id}"))
                })?;
            WireError::check("DescribeTransactions", || id.to_string(), state.error_code)?;
            Ok(TransactionState {
                state: state.transaction_state.to_string(),
                producer_id: state.producer_id.0,
                epoch: state.producer_epoch,
            })
        }
    })
    .await
}
