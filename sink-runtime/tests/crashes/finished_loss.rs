//! A job that lost output, killed right after its finished marker was
//! written and before its report reached anyone: every later start finds
//! the job finished and reports the loss again, counted and named, from the
//! marker (`FinishedMarker::lost`). Needs the `failpoints` feature (its own
//! process: `fail`'s configuration is process-wide).

use crate::common;

use common::*;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobStatus, LocalCheckpointStorage, RestartStrategy,
};
use sinks_memory::{InjectedCommitFailure, MemorySink, MemoryStore};

#[tokio::test]
async fn killed_after_its_finished_marker_a_job_that_lost_output_reports_the_loss_at_every_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<u64>::new();
    // The first checkpoint's commit fails with a known reason: its records
    // are lost, and the job goes on to finish.
    store.fail_next_commits(1, InjectedCommitFailure::KnownReason);
    let job = || {
        Job::builder(
            "finished-loss",
            ThrottledSource::bounded(100, 10, ms(50)),
            MemorySink::new(store.clone()),
        )
        .checkpointing(CheckpointConfig::every(ms(150)))
        .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
        .restart_strategy(RestartStrategy::Never)
        .build()
        .unwrap()
    };
    fail::cfg("after-mark-finished", "return").unwrap();
    let killed = job().run().await;
    fail::cfg("after-mark-finished", "off").unwrap();
    assert!(
        matches!(
            killed,
            Err(JobError::Crash {
                failpoint: "after-mark-finished"
            })
        ),
        "the run died right after its marker: {killed:?}"
    );
    assert_eq!(sink_runtime::failpoints::hits("after-mark-finished"), 1);
    let committed = store.committed().len() as u64;
    assert!(committed < 100, "output was lost: {committed} committed");

    for start in 1..=2 {
        let report = job().run().await.unwrap();
        assert_eq!(report.status, JobStatus::AlreadyFinished, "start {start}");
        assert!(report.lost_output(), "start {start}: {report:?}");
        assert_eq!(report.metrics.commits_failed, 1, "start {start}");
        assert_eq!(
            report.metrics.records_lost,
            100 - committed,
            "start {start}"
        );
        assert_eq!(report.known_failures.len(), 1, "start {start}");
        assert!(
            report.known_failures[0].reason.contains("injected"),
            "named: {:?}",
            report.known_failures[0]
        );
    }
    assert_eq!(
        store.committed().len() as u64,
        committed,
        "nothing written again"
    );
}
