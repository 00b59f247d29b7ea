//! The sink: reaches the cluster, makes writers and committers, and at
//! every start takes the lineage and aborts what earlier starts left open.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sink_api::{InitContext, JobStart, Sink, SinkError};
use tracing::info;

use crate::batcher::Batcher;
use crate::committer::KafkaCommitter;
use crate::errors::sink_error;
use crate::names::check_prefix;
use crate::owner::Owner;
use crate::recovery::abort_lingering;
use crate::settings::{KafkaSinkBuilder, Settings};
use crate::slots::Slots;
use crate::stats::{KafkaStats, Stats};
use crate::topic::{Found, Topic};
use crate::wire::{ClientConfig, Cluster, WireError};
use crate::writer::{KafkaCommittable, KafkaWriter};

/// Why [`KafkaSinkBuilder::connect`] refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A setting out of its range.
    #[error("{0}")]
    Setting(String),
    /// The cluster could not be reached, or answered with an error.
    #[error("cannot reach the Kafka cluster at {brokers}: {source}")]
    Cluster {
        /// The bootstrap brokers.
        brokers: String,
        /// Why.
        #[source]
        source: WireError,
    },
    /// The topic is missing and could not be created.
    #[error(
        "the topic {topic} does not exist and cannot be created with {partitions} partitions \
         (create it yourself, or give the sink's principal the CREATE ACL, or fix the partitions \
         and replication factor): {source}"
    )]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The partitions asked for.
        partitions: i32,
        /// The broker's refusal.
        #[source]
        source: WireError,
    },
}

/// A two-phase-commit sink into a Kafka topic: each checkpoint's records of
/// each subtask in one Kafka transaction, flushed at the barrier and
/// committed (`EndTxn`) once the checkpoint completed, also by a new
/// process after a crash.
///
/// Made by [`KafkaSink::builder`]; given to the job builder.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use sinks_kafka::{KafkaRecord, KafkaSink};
/// let sink = KafkaSink::builder("127.0.0.1:9092", "orders").partitions(4).connect().await?;
/// // The job's records are `KafkaRecord`s: `KafkaRecord::new(value).with_key(key)`.
/// # let _ = KafkaRecord::new("v"); Ok(()) }
/// ```
pub struct KafkaSink {
    cluster: Arc<Cluster>,
    settings: Arc<Settings>,
    slots: Arc<Slots>,
    owner: Arc<Owner>,
    stats: Arc<Stats>,
    created: bool,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.cluster.brokers())
            .field("topic", &self.settings.topic)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A builder of a sink writing to `topic` on the cluster reached
    /// through `brokers` (`host:port`, several separated by commas).
    pub fn builder(brokers: &str, topic: &str) -> KafkaSinkBuilder {
        KafkaSinkBuilder::new(brokers, topic)
    }

    pub(crate) async fn connect(builder: KafkaSinkBuilder) -> Result<KafkaSink, ConnectError> {
        let bootstrap: Vec<String> = builder
            .brokers
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(str::to_string)
            .collect();
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
            }),
            slots: Arc::new(Slots::new(builder.pool_size)),
            stats: Arc::new(Stats::default()),
            created: found == Found::Created,
        })
    }

    /// Whether [`connect`](KafkaSinkBuilder::connect) created the topic.
    pub fn created_topic(&self) -> bool {
        self.created
    }

    /// What the sink's writers and committers did so far.
    pub fn stats(&self) -> KafkaStats {
        self.stats.snapshot()
    }

    /// A reader of [`stats`](Self::stats) that stays usable after the sink
    /// was given to a job.
    pub fn stats_handle(&self) -> impl Fn() -> KafkaStats + Send + Sync + 'static {
        let stats = self.stats.clone();
        move || stats.snapshot()
    }

    fn prefix<'a>(&'a self, job: &'a str) -> Result<&'a str, SinkError> {
        let prefix = self.settings.prefix.as_deref().unwrap_or(job);
        check_prefix(prefix).map_err(|e| SinkError::msg(e).permanent())?;
        Ok(prefix)
    }
}

