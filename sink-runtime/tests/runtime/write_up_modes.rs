//! The write-up's experiment ("no checkpoint, never commits"), with the memory
//! sink: 160 records, parallelism 2, in each mode of the table in
//! `docs/semantics.md`. Runs on tokio's paused clock, so "12 seconds" take no
//! real time and every run is the same.

use crate::common;

use std::time::Duration;

use common::*;
use sink_runtime::{BuildError, CheckpointConfig, Job, JobStatus, RuntimeMode, SequenceSource};
use sinks_memory::{MemorySink, MemoryStore};

const RECORDS: u64 = 160;
const PARALLELISM: usize = 2;

fn every_second() -> CheckpointConfig {
    CheckpointConfig::every(Duration::from_secs(1))
}

/// Unbounded, 1 s checkpoints: everything is committed within a few
/// checkpoints, although the input never ends.
#[tokio::test(start_paused = true)]
async fn unbounded_with_checkpoints_commits_everything() {
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "unbounded",
        SequenceSource::unbounded(RECORDS),
        MemorySink::new(store.clone()),
    )
    .parallelism(PARALLELISM)
    .checkpointing(every_second())
    .build()
    .expect("checkpointing is on")
    .start();

    let mut seconds = 0;
    while (store.committed().len() as u64) < RECORDS {
        assert!(
            seconds < 4,
            "not all committed after {seconds} s: {:?}",
            handle.metrics()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        seconds += 1;
    }
    tokio::time::sleep(Duration::from_secs(12 - seconds)).await;
    handle.cancel();
    let report = handle.join().await.unwrap();
    let metrics = report.metrics;

    assert_eq!(report.status, JobStatus::Cancelled);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_eq!(store.written().len() as u64, RECORDS);
    assert_eq!(metrics.records_written, RECORDS);
    assert_eq!(metrics.records_committed, RECORDS);
    assert_eq!(metrics.records_uncommitted, 0);
    // One prepare_commit per subtask and checkpoint, and the input never ends.
    assert!(metrics.checkpoints_completed >= 11, "{metrics:?}");
    assert_eq!(
        metrics.prepare_commit_calls,
        PARALLELISM as u64 * metrics.checkpoints_triggered,
        "{metrics:?}"
    );
    assert_eq!(
        store.stats().prepare_commit_calls,
        metrics.prepare_commit_calls
    );
    assert_eq!(store.stats().end_of_input_flushes, 0);
    assert_no_violations(&store);
}

/// Unbounded, checkpointing off: refused at build time, with the fix named.
#[test]
fn unbounded_without_checkpoints_is_refused_at_build_time() {
    let error = Job::builder(
        "unbounded-nockpt",
        SequenceSource::unbounded(RECORDS),
        MemorySink::new(MemoryStore::<u64>::new()),
    )
    .parallelism(PARALLELISM)
    .build()
    .expect_err("must be refused");
    assert!(matches!(
        error,
        BuildError::UnboundedWithoutCheckpointing { .. }
    ));
    let message = error.to_string();
    assert!(message.contains("never commit"), "{message}");
    assert!(
        message.contains(".checkpointing("),
        "names the fix: {message}"
    );
    assert!(message.contains("allow_uncommitted_output"), "{message}");
}

/// Unbounded, checkpointing off, explicitly allowed: it runs, writes
/// everything, prepares and commits nothing, and the metrics say so.
#[tokio::test(start_paused = true)]
async fn unbounded_without_checkpoints_when_allowed_writes_but_never_commits() {
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "unbounded-nockpt",
        SequenceSource::unbounded(RECORDS),
        MemorySink::new(store.clone()),
    )
    .parallelism(PARALLELISM)
    .allow_uncommitted_output()
    .build()
    .expect("allowed explicitly")
    .start();
    tokio::time::sleep(Duration::from_secs(12)).await;
    handle.cancel();
    let report = handle.join().await.unwrap();
    let metrics = report.metrics;

    assert_eq!(report.status, JobStatus::Cancelled);
    assert_eq!(store.written().len() as u64, RECORDS);
    assert!(store.committed().is_empty());
    assert_eq!(store.stats().prepare_commit_calls, 0);
    assert_eq!(store.stats().commit_calls, 0);
    assert_eq!(metrics.records_written, RECORDS);
    assert_eq!(metrics.records_committed, 0);
    assert_eq!(metrics.records_uncommitted, RECORDS);
    assert_eq!(metrics.prepare_commit_calls, 0);
    assert_eq!(metrics.checkpoints_triggered, 0);
    assert_no_violations(&store);
}

