//! What the sink writes: one Kafka message per record (key, value or
//! tombstone, headers, timestamp), and the partition it goes to.

use bytes::Bytes;
use sink_api::BadRecord;
use sink_kafka_client::Header;

/// One message: an optional key, a value (or none: a tombstone), headers,
/// and optionally its timestamp and the partition it goes to.
///
/// The sink's input; a job maps its records to these. A record that names
/// its partition ([`with_partition`](Self::with_partition)) goes there; a
/// record with a key goes to the partition Kafka's own default partitioner
/// picks for that key (murmur2 of the key, modulo the partitions), so
/// records of one key stay in order in one partition, as with any Kafka
/// producer; a record with neither goes to its subtask's current
/// partition, which moves on to the next partition with every batch sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    /// The key, or `None`.
    pub key: Option<Vec<u8>>,
    /// The value, or `None`: a tombstone (null, which compacted topics
    /// take as the key's deletion; not the same as empty).
    pub value: Option<Vec<u8>>,
    /// Its headers, in order.
    pub headers: Vec<Header>,
    /// Its timestamp in milliseconds since the epoch, or `None`: when the
    /// writer batches it.
    pub timestamp: Option<i64>,
    /// The partition it goes to, or `None`: its key's, or the subtask's
    /// current one. A partition the topic does not have is refused when
    /// the record is written.
    pub partition: Option<i32>,
}

/// A dead letter (`JobBuilder::dead_letters` with a Kafka sink): the
/// refused bytes as the value, as they were read, and why and where in
/// the headers `dead_letter.error` and `dead_letter.position`, as Kafka
/// Connect's dead-letter queues carry their context in headers. Without a
/// key: dead letters spread over the topic's partitions.
impl From<BadRecord> for KafkaRecord {
    fn from(bad: BadRecord) -> KafkaRecord {
        KafkaRecord::new(bad.payload_bytes())
            .with_header(ERROR_HEADER, Some(bad.error()))
            .with_header(POSITION_HEADER, Some(bad.position()))
    }
}

/// The header of a dead letter that says why its record was refused.
pub const ERROR_HEADER: &str = "dead_letter.error";
/// The header of a dead letter that says where its record was read.
pub const POSITION_HEADER: &str = "dead_letter.position";

impl KafkaRecord {
    /// A record of `value`, without a key.
    pub fn new(value: impl Into<Vec<u8>>) -> KafkaRecord {
        KafkaRecord {
            key: None,
            value: Some(value.into()),
            headers: Vec::new(),
            timestamp: None,
            partition: None,
        }
    }

    /// A tombstone: a record without a value (null).
    pub fn tombstone() -> KafkaRecord {
        KafkaRecord {
            value: None,
            ..KafkaRecord::new(Vec::new())
        }
    }

    /// The same record with one more header, `key` with `value` (`None`:
    /// null).
    pub fn with_header(
        mut self,
        key: impl Into<String>,
        value: Option<impl Into<Vec<u8>>>,
    ) -> KafkaRecord {
        self.headers.push(Header {
            key: key.into(),
            value: value.map(|v| Bytes::from(v.into())),
        });
        self
    }

    /// The same record stamped `timestamp` (milliseconds since the epoch)
    /// rather than when it is batched.
    pub fn with_timestamp(mut self, timestamp: i64) -> KafkaRecord {
        self.timestamp = Some(timestamp);
        self
    }

    /// The same record with `key`.
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> KafkaRecord {
        self.key = Some(key.into());
        self
    }

    /// The same record, sent to `partition` whatever its key.
    pub fn with_partition(mut self, partition: i32) -> KafkaRecord {
        self.partition = Some(partition);
        self
    }

    /// Bytes it takes in a batch, about: key, value, headers and a
    /// record's overhead.
    pub(crate) fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len) + 8)
            .sum();
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + headers
            + 24
    }
}

/// The partition of `key` among `partitions`, as Kafka's default
/// partitioner computes it (Java client and librdkafka's
/// `murmur2_random`): the positive part of murmur2 of the key, modulo the
/// partitions.
pub(crate) fn partition_of_key(key: &[u8], partitions: usize) -> usize {
    (murmur2(key) & 0x7fff_ffff) as usize % partitions.max(1)
}

/// Kafka's murmur2 (32 bits, seed 0x9747b28c).
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len() as u32;
    let mut h: u32 = 0x9747_b28c ^ length;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_as_the_java_client_hashes_them() {
        // The values of Apache Kafka's own test of its murmur2
        // (`UtilsTest.testMurmur2`), as Java's signed ints.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (key, expected) in cases {
            assert_eq!(
                murmur2(key) as i32,
                expected,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
        assert!(partition_of_key(b"21", 7) < 7);
    }
}
