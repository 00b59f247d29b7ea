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
