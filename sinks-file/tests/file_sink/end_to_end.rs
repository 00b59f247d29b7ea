//! The file sink driven by the runtime, on the write-up's modes and across
//! restarts: every record in finished files exactly once.

use crate::common;

use std::time::Duration;

use common::*;
use sink_runtime::storage::CheckpointStorage;
use sink_runtime::{
    CheckpointConfig, Job, JobStatus, LocalCheckpointStorage, RuntimeMode, SequenceSource,
};
use sinks_file::{DateTimeBucketAssigner, FileSink, LineEncoder, ManualClock, RollingPolicy};

fn sink(dir: &std::path::Path) -> FileSink<u64, LineEncoder> {
    FileSink::builder(dir, LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(4 * 1024),
            ..RollingPolicy::default()
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_streaming_with_checkpoints_commits_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(&dir.path().join("out"));
    let stats = sink.stats();
    let report = Job::builder("files", SequenceSource::bounded(5_000).paced(20_000), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(
        report.metrics.checkpoints_completed >= 3,
        "{:?}",
        report.metrics
    );
    let numbers = visible_numbers(&dir.path().join("out"));
    assert_eq!(exactly_once_problem(&numbers, 5_000), None);
    assert_eq!(stats.snapshot().committed_records, 5_000);
    // The same counters, registered in the job's metrics.
    let sink_counter = |name: &str| {
        let counter = report.metrics.sink.iter().find(|c| c.name == name);
        counter
            .unwrap_or_else(|| panic!("no {name} in {:?}", report.metrics.sink))
            .value
    };
    assert_eq!(sink_counter("file_sink_committed_records"), 5_000);
    assert_eq!(
        sink_counter("file_sink_committed_files"),
        stats.snapshot().committed_files
    );
}

/// The runtime's clock reaches the file sink: a job built with a manual
/// clock puts records in the date-time bucket of that clock's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtimes_clock_decides_the_date_time_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .bucket_assigner(DateTimeBucketAssigner::default())
        .build()
        .unwrap();
    // 2026-01-02T13:00:00Z.
    let clock = ManualClock::new(1_767_358_800_000);
    let report = Job::builder("clock", SequenceSource::bounded(100), sink)
        .clock(clock)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let files = visible_files(dir.path());
    assert!(!files.is_empty());
    for file in &files {
        let bucket = file.strip_prefix(dir.path()).unwrap().parent().unwrap();
        assert_eq!(bucket, std::path::Path::new("2026-01-02--13"), "{file:?}");
    }
    assert_eq!(
        exactly_once_problem(&visible_numbers(dir.path()), 100),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_without_checkpoints_and_batch_commit_at_the_end() {
    for mode in [RuntimeMode::Streaming, RuntimeMode::Batch] {
        let dir = tempfile::tempdir().unwrap();
        let report = Job::builder("files", SequenceSource::bounded(1_000), sink(dir.path()))
            .parallelism(2)
            .mode(mode)
            .build()
            .unwrap()
            .run()
            .await
            .unwrap();
        assert_eq!(report.metrics.prepare_commit_calls, 2, "{mode:?}");
        assert_eq!(
            exactly_once_problem(&visible_numbers(dir.path()), 1_000),
            None,
            "{mode:?}"
        );
    }
}

/// The hidden files under `dir` whose names end with `lineage`.
fn hidden_of(dir: &std::path::Path, lineage: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() && !name.starts_with('.') {
            found.extend(hidden_of(&entry.path(), lineage));
        } else if name.starts_with('.') && name.ends_with(lineage) {
            found.push(entry.path());
        }
    }
    found
}

/// Stopped in the middle and started again on the same state directory (as
/// a new process would be): the output is exactly once, and the start
/// removes the hidden parts of the job's lineage that the restored
/// checkpoint does not refer to (those written after it, and one planted),
/// leaving another lineage's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_job_resumes_and_its_files_hold_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let state = out.join(".state");
    let first = Job::builder(
        "resume",
        SequenceSource::unbounded(4_000).paced(5_000),
        sink(&out),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
    .checkpoint_storage(LocalCheckpointStorage::open(&state).unwrap())
    .build()
    .unwrap()
    .start();
    // Stopped once something is committed, whatever the machine's speed.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while visible_numbers(&out).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.cancel();
    first.join().await.unwrap();
    let partial = visible_numbers(&out).len();
    assert!(partial > 0 && partial < 4_000, "{partial}");
    let lineage = {
        let storage = LocalCheckpointStorage::open(&state).unwrap();
        let latest = storage.latest().await.unwrap().unwrap();
        latest.lineage.unwrap().to_string()
    };
    let orphan = out.join(format!(".part-planted-0.inprogress.{lineage}"));
    let foreign = out.join(".part-planted-1.inprogress.0123456789abcdef0123456789abcdef");
    std::fs::write(&orphan, "99999\n").unwrap();
    std::fs::write(&foreign, "99999\n").unwrap();

    let second = sink(&out);
    let stats = second.stats();
    let report = Job::builder(
        "resume",
        SequenceSource::bounded(4_000).paced(5_000),
        second,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
    .checkpoint_storage(LocalCheckpointStorage::open(&state).unwrap())
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(exactly_once_problem(&visible_numbers(&out), 4_000), None);
    assert!(
        !orphan.exists(),
        "the planted orphan of this lineage is removed"
    );
    assert!(
        foreign.exists(),
        "another lineage's hidden part is left alone"
    );
    assert_eq!(hidden_of(&out, &lineage), Vec::<std::path::PathBuf>::new());
    assert!(
        stats.snapshot().orphans_removed >= 1,
        "{:?}",
        stats.snapshot()
    );
}

/// The same job run twice into the same output directory, each time on
/// fresh checkpoint storage (the in-memory default): both runs' records are
/// in the finished files, each once per run. Part names carry a random
/// writer id and the output keeps its identity, so the second run never
/// meets a name of the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_run_again_on_fresh_checkpoint_storage_keeps_both_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for run in 0..2 {
        let report = Job::builder(
            "files",
            SequenceSource::bounded(2_000).paced(20_000),
            sink(&out),
        )
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
        assert_eq!(report.status, JobStatus::Finished, "run {run}");
        assert_eq!(report.metrics.commits_already_committed, 0, "run {run}");
    }
    let mut numbers = visible_numbers(&out);
    numbers.sort_unstable();
    let expected: Vec<u64> = (0..2_000).flat_map(|n| [n, n]).collect();
    assert_eq!(numbers, expected, "each record once per run");
}
