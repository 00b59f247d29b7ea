//! The source and its builder: the topic, the group, bounded or not, and
//! the choices a user makes about records that are gone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sink_api::SubtaskIndex;
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{Brokers, ClientProperties, Security};
use sink_runtime::source::{Boundedness, Source, SourceError};

use crate::offsets::{offsets, Edge};
use crate::reader::KafkaReader;
use crate::settings::{KafkaSplit, Settings};
use crate::share::StartShare;
use crate::{KafkaMessage, KafkaSourceError};

/// A Kafka topic read by a consumer group, its positions committed with
/// the sink's data (the `positions` module of `sink-api`): each subtask of
/// each instance of the job is a member of the group, and a partition
/// moved to another member (a rebalance, an instance killed or cut off)
/// is read by it from where the destination's data of it ends.
///
/// Made by [`KafkaSource::builder`]; given to the job builder, whose sink
/// must commit positions (`Sink::commits_positions`).
///
/// - **Unbounded** (the default): reads until the job is stopped.
/// - **Bounded** ([`KafkaSourceBuilder::bounded`]): ends at the offsets the
///   partitions' stable ends had when the job first started, kept in its
///   checkpoints. A member ends only once **every** partition of the topic
///   is read to there, in the destination's committed positions or by a
///   subtask of its own start, whichever member read it; then, once its
///   own records are committed, it leaves the group. Partitions no member
///   reads fail the run, named, after
///   [`KafkaSourceBuilder::unread_partition_timeout`].
///
/// Records are read as a `read_committed` consumer reads them.
#[derive(Debug, Clone)]
pub struct KafkaSource {
    settings: Arc<Settings>,
    /// Bounded: each partition's end when this source was built.
    ends: Option<BTreeMap<i32, i64>>,
    /// What the readers of the current start share (`share.rs`): made
    /// anew with each start's first reader.
    start: Arc<Mutex<Arc<StartShare>>>,
}

/// Builds a [`KafkaSource`]. Made by [`KafkaSource::builder`].
#[derive(Debug, Clone)]
pub struct KafkaSourceBuilder {
    settings: Settings,
}

impl KafkaSource {
    /// A source of `topic` on the cluster reached through `brokers`
    /// (`host:port`, comma-separated; a [`Brokers`] carries TLS and SASL
    /// too, as does [`KafkaSourceBuilder::properties`]), read by the
    /// consumer group `group`.
    pub fn builder(
        brokers: impl Into<Brokers>,
        topic: impl Into<String>,
        group: impl Into<String>,
    ) -> KafkaSourceBuilder {
        let brokers: Brokers = brokers.into();
        KafkaSourceBuilder {
            settings: Settings {
                brokers: brokers.list,
                security: brokers.security,
                topic: topic.into(),
                group: group.into(),
                topic_id: None,
                bounded: false,
                session_timeout: Duration::from_secs(10),
                rebalance_timeout: Duration::from_secs(60),
                metadata_refresh: Duration::from_secs(5),
                request_timeout: Duration::from_secs(30),
                skip_deleted_records: false,
                recreated_from_start: false,
                unread: None,
                group_wait: None,
            },
        }
    }

    /// The scope its positions are committed under (`kafka/<topic>/<group>`).
    pub fn scope(&self) -> String {
        self.settings.scope()
    }

    /// The scope the positions of a source reading `topic` in `group` are
    /// committed under, without making one: for programs that read a
    /// destination's positions back ([`Sink::committed_positions`](sink_api::Sink::committed_positions)),
    /// as the demos' end checks do.
    pub fn scope_of(topic: &str, group: &str) -> String {
        crate::settings::scope(topic, group)
    }

    /// How long the job's Kafka source members waited on their consumer
    /// group (joining and syncing, rebalances included, until it dealt them
    /// partitions), added up over members and starts, as a snapshot of the
    /// job's metrics holds it (the counter `kafka_source_group_wait_ms`);
    /// zero for a job without this source. For programs that report it,
    /// as the demos' JSON does.
    pub fn group_wait(metrics: &sink_runtime::MetricsSnapshot) -> Duration {
        let millis = metrics
            .sink
            .iter()
            .find(|counter| counter.name == crate::reader::GROUP_WAIT_METRIC.0)
            .map_or(0, |counter| counter.value);
        Duration::from_millis(millis)
    }
}

impl KafkaSourceBuilder {
    /// Ends at the partitions' stable ends as the job's first start sees
    /// them (see [`KafkaSource`]).
    pub fn bounded(mut self) -> Self {
        self.settings.bounded = true;
        self
    }

    /// How connections are secured: TLS and SASL (default neither).
    pub fn security(mut self, security: Arc<Security>) -> Self {
        self.settings.security = security;
        self
    }

    /// What a client properties file (`--kafka-config`) sets for a
    /// reader: TLS and SASL (a producer's settings, such as
    /// `compression.type`, are the sink's).
    pub fn properties(mut self, properties: &ClientProperties) -> Self {
        self.settings.security = Arc::new(properties.security.clone());
        self
    }

