//! The idempotency keys of one reader's partitions as its checkpoints store
//! them: sealed segments shared between checkpoints, so that a checkpoint
//! costs the keys added since the last one, not every key retained.
//!
//! This module keeps a reader's log ([`KeyLog`]: which segments it seals,
//! merges, writes again and drops) and stores it ([`KeyCodec`], format 4).
//! A segment, its records and the log's state as a checkpoint holds it
//! (`Segment`, `LogState`) are module `keys`'s, with the key partitions
//! that read their keys from them.
//!
//! At each barrier the reader seals the keys its partitions assigned to the
//! checkpoint into one segment: a [`Chunk`], which checkpoint storage
//! writes once and later checkpoints name (`storage::shared`). A segment's
//! level is the number of times [`FANOUT`] goes into its key count (1 to 7
//! keys: level 0, 8 to 63: level 1, and so on). When the newest segments
//! of a level below [`MERGED_LEVELS`] or lower hold `FANOUT` of that level,
//! they merge into one (their live keys copied, the gone ones left out),
//! so a reader keeps under `FANOUT` segments per level, and each key is
//! copied about once per level. Segments of 4 096 keys and more never merge: a merge copies at
//! most 32 767 keys (about 1.2 MB), so no checkpoint pays for rewriting
//! the whole table; they go when their keys expire. A segment with no
//! live key left is dropped; one that lost half of its keys is written
//! again.
//!
//! Keys that expire are not recorded as gone: a segment may still hold keys
//! the table forgot by age or by count, and a restore brings them back
//! until the table's next expiry forgets them again. Every such key is one
//! whose records were committed, so answering a retry of it is right. The
//! keys of a checkpoint whose commit lost output are another matter: they
//! must never come back, so the log keeps those checkpoints (`forgotten`)
//! while a segment may hold keys of them, and a restore leaves their keys
//! out.
//!
//! # The stored format (format 4 of the keys)
//!
//! The splits of a reader are stored as the blob envelope of version 2 (the
//! default codec writes version 1: formats 1 to 3 of each partition) around
//! a header, followed by the segments' bytes and the loose keys' bytes:
//!
//! ```text
//! envelope v2 | header (bincode) | segment 0 | segment 1 | … | loose keys
//! header: (of, partitions, forgotten checkpoints,
//!          segments: [(keys, first checkpoint, last checkpoint, bytes)],
//!          loose keys, loose bytes)
//! segment, loose keys: records (partition: u32, key as format 3 encodes it)
//! ```
//!
//! Each segment is a sealed chunk; the header and the loose keys (assigned
//! and not sealed yet: normally none) are inline. Every length and count is
//! checked against the bytes, and every record decoded bounded.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sink_api::{
    decode_bincode_bounded, serialize_versioned, split_versioned, BincodeSerializer, CheckpointId,
    SerializerError, VersionedSerializer,
};

use super::keys::{
    decode_records, encode_key, KeyPartition, KeyTable, LogState, Segment, SegmentId, StoredKey,
    StoredKeyRef, RECORD_ENCODING,
};
use crate::source::SplitCodec;
use crate::storage::{Chunk, Piece, StateBytes};

/// How many segments of one level merge into one of the next.
pub(crate) const FANOUT: usize = 8;

/// Levels whose segments merge: 0 to 3, segments of up to 4 095 keys.
pub(crate) const MERGED_LEVELS: u32 = 4;

/// The level of a segment of `keys` keys: how many times [`FANOUT`] goes
/// into it.
fn level_of(keys: u32) -> u32 {
    let mut level = 0;
    let mut left = keys / FANOUT as u32;
    while left > 0 {
        level += 1;
        left /= FANOUT as u32;
    }
    level
}

/// The smallest segment written again alone when half of its keys are gone:
/// smaller ones wait for their merge.
const MIN_REWRITE: u32 = 64;

/// The envelope version of format 4 (version 1: the default codec's).
const LOG_VERSION: u32 = 2;

/// The segments of one reader's keys, with how many live keys each holds.
#[derive(Debug, Default)]
pub(crate) struct KeyLog {
    /// Oldest first; ids increase.
    segments: Vec<(Segment, u32)>,
    next_id: SegmentId,
    forgotten: BTreeSet<CheckpointId>,
}

