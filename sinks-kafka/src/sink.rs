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
use crate::format::CommittableFormat;
use crate::names::check_prefix;
use crate::owner::Owner;
use crate::positions;
use crate::recovery::abort_lingering;
use crate::settings::Settings;
use crate::slots::Slots;
use crate::stats::{KafkaStats, Stats};
use crate::writer::{KafkaCommittable, KafkaWriter};
use sink_kafka_client::topic::Topic;
use sink_kafka_client::Cluster;

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
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) settings: Arc<Settings>,
    pub(crate) slots: Arc<Slots>,
    pub(crate) owner: Arc<Owner>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) created: bool,
    /// The transactional id prefix, once the first start resolved it
    /// (the job's name by default): offsets of other prefixes are not the
    /// job's positions.
    pub(crate) started_prefix: std::sync::OnceLock<String>,
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
    /// Whether [`connect`](crate::KafkaSinkBuilder::connect) created the topic.
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
        let _ = self.started_prefix.set(prefix.to_string());
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
            advances: Vec::new(),
        })
    }

    async fn create_committer(&self, _context: &InitContext) -> Result<KafkaCommitter, SinkError> {
        Ok(KafkaCommitter {
            cluster: self.cluster.clone(),
            topic: self.settings.topic.clone(),
            slots: self.slots.clone(),
            stats: self.stats.clone(),
            settled: Default::default(),
            transaction_timeout: self.settings.transaction_timeout,
        })
    }

    /// The sink commits a Kafka source's positions: each transaction
    /// commits them with its records, as the source group's offsets (see
    /// the `positions` module).
    fn commits_positions(&self) -> bool {
        true
    }

    /// The offsets of a Kafka source's consumer group (scope
    /// `kafka/<topic>/<group>`), as last committed; other scopes are
    /// refused.
    async fn committed_positions(
        &self,
        scope: &str,
    ) -> Result<sink_api::CommittedPositions, SinkError> {
        let kafka =
            positions::KafkaScope::parse(scope).map_err(|why| SinkError::msg(why).permanent())?;
        let prefix = self.started_prefix.get().map(String::as_str);
        positions::read(&self.cluster, &kafka, prefix)
            .await
            .map_err(|e| match e {
                positions::PositionsError::Wire(e) => {
                    sink_error(format!("reading the positions of {scope:?}"), e)
                }
                positions::PositionsError::Foreign(why) => SinkError::msg(why).permanent(),
            })
    }

    fn committable_serializer(&self) -> Arc<dyn sink_api::VersionedSerializer<KafkaCommittable>> {
        Arc::new(CommittableFormat)
    }

    /// The transaction timeout: a prepared transaction not committed within
    /// it is aborted by the broker.
    fn uncommitted_lifetime(&self) -> Option<Duration> {
        Some(self.settings.transaction_timeout)
    }
}
