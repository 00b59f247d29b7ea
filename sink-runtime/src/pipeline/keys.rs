//! Idempotency keys: which keyed sends a pipeline accepted, kept in its
//! checkpoints next to the output they stand for.
//!
//! Keys are spread over a fixed number of key partitions by the CRC32C of
//! the key, and each partition is one split of the pipeline's source, so a
//! partition's keys are snapshotted by the subtask that wrote their records,
//! at the same barrier. A restore therefore brings back exactly the keys
//! whose records the restored checkpoint commits: a key that the restored
//! state knows has its records in the output, and a key it does not know has
//! none of them there (they were after the checkpoint and are not committed).
//!
//! A key is remembered while its records wait for their commit, and after
//! it for the [`KeyRetention`] window. An expired key is forgotten: a send
//! repeated after that is written again. That is the limit of the guarantee.
//!
//! The count of that window is a budget per namespace ([`KeyNamespaces`]):
//! a key's namespace is derived from the key itself (for the
//! `ingest-service` example, its tenant: keys there are `<tenant>/<key>`),
//! and a namespace over its budget forgets its own oldest committed keys,
//! never another namespace's. Since the namespace is a function of the key
//! and of the pipeline's setting, it is not stored: a restore derives it
//! again, and the stored format does not depend on it.
//!
//! A key may carry a [`Fingerprint`] of the send's content (the service's
//! hash of its request). It is kept with the key, in memory and in the
//! checkpoints, and a send that repeats a known key with another fingerprint
//! is refused: it is not the retry it claims to be.
//!
//! # The stored format
//!
//! A partition is stored (by the runtime's bincode split serializer) as a
//! tuple. Format 1 was `(index, of, keys)` with keys of `(key, checkpoint,
//! accepted_at_ms)`; format 2 starts with a marker that no format-1 index can
//! be (`u32::MAX`; indexes are below 65 536) and the version:
//! `(u32::MAX, 2, index, of, keys)` with keys of `(key, checkpoint,
//! accepted_at_ms, fingerprint)`. Format 3 keeps the keys of format 2 but
//! as one byte string: `(u32::MAX, 3, index, of, count, bytes)`, where
//! `bytes` are the `count` keys, oldest first, each encoded with bincode 2's
//! standard configuration as the tuple `(key, checkpoint, accepted_at_ms,
//! fingerprint)`. Formats 1 to 3 are read: format-1 keys come back without
//! a fingerprint. Another version is refused with a clear error.
//!
//! Format 4 is not a partition's but a reader's: the pipeline's source
//! stores the keys of all of a reader's partitions as sealed segments
//! shared between checkpoints (module `key_log`), so that a checkpoint
//! writes the keys added since the last one, not every key it holds (format
//! 3 copied them all: about 4 MB at 100 000 keys). A partition's serde form
//! stays format 3, for a source that stores the splits with the default
//! codec.
//!
//! A partition taken at a snapshot, or read back from format 4, holds its
//! keys in those segments: it refers to its reader's log as the checkpoint
//! stores it ([`LogState`]), and reads its keys from its [`Segment`]s,
//! whose records (the partition's index, then the key as format 3 encodes
//! it) are written and read here. Which segments a reader keeps (sealing,
//! merging, writing again) and format 4 itself are module `key_log`'s.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sink_api::CheckpointId;

use crate::storage::Chunk;

/// The most key partitions a pipeline may have.
pub(crate) const MAX_KEY_PARTITIONS: u32 = 65_536;

/// The first field of a stored partition from format 2 on: no format-1
/// partition index can be this (they are below [`MAX_KEY_PARTITIONS`]).
const FORMAT_MARKER: u32 = u32::MAX;

/// The format [`KeyPartition`] is written in: 2 since keys carry
/// fingerprints, 3 since they are stored as one byte string.
const FORMAT_VERSION: u32 = 3;

/// The bincode configuration of the keys of a format-3 partition: fixed, so
/// that every build reads what another wrote (the one
/// [`sink_api::decode_bincode_bounded`] reads).
const KEY_ENCODING: bincode::config::Configuration = bincode::config::standard();

/// A fingerprint of what a keyed send carries, to tell a retry (the same
/// content under the same key) from a key reused for other content.
///
/// Made by the caller of [`Pipeline::send_keyed`](super::Pipeline::send_keyed)
/// (the `ingest-service` example: the first 16 bytes of the SHA-256 of the
/// request body) and given with the key in an [`IdempotencyKey`]. The
/// pipeline only compares fingerprints for equality and keeps them in its
/// checkpoints, so they must be computed the same way in every process and
/// every build that may share the checkpoint storage: a stable hash of the
/// content, never `std`'s randomly seeded hasher.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint([u8; 16]);

impl Fingerprint {
    /// The fingerprint made of these 16 bytes (for example a truncated
    /// cryptographic hash of the content).
    pub const fn new(bytes: [u8; 16]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// Its 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    /// Lower-case hex, 32 digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// An idempotency key, and optionally a [`Fingerprint`] of the content sent
/// under it: what [`Pipeline::send_keyed`](super::Pipeline::send_keyed) and
/// [`Pipeline::try_send_keyed`](super::Pipeline::try_send_keyed) take.
///
/// Two sends with the same key are the same send (the second is answered,
/// not written) when their fingerprints are equal, or when either has none
/// (then the key alone decides, as for [`Pipeline::send`](super::Pipeline::send)'s
/// plain keys, and for keys restored from a format-1 checkpoint). With two
/// different fingerprints, the second send is refused with
/// [`TicketError::KeyReused`](super::TicketError::KeyReused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    key: String,
    fingerprint: Option<Fingerprint>,
}

impl IdempotencyKey {
    /// The key alone, without a fingerprint.
    pub fn new(key: impl Into<String>) -> IdempotencyKey {
        IdempotencyKey {
            key: key.into(),
            fingerprint: None,
        }
    }

    /// The key with the fingerprint of the content sent under it.
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> IdempotencyKey {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fingerprint, if one was given.
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.fingerprint
    }
}

impl From<String> for IdempotencyKey {
    /// The key alone, without a fingerprint.
    fn from(key: String) -> IdempotencyKey {
        IdempotencyKey::new(key)
    }
}

impl From<&str> for IdempotencyKey {
    /// The key alone, without a fingerprint.
    fn from(key: &str) -> IdempotencyKey {
        IdempotencyKey::new(key)
    }
}

/// How long a committed idempotency key is remembered.
///
/// Given to [`PipelineBuilder::key_retention`](super::PipelineBuilder::key_retention).
/// A committed key is forgotten once it is older than `max_age` (counted
/// from when it was accepted), or once its key partition holds more than
/// `max_keys / key_partitions` (rounded up) newer keys *of its namespace*
/// ([`KeyNamespaces`]), whichever comes first. Keys of other namespaces never
/// count against it: one namespace's new keys cannot push out another's.
/// Keys whose records are not committed yet are never forgotten.
///
/// Memory: at most about `max_keys` committed keys per namespace that holds
/// keys (exactly, at most `key_partitions` × `max_keys / key_partitions`
/// rounded up), plus the keys of sends not committed yet. With the default
/// single namespace, that is `max_keys` for the whole pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRetention {
    /// About how many committed keys are kept per namespace, over all
    /// partitions (with [`KeyNamespaces::Single`], over the whole pipeline).
    pub max_keys: usize,
    /// How long after it was accepted a committed key is kept.
    pub max_age: Duration,
}

