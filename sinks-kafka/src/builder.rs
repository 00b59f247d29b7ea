//! How a sink is set up: [`KafkaSinkBuilder`], from [`KafkaSink::builder`]
//! to a connected [`KafkaSink`]: the settings checked, the cluster reached,
//! the topic created when missing.

use std::sync::Arc;
use std::time::Duration;

use crate::errors::ConnectError;
use crate::names::check_prefix;
use crate::owner::Owner;
use crate::settings::Settings;
use crate::sink::KafkaSink;
use crate::slots::Slots;
use crate::stats::Stats;
use sink_kafka_client::topic::{Found, Topic};
use sink_kafka_client::{
    Brokers, ClientConfig, ClientProperties, Cluster, CompressionType, Security, WireError,
};

impl KafkaSink {
    /// A builder of a sink writing to `topic` on the cluster reached
    /// through `brokers` (`host:port`, several separated by commas; a
    /// [`Brokers`] carries TLS and SASL too, as does
    /// [`KafkaSinkBuilder::properties`]).
    pub fn builder(brokers: impl Into<Brokers>, topic: &str) -> KafkaSinkBuilder {
        KafkaSinkBuilder::new(brokers.into(), topic)
    }

    async fn connect(builder: KafkaSinkBuilder) -> Result<KafkaSink, ConnectError> {
        let bootstrap = builder.brokers.bootstrap();
        builder
            .brokers
            .security
            .check()
            .map_err(ConnectError::Setting)?;
        if bootstrap.is_empty() {
            return Err(ConnectError::Setting(
                "no Kafka broker given: name at least one as host:port".to_string(),
            ));
        }
        if let Some(bad) = bootstrap.iter().find(|b| {
            b.rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        }) {
            return Err(ConnectError::Setting(format!(
                "the broker address {bad:?} is not host:port"
            )));
        }
        let topic = builder.topic.as_str();
        if topic.is_empty()
            || topic.len() > 249
            || !topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(ConnectError::Setting(format!(
                "{topic:?} is not a valid topic name: 1 to 249 letters, digits, '.', '_' and '-'"
            )));
        }
        if builder.pool_size < 2 {
            return Err(ConnectError::Setting(format!(
                "a pool of {} transactional ids per subtask is too small: one transaction waits \
                 for its commit while the next one is written; use at least 2",
                builder.pool_size
            )));
        }
        if builder.partitions < 1 {
            return Err(ConnectError::Setting(
                "a topic needs at least 1 partition".to_string(),
            ));
        }
        if let Some(prefix) = &builder.prefix {
            check_prefix(prefix).map_err(ConnectError::Setting)?;
        }
        if builder.batch_bytes == 0 || builder.max_record_bytes == 0 {
            return Err(ConnectError::Setting(
                "batch_bytes and max_record_bytes must be at least 1".to_string(),
            ));
        }
        let cluster = Arc::new(Cluster::new(ClientConfig {
            bootstrap,
            client_id: builder.client_id.clone(),
            connect_timeout: builder.connect_timeout,
            request_timeout: builder.request_timeout,
            security: Arc::clone(&builder.brokers.security),
        }));
        let brokers = cluster.brokers();
        cluster
            .metadata(&[])
            .await
            .map_err(|source| ConnectError::Cluster {
                brokers: brokers.clone(),
                source,
            })?;
        let (_, found) = Topic::describe_or_create(
            &cluster,
            topic,
            builder.partitions,
            builder.replication_factor,
        )
        .await
        .map_err(|source| match source {
            WireError::Broker {
                api: "CreateTopics",
                ..
            } => ConnectError::CreateTopic {
                topic: topic.to_string(),
                partitions: builder.partitions,
                source,
            },
            source => ConnectError::Cluster {
                brokers: brokers.clone(),
                source,
            },
        })?;
        Ok(KafkaSink {
            owner: Arc::new(Owner::new(cluster.clone())),
            cluster,
            settings: Arc::new(Settings {
                topic: builder.topic.clone().into(),
                prefix: builder.prefix.clone(),
                transaction_timeout: builder.transaction_timeout,
                batch_bytes: builder.batch_bytes,
                max_record_bytes: builder.max_record_bytes,
                compression: builder.compression,
            }),
            slots: Arc::new(Slots::new(
                builder.pool_size,
                builder.transaction_timeout / 2,
            )),
            stats: Arc::new(Stats::default()),
            created: found == Found::Created,
            started_prefix: std::sync::OnceLock::new(),
        })
    }
}

