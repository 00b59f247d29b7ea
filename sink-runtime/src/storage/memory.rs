//! Checkpoints kept in memory: the default storage, for tests and for jobs
//! that need no recovery across processes.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use sink_api::{Generation, Lineage};

use super::{CheckpointStorage, CompletedCheckpoint, FinishedMarker, StorageError};

/// Keeps the newest `retained` completed checkpoints in memory. Clones share
/// the same checkpoints, so a test (or a restarted job in the same process)
/// can read what a job stored.
#[derive(Debug, Clone)]
pub struct MemoryCheckpointStorage {
    retained: usize,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    checkpoints: Vec<CompletedCheckpoint>,
    generation: u64,
    finished: Option<FinishedMarker>,
    lineage: Option<Lineage>,
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
            state: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half
        // changed (every change is one assignment, push or drain), so a
        // poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The retained checkpoints, oldest first.
    pub fn checkpoints(&self) -> Vec<CompletedCheckpoint> {
        self.lock().checkpoints.clone()
    }
}

#[async_trait]
impl CheckpointStorage for MemoryCheckpointStorage {
    async fn begin(&self) -> Result<Generation, StorageError> {
        let mut state = self.lock();
        state.generation += 1;
        Ok(Generation(state.generation))
    }

    async fn store(&self, checkpoint: CompletedCheckpoint) -> Result<(), StorageError> {
        let mut state = self.lock();
        let checkpoints = &mut state.checkpoints;
        if let Some(newest) = checkpoints.last() {
            if newest.checkpoint_id >= checkpoint.checkpoint_id {
                return Err(StorageError::Message(format!(
                    "checkpoint {} is not newer than the stored checkpoint {}; checkpoints are stored in order",
                    checkpoint.checkpoint_id, newest.checkpoint_id
                )));
            }
        }
        checkpoints.push(checkpoint);
        let excess = checkpoints.len().saturating_sub(self.retained);
        checkpoints.drain(..excess);
        // The checkpoints carry the lineage from now on.
        state.lineage = None;
        Ok(())
    }

    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        Ok(self.lock().checkpoints.last().cloned())
    }

    async fn mark_finished(&self, marker: FinishedMarker) -> Result<(), StorageError> {
        self.lock().finished = Some(marker);
        Ok(())
    }

    async fn finished(&self) -> Result<Option<FinishedMarker>, StorageError> {
        Ok(self.lock().finished.clone())
    }

    async fn lineage(&self, fresh: Lineage) -> Result<Lineage, StorageError> {
        Ok(self.lock().lineage.get_or_insert(fresh).clone())
    }
}
