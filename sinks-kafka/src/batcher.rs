//! Records into batches, one per partition: a record with a key goes to
//! its key's partition (Kafka's default partitioner), one without to the
//! current partition, which moves on to the next with every batch taken.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Record;

use crate::record::{partition_of_key, KafkaRecord};
use crate::session::record;

/// The records of each partition waiting to be sent.
#[derive(Debug)]
pub(crate) struct Batcher {
    batches: Vec<Batch>,
    /// The partition records without a key go to now.
    current: usize,
    batch_bytes: usize,
    max_record_bytes: usize,
}

#[derive(Debug, Default)]
struct Batch {
    records: Vec<Record>,
    bytes: usize,
}

/// Why a record cannot be batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Over the largest size sent; its size.
    TooLarge(usize),
    /// It names a partition the topic does not have; the partition and
    /// how many there are.
    NoPartition(i32, usize),
}

impl Refused {
    /// The reason, naming the fix (`limit`: the largest record sent, and
    /// the setting that sets it).
    pub(crate) fn message(&self, topic: &str, limit: &str) -> String {
        match self {
            Refused::TooLarge(size) => format!(
                "a record of {size} bytes is larger than the sink sends ({limit}; the broker's \
                 message.max.bytes and the topic's max.message.bytes bound it): split it, or \
                 raise both"
            ),
            Refused::NoPartition(partition, count) => format!(
                "a record names partition {partition} of {topic}, which has {count} \
                 (0 to {}): name one of them, or add partitions to the topic",
                count.saturating_sub(1)
            ),
        }
    }
}

impl Batcher {
    /// Batches for `partitions` partitions, records without a key going to
    /// `first` first.
    pub(crate) fn new(
        partitions: usize,
        first: usize,
        batch_bytes: usize,
        max_record_bytes: usize,
    ) -> Batcher {
        let partitions = partitions.max(1);
        Batcher {
            batches: (0..partitions).map(|_| Batch::default()).collect(),
            current: first % partitions,
            batch_bytes,
            max_record_bytes,
        }
    }

    /// How many partitions there are.
    pub(crate) fn partitions(&self) -> usize {
        self.batches.len()
    }

    /// The time records are stamped with: now, in milliseconds.
    pub(crate) fn now_ms() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// Adds `input`, stamped `timestamp`; returns its partition when its
    /// batch is full (to be taken and sent).
    pub(crate) fn push(
        &mut self,
        input: KafkaRecord,
        timestamp: i64,
    ) -> Result<Option<usize>, Refused> {
        let size = input.size();
        if size > self.max_record_bytes {
            return Err(Refused::TooLarge(size));
        }
        let count = self.batches.len();
        let partition = match (input.partition, &input.key) {
            (Some(named), _) => usize::try_from(named)
                .ok()
                .filter(|p| *p < count)
                .ok_or(Refused::NoPartition(named, count))?,
            (None, Some(key)) => partition_of_key(key, count),
            (None, None) => self.current,
        };
        let batch = &mut self.batches[partition];
        batch.bytes += size;
        let mut out = record(
            input.key.map(Bytes::from),
            input.value.map(Bytes::from),
            input.timestamp.unwrap_or(timestamp),
        );
        out.headers = input
            .headers
            .into_iter()
            .map(|h| (StrBytes::from_string(h.key), h.value))
            .collect();
        batch.records.push(out);
        Ok((batch.bytes >= self.batch_bytes).then_some(partition))
    }

    /// Takes the records of `partition`; records without a key go on to
    /// the next partition when this one was theirs.
    pub(crate) fn take(&mut self, partition: usize) -> Vec<Record> {
        let batch = std::mem::take(&mut self.batches[partition]);
        if partition == self.current && !batch.records.is_empty() {
            self.current = (self.current + 1) % self.batches.len();
        }
        batch.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_in_their_partition_and_records_without_move_on() {
        let mut batcher = Batcher::new(3, 1, 100, 1000);
        assert_eq!(batcher.push(KafkaRecord::new("a"), 0), Ok(None));
        let full = batcher.push(KafkaRecord::new(vec![b'x'; 90]), 0);
        assert_eq!(full, Ok(Some(1)), "the current partition's batch is full");
        assert_eq!(batcher.take(1).len(), 2);
        assert_eq!(batcher.push(KafkaRecord::new("b"), 0), Ok(None));
        assert_eq!(batcher.take(2).len(), 1, "moved on to the next partition");
        let keyed = KafkaRecord::new("c").with_key("21");
        batcher.push(keyed.clone(), 0).expect("small");
        let partition = partition_of_key(b"21", 3);
        assert_eq!(batcher.take(partition).len(), 1);
        assert!((0..3).all(|p| batcher.take(p).is_empty()));
        assert_eq!(
            batcher.push(KafkaRecord::new(vec![0; 2000]), 0),
            Err(Refused::TooLarge(2024))
        );
        let other = (partition + 1) % 3;
        let named = KafkaRecord::new("c")
            .with_key("21")
            .with_partition(other as i32);
        assert_eq!(batcher.push(named, 0), Ok(None));
        assert_eq!(
            batcher.take(other).len(),
            1,
            "a named partition wins over the key's"
        );
        let refused = batcher.push(KafkaRecord::new("d").with_partition(3), 0);
        assert_eq!(refused, Err(Refused::NoPartition(3, 3)));
        assert!(Refused::NoPartition(3, 3)
            .message("t", "")
            .contains("0 to 2"));
    }
}
