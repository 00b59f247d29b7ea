//! Jobs on checkpoint storage in an object store (object_store's in-memory
//! store here; the same tests against an S3-compatible server are in the
//! file sink's and the examples' tests): resuming on another instance, and
//! fencing an instance that is still running when a newer one starts.

use crate::common;

use std::sync::Arc;

use common::*;
use object_store::memory::InMemory;
use object_store::path::Path;
use sink_runtime::storage::{ObjectCheckpointStorage, StorageError};
use sink_runtime::{CheckpointConfig, Job, JobError, JobStatus, RestartStrategy};
use sinks_memory::{MemorySink, MemoryStore};

fn job(
    storage: &ObjectCheckpointStorage,
    store: &MemoryStore<u64>,
    source: ThrottledSource,
) -> Job<ThrottledSource, MemorySink<u64>> {
    // A new instance on the same storage: a storage object of its own.
    let storage = ObjectCheckpointStorage::new(
        storage.object_store(),
        storage.prefix().clone(),
        storage.location(),
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

fn in_memory() -> ObjectCheckpointStorage {
    ObjectCheckpointStorage::new(
        Arc::new(InMemory::new()),
        Path::from("jobs/state"),
        "memory://jobs/state",
    )
}

/// A job whose sink fails after a newer instance took its checkpoint
/// storage over (on S3 the newer start aborts the older one's uploads, and
/// the older one's next upload fails) is reported fenced, naming the newer
/// instance, not with the sink's error, and is not restarted.
#[tokio::test]
async fn a_failure_after_a_newer_instance_took_over_is_reported_as_fenced() {
    let storage = in_memory();
    let store = MemoryStore::<u64>::new();
    let older = Job::builder(
        "object-state",
        ThrottledSource::unbounded(2_000, 10, ms(1)),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(ms(20)))
    .checkpoint_storage(storage.clone())
    .build()
    .unwrap()
    .start();
    while older.metrics().checkpoints_completed < 2 {
        tokio::time::sleep(ms(5)).await;
    }
    // A newer instance claims the storage; then the older one's sink fails
    // at its next prepare, before its next store could find out.
    ObjectCheckpointStorage::new(storage.object_store(), storage.prefix().clone(), "x")
        .fence()
        .await
        .unwrap();
    store.fail_next_prepare_commits(1);
    let error = older.join().await.unwrap_err();
    let JobError::Storage(StorageError::Fenced {
        generation, newer, ..
    }) = &error
    else {
        panic!("the older instance must be reported fenced, not {error:?}");
    };
    assert_eq!((generation.0, newer.0), (1, 2));
    assert!(!error.is_restartable());
}

#[tokio::test]
async fn a_job_resumes_from_the_object_store_on_a_new_instance() {
    resumes_on_a_new_instance(in_memory()).await;
}

#[tokio::test]
async fn an_older_instance_still_running_is_fenced_and_stops() {
    fences_the_older_instance(in_memory()).await;
}

/// The same against an S3-compatible server (`scripts/with-s3`), whose
/// conditional writes do the fencing.
#[cfg(feature = "s3")]
mod s3 {
    use super::*;

    fn storage() -> Option<ObjectCheckpointStorage> {
        let Ok(bucket) = std::env::var("S3_TEST_BUCKET") else {
            println!("skipped: no S3-compatible test server (run under scripts/with-s3)");
            return None;
        };
        let url = format!("s3://{bucket}/{}/state", uuid::Uuid::new_v4().simple());
        Some(ObjectCheckpointStorage::s3(&url, &[]).expect("a valid URL"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_resumes_from_s3_on_a_new_instance() {
        if let Some(storage) = storage() {
            resumes_on_a_new_instance(storage).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_older_instance_on_s3_is_fenced_and_stops() {
        if let Some(storage) = storage() {
            fences_the_older_instance(storage).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_credentials_are_refused_at_start_and_not_restarted() {
        let Ok(refusing) = std::env::var("S3_TEST_REFUSING_ENDPOINT") else {
            println!("skipped: no S3-compatible test server (run under scripts/with-s3)");
            return;
        };
        let storage =
            ObjectCheckpointStorage::s3("s3://eo-test/state", &[("endpoint".into(), refusing)])
                .unwrap();
        let store = MemoryStore::<u64>::new();
        let error = job(&storage, &store, ThrottledSource::bounded(100, 10, ms(1)))
            .run()
            .await
            .unwrap_err();
        assert!(!error.is_restartable(), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("the credentials are"), "{message}");
        assert_eq!(
            store.stats().writers_created,
            0,
            "refused before any writer"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_bucket_is_refused_at_start_and_not_restarted() {
        if storage().is_none() {
            return;
        }
        let storage = ObjectCheckpointStorage::s3("s3://no-such-bucket/state", &[]).unwrap();
        let store = MemoryStore::<u64>::new();
        let error = job(&storage, &store, ThrottledSource::bounded(100, 10, ms(1)))
            .run()
            .await
            .unwrap_err();
        assert!(!error.is_restartable(), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("the bucket does not exist"), "{message}");
        assert!(message.contains("s3://no-such-bucket/state"), "{message}");
        assert_eq!(
            store.stats().writers_created,
            0,
            "refused before any writer"
        );
    }
}

/// A checkpoint store refused for good (credentials revoked while the job
/// runs, say) stops the job at once: no tolerated failures, no restarts,
/// nothing of that checkpoint committed.
#[tokio::test]
async fn a_permanent_storage_error_at_a_store_stops_the_job_without_restarts() {
    let storage = ScriptedStorage::new(|id| match id.0 {
        1..=2 => StoreScript::Succeed,
        _ => StoreScript::Refuse,
    });
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "refused-store",
        ThrottledSource::unbounded(2_000, 10, ms(1)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(20)))
    .checkpoint_storage(storage.clone())
    .restart_strategy(RestartStrategy::FixedDelay {
        attempts: 3,
        delay: ms(10),
    })
    .build()
    .unwrap()
    .start();
    let error = handle.join().await.unwrap_err();
    assert!(
        matches!(
            error,
            JobError::Storage(StorageError::Remote {
                permanent: true,
                ..
            })
        ),
        "{error:?}"
    );
    assert!(!error.is_restartable());
    assert_eq!(
        storage.store_calls().len(),
        3,
        "stopped at the first refused store: {:?}",
        storage.store_calls()
    );
    assert_no_violations(&store);
}

/// A job stopped on one instance resumes on another from the object store
/// alone, and a finished job is not run again.
async fn resumes_on_a_new_instance(storage: ObjectCheckpointStorage) {
    let store = MemoryStore::<u64>::new();
    let first = job(
        &storage,
        &store,
        ThrottledSource::unbounded(2_000, 10, ms(1)),
    )
    .start();
    while first.metrics().checkpoints_completed < 3 {
        tokio::time::sleep(ms(5)).await;
    }
    first.cancel();
    first.join().await.unwrap();
    let report = job(&storage, &store, ThrottledSource::bounded(2_000, 10, ms(1)))
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 2_000);
    assert_no_violations(&store);
    let again = job(&storage, &store, ThrottledSource::bounded(2_000, 10, ms(1)))
        .run()
        .await
        .unwrap();
    assert_eq!(again.status, JobStatus::AlreadyFinished);
}

/// Two instances on the same checkpoint storage: when the newer starts, the
/// older (still running: a zombie) is refused its next checkpoint and stops,
/// without a restart though it has a restart strategy; the newer finishes
/// the job, and every record is committed exactly once.
async fn fences_the_older_instance(storage: ObjectCheckpointStorage) {
    let store = MemoryStore::<u64>::new();
    let older = job(
        &storage,
        &store,
        ThrottledSource::unbounded(2_000, 10, ms(1)),
    )
    .start();
    while older.metrics().checkpoints_completed < 3 {
        tokio::time::sleep(ms(5)).await;
    }
    let newer = job(&storage, &store, ThrottledSource::bounded(2_000, 10, ms(1))).start();
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
