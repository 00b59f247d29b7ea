//! A global committer's commit schedule: completed checkpoints held back
//! until the schedule is due are handed over together, kept in the
//! checkpoints meanwhile (a stop and a restart lose none and repeat none),
//! and everything is committed at end of input.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use crate::common;

use common::*;
use sink_api::{CheckpointId, CommitSchedule, GlobalCommitter, SinkError};
use sink_runtime::{CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage};
use sinks_memory::{MemoryCommittable, MemoryGlobalCommitter, MemorySink, MemoryStore};

const RECORDS: u64 = 2_000;

/// The memory global committer on a schedule of `every` checkpoints,
/// recording the checkpoints of each call.
struct Scheduled {
    inner: MemoryGlobalCommitter<u64>,
    every: NonZeroU32,
    calls: Arc<Mutex<Vec<Vec<CheckpointId>>>>,
}

#[async_trait::async_trait]
impl GlobalCommitter for Scheduled {
    type Committable = MemoryCommittable;

    async fn commit_checkpoint(
        &mut self,
        id: CheckpointId,
        committables: Vec<MemoryCommittable>,
    ) -> Result<(), SinkError> {
        self.calls.lock().unwrap().push(vec![id]);
        self.inner.commit_checkpoint(id, committables).await
    }

    async fn commit_checkpoints(
        &mut self,
        checkpoints: Vec<(CheckpointId, Vec<MemoryCommittable>)>,
    ) -> Result<(), SinkError> {
        let ids = checkpoints.iter().map(|(id, _)| *id).collect();
        self.calls.lock().unwrap().push(ids);
        for (id, committables) in checkpoints {
            self.inner.commit_checkpoint(id, committables).await?;
        }
        Ok(())
    }

    fn schedule(&self) -> CommitSchedule {
        CommitSchedule::every_checkpoint().with_checkpoints(self.every)
    }

    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        self.inner.end_of_input().await
    }
}

type Calls = Arc<Mutex<Vec<Vec<CheckpointId>>>>;

fn job(
    source: ThrottledSource,
    store: &MemoryStore<u64>,
    storage: &MemoryCheckpointStorage,
    calls: &Calls,
) -> Job<ThrottledSource, MemorySink<u64>> {
    let (store, calls) = (store.clone(), calls.clone());
    Job::builder("scheduled", source, MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(100)))
        .checkpoint_storage(storage.clone())
        .global_committer(move || Scheduled {
            inner: MemoryGlobalCommitter::new(store.clone()),
            every: NonZeroU32::new(4).unwrap(),
            calls: calls.clone(),
        })
        .build()
        .unwrap()
}

/// Commits every 4 checkpoints: each call but the end of input's holds
/// checkpoints in order, fewer calls than checkpoints are made, and at the
/// end every record is committed once, with the end of input after them.
#[tokio::test(start_paused = true)]
async fn a_scheduled_global_committer_gets_several_checkpoints_at_once_and_all_at_the_end() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let calls = Calls::default();
    let report = job(
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        &calls,
    )
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let calls = calls.lock().unwrap().clone();
    let completed = report.metrics.checkpoints_completed;
    assert!(completed >= 8, "{:?}", report.metrics);
    // At most one call per 4 checkpoints, and one at end of input.
    assert!(
        calls.len() as u64 <= completed / 4 + 1,
        "{} calls for {completed} checkpoints: {calls:?}",
        calls.len()
    );
    assert!(calls.iter().any(|ids| ids.len() > 1), "{calls:?}");
    let flat: Vec<CheckpointId> = calls.iter().flatten().copied().collect();
    assert!(flat.windows(2).all(|w| w[0] < w[1]), "in order: {calls:?}");
    assert!(store.global_end_of_input_called());
    assert_exactly_once("global committer", &store.global_records(), RECORDS);
    assert_no_violations(&store);
}

/// Stopped while completed checkpoints were held back: their records are
/// not committed by the global committer yet, and the next start delivers
/// them again from the checkpoint that holds them: every record once.
#[tokio::test(start_paused = true)]
async fn checkpoints_held_back_at_a_stop_are_committed_once_by_the_next_start() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let calls = Calls::default();
    let handle = job(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        &calls,
    )
    .start();
    tokio::time::sleep(ms(1_050)).await;
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    let globally = store.global_records().len();
    let committed = store.committed().len();
    assert!(
        globally < committed,
        "nothing was held back at the stop: {globally} of {committed} committed records"
    );
    let report = job(
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        &calls,
    )
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("global committer", &store.global_records(), RECORDS);
    assert_no_violations(&store);
}