impl Default for KeyRetention {
    /// 100 000 keys, for an hour.
    fn default() -> Self {
        KeyRetention {
            max_keys: 100_000,
            max_age: Duration::from_secs(3600),
        }
    }
}

/// Which idempotency keys share a [`KeyRetention::max_keys`] budget: the
/// keys of one namespace do, and the keys of different namespaces never
/// push each other out.
///
/// Given to [`PipelineBuilder::key_namespaces`](super::PipelineBuilder::key_namespaces)
/// by a service whose keys belong to different owners (tenants, clients), so
/// that one owner sending many new keys forgets only its own oldest ones. A
/// key's namespace is derived from the key's text alone, every time the
/// pipeline needs it (also after a restore: it is not stored), so the rule
/// must put a key in the same namespace in every process that shares the
/// checkpoint storage. Changing the rule between two starts changes only
/// which keys share a budget, never which keys are known: keys and their
/// partitions do not depend on it.
///
/// Every namespace that holds keys may keep `max_keys` of them: the set of
/// namespaces must be bounded (a service's tenants, not its clients'
/// addresses), or the memory is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyNamespaces {
    /// One namespace for every key: `max_keys` counts all of the pipeline's
    /// keys. The default.
    #[default]
    Single,
    /// A key's namespace is its text before the first `separator`; the keys
    /// without it (or starting with it) share the namespace `""`.
    /// `ingest-service` uses `/` with tokens, its keys being
    /// `<tenant>/<key>` and its tenant names free of `/`.
    Prefix {
        /// What ends the namespace in a key.
        separator: char,
    },
}

impl KeyNamespaces {
    /// The namespace of `key` under this rule: a prefix of it (`""` for
    /// every key with [`Single`](KeyNamespaces::Single)). Called by the
    /// pipeline for each key it accepts, restores or expires; public so that
    /// a service can check its key scheme against it.
    pub fn namespace<'k>(&self, key: &'k str) -> &'k str {
        match *self {
            KeyNamespaces::Single => "",
            KeyNamespaces::Prefix { separator } => key
                .split_once(separator)
                .map_or("", |(namespace, _)| namespace),
        }
    }
}

/// One key partition as stored in a checkpoint: the split type of the
/// pipeline's source.
///
/// Made and read only by the runtime, stored by the pipeline source's codec
/// ([`KeyPartition::codec`]: format 4, module `key_log`, where that
/// function is defined with the codec). Its serde form is the versioned tuple
/// described in the module documentation, for the default bincode codec:
/// format 3 is written; formats 1 to 3 are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPartition {
    /// Which partition, in `0..of`.
    pub(crate) index: u32,
    /// How many partitions there are; fixed when the pipeline's storage was
    /// first used.
    pub(crate) of: u32,
    /// How many keys `encoded` holds.
    count: u64,
    /// Its keys outside `log`, oldest first, each encoded as a
    /// [`StoredKey`] with [`KEY_ENCODING`]; they come after the log's.
    encoded: Vec<u8>,
    /// The sealed segments that hold its other keys (and other partitions'
    /// of the same reader): the reader's log at a snapshot, the stored log
    /// at a restore.
    pub(crate) log: Option<Arc<LogState>>,
}

/// A key as stored, format 2 (and, encoded, formats 3 and 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StoredKey {
    pub key: String,
    pub checkpoint: u64,
    pub accepted_at_ms: u64,
    pub fingerprint: Option<Fingerprint>,
}

/// A [`StoredKey`] to encode without copying its key: the same encoding.
#[derive(Serialize)]
pub(super) struct StoredKeyRef<'a> {
    pub key: &'a str,
    pub checkpoint: u64,
    pub accepted_at_ms: u64,
    pub fingerprint: Option<Fingerprint>,
}

/// Appends the format-3 encoding of a key to `out`; returns its length.
pub(super) fn encode_key(out: &mut Vec<u8>, key: StoredKeyRef<'_>) -> usize {
    let before = out.len();
    // Encoding into a vector fails only for types serde cannot describe,
    // and these are plain fields.
    let _ = bincode::serde::encode_into_std_write(&key, out, KEY_ENCODING);
    out.len() - before
}

/// The keys of a format-3 byte string of `count` keys; an error for bytes
/// that do not hold exactly that many.
pub(super) fn decode_keys(count: u64, bytes: &[u8]) -> Result<Vec<StoredKey>, String> {
    let mut keys = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        // Bounded: a damaged length cannot claim more memory than the bytes
        // left could hold.
        let (key, read): (StoredKey, usize) = sink_api::decode_bincode_bounded(&bytes[offset..])
            .map_err(|e| {
                format!(
                    "key {} of the stored key partition cannot be read: {e}",
                    keys.len() + 1
                )
            })?;
        keys.push(key);
        offset += read;
    }
    if keys.len() as u64 != count {
        return Err(format!(
            "the stored key partition says it holds {count} keys, and its bytes hold {}",
            keys.len()
        ));
    }
    Ok(keys)
}

/// A partition of `keys` in format 3.
pub(super) fn encoded_partition(index: u32, of: u32, keys: &[StoredKey]) -> KeyPartition {
    let mut encoded = Vec::new();
    for key in keys {
        encode_key(
            &mut encoded,
            StoredKeyRef {
                key: &key.key,
                checkpoint: key.checkpoint,
                accepted_at_ms: key.accepted_at_ms,
                fingerprint: key.fingerprint,
            },
        );
    }
    KeyPartition {
        index,
        of,
        count: keys.len() as u64,
        encoded,
        log: None,
    }
}

/// A key as stored in format 1: without a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredKeyV1 {
    key: String,
    checkpoint: u64,
    accepted_at_ms: u64,
}

impl From<StoredKeyV1> for StoredKey {
    fn from(old: StoredKeyV1) -> StoredKey {
        StoredKey {
            key: old.key,
            checkpoint: old.checkpoint,
            accepted_at_ms: old.accepted_at_ms,
            fingerprint: None,
        }
    }
}

impl Serialize for KeyPartition {
    /// Format 3: `(marker, 3, index, of, count, bytes)`, with every key,
    /// also those of the log.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let whole;
        let (count, encoded) = match &self.log {
            None => (self.count, &self.encoded),
            Some(_) => {
                let keys: Vec<StoredKey> = (self.keys().map_err(serde::ser::Error::custom)?)
                    .into_iter()
                    .map(|(key, _)| key)
                    .collect();
                whole = encoded_partition(self.index, self.of, &keys);
                (whole.count, &whole.encoded)
            }
        };
        let mut tuple = serializer.serialize_tuple(6)?;
        tuple.serialize_element(&FORMAT_MARKER)?;
        tuple.serialize_element(&FORMAT_VERSION)?;
        tuple.serialize_element(&self.index)?;
        tuple.serialize_element(&self.of)?;
        tuple.serialize_element(&count)?;
        tuple.serialize_element(serde_bytes::Bytes::new(encoded))?;
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for KeyPartition {
    /// Format 3, 2, or 1 (its keys without fingerprints); another version is
    /// an error that names it.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<KeyPartition, D::Error> {
        // Format 1 has 3 elements, format 2 has 5, format 3 has 6; bincode
        // reads only as many as the visitor asks for.
        deserializer.deserialize_tuple(6, PartitionVisitor)
    }
}

struct PartitionVisitor;

fn element<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
    what: &str,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| A::Error::custom(format!("a stored key partition lacks its {what}")))
}