impl KeyLog {
    /// The log of a restore that keeps `state`: `tables` hold its keys, with
    /// its segments' ids.
    pub(super) fn adopt<'t>(
        state: &LogState,
        tables: impl Iterator<Item = &'t KeyTable>,
    ) -> KeyLog {
        let mut live = HashMap::new();
        for table in tables {
            table.count_segments(&mut live);
        }
        let segments: Vec<(Segment, u32)> = (state.segments.iter())
            .map(|segment| (segment.clone(), live.get(&segment.id).copied().unwrap_or(0)))
            .collect();
        let next_id = segments.iter().map(|(s, _)| s.id + 1).max().unwrap_or(0);
        let mut log = KeyLog {
            segments,
            next_id,
            forgotten: state.forgotten.clone(),
        };
        log.segments.retain(|(_, live)| *live > 0);
        log.prune_forgotten();
        log
    }

    /// Seals the keys `tables` assigned and did not seal yet into a new
    /// segment, then merges, rewrites and drops segments as the module
    /// documentation says. Called by the reader at every barrier, after
    /// the tables assigned the checkpoint.
    pub(super) fn seal(&mut self, tables: &mut std::collections::BTreeMap<u32, KeyTable>) {
        self.release(tables);
        let id = self.next_id;
        let mut bytes = Vec::new();
        let (mut keys, mut first, mut last) = (0, CheckpointId(u64::MAX), CheckpointId::NONE);
        for table in tables.values_mut() {
            let (count, oldest, newest) = table.seal_into(&mut bytes, id);
            keys += count;
            first = first.min(oldest);
            last = last.max(newest);
        }
        if keys > 0 {
            self.next_id += 1;
            let segment = Segment {
                id,
                chunk: Chunk::seal(bytes),
                keys,
                first,
                last,
            };
            self.segments.push((segment, keys));
        }
        self.maintain(tables);
    }

    /// Counts the keys `tables` removed out of their segments.
    pub(super) fn release(&mut self, tables: &mut std::collections::BTreeMap<u32, KeyTable>) {
        let mut released: HashMap<SegmentId, u32> = HashMap::new();
        for table in tables.values_mut() {
            for id in table.take_released() {
                *released.entry(id).or_default() += 1;
            }
        }
        if released.is_empty() {
            return;
        }
        // Few segments, not in id order once one was written again.
        for (segment, live) in &mut self.segments {
            if let Some(gone) = released.get(&segment.id) {
                *live = live.saturating_sub(*gone);
            }
        }
    }

    /// After a commit lost output: writes again every segment that holds
    /// a key the tables no longer hold, so that no older copy of a key
    /// of the lost checkpoint (one that expired before the key was
    /// accepted again) stays stored to come back at a restore. Rare: a
    /// pass over the kept keys.
    pub(super) fn compact(&mut self, tables: &mut std::collections::BTreeMap<u32, KeyTable>) {
        self.release(tables);
        let old = std::mem::take(&mut self.segments);
        for (segment, live) in old {
            if live >= segment.keys {
                self.segments.push((segment, live));
                continue;
            }
            match self.rewrite(std::slice::from_ref(&(segment.clone(), live)), tables) {
                Ok(Some(new)) => self.segments.push(new),
                Ok(None) => {}
                Err(()) => self.segments.push((segment, live)),
            }
        }
        self.prune_forgotten();
    }

    /// The keys of `checkpoint` are gone for good (its commit lost output):
    /// a restore must never bring them back.
    pub(super) fn forget(&mut self, checkpoint: CheckpointId) {
        self.forgotten.insert(checkpoint);
    }

    /// The log as a checkpoint stores it, for the reader's `partitions`.
    pub(super) fn state(&self, partitions: BTreeSet<u32>) -> LogState {
        LogState::new(
            partitions,
            self.forgotten.clone(),
            self.segments.iter().map(|(s, _)| s.clone()).collect(),
        )
    }

    fn maintain(&mut self, tables: &mut std::collections::BTreeMap<u32, KeyTable>) {
        self.segments.retain(|(_, live)| *live > 0);
        // Merge the newest segments of level `level` or below once FANOUT
        // of them are of level `level`, the lowest levels first:
        // checkpoints of varying size seal segments of varying levels, so
        // a run of one exact level would rarely form, and a run counted
        // by any level below would copy its oldest, largest member again
        // and again.
        'merging: loop {
            for level in 0..MERGED_LEVELS {
                let levels = (self.segments.iter().rev())
                    .map(|(s, _)| level_of(s.keys))
                    .take_while(|l| *l <= level);
                let (run, at_level) = levels.fold((0, 0), |(run, at), l| {
                    (run + 1, at + usize::from(l == level))
                });
                if at_level < FANOUT {
                    continue;
                }
                let merged = self.segments.split_off(self.segments.len() - run);
                match self.rewrite(&merged, tables) {
                    Ok(Some(segment)) => self.segments.push(segment),
                    Ok(None) => {}
                    Err(()) => {
                        self.segments.extend(merged);
                        break 'merging;
                    }
                }
                continue 'merging;
            }
            break;
        }
        // Write a segment that lost half of its keys again, alone.
        let mut at = 0;
        while at < self.segments.len() {
            let (segment, live) = &self.segments[at];
            if segment.keys >= MIN_REWRITE && live * 2 < segment.keys {
                let old = self.segments.remove(at);
                match self.rewrite(std::slice::from_ref(&old), tables) {
                    Ok(Some(segment)) => {
                        self.segments.insert(at, segment);
                        at += 1;
                    }
                    Ok(None) => {}
                    Err(()) => {
                        self.segments.insert(at, old);
                        at += 1;
                    }
                }
            } else {
                at += 1;
            }
        }
        self.prune_forgotten();
    }

    /// One new segment holding the live keys of `old`, in their
    /// order; `None` when none is live. `Err` when a segment of `old` does
    /// not decode (it was sealed by this process or checked when read
    /// back, so never, short of a bug): the caller keeps `old` as it is,
    /// and no table has been changed.
    fn rewrite(
        &mut self,
        old: &[(Segment, u32)],
        tables: &mut std::collections::BTreeMap<u32, KeyTable>,
    ) -> Result<Option<(Segment, u32)>, ()> {
        let decoded: Vec<(SegmentId, Vec<(u32, StoredKey)>)> = (old.iter())
            .map(|(segment, _)| {
                decode_records(u64::from(segment.keys), segment.chunk.bytes())
                    .map(|records| (segment.id, records))
            })
            .collect::<Result<_, _>>()
            .map_err(|_| ())?;
        let id = self.next_id;
        self.next_id += 1;
        let mut bytes = Vec::new();
        let (mut keys, mut first, mut last) = (0u32, CheckpointId(u64::MAX), CheckpointId::NONE);
        for (segment_id, records) in decoded {
            for (partition, key) in records {
                let checkpoint = CheckpointId(key.checkpoint);
                let Some(table) = tables.get_mut(&partition) else {
                    continue;
                };
                if table.reseal(&key.key, checkpoint, segment_id, id, &mut bytes) {
                    keys += 1;
                    first = first.min(checkpoint);
                    last = last.max(checkpoint);
                }
            }
        }
        Ok((keys > 0).then(|| {
            let segment = Segment {
                id,
                chunk: Chunk::seal(bytes),
                keys,
                first,
                last,
            };
            (segment, keys)
        }))
    }

    /// Forgets the forgotten checkpoints no segment may hold keys of.
    fn prune_forgotten(&mut self) {
        let segments = &self.segments;
        self.forgotten.retain(|checkpoint| {
            segments
                .iter()
                .any(|(s, _)| s.first <= *checkpoint && *checkpoint <= s.last)
        });
    }

    /// How many segments it keeps.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.segments.len()
    }
}

