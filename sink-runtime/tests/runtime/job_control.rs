//! `JobControl`: a stop, asked from another task while one awaits `join`,
//! ends the input, commits everything read and returns `Stopped`; the
//! storage stays resumable, so the next start goes on from there, every
//! record once. A cancel from the control stops without committing.

use std::time::Duration;

use sink_runtime::{
    CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage, RuntimeMode, SequenceSource,
};
use sinks_memory::{MemorySink, MemoryStore};

fn sorted(store: &MemoryStore<u64>) -> Vec<u64> {
    let mut committed = store.committed();
    committed.sort_unstable();
    committed
}

/// An unbounded job, stopped twice from a "signal handler" while another
/// task awaits it: each run ends `Stopped` with everything it wrote
/// committed, and the second run goes on where the first stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_commits_what_was_read_and_the_next_start_goes_on_from_there() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::default();
    let run = |store: &MemoryStore<u64>| {
        let source = SequenceSource::unbounded(1_000_000).paced(2_000);
        let handle = Job::builder("stopped", source, MemorySink::new(store.clone()))
            .parallelism(2)
            // Long enough that a stop never waits for a periodic one: the
            // commit is the stop's own final checkpoint.
            .checkpointing(CheckpointConfig::every(Duration::from_secs(3600)))
            .checkpoint_storage(storage.clone())
            .build()
            .unwrap()
            .start();
        let control = handle.control();
        (control, tokio::spawn(handle.join()))
    };

    let (control, job) = run(&store);
    // Nothing is committed before the stop (no checkpoint completes):
    // wait for records to be written instead.
    tokio::time::sleep(Duration::from_millis(150)).await;
    control.stop();
    control.stop(); // twice: harmless
    let report = tokio::time::timeout(Duration::from_secs(30), job)
        .await
        .expect("the stop ended the job")
        .unwrap()
        .unwrap();
    assert_eq!(report.status, JobStatus::Stopped);
    let first = sorted(&store);
    assert!(!first.is_empty(), "the stop committed what was read");
    assert_eq!(report.metrics.records_written, first.len() as u64);
    assert_eq!(report.metrics.records_committed, first.len() as u64);
    assert!(store.violations().is_empty(), "{:?}", store.violations());
    control.stop(); // after the end: harmless

    // The second start restores the stop's final checkpoint and reads on.
    let (control, job) = run(&store);
    tokio::time::sleep(Duration::from_millis(150)).await;
    control.stop();
    let report = tokio::time::timeout(Duration::from_secs(30), job)
        .await
        .expect("the stop ended the job")
        .unwrap()
        .unwrap();
    assert_eq!(report.status, JobStatus::Stopped);
    let second = sorted(&store);
    assert!(second.len() > first.len());
    assert!(store.violations().is_empty(), "{:?}", store.violations());
    let mut deduplicated = second.clone();
    deduplicated.dedup();
    assert_eq!(deduplicated, second, "every record once");
    // Each subtask's numbers are a contiguous run from its start: nothing
    // skipped between the two runs.
    let half = 500_000;
    for (from, part) in [(0, &second[..]), (half, &second[..])] {
        let mine: Vec<u64> = part
            .iter()
            .copied()
            .filter(|n| (from..from + half).contains(n))
            .collect();
        assert_eq!(mine, (from..from + mine.len() as u64).collect::<Vec<_>>());
    }
}

/// A bounded batch job stopped half-way commits what it read; started again
/// on the same storage it does not find itself finished, and reads the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_bounded_job_is_not_finished_and_its_next_start_reads_the_rest() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::default();
    let job = |store: &MemoryStore<u64>| {
        Job::builder(
            "batch",
            SequenceSource::bounded(2_000).paced(4_000),
            MemorySink::new(store.clone()),
        )
        .mode(RuntimeMode::Batch)
        .parallelism(2)
        .checkpoint_storage(storage.clone())
        .build()
        .unwrap()
    };
    let handle = job(&store).start();
    let control = handle.control();
    let joined = tokio::spawn(handle.join());
    tokio::time::sleep(Duration::from_millis(100)).await;
    control.stop();
    let report = joined.await.unwrap().unwrap();
    assert_eq!(report.status, JobStatus::Stopped);
    let first = store.committed().len();
    assert!(first > 0 && first < 2_000, "{first} committed at the stop");

    let report = job(&store).run().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(sorted(&store), (0..2_000).collect::<Vec<_>>());
    assert!(store.violations().is_empty(), "{:?}", store.violations());
}

/// A cancel from the control commits nothing more and ends `Cancelled`,
/// even while a stop is under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_the_control_commits_nothing_more() {
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "cancelled",
        SequenceSource::unbounded(1_000_000).paced(2_000),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(Duration::from_secs(3600)))
    .build()
    .unwrap()
    .start();
    let control = handle.control();
    let joined = tokio::spawn(handle.join());
    tokio::time::sleep(Duration::from_millis(50)).await;
    control.cancel();
    control.stop();
    let report = joined.await.unwrap().unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    assert!(store.committed().is_empty());
}
