//! The counters a file sink keeps of its commits.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::part_file::FileCommittable;

/// What the file committers did, counted over every subtask and restart.
#[derive(Debug, Default)]
pub struct FileSinkStats {
    committed_files: AtomicU64,
    committed_records: AtomicU64,
    committed_bytes: AtomicU64,
    replayed: AtomicU64,
    failed: AtomicU64,
    orphans_removed: AtomicU64,
}

/// A copy of [`FileSinkStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileSinkStatsSnapshot {
    /// Part files made visible.
    pub committed_files: u64,
    /// Records in them.
    pub committed_records: u64,
    /// Bytes in them.
    pub committed_bytes: u64,
    /// Commits recognised as done before (replays after recovery).
    pub replayed: u64,
    /// Commits that failed with a known reason (lost or altered files).
    pub failed: u64,
    /// Hidden parts of the job's lineage that no restored checkpoint
    /// referred to, removed at starts.
    pub orphans_removed: u64,
}

impl FileSinkStats {
    pub(crate) fn committed(&self, committable: &FileCommittable) {
        self.committed_files.fetch_add(1, Ordering::Relaxed);
        self.committed_records
            .fetch_add(committable.records, Ordering::Relaxed);
        self.committed_bytes
            .fetch_add(committable.size_bytes, Ordering::Relaxed);
    }

    pub(crate) fn replayed(&self) {
        self.replayed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn orphans_removed(&self, count: u64) {
        self.orphans_removed.fetch_add(count, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> FileSinkStatsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        FileSinkStatsSnapshot {
            committed_files: get(&self.committed_files),
            committed_records: get(&self.committed_records),
            committed_bytes: get(&self.committed_bytes),
            replayed: get(&self.replayed),
            failed: get(&self.failed),
            orphans_removed: get(&self.orphans_removed),
        }
    }
}