/// The header of format 4.
#[derive(Debug, Serialize, Deserialize)]
struct StoredLog {
    of: u32,
    partitions: Vec<u32>,
    forgotten: Vec<u64>,
    segments: Vec<StoredSegment>,
    loose_keys: u64,
    loose_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredSegment {
    keys: u32,
    first: u64,
    last: u64,
    bytes: u64,
}

/// The pipeline source's [`SplitCodec`]: format 4 (see the module
/// documentation); reads formats 1 to 3 (the default codec's) too.
#[derive(Debug, Default)]
pub(crate) struct KeyCodec;

impl KeyPartition {
    /// How the pipeline stores a reader's key partitions in checkpoints
    /// (format 4; formats 1 to 3 are read): its source's [`SplitCodec`],
    /// for tools and tests that read stored state.
    pub fn codec() -> Arc<dyn SplitCodec<KeyPartition>> {
        Arc::new(KeyCodec)
    }
}

impl SplitCodec<KeyPartition> for KeyCodec {
    fn encode(&self, splits: &[KeyPartition]) -> Result<StateBytes, SerializerError> {
        let encode_error = |message: String| SerializerError::Encode {
            what: "the pipeline's key partitions",
            message,
        };
        let of = splits.first().map_or(0, |split| split.of);
        let mut logs: Vec<&Arc<LogState>> = Vec::new();
        for log in splits.iter().filter_map(|split| split.log.as_ref()) {
            if !logs.iter().any(|seen| Arc::ptr_eq(seen, log)) {
                logs.push(log);
            }
        }
        let mut loose = Vec::new();
        let mut loose_keys = 0;
        for split in splits {
            let (count, encoded) = split.loose();
            if count == 0 {
                continue;
            }
            let keys = super::keys::decode_keys(count, encoded).map_err(encode_error)?;
            for key in keys {
                let entry_bytes = StoredKeyRef {
                    key: &key.key,
                    checkpoint: key.checkpoint,
                    accepted_at_ms: key.accepted_at_ms,
                    fingerprint: key.fingerprint,
                };
                let _ = bincode::encode_into_std_write(split.index, &mut loose, RECORD_ENCODING);
                encode_key(&mut loose, entry_bytes);
                loose_keys += 1;
            }
        }
        let segments: Vec<&Segment> = logs.iter().flat_map(|log| log.segments.iter()).collect();
        let header = StoredLog {
            of,
            partitions: splits.iter().map(|split| split.index).collect(),
            forgotten: (logs.iter())
                .flat_map(|log| log.forgotten.iter().map(|c| c.0))
                .collect::<BTreeSet<u64>>()
                .into_iter()
                .collect(),
            segments: (segments.iter())
                .map(|s| StoredSegment {
                    keys: s.keys,
                    first: s.first.0,
                    last: s.last.0,
                    bytes: s.chunk.bytes().len() as u64,
                })
                .collect(),
            loose_keys,
            loose_bytes: loose.len() as u64,
        };
        let mut stored = StateBytes::from(serialize_versioned(
            &BincodeSerializer::<StoredLog>::new(LOG_VERSION),
            &header,
        )?);
        for segment in segments {
            stored.push_chunk(segment.chunk.clone());
        }
        stored.push_inline(&loose);
        Ok(stored)
    }

