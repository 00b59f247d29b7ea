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

use sink_kafka_client::topic::Topic;
use sink_kafka_client::{millis, str_bytes, Cluster, CompressionType, Link, WireError};

/// Produce requests of one session in flight at once (Kafka keeps the
/// order, and deduplicates, within 5 per partition).
const MAX_IN_FLIGHT: usize = 5;

/// How many times a session sends batches again after a leader moved
/// before it gives up (the writer's error then restarts the job).
const MAX_LEADER_MOVES: u32 = 20;

/// A produce request sent and not answered yet: kept whole, to be sent
/// again, in order, to its partition's new leader.
#[derive(Debug)]
struct InFlight {
    partition: i32,
    request: Arc<ProduceRequest>,
    answer: JoinHandle<Result<(), WireError>>,
}

/// Whether a produce answer says the partition's leader is elsewhere now.
fn leader_moved(error: &WireError) -> bool {
    matches!(
        error.code(),
        Some(
            ResponseError::NotLeaderOrFollower
                | ResponseError::LeaderNotAvailable
                | ResponseError::FencedLeaderEpoch
                | ResponseError::UnknownLeaderEpoch
        )
    )
}

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
    in_flight: VecDeque<InFlight>,
    /// Batches sent again after their partition's leader moved, this
    /// session: bounded by [`MAX_LEADER_MOVES`].
    leader_moves: u32,
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
            leader_moves: 0,
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
        self.dispatch(partition, leader, Arc::new(request)).await
    }

    /// Sends `request` (of `partition`) to `leader` on the session's
    /// connection to it, and queues its answer.
    async fn dispatch(
        &mut self,
        partition: i32,
        leader: i32,
        request: Arc<ProduceRequest>,
    ) -> Result<(), WireError> {
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
        let answer = self.cluster.send(&link, &*request).await?;
        let timeout = self.cluster.config.request_timeout;
        let topic = self.topic.clone();
        self.in_flight.push_back(InFlight {
            partition,
            request,
            answer: tokio::spawn(async move {
                let answer = answer.wait(timeout).await?;
                check_produce(&answer, &topic, partition)
            }),
        });
        Ok(())
    }

    /// Waits for the oldest answer. One that says the partition's leader
    /// moved (`NOT_LEADER_OR_FOLLOWER` and the like) is no failure: the
    /// metadata is read again, and that batch and every later one of the
    /// partition (sent to the old leader too) go to the new leader, in
    /// order, with their sequence numbers: the broker keeps each once
    /// (a batch it already has answers `DUPLICATE_SEQUENCE_NUMBER`, taken
    /// as written). No restart of the job.
    async fn wait_oldest(&mut self) -> Result<(), WireError> {
        let Some(oldest) = self.in_flight.pop_front() else {
            return Ok(());
        };
        let answer = oldest
            .answer
            .await
            .map_err(|e| WireError::Protocol(format!("a produce task failed: {e}")))?;
        match answer {
            Err(error) if leader_moved(&error) && self.leader_moves < MAX_LEADER_MOVES => {
                self.leader_moves += 1;
                let partition = oldest.partition;
                let mut again = vec![oldest.request];
                let mut others = VecDeque::new();
                for later in std::mem::take(&mut self.in_flight) {
                    match later.partition == partition {
                        true => {
                            // Answered by the old leader (an error, or, had
                            // it led still, a write the resend finds).
                            let _ = later.answer.await;
                            again.push(later.request);
                        }
                        false => others.push_back(later),
                    }
                }
                self.in_flight = others;
                tracing::info!(topic = %self.topic, partition, %error,
                    "the partition's leader moved: its batches go to the new leader");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let leader = Topic::describe(&self.cluster, &self.topic)
                    .await?
                    .and_then(|t| t.leaders.get(partition as usize).copied())
                    .ok_or(error)?;
                // A connection that broke with the move is opened anew; a
                // live one is kept, so that the batches of other partitions
                // on it stay in order.
                self.links.retain(|_, link| !link.is_broken());
                for request in again {
                    self.dispatch(partition, leader, request).await?;
                }
                Ok(())
            }
            answer => answer,
        }
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
            // A batch sent again after a leader moved that the broker had
            // written already: written once, as asked.
            if p.error_code == ResponseError::DuplicateSequenceNumber.code() {
                continue;
            }
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
