//! How the sink is set up: [`KafkaSinkBuilder`], and the settings its
//! writers and committers share.

use std::sync::Arc;
use std::time::Duration;

use crate::sink::{ConnectError, KafkaSink};

/// The settings every writer and committer of one sink reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) topic: Arc<str>,
    pub(crate) prefix: Option<String>,
    pub(crate) transaction_timeout: Duration,
    pub(crate) batch_bytes: usize,
    pub(crate) max_record_bytes: usize,
}

/// Sets up a [`KafkaSink`]: where it writes, and how.
///
/// Made by [`KafkaSink::builder`]; [`connect`](Self::connect) reaches the
/// cluster, creates the topic when it is missing, and returns the sink.
#[derive(Debug, Clone)]
#[must_use]
pub struct KafkaSinkBuilder {
    pub(crate) brokers: String,
    pub(crate) topic: String,
    pub(crate) partitions: i32,
    pub(crate) replication_factor: i16,
    pub(crate) prefix: Option<String>,
    pub(crate) transaction_timeout: Duration,
    pub(crate) pool_size: u32,
    pub(crate) batch_bytes: usize,
    pub(crate) max_record_bytes: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) client_id: String,
}

impl KafkaSinkBuilder {
    pub(crate) fn new(brokers: &str, topic: &str) -> KafkaSinkBuilder {
        KafkaSinkBuilder {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            partitions: 1,
            replication_factor: -1,
            prefix: None,
            transaction_timeout: Duration::from_secs(900),
            pool_size: 4,
            batch_bytes: 256 << 10,
            max_record_bytes: 1 << 20,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            client_id: "eo-kafka-sink".to_string(),
        }
    }

    /// Partitions of the topic when the sink creates it (default 1); an
    /// existing topic keeps its own.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = i32::try_from(partitions).unwrap_or(i32::MAX);
        self
    }

    /// Replicas of each partition when the sink creates the topic (default:
    /// the broker's `default.replication.factor`).
    pub fn replication_factor(mut self, replicas: u16) -> Self {
        self.replication_factor = i16::try_from(replicas).unwrap_or(i16::MAX);
        self
    }

    /// The prefix of the sink's transactional ids and marker groups
    /// (default: the job's name). What ACLs match; letters, digits, `.`,
    /// `_` and `-`.
    pub fn transactional_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The transaction timeout the broker enforces (default 15 minutes,
    /// Apache Kafka's default `transaction.max.timeout.ms`, which caps it).
    /// A transaction open longer is aborted by the broker: the job's build
    /// refuses checkpoint settings under which a prepared transaction could
    /// wait longer for its commit.
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// Transactional ids per subtask (default 4): how many checkpoints'
    /// transactions of one subtask may wait for their commit at once before
    /// the writer waits for one (at least 2: one prepared, one open).
    pub fn pool_size(mut self, slots: u32) -> Self {
        self.pool_size = slots;
        self
    }

    /// Bytes of records per partition sent in one batch (default 256 KiB).
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes;
        self
    }

    /// The largest record the sink sends (default 1 MiB, the broker's
    /// default `message.max.bytes`); a larger one fails the job with its
    /// size.
    pub fn max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes;
        self
    }

    /// How long one request may wait for its answer (default 30 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The client id brokers see (default `eo-kafka-sink`).
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = client_id.into();
        self
    }

    /// Reaches the cluster, creates the topic if it is missing, and returns
    /// the sink. Each refusal names what to change.
    pub async fn connect(self) -> Result<KafkaSink, ConnectError> {
        KafkaSink::connect(self).await
    }
}