impl<'de> Visitor<'de> for PartitionVisitor {
    type Value = KeyPartition;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key partition of the pipeline's idempotency keys")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyPartition, A::Error> {
        let first: u32 = element(&mut seq, "index")?;
        if first != FORMAT_MARKER {
            // Format 1: `first` is the index.
            let of = element(&mut seq, "partition count")?;
            let keys: Vec<StoredKeyV1> = element(&mut seq, "keys")?;
            let keys: Vec<StoredKey> = keys.into_iter().map(StoredKey::from).collect();
            return Ok(encoded_partition(first, of, &keys));
        }
        let version: u32 = element(&mut seq, "format version")?;
        match version {
            2 => {
                let index = element(&mut seq, "index")?;
                let of = element(&mut seq, "partition count")?;
                let keys: Vec<StoredKey> = element(&mut seq, "keys")?;
                Ok(encoded_partition(index, of, &keys))
            }
            FORMAT_VERSION => {
                let index = element(&mut seq, "index")?;
                let of = element(&mut seq, "partition count")?;
                let count = element(&mut seq, "key count")?;
                let encoded: serde_bytes::ByteBuf = element(&mut seq, "keys")?;
                let encoded = encoded.into_vec();
                // Checked here, so that a damaged partition is refused when
                // the checkpoint is read, not when the table is built.
                decode_keys(count, &encoded).map_err(A::Error::custom)?;
                Ok(KeyPartition {
                    index,
                    of,
                    count,
                    encoded,
                    log: None,
                })
            }
            version => Err(A::Error::custom(format!(
                "the idempotency keys are stored in format version {version}, unknown to this \
                 build, which reads versions 1 to {FORMAT_VERSION}: run a build that knows it"
            ))),
        }
    }
}

impl KeyPartition {
    /// How many keys it holds (a restore brings them back); 0 for a
    /// partition whose keys cannot be read, which the codec refuses when
    /// it reads a checkpoint. For tools that report stored state.
    pub fn key_count(&self) -> usize {
        self.keys().map_or(0, |keys| keys.len())
    }

    /// An empty partition, for a fresh start.
    pub(crate) fn empty(index: u32, of: u32) -> KeyPartition {
        KeyPartition {
            index,
            of,
            count: 0,
            encoded: Vec::new(),
            log: None,
        }
    }

    /// Partition `index` of `of` at a snapshot: its keys in `log` and, after
    /// them, the `loose` ones (their count and encodings: assigned to a
    /// checkpoint and not sealed yet).
    pub(crate) fn logged(
        index: u32,
        of: u32,
        log: Arc<LogState>,
        loose: (u64, Vec<u8>),
    ) -> KeyPartition {
        KeyPartition {
            index,
            of,
            count: loose.0,
            encoded: loose.1,
            log: Some(log),
        }
    }

    /// Its keys outside the log: their count and encodings.
    pub(super) fn loose(&self) -> (u64, &[u8]) {
        (self.count, &self.encoded)
    }

    /// Every key, oldest first, with the segment of the log that holds it
    /// (`None` outside the log): a later copy of a key replaces an earlier.
    pub(super) fn keys(&self) -> Result<Vec<(StoredKey, Option<SegmentId>)>, String> {
        let mut all: Vec<Option<(StoredKey, Option<SegmentId>)>> = Vec::new();
        if let Some(log) = &self.log {
            for (key, segment) in log.keys_of(self.index)?.iter() {
                all.push(Some((key.clone(), Some(*segment))));
            }
        }
        for key in decode_keys(self.count, &self.encoded)? {
            all.push(Some((key, None)));
        }
        let mut last: HashMap<String, usize> = HashMap::with_capacity(all.len());
        let mut earlier = Vec::new();
        for (position, entry) in all.iter().enumerate() {
            if let Some((key, _)) = entry {
                if let Some(before) = last.insert(key.key.clone(), position) {
                    earlier.push(before);
                }
            }
        }
        for position in earlier {
            all[position] = None;
        }
        Ok(all.into_iter().flatten().collect())
    }
}

/// A segment's number in its log: increasing as segments are sealed.
pub(crate) type SegmentId = u64;

/// The bincode configuration of records: fixed, so that every build reads
/// what another wrote.
pub(super) const RECORD_ENCODING: bincode::config::Configuration = bincode::config::standard();

/// Appends the record of `key` of `partition`, assigned to `checkpoint`,
/// to `out`.
pub(super) fn encode_record(
    out: &mut Vec<u8>,
    partition: u32,
    key: &str,
    checkpoint: CheckpointId,
    entry: &Entry,
) {
    // Encoding into a vector fails only for types serde cannot describe.
    let _ = bincode::encode_into_std_write(partition, out, RECORD_ENCODING);
    encode_key(
        out,
        StoredKeyRef {
            key,
            checkpoint: checkpoint.0,
            accepted_at_ms: entry.accepted_at_ms,
            fingerprint: entry.fingerprint,
        },
    );
}

/// The `count` records of `bytes`; an error for bytes that do not hold
/// exactly that many.
pub(super) fn decode_records(count: u64, bytes: &[u8]) -> Result<Vec<(u32, StoredKey)>, String> {
    let mut records = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        if records.len() as u64 == count {
            return Err(format!(
                "{} bytes follow the {count} keys it says it holds",
                bytes.len() - offset
            ));
        }
        // Bounded: a damaged length cannot claim more memory than the bytes
        // left could hold.
        let (record, read): ((u32, StoredKey), usize) =
            sink_api::decode_bincode_bounded(&bytes[offset..])
                .map_err(|e| format!("key {} cannot be read: {e}", records.len() + 1))?;
        records.push(record);
        offset += read;
    }
    if records.len() as u64 != count {
        return Err(format!(
            "it says it holds {count} keys, and its bytes hold {}",
            records.len()
        ));
    }
    Ok(records)
}

/// A sealed segment of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    pub id: SegmentId,
    pub chunk: Chunk,
    /// How many records it holds.
    pub keys: u32,
    /// The oldest and newest checkpoint of its keys.
    pub first: CheckpointId,
    pub last: CheckpointId,
}

/// A log as one checkpoint stores it, shared by the partitions of its
/// reader: made by the reader at a snapshot, or read back by a restore.
#[derive(Debug)]
pub(crate) struct LogState {
    /// The reader's partitions.
    pub partitions: BTreeSet<u32>,
    /// Checkpoints whose keys are not to come back.
    pub forgotten: BTreeSet<CheckpointId>,
    pub segments: Vec<Segment>,
    /// Every partition's keys in the segments, oldest first, with their
    /// segment: read once, when a partition's keys are first asked for.
    keys: OnceLock<Result<KeysByPartition, String>>,
}

/// Each partition's keys in a log's segments, oldest first, with their
/// segment.
type KeysByPartition = HashMap<u32, Vec<(StoredKey, SegmentId)>>;

impl PartialEq for LogState {
    fn eq(&self, other: &LogState) -> bool {
        self.partitions == other.partitions
            && self.forgotten == other.forgotten
            && self.segments == other.segments
    }
}

impl Eq for LogState {}

impl LogState {
    /// The state of a log of `segments`, for the reader's `partitions`,
    /// leaving out the keys of the `forgotten` checkpoints; its segments
    /// are read at the first [`keys_of`](Self::keys_of).
    pub(super) fn new(
        partitions: BTreeSet<u32>,
        forgotten: BTreeSet<CheckpointId>,
        segments: Vec<Segment>,
    ) -> LogState {
        LogState {
            partitions,
            forgotten,
            segments,
            keys: OnceLock::new(),
        }
    }

