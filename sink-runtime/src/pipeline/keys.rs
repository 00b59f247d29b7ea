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
//! accepted_at_ms, fingerprint)`. Both are read: format-1 keys come back
//! without a fingerprint. Another version is refused with a clear error.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use serde::de::{Error as _, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sink_api::CheckpointId;

/// The first field of a stored partition from format 2 on: no format-1
/// partition index can be this (they are below [`MAX_KEY_PARTITIONS`]).
///
/// [`MAX_KEY_PARTITIONS`]: super::channel::MAX_KEY_PARTITIONS
const FORMAT_MARKER: u32 = u32::MAX;

/// The format [`KeyPartition`] is written in: 2 since keys carry
/// fingerprints.
const FORMAT_VERSION: u32 = 2;

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
/// Given to `PipelineBuilder::key_retention`. A committed key is forgotten
/// once it is older than `max_age` (counted from when it was accepted), or
/// once its key partition holds more than `max_keys / key_partitions`
/// (rounded up) newer keys, whichever comes first. Keys whose records are not
/// committed yet are never forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRetention {
    /// About how many committed keys are kept over all partitions.
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

/// One key partition as stored in a checkpoint: the split type of the
/// pipeline's source.
///
/// Made and read only by the runtime. Its serde form is the versioned tuple
/// described in the module documentation, meant for the runtime's bincode
/// split serializer: format 2 is written; formats 1 and 2 are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPartition {
    /// Which partition, in `0..of`.
    pub(crate) index: u32,
    /// How many partitions there are; fixed when the pipeline's storage was
    /// first used.
    pub(crate) of: u32,
    /// Its keys, oldest first.
    keys: Vec<StoredKey>,
}

/// A key as stored, format 2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredKey {
    key: String,
    checkpoint: u64,
    accepted_at_ms: u64,
    fingerprint: Option<Fingerprint>,
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
    /// Format 2: `(marker, 2, index, of, keys)`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tuple = serializer.serialize_tuple(5)?;
        tuple.serialize_element(&FORMAT_MARKER)?;
        tuple.serialize_element(&FORMAT_VERSION)?;
        tuple.serialize_element(&self.index)?;
        tuple.serialize_element(&self.of)?;
        tuple.serialize_element(&self.keys)?;
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for KeyPartition {
    /// Format 2, or format 1 (its keys without fingerprints); another
    /// version is an error that names it.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<KeyPartition, D::Error> {
        // Format 1 has 3 elements and format 2 has 5; bincode reads only as
        // many as the visitor asks for.
        deserializer.deserialize_tuple(5, PartitionVisitor)
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
            return Ok(KeyPartition {
                index: first,
                of,
                keys: keys.into_iter().map(StoredKey::from).collect(),
            });
        }
        let version: u32 = element(&mut seq, "format version")?;
        if version != FORMAT_VERSION {
            return Err(A::Error::custom(format!(
                "the idempotency keys are stored in format version {version}, unknown to this \
                 build, which reads versions 1 and {FORMAT_VERSION}: run a build that knows it"
            )));
        }
        Ok(KeyPartition {
            index: element(&mut seq, "index")?,
            of: element(&mut seq, "partition count")?,
            keys: element(&mut seq, "keys")?,
        })
    }
}