/// Sets up a [`KafkaSink`]: where it writes, and how.
///
/// Made by [`KafkaSink::builder`]; [`connect`](Self::connect) reaches the
/// cluster, creates the topic when it is missing, and returns the sink.
#[derive(Debug, Clone)]
#[must_use]
pub struct KafkaSinkBuilder {
    pub(crate) brokers: Brokers,
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
    pub(crate) compression: CompressionType,
}

impl KafkaSinkBuilder {
    pub(crate) fn new(brokers: Brokers, topic: &str) -> KafkaSinkBuilder {
        KafkaSinkBuilder {
            brokers,
            topic: topic.to_string(),
            partitions: 1,
            replication_factor: -1,
            prefix: None,
            transaction_timeout: Duration::from_secs(900),
            pool_size: 64,
            batch_bytes: 256 << 10,
            max_record_bytes: 1 << 20,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            client_id: "eo-kafka-sink".to_string(),
            compression: CompressionType::None,
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

    /// Transactional ids per subtask (default 64): how many of one
    /// subtask's transactions may wait for their commit at once (at least
    /// 2: one prepared, one open). Ids are used lowest first, so usually
    /// two or three are in use; more only while commits fall behind the
    /// checkpoints (a commit retried with backoff while checkpoints keep
    /// coming). When all are taken, the writer fails with a transient
    /// error and the job restarts from its last checkpoint.
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

    /// The codec batches are compressed with (Kafka's `compression.type`;
    /// default none). Any reader of Kafka reads each of them; this
    /// project's Kafka source and `read_committed` too.
    pub fn compression(mut self, codec: CompressionType) -> Self {
        self.compression = codec;
        self
    }

    /// How long one request may wait for its answer (default 30 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How connections are secured: TLS and SASL (default neither).
    pub fn security(mut self, security: Arc<Security>) -> Self {
        self.brokers.security = security;
        self
    }

    /// What a client properties file (`--kafka-config`) sets: TLS and
    /// SASL, `compression.type` and `client.id` where given.
    pub fn properties(mut self, properties: &ClientProperties) -> Self {
        self.brokers.security = Arc::new(properties.security.clone());
        if let Some(codec) = properties.compression {
            self.compression = codec;
        }
        if let Some(id) = &properties.client_id {
            self.client_id = id.clone();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_broker_is_named_with_the_reason() {
        // Nothing listens on port 1: the connection is refused at once.
        let error = KafkaSink::builder("127.0.0.1:1", "t")
            .connect()
            .await
            .expect_err("nothing listens on port 1");
        let message = error.to_string();
        assert!(matches!(error, ConnectError::Cluster { .. }), "{error:?}");
        assert!(
            message.starts_with(
                "the Kafka cluster at 127.0.0.1:1: no Kafka broker of 127.0.0.1:1 \
                 could be reached (check the address, and that the broker listens there): cannot \
                 connect to the Kafka broker 127.0.0.1:1: "
            ),
            "{message}"
        );
    }

    #[tokio::test]
    async fn bad_settings_are_refused_before_any_connection_naming_the_fix() {
        for (builder, expected) in [
            (KafkaSink::builder("", "t"), "no Kafka broker given"),
            (
                KafkaSink::builder("localhost", "t"),
                "\"localhost\" is not host:port",
            ),
            (KafkaSink::builder("h:1", "a b"), "not a valid topic name"),
            (
                KafkaSink::builder("h:1", "t").pool_size(1),
                "use at least 2",
            ),
            (
                KafkaSink::builder("h:1", "t").transactional_id_prefix("a/b"),
                "transactional_id_prefix",
            ),
        ] {
            let error = builder.connect().await.expect_err(expected);
            assert!(matches!(error, ConnectError::Setting(_)), "{error:?}");
            assert!(error.to_string().contains(expected), "{error}");
        }
    }
}