fn check_lineage(lineage: &str) -> Result<(), SinkError> {
    if lineage.is_empty()
        || !lineage
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(SinkError::msg(format!(
            "the lineage {lineage:?} cannot be part of a transactional id: letters, digits and '-' only"
        ))
        .permanent());
    }
    Ok(())
}

#[async_trait]
impl Sink for KafkaSink {
    type Writer = KafkaWriter;
    type Committer = KafkaCommitter;

    /// Once per start, before any writer: takes the lineage's owner id
    /// (fencing an older instance of the job, see the `owner` module),
    /// aborts the lineage's open transactions that the restored checkpoint
    /// does not hold (see `recovery`), and sets the pools of transactional
    /// ids to what the checkpoint holds.
    async fn on_start(&self, start: &JobStart<'_, KafkaCommittable, ()>) -> Result<(), SinkError> {
        self.stats.register(&start.metrics);
        let prefix = self.prefix(start.job_name)?;
        let lineage = start.lineage.as_str();
        check_lineage(lineage)?;
        let timeout = self.settings.transaction_timeout;
        self.owner
            .claim(prefix, lineage, timeout)
            .await
            .map_err(|e| sink_error("taking the job's owner id", e))?;
        let kept: HashSet<_> = start
            .restored_committables
            .iter()
            .map(|c| &c.transaction)
            .collect();
        let aborted = abort_lingering(&self.cluster, prefix, lineage, &kept, timeout)
            .await
            .map_err(|e| sink_error("aborting transactions left open by earlier starts", e))?;
        if aborted > 0 {
            self.stats.aborted_at_start(aborted);
            info!(aborted, "open transactions of earlier starts aborted");
        }
        self.slots
            .reset(start.restored_committables.iter().map(|c| {
                let holder = (c.transaction.producer_id, c.transaction.epoch);
                (c.subtask, c.slot, Some(holder))
            }));
        Ok(())
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        _restored_states: Vec<()>,
    ) -> Result<KafkaWriter, SinkError> {
        let prefix = self.prefix(&context.job_name)?.to_string();
        check_lineage(context.lineage.as_str())?;
        let topic = Topic::describe(&self.cluster, &self.settings.topic)
            .await
            .map_err(|e| sink_error(format!("reading the topic {}", self.settings.topic), e))?
            .ok_or_else(|| {
                SinkError::msg(format!(
                    "the topic {} no longer exists (deleted while the job runs?): create it again, \
                     or start the job again to have the sink create it",
                    self.settings.topic
                ))
                .permanent()
            })?;
        let partitions = topic.leaders.len();
        Ok(KafkaWriter {
            cluster: self.cluster.clone(),
            settings: self.settings.clone(),
            slots: self.slots.clone(),
            owner: self.owner.clone(),
            stats: self.stats.clone(),
            topic,
            prefix,
            lineage: context.lineage.as_str().to_string(),
            subtask: context.subtask_index,
            batcher: Batcher::new(
                partitions,
                context.subtask_index,
                self.settings.batch_bytes,
                self.settings.max_record_bytes,
            ),
            open: None,
        })
    }

    async fn create_committer(&self, _context: &InitContext) -> Result<KafkaCommitter, SinkError> {
        Ok(KafkaCommitter {
            cluster: self.cluster.clone(),
            topic: self.settings.topic.clone(),
            slots: self.slots.clone(),
            stats: self.stats.clone(),
        })
    }

    /// The transaction timeout: a prepared transaction not committed within
    /// it is aborted by the broker.
    fn uncommitted_lifetime(&self) -> Option<Duration> {
        Some(self.settings.transaction_timeout)
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
                "cannot reach the Kafka cluster at 127.0.0.1:1: no Kafka broker of 127.0.0.1:1 \
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