impl KeyPartition {
    /// An empty partition, for a fresh start.
    pub(crate) fn empty(index: u32, of: u32) -> KeyPartition {
        KeyPartition {
            index,
            of,
            keys: Vec::new(),
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
struct Entry {
    checkpoint: Option<CheckpointId>,
    accepted_at_ms: u64,
    fingerprint: Option<Fingerprint>,
}

/// The live keys of one partition, owned by the reader of the subtask that
/// owns the partition.
#[derive(Debug)]
pub(crate) struct KeyTable {
    index: u32,
    of: u32,
    /// Keys in the order they were accepted, so also in checkpoint order.
    order: VecDeque<String>,
    entries: HashMap<String, Entry>,
}

impl KeyTable {
    /// The table a stored partition describes. Every key in it is
    /// committed: it was restored from a checkpoint, and the restore commits
    /// that checkpoint before anything is read.
    pub(crate) fn restore(partition: KeyPartition) -> KeyTable {
        let mut table = KeyTable {
            index: partition.index,
            of: partition.of,
            order: VecDeque::with_capacity(partition.keys.len()),
            entries: HashMap::with_capacity(partition.keys.len()),
        };
        for stored in partition.keys {
            let entry = Entry {
                checkpoint: Some(CheckpointId(stored.checkpoint)),
                accepted_at_ms: stored.accepted_at_ms,
                fingerprint: stored.fingerprint,
            };
            if table.entries.insert(stored.key.clone(), entry).is_none() {
                table.order.push_back(stored.key);
            }
        }
        table
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

    /// The table as stored in a checkpoint. Called after
    /// [`assign`](Self::assign), so every key has its checkpoint.
    pub(crate) fn snapshot(&self) -> KeyPartition {
        let keys = self
            .order
            .iter()
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
        KeyPartition {
            index: self.index,
            of: self.of,
            keys,
        }
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
        };
        if self.entries.insert(key.clone(), entry).is_none() {
            self.order.push_back(key);
        }
    }

    /// Every key accepted since the last call belongs to `checkpoint`.
    pub(crate) fn assign(&mut self, checkpoint: CheckpointId) {
        // Unassigned keys are the newest, at the back.
        for key in self.order.iter().rev() {
            match self.entries.get_mut(key) {
                Some(entry) if entry.checkpoint.is_none() => entry.checkpoint = Some(checkpoint),
                _ => break,
            }
        }
    }

    /// Forgets the keys of `checkpoint`, whose commit lost output: a repeated
    /// send must be written again.
    pub(crate) fn forget_checkpoint(&mut self, checkpoint: CheckpointId) {
        let entries = &mut self.entries;
        self.order.retain(|key| {
            let lost = entries
                .get(key)
                .is_some_and(|entry| entry.checkpoint == Some(checkpoint));
            if lost {
                entries.remove(key);
            }
            !lost
        });
    }

    /// Forgets the oldest committed keys beyond `max_keys` or older than
    /// `max_age` at `now_ms`.
    pub(crate) fn expire(
        &mut self,
        committed_through: CheckpointId,
        max_keys: usize,
        max_age: Duration,
        now_ms: u64,
    ) {
        let max_age_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        while let Some(oldest) = self.order.front() {
            let Some(entry) = self.entries.get(oldest) else {
                self.order.pop_front();
                continue;
            };
            let committed = entry.checkpoint.is_some_and(|c| c <= committed_through);
            let too_many = self.entries.len() > max_keys;
            let too_old = now_ms.saturating_sub(entry.accepted_at_ms) >= max_age_ms;
            if !committed || !(too_many || too_old) {
                break;
            }
            if let Some(key) = self.order.pop_front() {
                self.entries.remove(&key);
            }
        }
    }

    /// How many keys the table holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn table() -> KeyTable {
        KeyTable::restore(KeyPartition::empty(0, 1))
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
        let restored = KeyTable::restore(keys.snapshot());
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
        let mut keys = KeyTable::restore(KeyPartition::empty(3, 64));
        keys.accept("k".into(), Some(FP_A), 7);
        keys.accept("plain".into(), None, 8);
        keys.assign(CheckpointId(5));
        let serializer = splits_serializer();
        let blob = serialize_versioned(&serializer, &vec![keys.snapshot()]).unwrap();
        let mut stored = deserialize_versioned(&serializer, &blob).unwrap();
        assert_eq!(stored, vec![keys.snapshot()]);
        let restored = KeyTable::restore(stored.remove(0));
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
        assert!(read[0].keys.is_empty());
        assert_eq!((read[1].index, read[1].of), (65_535, 65_536));
        assert_eq!(
            read[1].keys,
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
        let restored = KeyTable::restore(read[1].clone());
        assert_eq!(
            restored.seen("a", Some(FP_B), CheckpointId(300)),
            Seen::Committed(CheckpointId(4))
        );
    }

    #[test]
    fn an_unknown_format_version_is_a_clear_error() {
        use sink_api::{deserialize_versioned, serialize_versioned, BincodeSerializer};
        // A later format: the marker, version 3, then whatever it holds.
        let later: Vec<(u32, u32, u32, u32, Vec<u8>)> = vec![(FORMAT_MARKER, 3, 0, 1, vec![])];
        let blob = serialize_versioned(&BincodeSerializer::new(1), &later).unwrap();
        let error = deserialize_versioned(&splits_serializer(), &blob)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("format version 3, unknown to this build"),
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
