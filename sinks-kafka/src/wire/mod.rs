//! The Kafka client under the sink: connections, the protocol's requests,
//! the cluster's brokers and coordinators. Written on the `kafka-protocol`
//! crate's message types; `docs/architecture.md` says why the sink does not
//! use librdkafka.

mod api;
mod cluster;
mod connection;
mod error;

pub(crate) use cluster::{ClientConfig, Cluster, CoordinatorKind, Link};
pub use error::WireError;

use std::time::Duration;

use kafka_protocol::protocol::StrBytes;

/// `s` as the protocol's string type.
pub(crate) fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// `d` in milliseconds, as the protocol's 32-bit fields take it (longer
/// saturates).
pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}
