//! What every reader of one source shares, and what a checkpoint keeps of
//! it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sink_kafka_client::{ClientConfig, Cluster};

/// What every reader of one source shares.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub brokers: String,
    pub topic: String,
    pub group: String,
    pub topic_id: Option<String>,
    pub bounded: bool,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub metadata_refresh: Duration,
    pub request_timeout: Duration,
    pub skip_deleted_records: bool,
    pub recreated_from_start: bool,
}

impl Settings {
    /// The scope positions are committed under: the topic and the group.
    /// Every instance of the group shares it.
    pub(crate) fn scope(&self) -> String {
        format!("kafka/{}/{}", self.topic, self.group)
    }

    /// A client for readers (`request_timeout`) or for a member, whose
    /// `JoinGroup` waits up to the rebalance timeout.
    pub(crate) fn cluster(&self, member: bool) -> Cluster {
        let request_timeout = match member {
            true => self.rebalance_timeout + self.request_timeout,
            false => self.request_timeout,
        };
        Cluster::new(ClientConfig {
            bootstrap: self
                .brokers
                .split(',')
                .map(|b| b.trim().to_string())
                .collect(),
            client_id: format!("eo-kafka-source-{}", self.group),
            connect_timeout: Duration::from_secs(10),
            request_timeout,
        })
    }
}

/// What a subtask's checkpoint keeps of the source: a bounded job's ends,
/// the same in every subtask (positions are the destination's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaSplit {
    /// Bounded: each partition's end, as the job's first start saw it.
    pub ends: Option<BTreeMap<i32, i64>>,
}
