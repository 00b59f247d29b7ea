//! Reading a topic back as a `read_committed` consumer sees it: what the
//! kit, the tests and the demos check the sink's output with.
//!
//! The broker returns a partition's records up to its last stable offset
//! (the first offset of the oldest open transaction) with the list of
//! transactions aborted in that range; the reader drops the records of
//! aborted transactions and the control records, as Kafka's consumers do.
//! It also reports each partition's last stable offset and high watermark:
//! the two differ while a transaction is open on the partition.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};

use crate::recovery::transactions;
use sink_kafka_client::fetch::{aborted, committed_records, stable_end, FetchedRecord};
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{str_bytes, Brokers, Header, WireError};

/// One committed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedMessage {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// Its timestamp, in milliseconds since the epoch.
    pub timestamp: i64,
    /// Its headers, in order.
    pub headers: Vec<Header>,
}

impl CommittedMessage {
    /// The value's bytes, empty for a tombstone.
    pub fn value_bytes(&self) -> &[u8] {
        self.value.as_deref().unwrap_or_default()
    }
}

/// What a `read_committed` consumer sees of a topic now.
#[derive(Debug, Clone, Default)]
pub struct CommittedTopic {
    /// Every committed message, partition by partition, in offset order.
    pub messages: Vec<CommittedMessage>,
    /// Partitions whose last stable offset is below their high watermark:
    /// a transaction is open on them (its records are not readable yet).
    pub open_partitions: Vec<i32>,
}

/// The transactional ids starting with `prefix` whose transaction is open
/// now (`Ongoing`), on the cluster reached through `brokers`. Called by
/// tests and operators to check that a job left no transaction open: the
/// sink's ids start with its prefix (by default the job's name).
pub async fn open_transactions(
    brokers: impl Into<Brokers>,
    prefix: &str,
) -> Result<Vec<String>, WireError> {
    let cluster = brokers.into().cluster("eo-kafka-reader");
    let mut open: Vec<String> = transactions(&cluster, prefix, &["Ongoing"])
        .await?
        .into_iter()
        .filter(|(_, state)| state == "Ongoing")
        .map(|(id, _)| id)
        .collect();
    open.sort();
    Ok(open)
}

/// How many bytes one fetch asks for per partition.
const FETCH_BYTES: i32 = 4 << 20;

/// Reads every committed message of `topic` on the cluster reached through
/// `brokers`, as a `read_committed` consumer would, from each partition's
/// log start (what retention kept) to its last stable offset. Called by tests and demos to check what the sink
/// committed; a topic that does not exist reads as empty.
pub async fn read_committed(
    brokers: impl Into<Brokers>,
    topic: &str,
) -> Result<CommittedTopic, WireError> {
    let mut messages = Vec::new();
    let open_partitions = read_committed_with(brokers, topic, |partition, record| {
        messages.push(CommittedMessage {
            partition,
            offset: record.offset,
            key: record.key.map(|k| k.to_vec()),
            value: record.value.map(|v| v.to_vec()),
            timestamp: record.timestamp,
            headers: record.headers,
        })
    })
    .await?;
    Ok(CommittedTopic {
        messages,
        open_partitions,
    })
}

/// As [`read_committed`], handing each committed record to `each` (its
/// partition, then the record) as it is fetched instead of keeping them:
/// partition by partition, in offset order. Returns the partitions with a
/// transaction open (see [`CommittedTopic::open_partitions`]). Called by
/// readers of large topics (the benchmarks' plain consumer).
pub async fn read_committed_with(
    brokers: impl Into<Brokers>,
    topic: &str,
    mut each: impl FnMut(i32, FetchedRecord),
) -> Result<Vec<i32>, WireError> {
    let cluster = brokers.into().cluster("eo-kafka-reader");
    let Some(described) = Topic::describe(&cluster, topic).await? else {
        return Ok(Vec::new());
    };
    let mut open_partitions = Vec::new();
    for (partition, leader) in described.leaders.iter().enumerate() {
        let partition = partition as i32;
        let mut offset = 0;
        let mut stalled = 0u32;
        loop {
            let link = cluster.broker(*leader).await?;
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(0)
                .with_min_bytes(1)
                .with_max_bytes(FETCH_BYTES)
                .with_isolation_level(1)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(str_bytes(topic)))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(offset)
                        .with_current_leader_epoch(-1)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(FETCH_BYTES)])]);
            let answer = cluster.call(&link, &request).await?;
            WireError::check("Fetch", || topic.to_string(), answer.error_code)?;
            let data = answer
                .responses
                .iter()
                .flat_map(|t| t.partitions.iter())
                .find(|p| p.partition_index == partition)
                .ok_or_else(|| {
                    WireError::Protocol(format!("Fetch of {topic}/{partition} answered nothing"))
                })?;
            if let Some(code) = ResponseError::try_from_code(data.error_code) {
                // The partition's log starts past `offset`: what is below
                // it is gone from the topic (retention; noida-db also moves
                // its log start past an aborted transaction's records at
                // the start of a partition, seen after a fenced
                // transaction), so the topic's committed records begin
                // there. A reader of the topic reads what it holds.
                if code == ResponseError::OffsetOutOfRange && data.log_start_offset > offset {
                    offset = data.log_start_offset;
                    continue;
                }
                // Out of range with no log start past it: asked again, a
                // bounded number of times, never skipped.
                if code == ResponseError::OffsetOutOfRange && stalled < 100 {
                    stalled += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                return Err(WireError::Broker {
                    api: "Fetch",
                    subject: format!("{topic}/{partition}"),
                    code,
                    message: None,
                });
            }
            let end = stable_end(data);
            let aborted = aborted(data);
            let before = offset;
            if let Some(records) = &data.records {
                let mut bytes = records.clone();
                offset = committed_records(&mut bytes, offset, end, &aborted, |record| {
                    each(partition, record)
                })?;
            }
            if offset == before && offset < end {
                // The broker may answer nothing for a moment at an offset
                // below the stable end it reports (a transaction just
                // committed): ask again, a bounded number of times.
                stalled += 1;
                if stalled > 100 {
                    return Err(WireError::Protocol(format!(
                        "{topic}/{partition}: no progress at offset {offset} (end {end}) in 100 fetches"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            stalled = 0;
            if offset >= end {
                if data.last_stable_offset >= 0 && data.last_stable_offset < data.high_watermark {
                    open_partitions.push(partition);
                }
                break;
            }
        }
    }
    Ok(open_partitions)
}
