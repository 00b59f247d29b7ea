//! Checkpoints kept in memory: the default storage, for tests and for jobs
//! that need no recovery across processes.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::{CheckpointStorage, CompletedCheckpoint, StorageError};

/// Keeps the newest `retained` completed checkpoints in memory. Clones share
/// the same checkpoints, so a test can read what a job stored.
#[derive(Debug, Clone)]
pub struct MemoryCheckpointStorage {
    retained: usize,
    checkpoints: Arc<Mutex<Vec<CompletedCheckpoint>>>,
}

impl Default for MemoryCheckpointStorage {
    fn default() -> MemoryCheckpointStorage {
        MemoryCheckpointStorage::new(3)
    }
}

impl MemoryCheckpointStorage {
    /// A storage that keeps the newest `retained` checkpoints (at least 1).
    pub fn new(retained: usize) -> MemoryCheckpointStorage {
        MemoryCheckpointStorage {
            retained: retained.max(1),
            checkpoints: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<CompletedCheckpoint>> {
        // A panic while holding this lock cannot leave the vector half
        // changed (every change is one push or drain), so a poisoned lock is
        // still consistent.
        self.checkpoints.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The retained checkpoints, oldest first.
    pub fn checkpoints(&self) -> Vec<CompletedCheckpoint> {
        self.lock().clone()
    }
}

#[async_trait]
impl CheckpointStorage for MemoryCheckpointStorage {
    async fn store(&self, checkpoint: &CompletedCheckpoint) -> Result<(), StorageError> {
        let mut checkpoints = self.lock();
        if let Some(newest) = checkpoints.last() {
            if newest.checkpoint_id >= checkpoint.checkpoint_id {
                return Err(StorageError::Message(format!(
                    "checkpoint {} is not newer than the stored checkpoint {}; checkpoints are stored in order",
                    checkpoint.checkpoint_id, newest.checkpoint_id
                )));
            }
        }
        checkpoints.push(checkpoint.clone());
        let excess = checkpoints.len().saturating_sub(self.retained);
        checkpoints.drain(..excess);
        Ok(())
    }

    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        Ok(self.lock().last().cloned())
    }
}
