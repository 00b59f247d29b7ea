//! The demos' Kafka source (`--source kafka`, `--source kafka-unbounded`):
//! its flags, the source they make, and each record's value as one line.

use std::time::Duration;

use clap::Args;
use sink_api::SinkError;
use sink_runtime::RestartStrategy;
use sinks_file::Encoder;
use sources_kafka::{ClientProperties, KafkaMessage, KafkaSource};

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
}

impl KafkaSourceArgs {
    /// The source these flags name, `bounded` or not; an error names a
    /// missing flag.
    pub async fn source(&self, bounded: bool) -> anyhow::Result<KafkaSource> {
        let missing = |flag: &str| anyhow::anyhow!("--source kafka needs {flag}");
        let properties = match &self.kafka_config {
            Some(path) => ClientProperties::read(path).map_err(anyhow::Error::msg)?,
            None => ClientProperties::default(),
        };
        for ignored in &properties.ignored {
            eprintln!("warning: the Kafka client property {ignored} is not used by this client");
        }
        let brokers = self
            .brokers
            .clone()
            .or_else(|| properties.bootstrap.clone())
            .ok_or_else(|| missing("--brokers"))?;
        let topic = self.topic.clone().ok_or_else(|| missing("--topic"))?;
        let group = self.group.clone().ok_or_else(|| missing("--group"))?;
        let mut builder =
            KafkaSource::builder(brokers.as_str(), topic, group).properties(&properties);
        if bounded {
            builder = builder.bounded();
        }
        if self.skip_deleted_records {
            builder = builder.skip_deleted_records();
        }
        if self.recreated_topic_from_start {
            builder = builder.read_recreated_topic_from_start();
        }
        Ok(builder.build().await?)
    }
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
    (i64::from(message.partition) << 40) + message.offset
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
