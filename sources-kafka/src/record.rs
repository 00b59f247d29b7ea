//! What the source reads: one message of a partition.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

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
    /// Its value (`None`: a tombstone).
    pub value: Option<Bytes>,
}

impl KafkaMessage {
    /// The value's bytes, empty for a tombstone.
    pub fn value_bytes(&self) -> &[u8] {
        self.value.as_deref().unwrap_or_default()
    }
}