/// Bounded, checkpointing off: everything committed once at end of input,
/// with exactly one prepare_commit per subtask.
#[tokio::test(start_paused = true)]
async fn bounded_without_checkpoints_commits_everything_at_end_of_input() {
    let store = MemoryStore::<u64>::new();
    let report = Job::builder(
        "nockpt",
        SequenceSource::bounded(RECORDS),
        MemorySink::new(store.clone()),
    )
    .parallelism(PARALLELISM)
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();

    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_eq!(store.stats().prepare_commit_calls, 2);
    assert_eq!(report.metrics.prepare_commit_calls, 2);
    assert_eq!(store.stats().end_of_input_flushes, 2);
    // Both subtasks' end-of-input committables carry checkpoint id 1 (the id
    // after "no checkpoint yet").
    assert_eq!(
        store
            .commits_per_checkpoint()
            .into_iter()
            .collect::<Vec<_>>(),
        vec![(sink_api::CheckpointId(1), 2)]
    );
    assert_eq!(report.metrics.records_committed, RECORDS);
    // Only the final checkpoint was taken, at end of input, so that a crash
    // during the commit is recovered without duplicates.
    assert_eq!(report.last_checkpoint, Some(sink_api::CheckpointId(1)));
    assert_eq!(report.metrics.checkpoints_triggered, 1);
    assert_no_violations(&store);
}

/// Batch mode: everything committed once at the end, whatever the
/// checkpointing setting says.
#[tokio::test(start_paused = true)]
async fn batch_mode_commits_everything_at_the_end() {
    let store = MemoryStore::<u64>::new();
    let report = Job::builder(
        "batch",
        ThrottledSource::bounded(RECORDS, 10, ms(300)),
        MemorySink::new(store.clone()),
    )
    .parallelism(PARALLELISM)
    .mode(RuntimeMode::Batch)
    .checkpointing(every_second())
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();

    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), RECORDS);
    assert_eq!(
        report.metrics.checkpoints_triggered, 1,
        "batch ignores the interval: only the final checkpoint is taken"
    );
    assert_eq!(store.stats().prepare_commit_calls, 2);
    assert_eq!(store.stats().commit_calls, 2);
    assert_no_violations(&store);
}

/// Batch mode with an unbounded source: refused.
#[test]
fn batch_mode_with_an_unbounded_source_is_refused() {
    let error = Job::builder(
        "batch-unbounded",
        SequenceSource::unbounded(RECORDS),
        MemorySink::new(MemoryStore::<u64>::new()),
    )
    .mode(RuntimeMode::Batch)
    .checkpointing(every_second())
    .allow_uncommitted_output()
    .build()
    .expect_err("must be refused");
    assert!(matches!(error, BuildError::BatchWithUnboundedSource { .. }));
    assert!(error.to_string().contains("bounded source"), "{error}");
}

/// Settings out of range are refused with what is allowed.
#[test]
fn invalid_settings_are_refused() {
    let build = |parallelism, config: Option<CheckpointConfig>| {
        let builder = Job::builder(
            "bad",
            SequenceSource::bounded(1),
            MemorySink::new(MemoryStore::<u64>::new()),
        )
        .parallelism(parallelism);
        match config {
            Some(config) => builder.checkpointing(config),
            None => builder,
        }
        .build()
        .map(|_| ())
    };
    let message = |result: Result<(), BuildError>| result.unwrap_err().to_string();
    assert!(message(build(0, None)).contains("parallelism must be at least 1"));
    assert!(message(build(1, Some(CheckpointConfig::every(Duration::ZERO)))).contains("interval"));
    assert!(message(build(1, Some(every_second().timeout(Duration::ZERO)))).contains("timeout"));
    assert!(message(build(1, Some(every_second().max_concurrent(0)))).contains("in flight"));
}
