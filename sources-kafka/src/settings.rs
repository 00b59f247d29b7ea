//! What every reader of one source shares, and what a checkpoint keeps of
//! it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sink_kafka_client::{ClientConfig, Cluster, Security};

/// What every reader of one source shares.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub brokers: String,
    /// TLS and SASL.
    pub security: Arc<Security>,
    pub topic: String,
    pub group: String,
    pub topic_id: Option<String>,
    pub bounded: bool,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub metadata_refresh: Duration,
    pub request_timeout: Duration,
    pub skip_deleted_records: bool,
    /// Bounded: how long a member whose own partitions are read (or that
    /// was dealt none) waits, with nothing moving, for partitions no member
    /// reads; `None`: derived from the group's timeouts
    /// ([`Settings::unread_timeout`]).
    pub unread: Option<Duration>,
    pub recreated_from_start: bool,
    /// How long a member waits for the group to deal it partitions; `None`:
    /// derived from the group's timeouts ([`Settings::group_wait_timeout`]).
    pub group_wait: Option<Duration>,
}

/// The scope the positions of `topic` read in `group` are committed under.
pub(crate) fn scope(topic: &str, group: &str) -> String {
    format!("kafka/{topic}/{group}")
}

impl Settings {
    /// How long a member waits for the group to deal it partitions (joining,
    /// syncing and the rebalances between) before the job fails naming the
    /// group's state: the bound set, or [`Settings::group_bound`].
    pub(crate) fn group_wait_timeout(&self) -> Duration {
        self.group_wait.unwrap_or_else(|| self.group_bound())
    }

    /// Bounded: how long a member waits, with nothing moving, for
    /// partitions no member reads before the job fails naming them: the
    /// bound set, or the same as for a group that does not deal (a
    /// partition whose reader is gone moves once the group dropped it and
    /// dealt again).
    pub(crate) fn unread_timeout(&self) -> Duration {
        self.unread.unwrap_or_else(|| self.group_bound())
    }

    /// Two rebalances and a session: a rebalance takes at most the
    /// rebalance timeout; a member gone is dropped after its session
    /// timeout, which starts one more.
    fn group_bound(&self) -> Duration {
        self.rebalance_timeout * 2 + self.session_timeout
    }

    /// The scope positions are committed under: the topic and the group.
    /// Every instance of the group shares it.
    pub(crate) fn scope(&self) -> String {
        scope(&self.topic, &self.group)
    }

    /// Bounded: how long a waiting member lets the partitions it lacks
    /// stand still before it asks the group to deal them again (then twice
    /// as long each time): half the session timeout, since a member that
    /// reads them and is alive commits more often than that in a job with
    /// checkpoints, and a dead one is dropped after it.
    pub(crate) fn rebalance_after(&self) -> Duration {
        (self.session_timeout / 2).max(Duration::from_secs(1))
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
            security: Arc::clone(&self.security),
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
