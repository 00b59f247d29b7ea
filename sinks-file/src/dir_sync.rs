//! Directory fsyncs of one file sink, and the creations they made durable.
//!
//! A part file's name is durable only once its directory is fsynced. A
//! commit's rename syncs the directory anyway, so a part created in it
//! before that sync started needs no fsync of its own at the next
//! checkpoint: one directory fsync fewer per part. The bookkeeping is per
//! sink (never process-global): a sync by another sink in the same process
//! is not counted, which only costs a redundant fsync.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use sink_api::SinkError;

use crate::blocking::assert_blocking;
use crate::io_error::io_error;

/// Orders file creations and directory fsyncs of one sink. Made by the
/// sink's builder, shared by its writers and committers.
#[derive(Debug)]
pub(crate) struct DirSyncs {
    /// A creation or a sync takes the next number.
    sequence: AtomicU64,
    /// Per directory, the number at which its latest fsync started.
    synced: Mutex<BTreeMap<PathBuf, u64>>,
    /// Directories whose name, and every name above them up to the base
    /// directory, this sink has made durable.
    durable: Mutex<BTreeSet<PathBuf>>,
}

impl Default for DirSyncs {
    fn default() -> DirSyncs {
        DirSyncs {
            sequence: AtomicU64::new(1),
            synced: Mutex::new(BTreeMap::new()),
            durable: Mutex::new(BTreeSet::new()),
        }
    }
}

impl DirSyncs {
    /// A sequence number, taken right after a creation or before a sync.
    pub(crate) fn sequence(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::SeqCst)
    }

    /// Makes a rename or a creation in `dir` durable, and remembers when.
    pub(crate) fn sync_dir(&self, dir: &Path) -> Result<(), SinkError> {
        let started = self.sequence();
        fsync_dir(dir)?;
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        let latest = synced.entry(dir.to_path_buf()).or_default();
        *latest = (*latest).max(started);
        Ok(())
    }

    /// Records that `dir`'s name, and every name above it up to the base
    /// directory, are durable: synced by this sink, or known to be.
    pub(crate) fn durable_dir(&self, dir: &Path) {
        let mut durable = self.durable.lock().unwrap_or_else(|e| e.into_inner());
        durable.insert(dir.to_path_buf());
    }

    /// Whether [`durable_dir`](Self::durable_dir) recorded `dir`: a part
    /// created in it needs only `dir` itself synced, not the directories
    /// above it.
    pub(crate) fn is_durable(&self, dir: &Path) -> bool {
        let durable = self.durable.lock().unwrap_or_else(|e| e.into_inner());
        durable.contains(dir)
    }

    /// Makes durable a name created in `dir` at sequence `created`, unless a
    /// sync of `dir` that started later already did.
    pub(crate) fn sync_dir_since(&self, dir: &Path, created: u64) -> Result<(), SinkError> {
        let covered = self
            .synced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(dir)
            .is_some_and(|&started| started > created);
        match covered {
            true => Ok(()),
            false => self.sync_dir(dir),
        }
    }
}

/// Fsyncs the directory `dir`, without bookkeeping.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), SinkError> {
    assert_blocking("fsync of a directory");
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(format!("syncing the directory {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::on_this_thread;

    #[test]
    fn a_sync_started_after_a_creation_covers_it_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let syncs = DirSyncs::default();
        let created = syncs.sequence();
        assert!(syncs.synced.lock().unwrap().get(dir.path()).is_none());
        on_this_thread(|| syncs.sync_dir(dir.path())).unwrap();
        assert!(syncs.synced.lock().unwrap()[dir.path()] > created);
        let later = syncs.sequence();
        assert!(syncs.synced.lock().unwrap()[dir.path()] < later);
        // Another sink's bookkeeping is its own.
        assert!(DirSyncs::default().synced.lock().unwrap().is_empty());
    }
}
