//! Resuming from a stored checkpoint (in memory here; durable storage and
//! crash tests come with the state directory): nothing lost, nothing twice.

use crate::common;

use common::*;
use sink_api::CheckpointId;
use sink_runtime::storage::CheckpointStorage;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobStatus, MemoryCheckpointStorage, RestartStrategy,
    SequenceSource,
};
use sinks_memory::{InjectedCommitFailure, MemoryGlobalCommitter, MemorySink, MemoryStore};

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

/// Runs the unbounded job of parallelism 2 on `storage` for `running`,
/// then cancels it; its report.
async fn stopped_after(
    running: std::time::Duration,
    store: &MemoryStore<u64>,
    storage: &MemoryCheckpointStorage,
) -> sink_runtime::JobReport {
    let handle = job(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        store,
        storage,
        2,
    )
    .start();
    tokio::time::sleep(running).await;
    handle.cancel();
    handle.join().await.unwrap()
}

/// A job stopped in the middle and started again on the same checkpoints
/// resumes from the last completed one: every record committed exactly once.
#[tokio::test(start_paused = true)]
async fn a_stopped_job_resumes_from_its_last_checkpoint_exactly_once() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);

    let report = stopped_after(ms(650), &store, &storage).await;
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
    let generations: Vec<String> = store
        .transactions()
        .into_iter()
        .map(|(id, _)| generation_of(&id))
        .collect();
    assert!(generations.iter().any(|g| g == "g1"));
    assert!(
        generations.iter().any(|g| g == "g2"),
        "the restart is generation 2"
    );
    assert_eq!(lineages(&store).len(), 1, "a restore keeps the lineage");
    assert_no_violations(&store);
}

/// A job stopped before its first checkpoint and started again restores
/// nothing, but continues the lineage its checkpoint storage keeps: the
/// second start's checkpoints carry the first start's lineage, so a sink's
/// start hook can find what the first start left.
#[tokio::test(start_paused = true)]
async fn a_start_without_a_checkpoint_continues_the_lineage_the_storage_keeps() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    stopped_after(ms(100), &store, &storage).await;
    assert!(
        storage.checkpoints().is_empty(),
        "stopped before any checkpoint"
    );
    let kept = storage
        .lineage(sink_api::Lineage::new("not-drawn-by-the-runtime"))
        .await
        .unwrap();
    assert_ne!(
        kept.as_str(),
        "not-drawn-by-the-runtime",
        "the first start kept its lineage"
    );

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
    let last = storage.checkpoints().last().cloned().unwrap();
    assert_eq!(
        last.lineage,
        Some(kept),
        "the second start continued the lineage"
    );
    assert!(
        last.generation.0 >= 2,
        "a new generation: {:?}",
        last.generation
    );
    assert_exactly_once("committed", &store.committed(), RECORDS);
}

/// Stops a job of parallelism `from` in the middle, restarts it with
/// parallelism `to` (and a global committer throughout), and checks that every
/// record is committed, and delivered to the global committer, exactly once.
async fn rescale(from: usize, to: usize) {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let build = |source: ThrottledSource, parallelism| {
        Job::builder("resume", source, MemorySink::new(store.clone()))
            .parallelism(parallelism)
            .checkpointing(CheckpointConfig::every(ms(200)))
            .checkpoint_storage(storage.clone())
            .global_committer({
                let store = store.clone();
                move || MemoryGlobalCommitter::new(store.clone())
            })
            .build()
            .unwrap()
    };
    let first = build(ThrottledSource::unbounded(RECORDS, 10, ms(10)), from).start();
    tokio::time::sleep(ms(650)).await;
    first.cancel();
    first.join().await.unwrap();
    let restored = storage.checkpoints().last().unwrap().clone();
    assert_eq!(restored.parallelism, from);
    assert!(
        restored.subtasks.iter().any(|s| !s.pending.is_empty())
            || restored
                .global_committer
                .as_ref()
                .is_some_and(|g| !g.pending.is_empty()),
        "the restored checkpoint should hold something to re-commit"
    );
    assert!((store.committed().len() as u64) < RECORDS);

    let report = build(ThrottledSource::bounded(RECORDS, 10, ms(10)), to)
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_exactly_once("global committer", &store.global_records(), RECORDS);
    assert_eq!(store.stats().writers_created as usize, from + to);
    assert_no_violations(&store);
}