    /// The keys of partition `partition` the segments hold, oldest first,
    /// with their segment: of a key stored twice (forgotten and accepted
    /// again) the later copy, and no key whose later copy is of a
    /// forgotten checkpoint.
    ///
    /// Every segment is read at the first call (a restore makes it while
    /// it reads the checkpoint): damaged bytes are an error, and so is a
    /// segment whose keys are not of the checkpoints it says it holds
    /// (they decide which lost checkpoints the log keeps).
    pub(super) fn keys_of(&self, partition: u32) -> Result<&[(StoredKey, SegmentId)], String> {
        let keys = self.keys.get_or_init(|| {
            let mut by_partition: HashMap<u32, Vec<Option<(StoredKey, SegmentId)>>> =
                HashMap::new();
            let mut newest: HashMap<(u32, String), usize> = HashMap::new();
            for segment in &self.segments {
                let records = decode_records(u64::from(segment.keys), segment.chunk.bytes())
                    .map_err(|why| format!("segment {} of the stored keys: {why}", segment.id))?;
                let checkpoints = records.iter().map(|(_, key)| CheckpointId(key.checkpoint));
                let (first, last) = checkpoints
                    .fold((CheckpointId(u64::MAX), CheckpointId::NONE), |(f, l), c| {
                        (f.min(c), l.max(c))
                    });
                if (first, last) != (segment.first, segment.last) {
                    return Err(format!(
                        "segment {} says it holds checkpoints {} to {}, and holds {first} to {last}",
                        segment.id, segment.first, segment.last
                    ));
                }
                for (partition, key) in records {
                    let keys = by_partition.entry(partition).or_default();
                    if let Some(earlier) = newest.insert((partition, key.key.clone()), keys.len()) {
                        keys[earlier] = None;
                    }
                    keys.push(Some((key, segment.id)));
                }
            }
            let forgotten =
                |key: &StoredKey| self.forgotten.contains(&CheckpointId(key.checkpoint));
            Ok((by_partition.into_iter())
                .map(|(partition, keys)| {
                    let keys = (keys.into_iter().flatten())
                        .filter(|(key, _)| !forgotten(key))
                        .collect();
                    (partition, keys)
                })
                .collect())
        });
        match keys {
            Ok(keys) => Ok(keys.get(&partition).map_or(&[], Vec::as_slice)),
            Err(why) => Err(why.clone()),
        }
    }
}

/// The partition a key belongs to, out of `of`.
pub(crate) fn partition_of(key: &str, of: u32) -> u32 {
    crc32c::crc32c(key.as_bytes()) % of.max(1)
}

/// What a table knows of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Never accepted, or forgotten.
    New,
    /// Accepted, and its records are not committed yet: in checkpoint `Some(n)`,
    /// or in none yet (read since the last barrier).
    Pending(Option<CheckpointId>),
    /// Its records were committed in this checkpoint.
    Committed(CheckpointId),
    /// Known, but with another fingerprint: a different send under a used
    /// key. Its records were committed in `Some(checkpoint)`, or are not
    /// committed yet.
    Reused(Option<CheckpointId>),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    checkpoint: Option<CheckpointId>,
    pub accepted_at_ms: u64,
    pub fingerprint: Option<Fingerprint>,
    /// The segment of the reader's log that holds it, once sealed.
    segment: Option<SegmentId>,
}

/// The live keys of one partition, owned by the reader of the subtask that
/// owns the partition.
#[derive(Debug)]
pub(crate) struct KeyTable {
    index: u32,
    of: u32,
    /// Which keys share a retention budget.
    namespaces: KeyNamespaces,
    /// Keys in the order they were accepted, so also in checkpoint order.
    order: VecDeque<String>,
    entries: HashMap<String, Entry>,
    /// How many keys of each namespace `entries` holds; a namespace without
    /// keys has no entry (owners that come and go leave nothing behind).
    held: HashMap<String, usize>,
    /// Keys assigned to a checkpoint and not sealed into a segment yet, in
    /// order (some may be gone since).
    unsealed: Vec<String>,
    /// The segments of keys removed since the reader last asked: each
    /// holds one live key fewer.
    released: Vec<SegmentId>,
}

impl KeyTable {
    /// The table a stored partition describes, its keys grouped by
    /// `namespaces` (derived from the keys: it is not stored). Every key in
    /// it is committed: it was restored from a checkpoint, and the restore
    /// commits that checkpoint before anything is read. Fails (saying why)
    /// for a partition whose keys cannot be read; those decoded from a
    /// checkpoint were checked already.
    pub(crate) fn restore(
        partition: KeyPartition,
        namespaces: KeyNamespaces,
    ) -> Result<KeyTable, String> {
        let keys = partition.keys()?;
        let mut table = KeyTable {
            index: partition.index,
            of: partition.of,
            namespaces,
            order: VecDeque::with_capacity(keys.len()),
            entries: HashMap::with_capacity(keys.len()),
            held: HashMap::new(),
            unsealed: Vec::new(),
            released: Vec::new(),
        };
        for (stored, segment) in keys {
            let entry = Entry {
                checkpoint: Some(CheckpointId(stored.checkpoint)),
                accepted_at_ms: stored.accepted_at_ms,
                fingerprint: stored.fingerprint,
                segment,
            };
            if segment.is_none() {
                table.unsealed.push(stored.key.clone());
            }
            table.insert(stored.key, entry);
        }
        Ok(table)
    }

    /// Every key is to be sealed again: the reader starts a log of its own
    /// rather than keep the restored one (whose segments hold other
    /// partitions' keys, after a rescale).
    pub(super) fn unseal_all(&mut self) {
        self.unsealed.clear();
        for key in &self.order {
            if let Some(entry) = self.entries.get_mut(key) {
                entry.segment = None;
                self.unsealed.push(key.clone());
            }
        }
    }

    /// Counts, per segment of the restored log, the keys it holds here.
    pub(super) fn count_segments(&self, counts: &mut HashMap<SegmentId, u32>) {
        for entry in self.entries.values() {
            if let Some(segment) = entry.segment {
                *counts.entry(segment).or_default() += 1;
            }
        }
    }

    /// Appends the keys assigned and not sealed yet to `out` as records of
    /// segment `segment` (module `key_log`), and records them there.
    /// Returns how many, and the oldest and newest checkpoint among them.
    pub(super) fn seal_into(
        &mut self,
        out: &mut Vec<u8>,
        segment: SegmentId,
    ) -> (u32, CheckpointId, CheckpointId) {
        let (mut count, mut first, mut last) = (0, CheckpointId(u64::MAX), CheckpointId::NONE);
        for key in std::mem::take(&mut self.unsealed) {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let (Some(checkpoint), None) = (entry.checkpoint, entry.segment) else {
                continue;
            };
            entry.segment = Some(segment);
            encode_record(out, self.index, &key, checkpoint, entry);
            count += 1;
            first = first.min(checkpoint);
            last = last.max(checkpoint);
        }
        (count, first, last)
    }

