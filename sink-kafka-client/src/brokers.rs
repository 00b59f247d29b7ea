//! Where a cluster is and how to reach it: the bootstrap list and the
//! connections' [`Security`].

use std::sync::Arc;
use std::time::Duration;

use crate::{ClientConfig, Cluster, Security};

/// A cluster's bootstrap list (`host:port`, comma-separated) and how its
/// connections are secured.
///
/// Taken by every function that reaches a cluster by its address
/// (`read_committed`, `delete_topic`, …): a `&str` or `String` converts
/// into one without TLS or SASL; [`Brokers::secured`] adds them. Its
/// `Display` is the list alone.
#[derive(Debug, Clone, Default)]
pub struct Brokers {
    /// `host:port[,host:port…]`.
    pub list: String,
    /// TLS and SASL.
    pub security: Arc<Security>,
}

impl Brokers {
    /// The same brokers, reached with `security`.
    pub fn secured(mut self, security: Arc<Security>) -> Brokers {
        self.security = security;
        self
    }

    /// The bootstrap list, one `host:port` each.
    pub fn bootstrap(&self) -> Vec<String> {
        self.list
            .split(',')
            .map(|b| b.trim().to_string())
            .filter(|b| !b.is_empty())
            .collect()
    }

    /// A client of these brokers, as `client_id`, with a 10 s connect and
    /// a 30 s request timeout.
    pub fn cluster(&self, client_id: &str) -> Cluster {
        Cluster::new(ClientConfig {
            bootstrap: self.bootstrap(),
            client_id: client_id.to_string(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            security: Arc::clone(&self.security),
        })
    }
}

impl std::fmt::Display for Brokers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.list)
    }
}

impl From<&str> for Brokers {
    fn from(list: &str) -> Brokers {
        Brokers {
            list: list.to_string(),
            security: Arc::default(),
        }
    }
}

impl From<String> for Brokers {
    fn from(list: String) -> Brokers {
        Brokers {
            list,
            security: Arc::default(),
        }
    }
}

impl From<&String> for Brokers {
    fn from(list: &String) -> Brokers {
        Brokers::from(list.as_str())
    }
}

impl From<&Brokers> for Brokers {
    fn from(brokers: &Brokers) -> Brokers {
        brokers.clone()
    }
}
