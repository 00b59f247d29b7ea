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

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sink_api::CheckpointId;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPartition {
    /// Which partition, in `0..of`.
    pub(crate) index: u32,
    /// How many partitions there are; fixed when the pipeline's storage was
    /// first used.
    pub(crate) of: u32,
    /// Its keys, oldest first.
    keys: Vec<StoredKey>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredKey {
    key: String,
    checkpoint: u64,
    accepted_at_ms: u64,
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
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    checkpoint: Option<CheckpointId>,
    accepted_at_ms: u64,
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
                })
            })
            .collect();
        KeyPartition {
            index: self.index,
            of: self.of,
            keys,
        }
    }

    /// What the table knows of `key`, given that everything up to
    /// `committed_through` is committed.
    pub(crate) fn seen(&self, key: &str, committed_through: CheckpointId) -> Seen {
        match self.entries.get(key) {
            None => Seen::New,
            Some(Entry {
                checkpoint: Some(checkpoint),
                ..
            }) if *checkpoint <= committed_through => Seen::Committed(*checkpoint),
            Some(entry) => Seen::Pending(entry.checkpoint),
        }
    }

    /// Records that `key`'s records were just read; they belong to no
    /// checkpoint until the next [`assign`](Self::assign).
    pub(crate) fn accept(&mut self, key: String, now_ms: u64) {
        let entry = Entry {
            checkpoint: None,
            accepted_at_ms: now_ms,
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
        assert_eq!(keys.seen("a", CheckpointId(0)), Seen::New);
        keys.accept("a".into(), 0);
        assert_eq!(keys.seen("a", CheckpointId(0)), Seen::Pending(None));
        keys.assign(CheckpointId(3));
        assert_eq!(
            keys.seen("a", CheckpointId(2)),
            Seen::Pending(Some(CheckpointId(3)))
        );
        assert_eq!(
            keys.seen("a", CheckpointId(3)),
            Seen::Committed(CheckpointId(3))
        );
    }

    #[test]
    fn assign_only_touches_keys_read_since_the_last_barrier() {
        let mut keys = table();
        keys.accept("a".into(), 0);
        keys.assign(CheckpointId(1));
        keys.accept("b".into(), 0);
        keys.assign(CheckpointId(2));
        assert_eq!(
            keys.seen("a", CheckpointId(0)),
            Seen::Pending(Some(CheckpointId(1)))
        );
        assert_eq!(
            keys.seen("b", CheckpointId(0)),
            Seen::Pending(Some(CheckpointId(2)))
        );
    }

    #[test]
    fn a_snapshot_restores_every_assigned_key_as_committed() {
        let mut keys = table();
        keys.accept("a".into(), 5);
        keys.accept("b".into(), 6);
        keys.assign(CheckpointId(4));
        let restored = KeyTable::restore(keys.snapshot());
        assert_eq!(restored.newest_checkpoint(), CheckpointId(4));
        assert_eq!(
            restored.seen("b", restored.newest_checkpoint()),
            Seen::Committed(CheckpointId(4))
        );
        assert_eq!(restored.len(), 2);
    }

    #[test]
    fn keys_expire_by_count_and_by_age_but_never_before_their_commit() {
        let mut keys = table();
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            keys.accept(key.into(), i as u64 * 1000);
            keys.assign(CheckpointId(i as u64 + 1));
        }
        // Nothing committed: nothing expires, however old or many.
        keys.expire(CheckpointId(0), 1, Duration::ZERO, 10_000);
        assert_eq!(keys.len(), 3);
        // Count: two committed keys over a limit of one, the third pending.
        keys.expire(CheckpointId(2), 1, HOUR, 10_000);
        assert_eq!(keys.seen("a", CheckpointId(3)), Seen::New);
        assert_eq!(keys.seen("b", CheckpointId(3)), Seen::New);
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
        keys.accept("a".into(), 0);
        keys.assign(CheckpointId(1));
        keys.accept("b".into(), 0);
        keys.assign(CheckpointId(2));
        keys.forget_checkpoint(CheckpointId(2));
        assert_eq!(keys.seen("b", CheckpointId(2)), Seen::New);
        assert_eq!(
            keys.seen("a", CheckpointId(2)),
            Seen::Committed(CheckpointId(1))
        );
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