    /// Moves `key`, stored in segment `from` with `checkpoint`, to segment
    /// `to`, appending its record to `out`; false (nothing written) when
    /// the table no longer holds that copy of it.
    pub(super) fn reseal(
        &mut self,
        key: &str,
        checkpoint: CheckpointId,
        from: SegmentId,
        to: SegmentId,
        out: &mut Vec<u8>,
    ) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) if entry.segment == Some(from) && entry.checkpoint == Some(checkpoint) => {
                entry.segment = Some(to);
                encode_record(out, self.index, key, checkpoint, entry);
                true
            }
            _ => false,
        }
    }

    /// The segments of the keys removed since the last call, one per key.
    pub(super) fn take_released(&mut self) -> Vec<SegmentId> {
        std::mem::take(&mut self.released)
    }

    /// The keys assigned and not sealed (normally none: a barrier seals
    /// them before the snapshot): their count and format-3 encodings.
    pub(super) fn loose(&self) -> (u64, Vec<u8>) {
        let mut encoded = Vec::new();
        let mut count = 0;
        for key in &self.unsealed {
            if let Some(entry) = self.entries.get(key) {
                if let (Some(checkpoint), None) = (entry.checkpoint, entry.segment) {
                    encode_key(
                        &mut encoded,
                        StoredKeyRef {
                            key,
                            checkpoint: checkpoint.0,
                            accepted_at_ms: entry.accepted_at_ms,
                            fingerprint: entry.fingerprint,
                        },
                    );
                    count += 1;
                }
            }
        }
        (count, encoded)
    }

    /// How many partitions there are.
    pub(crate) fn of(&self) -> u32 {
        self.of
    }

    /// Adds `key` at the back of the order, unless it is known already
    /// (then only its entry is replaced).
    fn insert(&mut self, key: String, entry: Entry) {
        if self.entries.insert(key.clone(), entry).is_some() {
            return;
        }
        let namespace = self.namespaces.namespace(&key);
        match self.held.get_mut(namespace) {
            Some(held) => *held += 1,
            None => {
                self.held.insert(namespace.to_string(), 1);
            }
        }
        self.order.push_back(key);
    }

    /// Removes `key`'s entry and counts it out of its namespace (and out
    /// of its segment); its place in `order` is the caller's to remove.
    fn remove_entry(&mut self, key: &str) {
        let Some(entry) = self.entries.remove(key) else {
            return;
        };
        if let Some(segment) = entry.segment {
            self.released.push(segment);
        }
        let namespace = self.namespaces.namespace(key);
        if let Some(held) = self.held.get_mut(namespace) {
            *held -= 1;
            if *held == 0 {
                self.held.remove(namespace);
            }
        }
    }

    /// How many keys of `key`'s namespace the table holds.
    fn held_with(&self, key: &str) -> usize {
        self.held
            .get(self.namespaces.namespace(key))
            .copied()
            .unwrap_or(0)
    }

    /// Removes the keys for which `doomed(position in order, key, entry)`
    /// holds, wherever they are in the order. One pass over the table.
    fn remove_where(&mut self, mut doomed: impl FnMut(usize, &str, Option<&Entry>) -> bool) {
        let old_order = std::mem::take(&mut self.order);
        self.order.reserve(old_order.len());
        for (position, key) in old_order.into_iter().enumerate() {
            if doomed(position, &key, self.entries.get(&key)) {
                self.remove_entry(&key);
            } else {
                self.order.push_back(key);
            }
        }
    }

    /// Which partition this is.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// The newest checkpoint any key of this table is in.
    pub(crate) fn newest_checkpoint(&self) -> CheckpointId {
        self.order
            .back()
            .and_then(|key| self.entries.get(key))
            .and_then(|entry| entry.checkpoint)
            .unwrap_or(CheckpointId::NONE)
    }

    /// The table as format 3 stores it: the keys assigned to a checkpoint
    /// (all of them, when called after [`assign`](Self::assign)). For
    /// tests of the table; the reader stores its log.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> KeyPartition {
        let keys: Vec<StoredKey> = (self.order.iter())
            .filter_map(|key| {
                let entry = self.entries.get(key)?;
                Some(StoredKey {
                    key: key.clone(),
                    checkpoint: entry.checkpoint?.0,
                    accepted_at_ms: entry.accepted_at_ms,
                    fingerprint: entry.fingerprint,
                })
            })
            .collect();
        encoded_partition(self.index, self.of, &keys)
    }

    /// What the table knows of `key` sent with `fingerprint`, given that
    /// everything up to `committed_through` is committed. Fingerprints are
    /// compared when both the stored key and this send have one.
    pub(crate) fn seen(
        &self,
        key: &str,
        fingerprint: Option<Fingerprint>,
        committed_through: CheckpointId,
    ) -> Seen {
        let Some(entry) = self.entries.get(key) else {
            return Seen::New;
        };
        let committed = entry.checkpoint.filter(|c| *c <= committed_through);
        if let (Some(stored), Some(sent)) = (entry.fingerprint, fingerprint) {
            if stored != sent {
                return Seen::Reused(committed);
            }
        }
        match committed {
            Some(checkpoint) => Seen::Committed(checkpoint),
            None => Seen::Pending(entry.checkpoint),
        }
    }

    /// Records that `key`'s records (with `fingerprint`) were just read;
    /// they belong to no checkpoint until the next [`assign`](Self::assign).
    pub(crate) fn accept(&mut self, key: String, fingerprint: Option<Fingerprint>, now_ms: u64) {
        let entry = Entry {
            checkpoint: None,
            accepted_at_ms: now_ms,
            fingerprint,
            segment: None,
        };
        self.insert(key, entry);
    }

    /// Every key accepted since the last call belongs to `checkpoint`; they
    /// are to be sealed into the reader's log.
    pub(crate) fn assign(&mut self, checkpoint: CheckpointId) {
        // Unassigned keys are the newest, at the back.
        let mut unassigned = 0;
        for key in self.order.iter().rev() {
            match self.entries.get_mut(key) {
                Some(entry) if entry.checkpoint.is_none() => {
                    entry.checkpoint = Some(checkpoint);
                    unassigned += 1;
                }
                _ => break,
            }
        }
        let from = self.order.len() - unassigned;
        let assigned = self.order.iter().skip(from).cloned();
        self.unsealed.extend(assigned);
    }

    /// Forgets the keys of `checkpoint`, whose commit lost output: a repeated
    /// send must be written again.
    pub(crate) fn forget_checkpoint(&mut self, checkpoint: CheckpointId) {
        // Rare (a commit lost output): one pass over the table.
        self.remove_where(|_, _, entry| entry.is_some_and(|e| e.checkpoint == Some(checkpoint)));
    }

    /// Forgets the committed keys older than `max_age` at `now_ms`, and in
    /// each namespace that holds more than `max_keys` keys, its oldest
    /// committed ones beyond that: a namespace's keys never make another's
    /// go.
    pub(crate) fn expire(
        &mut self,
        committed_through: CheckpointId,
        max_keys: usize,
        max_age: Duration,
        now_ms: u64,
    ) {
        let max_age_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        // The oldest keys of the table first: too old, or of a namespace
        // over its budget (with a single namespace, the only case).
        while let Some(oldest) = self.order.front() {
            let Some(entry) = self.entries.get(oldest) else {
                // Not a key any more.
                self.order.pop_front();
                continue;
            };
            let committed = entry.checkpoint.is_some_and(|c| c <= committed_through);
            let too_many = self.held_with(oldest) > max_keys;
            let too_old = now_ms.saturating_sub(entry.accepted_at_ms) >= max_age_ms;
            if !committed || !(too_many || too_old) {
                break;
            }
            if let Some(key) = self.order.pop_front() {
                self.remove_entry(&key);
            }
        }
        self.expire_over_budget(committed_through, max_keys);
    }

    /// Forgets, in each namespace still over `max_keys`, its oldest
    /// committed keys beyond that, from behind the front of the order
    /// (where another namespace's older keys are, within their budget).
    fn expire_over_budget(&mut self, committed_through: CheckpointId, max_keys: usize) {
        let mut excess: HashMap<&str, usize> = self
            .held
            .iter()
            .filter(|(_, held)| **held > max_keys)
            .map(|(namespace, held)| (namespace.as_str(), held - max_keys))
            .collect();
        let mut left: usize = excess.values().sum();
        if left == 0 {
            return;
        }
        let mut doomed = Vec::new();
        for (position, key) in self.order.iter().enumerate() {
            if left == 0 {
                break;
            }
            let Some(over) = excess.get_mut(self.namespaces.namespace(key)) else {
                continue;
            };
            if *over == 0 {
                continue;
            }
            let committed = self
                .entries
                .get(key)
                .and_then(|entry| entry.checkpoint)
                .is_some_and(|c| c <= committed_through);
            if committed {
                doomed.push(position);
                *over -= 1;
                left -= 1;
            } else {
                // Its namespace's newer keys are in later checkpoints (or
                // none yet): not committed either.
                left -= *over;
                *over = 0;
            }
        }
        if doomed.is_empty() {
            return;
        }
        let mut doomed = doomed.into_iter().peekable();
        self.remove_where(|position, _, _| doomed.next_if_eq(&position).is_some());
    }

    /// How many keys the table holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The keys the table holds, in no order.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn table() -> KeyTable {
        KeyTable::restore(KeyPartition::empty(0, 1), KeyNamespaces::Single).unwrap()
    }

    #[test]
    fn a_key_is_pending_until_its_checkpoint_is_committed() {
        let mut keys = table();
        assert_eq!(keys.seen("a", None, CheckpointId(0)), Seen::New);
        keys.accept("a".into(), None, 0);
        assert_eq!(keys.seen("a", None, CheckpointId(0)), Seen::Pending(None));
        keys.assign(CheckpointId(3));
        assert_eq!(
            keys.seen("a", None, CheckpointId(2)),
            Seen::Pending(Some(CheckpointId(3)))
        );
        assert_eq!(
            keys.seen("a", None, CheckpointId(3)),
            Seen::Committed(CheckpointId(3))
        );
    }

    #[test]
    fn assign_only_touches_keys_read_since_the_last_barrier() {
        let mut keys = table();
        keys.accept("a".into(), None, 0);
        keys.assign(CheckpointId(1));
        keys.accept("b".into(), None, 0);
        keys.assign(CheckpointId(2));
        assert_eq!(
            keys.seen("a", None, CheckpointId(0)),
            Seen::Pending(Some(CheckpointId(1)))
        );
        assert_eq!(
            keys.seen("b", None, CheckpointId(0)),
            Seen::Pending(Some(CheckpointId(2)))
        );
    }

    #[test]
    fn a_snapshot_restores_every_assigned_key_as_committed() {
        let mut keys = table();
        keys.accept("a".into(), None, 5);
        keys.accept("b".into(), None, 6);
        keys.assign(CheckpointId(4));
        let restored = KeyTable::restore(keys.snapshot(), KeyNamespaces::Single).unwrap();
        assert_eq!(restored.newest_checkpoint(), CheckpointId(4));
        assert_eq!(
            restored.seen("b", None, restored.newest_checkpoint()),
            Seen::Committed(CheckpointId(4))
        );
        assert_eq!(restored.len(), 2);
    }

    #[test]
    fn keys_expire_by_count_and_by_age_but_never_before_their_commit() {
        let mut keys = table();
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            keys.accept(key.into(), None, i as u64 * 1000);
            keys.assign(CheckpointId(i as u64 + 1));
        }
        // Nothing committed: nothing expires, however old or many.
        keys.expire(CheckpointId(0), 1, Duration::ZERO, 10_000);
        assert_eq!(keys.len(), 3);
        // Count: two committed keys over a limit of one, the third pending.
        keys.expire(CheckpointId(2), 1, HOUR, 10_000);
        assert_eq!(keys.seen("a", None, CheckpointId(3)), Seen::New);
        assert_eq!(keys.seen("b", None, CheckpointId(3)), Seen::New);
        assert_eq!(keys.len(), 1);
        // Age: "c" was accepted at 2 s; kept at 2.5 s, gone at 3 s.
        keys.expire(CheckpointId(3), 10, Duration::from_secs(1), 2500);
        assert_eq!(keys.len(), 1);
        keys.expire(CheckpointId(3), 10, Duration::from_secs(1), 3000);
        assert_eq!(keys.len(), 0);
    }

    #[test]
    fn a_lost_checkpoint_forgets_only_its_own_keys() {
        let mut keys = table();
        keys.accept("a".into(), None, 0);
        keys.assign(CheckpointId(1));
        keys.accept("b".into(), None, 0);
        keys.assign(CheckpointId(2));
        keys.forget_checkpoint(CheckpointId(2));
        assert_eq!(keys.seen("b", None, CheckpointId(2)), Seen::New);
        assert_eq!(
            keys.seen("a", None, CheckpointId(2)),
            Seen::Committed(CheckpointId(1))
        );
    }

    const FP_A: Fingerprint = Fingerprint::new([0xA; 16]);
    const FP_B: Fingerprint = Fingerprint::new([0xB; 16]);

    /// Keys `<tenant>/<key>` budgeted per tenant, as `ingest-service` does.
    const BY_TENANT: KeyNamespaces = KeyNamespaces::Prefix { separator: '/' };

    /// The keys a snapshot of `keys` stores, in their stored order.
    fn stored_keys(keys: &KeyTable) -> Vec<String> {
        let snapshot = keys.snapshot();
        decode_keys(snapshot.count, &snapshot.encoded)
            .unwrap()
            .into_iter()
            .map(|k| k.key)
            .collect()
    }

    #[test]
    fn a_namespace_sending_new_keys_fast_forgets_only_its_own_oldest_keys() {
        let mut keys = KeyTable::restore(KeyPartition::empty(0, 1), BY_TENANT).unwrap();
        // The slow tenant's two keys, committed first: the oldest of the
        // table, and within its budget of 5.
        keys.accept("slow/a".into(), Some(FP_A), 0);
        keys.accept("slow/b".into(), None, 1);
        keys.assign(CheckpointId(1));
        keys.expire(CheckpointId(1), 5, HOUR, 2);
        // The fast one sends 100 new keys over ten checkpoints, each
        // committed (and expired after) before the next.
        for i in 0..100u64 {
            keys.accept(format!("fast/{i}"), None, 10 + i);
            if i % 10 == 9 {
                let checkpoint = CheckpointId(i / 10 + 2);
                keys.assign(checkpoint);
                keys.expire(checkpoint, 5, HOUR, 200);
            }
        }
        // The slow tenant's retries are still recognised, as what they were.
        let committed = CheckpointId(11);
        assert_eq!(
            keys.seen("slow/a", Some(FP_A), committed),
            Seen::Committed(CheckpointId(1))
        );
        assert_eq!(
            keys.seen("slow/a", Some(FP_B), committed),
            Seen::Reused(Some(CheckpointId(1)))
        );
        assert_eq!(
            keys.seen("slow/b", None, committed),
            Seen::Committed(CheckpointId(1))
        );
        // The fast one keeps its newest five: its own oldest went.
        assert_eq!(keys.seen("fast/94", None, committed), Seen::New);
        assert_eq!(keys.seen("fast/0", None, committed), Seen::New);
        assert_eq!(
            keys.seen("fast/95", None, committed),
            Seen::Committed(CheckpointId(11))
        );
        assert_eq!(keys.len(), 7);
        // Snapshots hold what is left, oldest first, and restore to it.
        let left = [
            "slow/a", "slow/b", "fast/95", "fast/96", "fast/97", "fast/98", "fast/99",
        ];
        assert_eq!(stored_keys(&keys), left);
        let restored = KeyTable::restore(keys.snapshot(), BY_TENANT).unwrap();
        assert_eq!(stored_keys(&restored), left);
        // Keys not committed yet stay, however far over the budget.
        for i in 100..110u64 {
            keys.accept(format!("fast/{i}"), None, 300);
        }
        keys.assign(CheckpointId(12));
        keys.expire(committed, 5, HOUR, 400);
        assert_eq!(keys.seen("fast/99", None, committed), Seen::New);
        assert_eq!(
            keys.seen("fast/100", None, committed),
            Seen::Pending(Some(CheckpointId(12)))
        );
        assert_eq!(keys.len(), 12);
        // A lost checkpoint takes its keys, wherever they are; a namespace
        // left without keys leaves nothing behind.
        keys.forget_checkpoint(CheckpointId(12));
        assert_eq!(stored_keys(&keys), ["slow/a", "slow/b"]);
        assert_eq!(keys.held.get("slow"), Some(&2));
        assert!(!keys.held.contains_key("fast"), "{:?}", keys.held);
    }

    #[test]
    fn with_a_single_namespace_new_keys_push_out_everyone_s_oldest() {
        // The default, and what every pipeline did before namespaces.
        let mut keys = table();
        keys.accept("slow/a".into(), None, 0);
        keys.assign(CheckpointId(1));
        for i in 0..10u64 {
            keys.accept(format!("fast/{i}"), None, 1 + i);
        }
        keys.assign(CheckpointId(2));
        keys.expire(CheckpointId(2), 5, HOUR, 100);
        assert_eq!(keys.seen("slow/a", None, CheckpointId(2)), Seen::New);
        assert_eq!(keys.len(), 5);
    }

    #[test]
    fn namespaces_are_not_stored_and_are_derived_again_after_a_restore() {
        let fill = |namespaces| {
            let mut keys = KeyTable::restore(KeyPartition::empty(2, 4), namespaces).unwrap();
            keys.accept("slow/a".into(), Some(FP_A), 1);
            for i in 0..4u64 {
                keys.accept(format!("fast/{i}"), None, 2 + i);
            }
            keys.assign(CheckpointId(1));
            keys
        };
        // The same keys are the same stored bytes, whatever the rule: the
        // format is format 3 either way.
        let stored = fill(BY_TENANT).snapshot();
        assert_eq!(stored, fill(KeyNamespaces::Single).snapshot());
        // Restored with the rule, the budget is per namespace again.
        let mut restored = KeyTable::restore(stored, BY_TENANT).unwrap();
        for i in 4..20u64 {
            restored.accept(format!("fast/{i}"), None, 100);
        }
        restored.assign(CheckpointId(2));
        restored.expire(CheckpointId(2), 3, HOUR, 200);
        assert_eq!(
            restored.seen("slow/a", Some(FP_A), CheckpointId(2)),
            Seen::Committed(CheckpointId(1))
        );
        assert_eq!(
            stored_keys(&restored),
            ["slow/a", "fast/17", "fast/18", "fast/19"]
        );
    }

    #[test]
    fn a_key_s_namespace_is_its_text_before_the_separator() {
        assert_eq!(BY_TENANT.namespace("alpha/req-1"), "alpha");
        assert_eq!(BY_TENANT.namespace("alpha/a/b"), "alpha");
        assert_eq!(BY_TENANT.namespace("no-separator"), "");
        assert_eq!(BY_TENANT.namespace("/leading"), "");
        assert_eq!(KeyNamespaces::Single.namespace("alpha/req-1"), "");
        assert_eq!(KeyNamespaces::default(), KeyNamespaces::Single);
    }

    #[test]
    fn a_key_with_another_fingerprint_is_reused_in_flight_and_after_its_commit() {
        let mut keys = table();
        keys.accept("k".into(), Some(FP_A), 0);
        // In flight, before and after its barrier.
        assert_eq!(
            keys.seen("k", Some(FP_B), CheckpointId(0)),
            Seen::Reused(None)
        );
        assert_eq!(
            keys.seen("k", Some(FP_A), CheckpointId(0)),
            Seen::Pending(None)
        );
        keys.assign(CheckpointId(2));
        assert_eq!(
            keys.seen("k", Some(FP_B), CheckpointId(1)),
            Seen::Reused(None)
        );
        // Committed.
        assert_eq!(
            keys.seen("k", Some(FP_B), CheckpointId(2)),
            Seen::Reused(Some(CheckpointId(2)))
        );
        assert_eq!(
            keys.seen("k", Some(FP_A), CheckpointId(2)),
            Seen::Committed(CheckpointId(2))
        );
        // Without a fingerprint on either side, the key alone decides.
        assert_eq!(
            keys.seen("k", None, CheckpointId(2)),
            Seen::Committed(CheckpointId(2))
        );
        keys.accept("plain".into(), None, 0);
        keys.assign(CheckpointId(3));
        assert_eq!(
            keys.seen("plain", Some(FP_B), CheckpointId(3)),
            Seen::Committed(CheckpointId(3))
        );
    }

    fn splits_serializer() -> sink_api::BincodeSerializer<Vec<KeyPartition>> {
        // The runtime's split serializer (coordinator.rs).
        sink_api::BincodeSerializer::new(1)
    }

    #[test]
    fn fingerprints_survive_a_checkpoint() {
        use sink_api::{deserialize_versioned, serialize_versioned};
        let mut keys =
            KeyTable::restore(KeyPartition::empty(3, 64), KeyNamespaces::Single).unwrap();
        keys.accept("k".into(), Some(FP_A), 7);
        keys.accept("plain".into(), None, 8);
        keys.assign(CheckpointId(5));
        let serializer = splits_serializer();
        let blob = serialize_versioned(&serializer, &vec![keys.snapshot()]).unwrap();
        let mut stored = deserialize_versioned(&serializer, &blob).unwrap();
        assert_eq!(stored, vec![keys.snapshot()]);
        let restored = KeyTable::restore(stored.remove(0), KeyNamespaces::Single).unwrap();
        assert_eq!(restored.index(), 3);
        assert_eq!(
            restored.seen("k", Some(FP_B), CheckpointId(5)),
            Seen::Reused(Some(CheckpointId(5)))
        );
        assert_eq!(
            restored.seen("k", Some(FP_A), CheckpointId(5)),
            Seen::Committed(CheckpointId(5))
        );
    }

    /// A partition exactly as format 1 wrote it.
    #[derive(Serialize, Deserialize)]
    struct PartitionV1 {
        index: u32,
        of: u32,
        keys: Vec<StoredKeyV1>,
    }

    #[test]
    fn format_1_partitions_are_read_with_keys_without_fingerprints() {
        use sink_api::{deserialize_versioned, serialize_versioned, BincodeSerializer};
        let old = vec![
            PartitionV1 {
                index: 0,
                of: 65_536,
                keys: vec![],
            },
            PartitionV1 {
                index: 65_535,
                of: 65_536,
                keys: vec![
                    StoredKeyV1 {
                        key: "a".into(),
                        checkpoint: 4,
                        accepted_at_ms: 1_700_000_000_000,
                    },
                    StoredKeyV1 {
                        key: "ключ".into(),
                        checkpoint: 300,
                        accepted_at_ms: 9,
                    },
                ],
            },
        ];
        let blob =
            serialize_versioned(&BincodeSerializer::<Vec<PartitionV1>>::new(1), &old).unwrap();
        let read = deserialize_versioned(&splits_serializer(), &blob).unwrap();
        assert_eq!(read.len(), 2);
        assert_eq!((read[0].index, read[0].of), (0, 65_536));
        assert!(decode_keys(read[0].count, &read[0].encoded)
            .unwrap()
            .is_empty());
        assert_eq!((read[1].index, read[1].of), (65_535, 65_536));
        assert_eq!(
            decode_keys(read[1].count, &read[1].encoded).unwrap(),
            vec![
                StoredKey {
                    key: "a".into(),
                    checkpoint: 4,
                    accepted_at_ms: 1_700_000_000_000,
                    fingerprint: None,
                },
                StoredKey {
                    key: "ключ".into(),
                    checkpoint: 300,
                    accepted_at_ms: 9,
                    fingerprint: None,
                },
            ]
        );
        // A format-1 key is matched by the key alone, whatever the fingerprint.
        let restored = KeyTable::restore(read[1].clone(), KeyNamespaces::Single).unwrap();
        assert_eq!(
            restored.seen("a", Some(FP_B), CheckpointId(300)),
            Seen::Committed(CheckpointId(4))
        );
    }

    /// A partition exactly as format 2 wrote it.
    #[derive(Serialize, Deserialize)]
    struct PartitionV2 {
        marker: u32,
        version: u32,
        index: u32,
        of: u32,
        keys: Vec<StoredKey>,
    }

    #[test]
    fn format_2_partitions_are_read_and_written_again_in_format_3() {
        use sink_api::{deserialize_versioned, serialize_versioned, BincodeSerializer};
        let keys = vec![
            StoredKey {
                key: "a".into(),
                checkpoint: 4,
                accepted_at_ms: 10,
                fingerprint: Some(FP_A),
            },
            StoredKey {
                key: "b".into(),
                checkpoint: 5,
                accepted_at_ms: 11,
                fingerprint: None,
            },
        ];
        let old = vec![PartitionV2 {
            marker: FORMAT_MARKER,
            version: 2,
            index: 3,
            of: 8,
            keys: keys.clone(),
        }];
        let blob =
            serialize_versioned(&BincodeSerializer::<Vec<PartitionV2>>::new(1), &old).unwrap();
        let read = deserialize_versioned(&splits_serializer(), &blob).unwrap();
        assert_eq!((read[0].index, read[0].of), (3, 8));
        assert_eq!(decode_keys(read[0].count, &read[0].encoded).unwrap(), keys);
        // Restored, and stored again (format 3): the same keys.
        let table = KeyTable::restore(read[0].clone(), KeyNamespaces::Single).unwrap();
        assert_eq!(
            table.seen("a", Some(FP_B), CheckpointId(9)),
            Seen::Reused(Some(CheckpointId(4)))
        );
        let again = serialize_versioned(&splits_serializer(), &vec![table.snapshot()]).unwrap();
        let back = deserialize_versioned(&splits_serializer(), &again).unwrap();
        assert_eq!(decode_keys(back[0].count, &back[0].encoded).unwrap(), keys);
    }

    #[test]
    fn snapshots_follow_assignments_expiry_and_lost_checkpoints() {
        let mut keys = table();
        let stored = |keys: &KeyTable| {
            let snapshot = keys.snapshot();
            decode_keys(snapshot.count, &snapshot.encoded)
                .unwrap()
                .into_iter()
                .map(|k| (k.key, k.checkpoint))
                .collect::<Vec<_>>()
        };
        for i in 0..5000u64 {
            keys.accept(format!("key-{i}"), None, i);
            if i % 100 == 99 {
                keys.assign(CheckpointId(i / 100 + 1));
            }
        }
        keys.accept("unassigned".into(), None, 6000);
        let all = stored(&keys);
        assert_eq!(all.len(), 5000, "the unassigned key is not stored");
        assert_eq!(all[0], ("key-0".to_string(), 1));
        assert_eq!(all[4999], ("key-4999".to_string(), 50));
        // Expiry drops the oldest encodings (and the buffer is compacted):
        // 1200 keys are left, the unassigned one among them.
        keys.expire(CheckpointId(50), 1200, HOUR, 7000);
        let left = stored(&keys);
        assert_eq!(left.len(), 1199);
        assert_eq!(left[0], ("key-3801".to_string(), 39));
        // A lost checkpoint's keys are forgotten, in the snapshots too.
        keys.forget_checkpoint(CheckpointId(45));
        let left = stored(&keys);
        assert_eq!(left.len(), 1099);
        assert!(left.iter().all(|(_, checkpoint)| *checkpoint != 45));
        let restored = KeyTable::restore(keys.snapshot(), KeyNamespaces::Single).unwrap();
        assert_eq!(stored(&restored), left);
    }

    #[test]
    fn a_damaged_format_3_partition_is_a_clear_error() {
        use sink_api::{deserialize_versioned, serialize_versioned};
        let mut keys = table();
        keys.accept("a".into(), Some(FP_A), 1);
        keys.accept("b".into(), None, 2);
        keys.assign(CheckpointId(1));
        let mut partition = keys.snapshot();
        partition.count = 3;
        let blob = serialize_versioned(&splits_serializer(), &vec![partition.clone()]).unwrap();
        let error = deserialize_versioned(&splits_serializer(), &blob)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("says it holds 3 keys, and its bytes hold 2"),
            "{error}"
        );
        partition.count = 2;
        partition.encoded.truncate(partition.encoded.len() - 3);
        let blob = serialize_versioned(&splits_serializer(), &vec![partition]).unwrap();
        let error = deserialize_versioned(&splits_serializer(), &blob)
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot be read"), "{error}");
    }

    #[test]
    fn an_unknown_format_version_is_a_clear_error() {
        use sink_api::{deserialize_versioned, serialize_versioned, BincodeSerializer};
        // A later format: the marker, version 4, then whatever it holds.
        let later: Vec<(u32, u32, u32, u32, Vec<u8>)> = vec![(FORMAT_MARKER, 4, 0, 1, vec![])];
        let blob = serialize_versioned(&BincodeSerializer::new(1), &later).unwrap();
        let error = deserialize_versioned(&splits_serializer(), &blob)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("format version 4, unknown to this build"),
            "{error}"
        );
    }

    #[test]
    fn fingerprints_print_as_hex() {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xAB;
        bytes[15] = 0x01;
        let fingerprint = Fingerprint::new(bytes);
        assert_eq!(fingerprint.to_string(), "ab000000000000000000000000000001");
        assert_eq!(fingerprint.as_bytes(), &bytes);
        let key = IdempotencyKey::from("k").with_fingerprint(fingerprint);
        assert_eq!((key.key(), key.fingerprint()), ("k", Some(fingerprint)));
    }

    #[test]
    fn partitions_are_stable_and_in_range() {
        // The partition of a key is stored implicitly in checkpoints, so it
        // must not change between builds: CRC32C, not the std hasher.
        assert_eq!(
            partition_of("order-17", 64),
            crc32c::crc32c(b"order-17") % 64
        );
        for key in ["", "a", "order-17", "ключ"] {
            assert!(partition_of(key, 7) < 7);
        }
    }
}
