//! The demos' Kafka source (`--source kafka`, `--source kafka-unbounded`):
//! its flags, the source they make, and each record's value as one line.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sink_api::{CommittedPositions, Sink, SinkError};
use sink_runtime::RestartStrategy;
use sinks_file::Encoder;
use sources_kafka::{Brokers, ClientProperties, KafkaMessage, KafkaSource};

use crate::kafka_check::{self, InputAtPositions};

/// Where the demo reads from with `--source kafka` or `kafka-unbounded`.
#[derive(Debug, Clone, Args)]
pub struct KafkaSourceArgs {
    /// The Kafka cluster to read from, `host:port[,host:port…]`.
    #[arg(long)]
    pub brokers: Option<String>,
    /// A Kafka client properties file (Java's client.properties format):
    /// security.protocol, sasl.*, ssl.ca.location, … (docs/kafka.md,
    /// "Settings"). Its bootstrap.servers stands in for --brokers.
    #[arg(long, value_name = "FILE")]
    pub kafka_config: Option<std::path::PathBuf>,
    /// The topic to read.
    #[arg(long)]
    pub topic: Option<String>,
    /// The consumer group: every instance of it (each with its own
    /// --state) shares the topic's partitions, and each partition is read
    /// from where the output's data of it ends.
    #[arg(long)]
    pub group: Option<String>,
    /// Go on past records that retention deleted before the group read
    /// them (they are lost; without it, the run stops and says which).
    #[arg(long)]
    pub skip_deleted_records: bool,
    /// Read a topic that was deleted and created again from its start
    /// (without it, the run stops and says so).
    #[arg(long)]
    pub recreated_topic_from_start: bool,
    /// How long a member waits for the group to deal it partitions before
    /// the run fails naming the group's state and members (default: twice
    /// the rebalance timeout plus the session timeout, 130 s).
    #[arg(long, value_parser = sink_cli::flags::parse_duration)]
    pub group_wait_timeout: Option<Duration>,
}

impl KafkaSourceArgs {
    /// The source these flags name, `bounded` or not; an error names a
    /// missing flag.
    pub async fn source(&self, bounded: bool) -> anyhow::Result<KafkaSource> {
        let properties = self.properties()?;
        for ignored in &properties.ignored {
            eprintln!("warning: the Kafka client property {ignored} is not used by this client");
        }
        let (topic, group) = self.topic_and_group()?;
        let mut builder = KafkaSource::builder(self.brokers_with(&properties)?, topic, group)
            .properties(&properties);
        if bounded {
            builder = builder.bounded();
        }
        if self.skip_deleted_records {
            builder = builder.skip_deleted_records();
        }
        if self.recreated_topic_from_start {
            builder = builder.read_recreated_topic_from_start();
        }
        if let Some(bound) = self.group_wait_timeout {
            builder = builder.group_wait_timeout(bound);
        }
        Ok(builder.build().await?)
    }

    /// The positions `sink` holds for the source these flags name: the
    /// first read of the demos' end check (`kafka_check`), before their
    /// output.
    pub async fn job_positions<S: Sink>(&self, sink: &S) -> anyhow::Result<CommittedPositions> {
        let (topic, group) = self.topic_and_group()?;
        kafka_check::job_positions(sink, &topic, &group).await
    }

    /// The input read back and split at `positions`: the last read of the
    /// demos' end check, after their output.
    pub async fn input_at(
        &self,
        positions: &CommittedPositions,
    ) -> anyhow::Result<InputAtPositions> {
        let brokers = self.brokers_with(&self.properties()?)?;
        let (topic, _) = self.topic_and_group()?;
        InputAtPositions::read(&brokers, &topic, positions).await
    }

    /// The client properties of --kafka-config; none without it.
    fn properties(&self) -> anyhow::Result<ClientProperties> {
        match &self.kafka_config {
            Some(path) => ClientProperties::read(path).map_err(anyhow::Error::msg),
            None => Ok(ClientProperties::default()),
        }
    }

    /// The cluster: --brokers, or the properties' bootstrap.servers, reached
    /// with their security.
    fn brokers_with(&self, properties: &ClientProperties) -> anyhow::Result<Brokers> {
        let list = self
            .brokers
            .clone()
            .or_else(|| properties.bootstrap.clone())
            .ok_or_else(|| missing("--brokers"))?;
        Ok(Brokers::from(list.as_str()).secured(Arc::new(properties.security.clone())))
    }

    fn topic_and_group(&self) -> anyhow::Result<(String, String)> {
        let topic = self.topic.clone().ok_or_else(|| missing("--topic"))?;
        let group = self.group.clone().ok_or_else(|| missing("--group"))?;
        Ok((topic, group))
    }
}

/// The error for a flag `--source kafka` needs.
fn missing(flag: &str) -> anyhow::Error {
    anyhow::anyhow!("--source kafka needs {flag}")
}

/// How the demos restart a job reading Kafka after a failure the broker or
/// the network may explain (a broker that stopped answering for a moment).
/// A commit superseded (another member of the group committed the
/// partition's records, as after a rebalance) needs none: the runtime
/// restarts the job at once whatever the strategy, and it reads every
/// partition again from the destination.
pub const RESTARTS: RestartStrategy = RestartStrategy::FixedDelay {
    attempts: 10,
    delay: Duration::from_millis(500),
};

/// A message's id in the demos' tables: its partition times 2^40 plus its
/// offset, unique over the topic while offsets stay below 2^40 (a trillion
/// messages a partition). The Delta and PostgreSQL demos use it as the
/// row's `id`.
pub fn message_id(message: &KafkaMessage) -> i64 {
    message_id_at(message.partition, message.offset)
}

/// The id [`message_id`] gives the message at `offset` of `partition`: what
/// the demos' end checks look for in their tables.
pub fn message_id_at(partition: i32, offset: i64) -> i64 {
    (i64::from(partition) << 40) + offset
}

/// Each message's value, then a newline.
#[derive(Debug, Clone, Copy, Default)]
pub struct ValueLine;

impl Encoder<KafkaMessage> for ValueLine {
    fn encode(&self, message: &KafkaMessage, out: &mut Vec<u8>) -> Result<(), SinkError> {
        out.extend_from_slice(message.value_bytes());
        out.push(b'\n');
        Ok(())
    }
}
