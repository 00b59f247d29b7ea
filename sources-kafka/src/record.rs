//! What the source reads: one message of a partition.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sink_kafka_client::Header;

/// One committed message of the source's topic, as a `read_committed`
/// consumer sees it.
///
/// Made by the source's readers; the record type of jobs that read Kafka
/// (`Source::map` turns it into a sink's input).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaMessage {
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value (`None`: a tombstone, null, not empty).
    pub value: Option<Bytes>,
    /// Its timestamp, in milliseconds since the epoch (its producer's, or
    /// the broker's with `message.timestamp.type=LogAppendTime`).
    pub timestamp: i64,
    /// Its headers, in their order: each a key and a value (`None`: null).
    #[serde(with = "headers")]
    pub headers: Vec<Header>,
}

/// Headers as (key, value) pairs: `Header` is the client's, which has no
/// serde of its own.
mod headers {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(headers: &[Header], s: S) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(&str, Option<&Bytes>)> = headers
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_ref()))
            .collect();
        pairs.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Header>, D::Error> {
        let pairs: Vec<(String, Option<Bytes>)> = Vec::deserialize(d)?;
        Ok(pairs
            .into_iter()
            .map(|(key, value)| Header { key, value })
            .collect())
    }
}

impl KafkaMessage {
    /// The value's bytes, empty for a tombstone.
    pub fn value_bytes(&self) -> &[u8] {
        self.value.as_deref().unwrap_or_default()
    }
}