#[tokio::test(start_paused = true)]
async fn rescaling_from_two_to_three_is_exactly_once() {
    rescale(2, 3).await;
}

#[tokio::test(start_paused = true)]
async fn rescaling_from_three_to_one_is_exactly_once() {
    rescale(3, 1).await;
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

/// A task failure restarts the whole job from its last completed checkpoint
/// when a restart strategy allows it; the output is still exactly once.
#[tokio::test(start_paused = true)]
async fn a_failed_job_restarts_from_its_last_checkpoint() {
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "restarts",
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(200)))
    .global_committer({
        let store = store.clone();
        move || MemoryGlobalCommitter::new(store.clone())
    })
    .restart_strategy(RestartStrategy::FixedDelay {
        attempts: 3,
        delay: ms(100),
    })
    .build()
    .unwrap()
    .start();
    // Fail twice while the job runs: once in a commit, once in a writer.
    tokio::time::sleep(ms(450)).await;
    store.fail_next_commits(1, InjectedCommitFailure::UnknownReason);
    tokio::time::sleep(ms(400)).await;
    store.fail_next_prepare_commits(1);
    let report = handle.join().await.unwrap();

    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.restarts, 2, "{:?}", report.metrics);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_exactly_once("global committer", &store.global_records(), RECORDS);
    let generations: std::collections::BTreeSet<String> = store
        .transactions()
        .into_iter()
        .map(|(id, _)| generation_of(&id))
        .collect();
    assert_eq!(
        generations.into_iter().collect::<Vec<_>>(),
        vec!["g1", "g2", "g3"]
    );
    assert_eq!(lineages(&store).len(), 1, "restarts keep the lineage");
    assert_no_violations(&store);
}

/// Past the allowed restarts, the job fails with the last error.
#[tokio::test(start_paused = true)]
async fn restarts_are_bounded() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_prepare_commits(10);
    let error = Job::builder(
        "doomed",
        SequenceSource::bounded(100),
        MemorySink::new(store.clone()),
    )
    .restart_strategy(RestartStrategy::FixedDelay {
        attempts: 2,
        delay: ms(100),
    })
    .build()
    .unwrap()
    .run()
    .await
    .unwrap_err();
    assert!(
        matches!(
            error,
            JobError::Sink {
                action: "prepare_commit",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        store.stats().writers_created,
        3,
        "the first start and two restarts"
    );
    assert!(store.committed().is_empty());
}

/// A finished job is recognised as finished and not run again; both
/// reports name the lineage it ran in (the one its transactions carry).
#[tokio::test(start_paused = true)]
async fn a_finished_job_is_not_run_again() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let run = || {
        Job::builder(
            "once",
            SequenceSource::bounded(100),
            MemorySink::new(store.clone()),
        )
        .checkpoint_storage(storage.clone())
        .build()
        .unwrap()
        .run()
    };
    let first = run().await.unwrap();
    assert_eq!(first.status, JobStatus::Finished);
    let ran_in: Vec<_> = lineages(&store).into_iter().collect();
    let reported = first.lineage.as_ref().map(|l| l.to_string());
    assert_eq!(reported.as_ref(), ran_in.first(), "{ran_in:?}");
    let again = run().await.unwrap();
    assert_eq!(again.status, JobStatus::AlreadyFinished);
    assert_eq!(again.lineage, first.lineage);
    assert_eq!(again.metrics.records_written, 0);
    assert_eq!(store.stats().writers_created, 1);
    assert_exactly_once("committed", &store.committed(), 100);
}

/// A job built `resumable_after_finish` (what a pipeline does) does not
/// mark its storage finished: the next start restores the final
/// checkpoint, commits again what it held (a replay), reads nothing more,
/// and finishes; nothing is written twice.
#[tokio::test(start_paused = true)]
async fn a_job_resumable_after_finish_restores_its_final_checkpoint() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let run = || {
        Job::builder(
            "again",
            SequenceSource::bounded(100),
            MemorySink::new(store.clone()),
        )
        .checkpoint_storage(storage.clone())
        .resumable_after_finish()
        .build()
        .unwrap()
        .run()
    };
    assert_eq!(run().await.unwrap().status, JobStatus::Finished);
    let again = run().await.unwrap();
    assert_eq!(again.status, JobStatus::Finished);
    assert_eq!(again.metrics.records_written, 0);
    assert_eq!(store.stats().writers_created, 2, "the second start ran");
    assert_exactly_once("committed", &store.committed(), 100);
    assert_no_violations(&store);
}

