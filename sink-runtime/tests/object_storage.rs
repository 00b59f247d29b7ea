//! Jobs on checkpoint storage in an object store (object_store's in-memory
//! store here; the same tests against an S3-compatible server are in the
//! file sink's and the examples' tests): resuming on another instance, and
//! fencing an instance that is still running when a newer one starts.

mod common;

use std::sync::Arc;

use common::*;
use object_store::memory::InMemory;
use object_store::path::Path;
use sink_runtime::storage::{ObjectCheckpointStorage, StorageError};
use sink_runtime::{CheckpointConfig, Job, JobError, JobStatus, RestartStrategy};
use sinks_memory::{MemorySink, MemoryStore};

fn job(
    objects: &Arc<InMemory>,
    store: &MemoryStore<u64>,
    source: ThrottledSource,
) -> Job<ThrottledSource, MemorySink<u64>> {
    let storage = ObjectCheckpointStorage::new(
        objects.clone(),
        Path::from("jobs/state"),
        "memory://jobs/state",
    );
    Job::builder("object-state", source, MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(20)))
        .checkpoint_storage(storage)
        .restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: ms(10),
        })
        .build()
        .expect("a valid job")
}

/// A job stopped on one instance resumes on another from the object store
/// alone, and a finished job is not run again.
#[tokio::test]
async fn a_job_resumes_from_the_object_store_on_a_new_instance() {
    let objects = Arc::new(InMemory::new());
    let store = MemoryStore::<u64>::new();
    let first = job(
        &objects,
        &store,
        ThrottledSource::unbounded(2_000, 10, ms(1)),
    )
    .start();
    while first.metrics().checkpoints_completed < 3 {
        tokio::time::sleep(ms(5)).await;
    }
    first.cancel();
    first.join().await.unwrap();
    let report = job(&objects, &store, ThrottledSource::bounded(2_000, 10, ms(1)))
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 2_000);
    assert_no_violations(&store);
    let again = job(&objects, &store, ThrottledSource::bounded(2_000, 10, ms(1)))
        .run()
        .await
        .unwrap();
    assert_eq!(again.status, JobStatus::AlreadyFinished);
}

/// Two instances on the same checkpoint storage: when the newer starts, the
/// older (still running: a zombie) is refused its next checkpoint and stops,
/// without a restart though it has a restart strategy; the newer finishes
/// the job, and every record is committed exactly once.
#[tokio::test]
async fn an_older_instance_still_running_is_fenced_and_stops() {
    let objects = Arc::new(InMemory::new());
    let store = MemoryStore::<u64>::new();
    let older = job(
        &objects,
        &store,
        ThrottledSource::unbounded(2_000, 10, ms(1)),
    )
    .start();
    while older.metrics().checkpoints_completed < 3 {
        tokio::time::sleep(ms(5)).await;
    }
    let newer = job(&objects, &store, ThrottledSource::bounded(2_000, 10, ms(1))).start();
    let error = older.join().await.unwrap_err();
    let JobError::Storage(StorageError::Fenced {
        generation,
        newer: newer_generation,
        ..
    }) = &error
    else {
        panic!("the older instance must be fenced, not {error:?}");
    };
    assert_eq!((generation.0, newer_generation.0), (1, 2));
    assert!(!error.is_restartable());
    assert!(
        error.to_string().contains("a newer instance started there"),
        "{error}"
    );
    let report = newer.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.restarts, 0);
    assert_exactly_once("committed", &store.committed(), 2_000);
    assert_no_violations(&store);
}
