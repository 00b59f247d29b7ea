//! Resuming from a stored checkpoint (in memory here; durable storage and
//! crash tests come with the state directory): nothing lost, nothing twice.

mod common;

use common::*;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobStatus, MemoryCheckpointStorage, SequenceSource,
};
use sinks_memory::{MemorySink, MemoryStore};

const RECORDS: u64 = 2_000;

fn job(
    source: ThrottledSource,
    store: &MemoryStore<u64>,
    storage: &MemoryCheckpointStorage,
    parallelism: usize,
) -> sink_runtime::Job<ThrottledSource, MemorySink<u64>> {
    Job::builder("resume", source, MemorySink::new(store.clone()))
        .parallelism(parallelism)
        .checkpointing(CheckpointConfig::every(ms(200)))
        .checkpoint_storage(storage.clone())
        .build()
        .unwrap()
}

/// A job stopped in the middle and started again on the same checkpoints
/// resumes from the last completed one: every record committed exactly once.
#[tokio::test(start_paused = true)]
async fn a_stopped_job_resumes_from_its_last_checkpoint_exactly_once() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);

    let first = job(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        2,
    )
    .start();
    tokio::time::sleep(ms(650)).await;
    first.cancel();
    let report = first.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    let committed_before = store.committed().len() as u64;
    assert!(
        committed_before > 0 && committed_before < RECORDS,
        "{committed_before}"
    );
    let restored_from = storage.checkpoints().last().unwrap().checkpoint_id;
    // Records written after the last checkpoint were written but will be
    // read again from the stored positions.
    assert!(store.written().len() as u64 > committed_before);

    let report = job(
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        2,
    )
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(
        report.last_checkpoint.unwrap() > restored_from,
        "ids go on after the restored one"
    );
    assert_exactly_once("committed", &store.committed(), RECORDS);
    let generations: Vec<String> = store.transactions().into_iter().map(|(id, _)| id).collect();
    assert!(generations.iter().any(|id| id.starts_with("g1-")));
    assert!(
        generations.iter().any(|id| id.starts_with("g2-")),
        "the restart is generation 2"
    );
    assert_no_violations(&store);
}

/// A checkpoint of another parallelism is refused with what to do (rescaling
/// comes later), rather than restored wrongly.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_of_another_parallelism_is_refused() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let first = job(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        2,
    )
    .start();
    tokio::time::sleep(ms(450)).await;
    first.cancel();
    first.join().await.unwrap();

    let error = job(
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        3,
    )
    .run()
    .await
    .unwrap_err();
    assert!(matches!(error, JobError::Restore { .. }), "{error:?}");
    assert!(error.to_string().contains("parallelism 2"), "{error}");
}

/// A checkpoint of another job is refused.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_of_another_job_is_refused() {
    let storage = MemoryCheckpointStorage::new(3);
    let store = MemoryStore::<u64>::new();
    let first = job(
        ThrottledSource::unbounded(100, 10, ms(10)),
        &store,
        &storage,
        1,
    )
    .start();
    tokio::time::sleep(ms(450)).await;
    first.cancel();
    first.join().await.unwrap();
    let error = Job::builder("other", SequenceSource::bounded(10), MemorySink::new(store))
        .checkpoint_storage(storage)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("belongs to job 'resume'"),
        "{error}"
    );
}