/// Runs a job briefly and returns its newest checkpoint.
async fn a_checkpoint(store: &MemoryStore<u64>) -> sink_runtime::storage::CompletedCheckpoint {
    let storage = MemoryCheckpointStorage::new(3);
    let first = job(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        store,
        &storage,
        2,
    )
    .start();
    tokio::time::sleep(ms(450)).await;
    first.cancel();
    first.join().await.unwrap();
    storage.checkpoints().pop().unwrap()
}

/// The pending committables of a restored checkpoint are committed before the
/// first record is read.
#[tokio::test(start_paused = true)]
async fn a_restored_checkpoint_is_committed_before_any_record_is_read() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    // Each subtask's first commit fails: the job dies with checkpoint 1
    // stored and not committed.
    store.fail_next_commits(2, InjectedCommitFailure::UnknownReason);
    let error = job(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        2,
    )
    .run()
    .await
    .unwrap_err();
    assert!(matches!(error, JobError::Commit { .. }), "{error:?}");
    let stored = storage.checkpoints().pop().unwrap();
    assert_eq!(stored.checkpoint_id, CheckpointId(1));
    let pending_records: u64 = stored
        .subtasks
        .iter()
        .flat_map(|s| &s.pending)
        .map(|p| p.summary.record_count)
        .sum();
    assert!(pending_records > 0);
    assert!(store.committed().is_empty());
    let written_before = store.written().len();

    let second = job(
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        &store,
        &storage,
        2,
    )
    .start();
    // The throttled reader sleeps 10 ms before its first read.
    tokio::time::sleep(ms(5)).await;
    assert_eq!(store.written().len(), written_before, "no record read yet");
    assert_eq!(
        store.committed().len() as u64,
        pending_records,
        "the restored checkpoint is committed before new data flows"
    );
    let report = second.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_no_violations(&store);
}

/// An inconsistent checkpoint (a subtask missing, a part whose count does not
/// match its summary) is refused rather than restored wrongly.
#[tokio::test(start_paused = true)]
async fn an_inconsistent_checkpoint_is_refused() {
    let store = MemoryStore::<u64>::new();
    let checkpoint = a_checkpoint(&store).await;

    let mut missing = checkpoint.clone();
    missing.subtasks.pop();
    let mut miscounted = checkpoint.clone();
    let part = miscounted
        .subtasks
        .iter_mut()
        .flat_map(|s| s.pending.iter_mut())
        .next()
        .expect("a pending part");
    part.summary.committable_count += 1;

    for (broken, expected) in [
        (missing, "not each of 0..2 once"),
        (miscounted, "announcing"),
    ] {
        let storage = MemoryCheckpointStorage::new(3);
        sink_runtime::CheckpointStorage::store(&storage, broken)
            .await
            .unwrap();
        let error = job(
            ThrottledSource::bounded(RECORDS, 10, ms(10)),
            &store,
            &storage,
            2,
        )
        .run()
        .await
        .unwrap_err();
        assert!(matches!(error, JobError::Restore { .. }), "{error:?}");
        assert!(error.to_string().contains(expected), "{error}");
    }
}

/// A panicking task is a task failure like any other: the job restarts from
/// its last checkpoint and the output stays exactly once.
#[tokio::test(start_paused = true)]
async fn a_panicking_writer_restarts_the_job() {
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "panics",
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(200)))
    .restart_strategy(RestartStrategy::ExponentialBackoff(
        sink_runtime::RetryPolicy {
            max_retries: 3,
            initial_backoff: ms(50),
            max_backoff: ms(500),
        },
    ))
    .build()
    .unwrap()
    .start();
    tokio::time::sleep(ms(450)).await;
    store.panic_next_writes(1);
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.restarts, 1);
    assert_eq!(store.stats().injected_write_panics, 1);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_no_violations(&store);
}

/// The generation part (`g<n>`) of a memory-sink transaction id,
/// `<lineage>-g<n>-s<subtask>-t<seq>`.
fn generation_of(id: &str) -> String {
    id.split('-')
        .find(|part| part.starts_with('g'))
        .unwrap_or_default()
        .to_string()
}

/// The lineages the store's transaction ids were named in.
fn lineages(store: &MemoryStore<u64>) -> std::collections::BTreeSet<String> {
    store
        .transactions()
        .into_iter()
        .map(|(id, _)| id.split('-').next().unwrap_or_default().to_string())
        .collect()
}