    fn decode(&self, stored: &StateBytes) -> Result<Vec<KeyPartition>, SerializerError> {
        let bytes = stored.to_vec();
        let (version, payload) = split_versioned::<Vec<KeyPartition>>(&bytes)?;
        if version != LOG_VERSION {
            // Formats 1 to 3, one partition at a time.
            return BincodeSerializer::<Vec<KeyPartition>>::new(1).deserialize(version, payload);
        }
        let decode_error = |message: String| SerializerError::Decode {
            what: "the pipeline's key partitions",
            version,
            message,
        };
        let (header, read): (StoredLog, usize) =
            decode_bincode_bounded(payload).map_err(decode_error)?;
        // The chunks among the pieces, by where they start.
        let mut chunks: HashMap<usize, &Chunk> = HashMap::new();
        let mut offset = 0;
        for piece in stored.pieces() {
            match piece {
                Piece::Inline(inline) => offset += inline.len(),
                Piece::Chunk(chunk) => {
                    chunks.insert(offset, chunk);
                    offset += chunk.bytes().len();
                }
            }
        }
        let mut at = bytes.len() - payload.len() + read;
        let mut take = |len: u64, what: &str| -> Result<(usize, usize), SerializerError> {
            let end = usize::try_from(len)
                .ok()
                .and_then(|len| at.checked_add(len))
                .filter(|end| *end <= bytes.len())
                .ok_or_else(|| {
                    decode_error(format!(
                        "{what} says it holds {len} bytes, past the end of the stored keys"
                    ))
                })?;
            let range = (at, end);
            at = end;
            Ok(range)
        };
        let mut segments = Vec::with_capacity(header.segments.len());
        for (index, stored_segment) in header.segments.iter().enumerate() {
            let (start, end) = take(stored_segment.bytes, &format!("segment {index}"))?;
            let chunk = match chunks.get(&start) {
                Some(chunk) if chunk.bytes().len() == end - start => (*chunk).clone(),
                _ => Chunk::seal(bytes[start..end].to_vec()),
            };
            segments.push(Segment {
                id: index as SegmentId,
                chunk,
                keys: stored_segment.keys,
                first: CheckpointId(stored_segment.first),
                last: CheckpointId(stored_segment.last),
            });
        }
        let (start, end) = take(header.loose_bytes, "the loose keys")?;
        if end != bytes.len() {
            return Err(decode_error(format!(
                "{} bytes follow the stored keys",
                bytes.len() - end
            )));
        }
        let loose = decode_records(header.loose_keys, &bytes[start..end])
            .map_err(|why| decode_error(format!("the loose keys: {why}")))?;
        let partitions: BTreeSet<u32> = header.partitions.iter().copied().collect();
        if partitions.len() != header.partitions.len() {
            return Err(decode_error("a partition is named twice".into()));
        }
        let state = Arc::new(LogState::new(
            partitions,
            header.forgotten.into_iter().map(CheckpointId).collect(),
            segments,
        ));
        // Every segment read once, now: damage is refused when the
        // checkpoint is read, not when a table is built.
        state.keys_of(0).map_err(decode_error)?;
        let mut loose_of: HashMap<u32, Vec<StoredKey>> = HashMap::new();
        for (partition, key) in loose {
            if !state.forgotten.contains(&CheckpointId(key.checkpoint)) {
                loose_of.entry(partition).or_default().push(key);
            }
        }
        Ok((header.partitions.iter())
            .map(|&index| {
                let keys = loose_of.remove(&index).unwrap_or_default();
                let mut partition = super::keys::encoded_partition(index, header.of, &keys);
                partition.log = Some(state.clone());
                partition
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::pipeline::keys::KeyNamespaces;

    fn tables(partitions: &[u32], of: u32) -> BTreeMap<u32, KeyTable> {
        (partitions.iter())
            .map(|&index| {
                let empty = KeyPartition::empty(index, of);
                (
                    index,
                    KeyTable::restore(empty, KeyNamespaces::Single).unwrap(),
                )
            })
            .collect()
    }

    /// The reader's snapshot: what `snapshot_splits` returns.
    fn snapshot(log: &KeyLog, tables: &BTreeMap<u32, KeyTable>) -> Vec<KeyPartition> {
        let state = Arc::new(log.state(tables.keys().copied().collect()));
        (tables.values())
            .map(|t| KeyPartition::logged(t.index(), t.of(), state.clone(), t.loose()))
            .collect()
    }

    /// Keys `k<n>` into the partition `n % of` of `tables`.
    fn accept(tables: &mut BTreeMap<u32, KeyTable>, range: std::ops::Range<u64>, of: u32) {
        for n in range {
            let key = format!("k{n}");
            if let Some(table) = tables.get_mut(&((n % u64::from(of)) as u32)) {
                table.accept(key, None, n);
            }
        }
    }

    fn barrier(log: &mut KeyLog, tables: &mut BTreeMap<u32, KeyTable>, checkpoint: u64) {
        for table in tables.values_mut() {
            table.assign(CheckpointId(checkpoint));
        }
        log.seal(tables);
    }

    /// The keys a restore from `stored` gives each partition, sorted.
    fn restored(stored: &StateBytes) -> BTreeMap<u32, Vec<String>> {
        (KeyCodec.decode(stored).unwrap().into_iter())
            .map(|partition| {
                let index = partition.index;
                let table = KeyTable::restore(partition, KeyNamespaces::Single).unwrap();
                let mut keys = table.keys();
                keys.sort();
                (index, keys)
            })
            .collect()
    }

    /// A checkpoint stores the keys added since the last one (a new
    /// segment), and names the older segments again: a restore reads every
    /// key once, in its partition.
    #[test]
    fn a_checkpoint_seals_only_the_keys_added_since_the_last() {
        let of = 4;
        let mut tables = tables(&[1, 3], of);
        let mut log = KeyLog::default();
        accept(&mut tables, 0..40, of);
        barrier(&mut log, &mut tables, 1);
        let first = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        accept(&mut tables, 40..44, of);
        barrier(&mut log, &mut tables, 2);
        let second = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        let first_chunks: Vec<_> = first.chunks().map(Chunk::id).collect();
        let second_chunks: Vec<_> = second.chunks().map(Chunk::id).collect();
        assert_eq!(
            second_chunks[..1],
            first_chunks[..],
            "the old segment is named again"
        );
        assert_eq!(second_chunks.len(), 2);
        let new_bytes = second.chunks().last().unwrap().bytes().len();
        assert!(new_bytes < first.chunks().next().unwrap().bytes().len() / 5);
        let header_growth = second.inline_len() - first.inline_len();
        assert!(
            header_growth < 10,
            "one more segment in the header: {header_growth} bytes"
        );

        let read = restored(&second);
        assert_eq!(read.len(), 2);
        let mut expected: Vec<String> = (0..44)
            .filter(|n| n % 4 == 1)
            .map(|n| format!("k{n}"))
            .collect();
        expected.sort();
        assert_eq!(read[&1], expected);
        assert_eq!(read[&3].len(), 11);
    }

    #[test]
    fn a_segment_s_level_is_how_many_times_fanout_goes_into_its_keys() {
        let levels: Vec<u32> = [1, 7, 8, 63, 64, 511, 512, 4095, 4096, 40_000]
            .map(level_of)
            .to_vec();
        assert_eq!(levels, [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]);
    }

    /// Every FANOUT segments of one level merge into one of the next,
    /// keeping only the keys the tables still hold; segments without one
    /// go. However many checkpoints, the log keeps few segments.
    #[test]
    fn segments_merge_by_level_and_drop_what_the_tables_forgot() {
        let of = 2;
        let mut tables = tables(&[0, 1], of);
        let mut log = KeyLog::default();
        for checkpoint in 1..=600u64 {
            let first = checkpoint * 10;
            accept(&mut tables, first..first + 10, of);
            barrier(&mut log, &mut tables, checkpoint);
            for table in tables.values_mut() {
                // Keep 500 keys per partition.
                table.expire(CheckpointId(checkpoint), 500, Duration::from_secs(3600), 0);
            }
            log.release(&mut tables);
        }
        assert!(log.len() <= 3 * FANOUT, "{} segments", log.len());
        let stored = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        let read = restored(&stored);
        // At least the live keys, and never more than twice as many.
        for (index, table) in &tables {
            let live: BTreeSet<String> = table.keys().into_iter().collect();
            let back: BTreeSet<String> = read[index].iter().cloned().collect();
            assert!(back.is_superset(&live), "partition {index}");
            assert!(back.len() <= 2 * live.len() + FANOUT * 10, "{}", back.len());
        }
        assert!(
            stored.len() < 2 * 1000 * 20 + 4096,
            "{} bytes",
            stored.len()
        );
    }

    /// The keys of a checkpoint whose commit lost output never come back,
    /// though a segment still holds them.
    #[test]
    fn keys_of_a_lost_checkpoint_never_come_back() {
        let of = 1;
        let mut tables = tables(&[0], of);
        let mut log = KeyLog::default();
        accept(&mut tables, 0..5, of);
        barrier(&mut log, &mut tables, 1);
        accept(&mut tables, 5..10, of);
        barrier(&mut log, &mut tables, 2);
        for table in tables.values_mut() {
            table.forget_checkpoint(CheckpointId(2));
        }
        log.forget(CheckpointId(2));
        log.compact(&mut tables);
        let stored = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        assert_eq!(restored(&stored)[&0], ["k0", "k1", "k2", "k3", "k4"]);
        // Also after the segments merge and the loss is forgotten.
        for checkpoint in 3..3 + FANOUT as u64 * 2 {
            barrier(&mut log, &mut tables, checkpoint);
        }
        let stored = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        assert_eq!(restored(&stored)[&0].len(), 5);
    }

    /// A key that expired, was accepted again and lost with its checkpoint
    /// does not come back through its older, expired copy (the segment
    /// that held it is written again at the loss).
    #[test]
    fn an_expired_copy_of_a_lost_key_does_not_come_back() {
        let of = 1;
        let mut tables = tables(&[0], of);
        let mut log = KeyLog::default();
        accept(&mut tables, 0..100, of);
        barrier(&mut log, &mut tables, 1);
        // k0..k49 expire by count; their segment keeps half of its keys.
        for table in tables.values_mut() {
            table.expire(CheckpointId(1), 50, Duration::from_secs(3600), 0);
        }
        log.release(&mut tables);
        tables.get_mut(&0).unwrap().accept("k0".into(), None, 200);
        barrier(&mut log, &mut tables, 2);
        // The commit of 2 lost output: k0 must be written again.
        tables
            .get_mut(&0)
            .unwrap()
            .forget_checkpoint(CheckpointId(2));
        log.forget(CheckpointId(2));
        log.compact(&mut tables);
        for checkpoint in 3..3 + FANOUT as u64 {
            barrier(&mut log, &mut tables, checkpoint);
        }
        let stored = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        let back = restored(&stored);
        assert!(
            !back[&0].contains(&"k0".to_string()),
            "{:?}",
            &back[&0][..5]
        );
        assert_eq!(back[&0].len(), 50);
    }

    /// Releases reach a segment written again in the middle of the log
    /// (its id then out of order), which goes once its keys do.
    #[test]
    fn a_segment_written_again_still_counts_its_keys_out() {
        let of = 1;
        let mut tables = tables(&[0], of);
        let mut log = KeyLog::default();
        accept(&mut tables, 0..200, of);
        barrier(&mut log, &mut tables, 1);
        accept(&mut tables, 200..210, of);
        barrier(&mut log, &mut tables, 2);
        // 150 of the first 200 go: their segment is written again, in
        // first place, with the newest id.
        for table in tables.values_mut() {
            table.expire(CheckpointId(2), 60, Duration::from_secs(3600), 0);
        }
        log.release(&mut tables);
        barrier(&mut log, &mut tables, 3);
        assert_eq!(log.len(), 2);
        // Then all of its keys go: it is dropped.
        for table in tables.values_mut() {
            table.expire(CheckpointId(3), 10, Duration::from_secs(3600), 0);
        }
        log.release(&mut tables);
        barrier(&mut log, &mut tables, 4);
        assert_eq!(log.len(), 1);
    }

    /// A restore keeps the stored segments (same chunks) when the reader
    /// has the same partitions: its next checkpoint writes nothing again.
    #[test]
    fn a_restore_with_the_same_partitions_keeps_the_segments() {
        let of = 2;
        let mut tables_before = tables(&[0, 1], of);
        let mut log = KeyLog::default();
        accept(&mut tables_before, 0..100, of);
        barrier(&mut log, &mut tables_before, 1);
        let stored = KeyCodec.encode(&snapshot(&log, &tables_before)).unwrap();
        let partitions = KeyCodec.decode(&stored).unwrap();
        let state = partitions[0].log.clone().unwrap();
        let mut tables: BTreeMap<u32, KeyTable> = (partitions.into_iter())
            .map(|p| {
                (
                    p.index,
                    KeyTable::restore(p, KeyNamespaces::Single).unwrap(),
                )
            })
            .collect();
        let mut log = KeyLog::adopt(&state, tables.values());
        barrier(&mut log, &mut tables, 2);
        let again = KeyCodec.encode(&snapshot(&log, &tables)).unwrap();
        let ids = |s: &StateBytes| s.chunks().map(Chunk::id).collect::<Vec<_>>();
        assert_eq!(ids(&again), ids(&stored));
    }

    /// Damaged format-4 bytes are refused with an error, never a panic.
    #[test]
    fn damaged_stored_keys_are_a_clear_error() {
        let of = 1;
        let mut tables = tables(&[0], of);
        let mut log = KeyLog::default();
        accept(&mut tables, 0..20, of);
        barrier(&mut log, &mut tables, 1);
        let bytes = KeyCodec.encode(&snapshot(&log, &tables)).unwrap().to_vec();
        for cut in [bytes.len() - 1, bytes.len() / 2, 10] {
            let error = KeyCodec
                .decode(&StateBytes::from(bytes[..cut].to_vec()))
                .unwrap_err();
            assert!(error.to_string().contains("key"), "{error}");
        }
        let mut flipped = bytes.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0xff;
        let _ = KeyCodec.decode(&StateBytes::from(flipped));
        // A header whose checkpoint range disagrees with the records.
        let mut header_lies = snapshot(&log, &tables);
        let state = header_lies[0].log.clone().unwrap();
        let mut segments = state.segments.clone();
        segments[0].last = CheckpointId(7);
        let lying = Arc::new(LogState::new(
            state.partitions.clone(),
            state.forgotten.clone(),
            segments,
        ));
        header_lies[0].log = Some(lying);
        let stored = KeyCodec.encode(&header_lies).unwrap();
        let error = KeyCodec.decode(&stored).unwrap_err();
        assert!(error.to_string().contains("checkpoints 1 to 7"), "{error}");
    }

    use std::time::Duration;
}