    /// Bounded: how long a member that read its own partitions (or was
    /// dealt none) waits for partitions that no member reads before the job
    /// fails, naming them: by default the same bound as
    /// [`group_wait_timeout`](Self::group_wait_timeout)'s, twice the
    /// rebalance timeout plus the session timeout (130 s with the
    /// defaults).
    ///
    /// A bounded run ends only once the destination holds every
    /// partition's end, whichever member read it. A member waiting for the
    /// others asks the group to deal the partitions again when none of
    /// those it lacks moved for half the session timeout, then twice as
    /// long each time; when none moved for this long, the run fails. Keep
    /// it above the checkpoint interval of every instance of the group (a
    /// partition read by another instance moves in the destination only
    /// when that instance commits).
    pub fn unread_partition_timeout(mut self, timeout: Duration) -> Self {
        self.settings.unread = Some(timeout);
        self
    }

    /// A member that sends no heartbeat for this long is dropped from the
    /// group (default 10 s).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.settings.session_timeout = timeout;
        self
    }

    /// How long the group waits for its members to rejoin in a rebalance
    /// (default 60 s). A member rejoins once everything it read is
    /// committed: keep it above the checkpoint interval plus a commit.
    pub fn rebalance_timeout(mut self, timeout: Duration) -> Self {
        self.settings.rebalance_timeout = timeout;
        self
    }

    /// How long a member waits for the group to deal it partitions
    /// (joining, syncing, and the rebalances between) before the job fails
    /// naming the group's state, its members and its leader: by default
    /// twice the rebalance timeout plus the session timeout (130 s with the
    /// defaults). While it waits, the member says every 10 s (at WARN) what
    /// the group is doing.
    pub fn group_wait_timeout(mut self, timeout: Duration) -> Self {
        self.settings.group_wait = Some(timeout);
        self
    }

    /// How often the group's leader looks for partitions added to the
    /// topic (default 5 s); added partitions are read from their start.
    pub fn metadata_refresh(mut self, every: Duration) -> Self {
        self.settings.metadata_refresh = every;
        self
    }

    /// When the destination's data of a partition ends before the first
    /// offset the partition still holds (retention deleted records the
    /// group never read), go on from there, accepting the loss. Without
    /// it, such a partition fails the job naming the records.
    pub fn skip_deleted_records(mut self) -> Self {
        self.settings.skip_deleted_records = true;
        self
    }

    /// When the destination holds the group's positions of an earlier topic
    /// of the same name (deleted and created again), read the new topic
    /// from its start. Without it, the job fails naming both topic ids.
    pub fn read_recreated_topic_from_start(mut self) -> Self {
        self.settings.recreated_from_start = true;
        self
    }

    /// Checks the settings and the topic, and for a bounded source reads
    /// where each partition ends now.
    pub async fn build(self) -> Result<KafkaSource, KafkaSourceError> {
        let mut settings = self.settings;
        if settings.group.is_empty() || settings.topic.is_empty() {
            return Err(KafkaSourceError::Setting(
                "a Kafka source needs a topic and a group (--topic, --group)".into(),
            ));
        }
        settings
            .security
            .check()
            .map_err(KafkaSourceError::Setting)?;
        if settings.session_timeout < Duration::from_millis(100) {
            return Err(KafkaSourceError::Setting(format!(
                "the session timeout {:?} is too short: at least 100 ms",
                settings.session_timeout
            )));
        }
        let cluster = settings.cluster(false);
        let wire = KafkaSourceError::wire(&settings.brokers);
        let described = Topic::describe(&cluster, &settings.topic)
            .await
            .map_err(wire)?
            .ok_or_else(|| KafkaSourceError::NoTopic {
                topic: settings.topic.clone(),
                brokers: settings.brokers.clone(),
            })?;
        settings.topic_id = described.id.clone();
        let ends = match settings.bounded {
            true => {
                let partitions: Vec<i32> = (0..described.leaders.len() as i32).collect();
                Some(
                    offsets(
                        &cluster,
                        &settings.topic,
                        &described,
                        &partitions,
                        Edge::StableEnd,
                    )
                    .await
                    .map_err(KafkaSourceError::wire(&settings.brokers))?,
                )
            }
            false => None,
        };
        Ok(KafkaSource {
            settings: Arc::new(settings),
            ends,
            start: Arc::new(Mutex::new(StartShare::new())),
        })
    }
}

impl Source for KafkaSource {
    type Record = KafkaMessage;
    type Split = KafkaSplit;
    type Reader = KafkaReader;

    fn boundedness(&self) -> Boundedness {
        match self.settings.bounded {
            true => Boundedness::Bounded,
            false => Boundedness::Unbounded,
        }
    }

    fn position_scope(&self) -> Option<String> {
        Some(self.settings.scope())
    }

    fn create_splits(&self, parallelism: usize) -> Vec<KafkaSplit> {
        vec![
            KafkaSplit {
                ends: self.ends.clone()
            };
            parallelism
        ]
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<KafkaSplit>,
    ) -> Result<KafkaReader, SourceError> {
        // A bounded job ends where its first start saw the ends (kept in
        // every subtask's split); a subtask added by a rescale has none
        // and takes this start's.
        let ends = match self.settings.bounded {
            true => splits
                .into_iter()
                .find_map(|split| split.ends)
                .or_else(|| self.ends.clone()),
            false => None,
        };
        // The runtime creates a start's readers in subtask order, 0 first:
        // subtask 0 begins a new share, which the others of its start join
        // (what an earlier start read is not this one's to count).
        let share = {
            let mut current = self.start.lock().unwrap_or_else(PoisonError::into_inner);
            if subtask == 0 {
                *current = StartShare::new();
            }
            Arc::clone(&current)
        };
        Ok(KafkaReader::new(
            Arc::clone(&self.settings),
            subtask,
            ends,
            share,
        ))
    }
}
