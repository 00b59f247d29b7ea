//! A producer session: one producer id and epoch sending batches to the
//! partitions of one topic, each batch with its sequence number, pipelined.
//!
//! Used by a transaction of the `transaction` module (with its
//! transactional id: the batches are transactional) and by the
//! [`IdempotentProducer`](crate::IdempotentProducer) baseline (without).
//! Requests of one session reach the broker in the order they were sent
//! (see `wire::connection`), at most [`MAX_IN_FLIGHT`] unanswered at once,
//! so the broker's sequence checks see every partition's batches in order.
//! A batch that fails is not sent again: the caller's transaction fails
//! (see `transaction`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName, TransactionalId};
use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use tokio::task::JoinHandle;

use sink_kafka_client::{millis, str_bytes, Cluster, CompressionType, Link, WireError};

/// Produce requests of one session in flight at once (Kafka keeps the
/// order, and deduplicates, within 5 per partition).
const MAX_IN_FLIGHT: usize = 5;

/// One producer id and epoch, writing to one topic.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) topic: Arc<str>,
    transactional_id: Option<String>,
    producer_id: i64,
    epoch: i16,
    /// The next sequence number of each partition.
    sequences: HashMap<i32, i32>,
    /// The connection to each leader, kept for the session: batches of a
    /// partition must reach the broker in order, which a second connection
    /// opened meanwhile would not keep.
    links: HashMap<i32, Arc<Link>>,
    in_flight: VecDeque<JoinHandle<Result<(), WireError>>>,
    /// The codec of the batches it sends.
    compression: CompressionType,
}

impl Session {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        topic: Arc<str>,
        transactional_id: Option<String>,
        producer_id: i64,
        epoch: i16,
    ) -> Session {
        Session {
            cluster,
            topic,
            transactional_id,
            producer_id,
            epoch,
            sequences: HashMap::new(),
            links: HashMap::new(),
            in_flight: VecDeque::new(),
            compression: CompressionType::None,
        }
    }

    /// The same session, its batches compressed with `codec`.
    pub(crate) fn compressed(mut self, codec: CompressionType) -> Session {
        self.compression = codec;
        self
    }

    /// Sends `records` to `partition`, led by broker `leader`. Returns once
    /// the request is queued; [`flush`](Self::flush) waits for the
    /// answers.
    pub(crate) async fn send(
        &mut self,
        partition: i32,
        leader: i32,
        mut records: Vec<Record>,
    ) -> Result<(), WireError> {
        if records.is_empty() {
            return Ok(());
        }
        let sequence = self.sequences.entry(partition).or_insert(0);
        let count = i32::try_from(records.len())
            .map_err(|_| WireError::Protocol("a batch of more than 2^31 records".into()))?;
        let transactional = self.transactional_id.is_some();
        for (i, record) in (0..count).zip(records.iter_mut()) {
            record.transactional = transactional;
            record.producer_id = self.producer_id;
            record.producer_epoch = self.epoch;
            record.sequence = sequence.wrapping_add(i) & i32::MAX;
            record.offset = i64::from(i);
        }
        *sequence = sequence.wrapping_add(count) & i32::MAX;
        let mut batch = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut batch,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: self.compression.codec(),
            },
        )
        .map_err(|e| WireError::Encode {
            api: "Produce",
            reason: e.to_string(),
        })?;
        let request = ProduceRequest::default()
            .with_transactional_id(
                self.transactional_id
                    .as_deref()
                    .map(|id| TransactionalId(str_bytes(id))),
            )
            .with_acks(-1)
            .with_timeout_ms(millis(self.cluster.config.request_timeout))
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(str_bytes(&self.topic)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch.freeze()))])]);
        while self.in_flight.len() >= MAX_IN_FLIGHT {
            self.wait_oldest().await?;
        }
        let link = match self.links.get(&leader) {
            Some(link) if link.is_broken() => {
                return Err(WireError::Protocol(format!(
                    "the connection to {} broke during the session; its batches may be lost",
                    link.address()
                )))
            }
            Some(link) => link.clone(),
            None => {
                let link = self.cluster.broker(leader).await?;
                self.links.insert(leader, link.clone());
                link
            }
        };
        let answer = self.cluster.send(&link, &request).await?;
        let timeout = self.cluster.config.request_timeout;
        let topic = self.topic.clone();
        self.in_flight.push_back(tokio::spawn(async move {
            let answer = answer.wait(timeout).await?;
            check_produce(&answer, &topic, partition)
        }));
        Ok(())
    }

    async fn wait_oldest(&mut self) -> Result<(), WireError> {
        if let Some(task) = self.in_flight.pop_front() {
            task.await
                .map_err(|e| WireError::Protocol(format!("a produce task failed: {e}")))??;
        }
        Ok(())
    }

    /// Waits until every batch sent was written (acknowledged by every
    /// in-sync replica).
    pub(crate) async fn flush(&mut self) -> Result<(), WireError> {
        while !self.in_flight.is_empty() {
            self.wait_oldest().await?;
        }
        Ok(())
    }
}

/// A record as the batch encoder takes it; the session fills in the
/// producer's fields.
pub(crate) fn record(key: Option<Bytes>, value: Option<Bytes>, timestamp: i64) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: 0,
        timestamp,
        key,
        value,
        headers: IndexMap::new(),
    }
}

fn check_produce(answer: &ProduceResponse, topic: &str, partition: i32) -> Result<(), WireError> {
    let named = answer
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter())
        .any(|p| p.index == partition);
    if !named {
        return Err(WireError::Protocol(format!(
            "Produce to {topic}/{partition} was answered without that partition's result"
        )));
    }
    for topic_answer in &answer.responses {
        for p in &topic_answer.partition_responses {
            if let Some(code) = ResponseError::try_from_code(p.error_code) {
                return Err(WireError::Broker {
                    api: "Produce",
                    subject: format!("{topic}/{}", p.index),
                    code,
                    message: p.error_message.as_ref().map(|m| m.to_string()),
                });
            }
        }
    }
    if answer.responses.is_empty() {
        return Err(WireError::Protocol(format!(
            "Produce to {topic}/{partition} was answered without a result"
        )));
    }
    Ok(())
}
