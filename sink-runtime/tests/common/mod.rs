//! Test helpers: a throttled source (so checkpoints fall in the middle of the
//! input under tokio's paused clock), a storage whose stores can be scripted
//! to be slow, fail or hang, and the exactly-once check.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sink_api::{CheckpointId, Generation, PositionAdvance, SubtaskIndex};
use sink_runtime::source::{
    Boundedness, CommitOutcome, RangeSplit, ReadStatus, SequenceReader, SequenceSource, Source,
    SourceError, SourceStart, SplitReader,
};
use sink_runtime::storage::{
    CheckpointStorage, CompletedCheckpoint, FinishedMarker, MemoryCheckpointStorage, StorageError,
};
use sinks_memory::MemoryStore;

/// The numbers `0..count`, at most `per_batch` per read, each read taking
/// `delay` of (paused, virtual) time.
#[derive(Debug, Clone)]
pub struct ThrottledSource {
    pub inner: SequenceSource,
    pub per_batch: usize,
    pub delay: Duration,
    /// Splits to use instead of the sequence's even cut.
    pub splits: Option<Vec<RangeSplit>>,
}

impl ThrottledSource {
    pub fn bounded(count: u64, per_batch: usize, delay: Duration) -> ThrottledSource {
        ThrottledSource {
            inner: SequenceSource::bounded(count),
            per_batch,
            delay,
            splits: None,
        }
    }

    pub fn unbounded(count: u64, per_batch: usize, delay: Duration) -> ThrottledSource {
        ThrottledSource {
            inner: SequenceSource::unbounded(count),
            per_batch,
            delay,
            splits: None,
        }
    }
}

pub struct ThrottledReader {
    inner: SequenceReader,
    per_batch: usize,
    delay: Duration,
}

#[async_trait]
impl SplitReader for ThrottledReader {
    type Record = u64;
    type Split = RangeSplit;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<u64>,
    ) -> Result<ReadStatus, SourceError> {
        tokio::time::sleep(self.delay).await;
        self.inner.read_batch(max.min(self.per_batch), out).await
    }

    fn snapshot_splits(&self) -> Vec<RangeSplit> {
        self.inner.snapshot_splits()
    }

    fn on_checkpoint(&mut self, checkpoint_id: CheckpointId) {
        self.inner.on_checkpoint(checkpoint_id);
    }

    fn on_commit(&mut self, checkpoint_id: CheckpointId, outcome: CommitOutcome) {
        self.inner.on_commit(checkpoint_id, outcome);
    }

    async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError> {
        self.inner.seek_committed(start).await
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        self.inner.take_advances()
    }

    async fn close(&mut self) {
        self.inner.close().await;
    }
}

impl Source for ThrottledSource {
    type Record = u64;
    type Split = RangeSplit;
    type Reader = ThrottledReader;

    fn boundedness(&self) -> Boundedness {
        self.inner.boundedness()
    }

    fn position_scope(&self) -> Option<String> {
        self.inner.position_scope()
    }

    fn create_splits(&self, parallelism: usize) -> Vec<RangeSplit> {
        match &self.splits {
            Some(splits) => splits.clone(),
            None => self.inner.create_splits(parallelism),
        }
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<RangeSplit>,
    ) -> Result<ThrottledReader, SourceError> {
        Ok(ThrottledReader {
            inner: self.inner.create_reader(subtask, splits)?,
            per_batch: self.per_batch,
            delay: self.delay,
        })
    }
}

/// What a [`ScriptedStorage`] does when asked to store a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreScript {
    Succeed,
    SucceedAfter(Duration),
    FailAfter(Duration),
    /// Fails at once with an error no retry can help (credentials refused).
    Refuse,
    Hang,
}

type Script = Arc<dyn Fn(CheckpointId) -> StoreScript + Send + Sync>;

/// In-memory storage whose stores follow a script per checkpoint id.
#[derive(Clone)]
pub struct ScriptedStorage {
    pub inner: MemoryCheckpointStorage,
    script: Script,
    pub calls: Arc<Mutex<Vec<CheckpointId>>>,
}

impl ScriptedStorage {
    pub fn new(script: impl Fn(CheckpointId) -> StoreScript + Send + Sync + 'static) -> Self {
        ScriptedStorage {
            inner: MemoryCheckpointStorage::new(10),
            script: Arc::new(script),
            calls: Arc::default(),
        }
    }

    pub fn store_calls(&self) -> Vec<CheckpointId> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl CheckpointStorage for ScriptedStorage {
    async fn store(&self, checkpoint: CompletedCheckpoint) -> Result<(), StorageError> {
        self.calls.lock().unwrap().push(checkpoint.checkpoint_id);
        match (self.script)(checkpoint.checkpoint_id) {
            StoreScript::Succeed => {}
            StoreScript::SucceedAfter(delay) => tokio::time::sleep(delay).await,
            StoreScript::FailAfter(delay) => {
                tokio::time::sleep(delay).await;
                return Err(StorageError::Message(format!(
                    "scripted failure of checkpoint {}",
                    checkpoint.checkpoint_id
                )));
            }
            StoreScript::Refuse => {
                return Err(StorageError::Remote {
                    context: format!("writing checkpoint {}", checkpoint.checkpoint_id),
                    source: "403 InvalidAccessKeyId (scripted)".into(),
                    hint: "; the credentials are refused",
                    permanent: true,
                })
            }
            StoreScript::Hang => std::future::pending::<()>().await,
        }
        self.inner.store(checkpoint).await
    }

    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        self.inner.latest().await
    }

    async fn begin(&self) -> Result<Generation, StorageError> {
        self.inner.begin().await
    }

    async fn lineage(&self, fresh: sink_api::Lineage) -> Result<sink_api::Lineage, StorageError> {
        self.inner.lineage(fresh).await
    }

    async fn fenced(&self) -> Result<Option<StorageError>, StorageError> {
        self.inner.fenced().await
    }

    async fn mark_finished(&self, marker: FinishedMarker) -> Result<(), StorageError> {
        self.inner.mark_finished(marker).await
    }

    async fn finished(&self) -> Result<Option<FinishedMarker>, StorageError> {
        self.inner.finished().await
    }
}

/// What is wrong with `records` as "every number of `0..count` exactly
/// once", if anything.
pub fn exactly_once_problem(what: &str, records: &[u64], count: u64) -> Option<String> {
    let mut sorted = records.to_vec();
    sorted.sort_unstable();
    let duplicates: Vec<u64> = sorted
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if !duplicates.is_empty() {
        return Some(format!(
            "{what}: duplicated records {:?}",
            &duplicates[..duplicates.len().min(20)]
        ));
    }
    let expected: Vec<u64> = (0..count).collect();
    if sorted != expected {
        let missing: Vec<u64> = expected
            .iter()
            .filter(|r| sorted.binary_search(r).is_err())
            .copied()
            .collect();
        return Some(format!(
            "{what}: {} records instead of {count}; missing {:?}",
            sorted.len(),
            &missing[..missing.len().min(20)]
        ));
    }
    None
}

/// Asserts that `records` holds every number of `0..count` exactly once.
pub fn assert_exactly_once(what: &str, records: &[u64], count: u64) {
    if let Some(problem) = exactly_once_problem(what, records, count) {
        panic!("{problem}");
    }
}

/// Asserts the memory sink saw no broken contract.
pub fn assert_no_violations(store: &MemoryStore<u64>) {
    let violations = store.violations();
    assert!(
        violations.is_empty(),
        "contract violations: {violations:#?}"
    );
}

pub fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
