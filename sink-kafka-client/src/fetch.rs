//! Fetched record batches, as a `read_committed` consumer sees them: the
//! data records of committed transactions (and of non-transactional
//! producers), without control records or the records of aborted
//! transactions.
//!
//! A fetch at isolation level `read_committed` returns a partition's
//! batches up to its last stable offset, with the transactions aborted in
//! that range (producer id, first offset); a producer's records are
//! dropped from its aborted transaction's first offset to its abort marker,
//! as Kafka's consumers do.

use std::collections::HashSet;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::records::RecordBatchDecoder;

use crate::{Header, WireError};

/// One data record of a committed transaction (or of a non-transactional
/// producer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Its offset in its partition.
    pub offset: i64,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value (`None`: a tombstone, null, not empty).
    pub value: Option<Bytes>,
    /// Its timestamp, in milliseconds since the epoch: when its producer
    /// made it, or when the broker appended it (the topic's
    /// `message.timestamp.type`).
    pub timestamp: i64,
    /// Its headers, in their order.
    pub headers: Vec<Header>,
}

/// An aborted transaction of a fetch answer: its producer and the first
/// offset of its records in the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Aborted {
    /// The transaction's first offset in the partition.
    pub first_offset: i64,
    /// Its producer id.
    pub producer_id: i64,
}

/// Where a `read_committed` reader of one partition's fetch answer stops:
/// its last stable offset, or its high watermark where the broker gives
/// none. Called by every reader of fetch answers (the sink's
/// `read_committed`, the Kafka source).
pub fn stable_end(answer: &PartitionData) -> i64 {
    match answer.last_stable_offset {
        offset if offset >= 0 => offset,
        _ => answer.high_watermark,
    }
}

/// The transactions a fetch answer of one partition says were aborted in
/// the range it returns, for [`committed_records`].
pub fn aborted(answer: &PartitionData) -> Vec<Aborted> {
    answer
        .aborted_transactions
        .iter()
        .flatten()
        .map(|a| Aborted {
            first_offset: a.first_offset,
            producer_id: a.producer_id.0,
        })
        .collect()
}

/// Decodes the batches in `bytes` (one partition's records of one fetch
/// answer), hands `keep` every committed data record at or after `from`
/// and before `end` (the partition's last stable offset), in offset
/// order, and returns the offset to fetch next: past the last record
/// decoded before `end`, control and aborted records included (`from`
/// when nothing was).
///
/// Called by readers of topics: the sink's `read_committed`, the Kafka
/// source. A batch that cannot be decoded is an error, never skipped.
pub fn committed_records(
    bytes: &mut Bytes,
    from: i64,
    end: i64,
    aborted: &[Aborted],
    mut keep: impl FnMut(FetchedRecord),
) -> Result<i64, WireError> {
    let mut aborted = aborted.to_vec();
    aborted.sort_unstable();
    let mut aborted = aborted.into_iter().peekable();
    let mut dropping: HashSet<i64> = HashSet::new();
    let mut next = from;
    let codec = crate::compression::codec_of_first_batch(bytes);
    let sets = RecordBatchDecoder::decode_all(bytes).map_err(|e| {
        WireError::Protocol(format!(
            "a fetched batch ({}) cannot be read: {e}",
            codec.map_or_else(
                || "too short to name its codec".into(),
                |c| format!("codec {c}")
            )
        ))
    })?;
    for set in sets {
        for record in set.records {
            if record.offset < from {
                continue;
            }
            if record.offset >= end {
                return Ok(next);
            }
            next = record.offset + 1;
            while let Some(first) = aborted.next_if(|a| a.first_offset <= record.offset) {
                dropping.insert(first.producer_id);
            }
            if record.control {
                // An abort marker (type 0) ends the producer's aborted
                // transaction.
                let is_abort = record
                    .key
                    .as_ref()
                    .is_some_and(|k| k.len() >= 4 && k[2] == 0 && k[3] == 0);
                if is_abort {
                    dropping.remove(&record.producer_id);
                }
                continue;
            }
            if record.transactional && dropping.contains(&record.producer_id) {
                continue;
            }
            keep(FetchedRecord {
                offset: record.offset,
                key: record.key,
                value: record.value,
                timestamp: record.timestamp,
                headers: record
                    .headers
                    .into_iter()
                    .map(|(key, value)| Header {
                        key: key.to_string(),
                        value,
                    })
                    .collect(),
            });
        }
    }
    Ok(next)
}
