//! The Kafka client the project's Kafka sink and Kafka source share:
//! connections pipelined per broker, the protocol's requests on the
//! `kafka-protocol` crate's message types, the cluster's brokers and
//! coordinators, topics, and the decoding of fetched records as a
//! `read_committed` consumer sees them.
//!
//! Not a general-purpose client: it has what the sink and the source need
//! and no more (`docs/architecture.md`, "The Kafka client", says why the
//! project does not use librdkafka).
//!
//! | module | holds |
//! |---|---|
//! | `api` | which version of each request is sent |
//! | `connection` | one broker connection, requests pipelined, answers matched by correlation id |
//! | [`Cluster`] | brokers by id, metadata, coordinators of groups and transactions |
//! | [`topic`] | a topic's partitions, leaders and id; creation and deletion |
//! | [`admin`] | deleting a partition's oldest records, adding partitions |
//! | [`fetch`] | decoding fetched batches: committed data records only |
//! | [`group`] | a consumer group's state and members, as messages name them |
//! | [`Header`] | a record's header |
//! | [`Security`] | TLS (rustls) and SASL: PLAIN, SCRAM-SHA-256/512 (`scram`), OAUTHBEARER (`sasl`) |
//! | [`ClientProperties`] | a client properties file (`--kafka-config`), under Kafka's names |
//! | [`CompressionType`] | the codecs batches are written with; every codec is read |
//! | [`WireError`] | what a request can fail with, classed retriable, fenced or permanent |

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod admin;
mod api;
mod brokers;
mod cluster;
mod compression;
mod connection;
mod error;
pub mod fetch;
pub mod group;
mod header;
mod properties;
#[cfg(feature = "test-proxy")]
pub mod proxy;
mod sasl;
mod scram;
mod security;
#[cfg(feature = "test-proxy")]
pub mod test_certificates;
pub mod topic;

pub use api::Call;
pub use brokers::Brokers;
pub use cluster::{ClientConfig, Cluster, CoordinatorKind, Link};
pub use compression::{codec_of_first_batch, CompressionType};
pub use connection::{Answer, MAX_FRAME};
pub use error::WireError;
pub use header::Header;
pub use properties::ClientProperties;
pub use scram::{
    server_check as scram_server_check, ScramClient, ScramError, ScramHash, ScramKeys,
};
pub use security::{
    Sasl, SaslMechanism, Secret, Security, SecurityProtocol, StaticToken, TlsFiles, TokenFuture,
    TokenProvider,
};

/// The protocol's message types, as this client speaks them.
pub use kafka_protocol;

use std::time::Duration;

use kafka_protocol::protocol::StrBytes;

/// `s` as the protocol's string type.
pub fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// `d` in milliseconds, as the protocol's 32-bit fields take it (longer
/// saturates).
pub fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}
