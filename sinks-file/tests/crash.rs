//! Crash tests of the file sink: at every crash point of the runtime and in
//! the middle of a commit batch of the file committer, a job is crashed a few
//! times and restarted on the same output and state directory, as a new
//! process would be. Its finished files must hold every record exactly once,
//! and no uncommitted data may ever be visible.
//!
//! `cargo test -p sinks-file --features failpoints,sink-runtime/failpoints --test crash`

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use sink_runtime::failpoints::FAILPOINTS;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobReport, JobStatus, LocalCheckpointStorage, SequenceSource,
};
use sinks_file::{FileSink, LineEncoder, RollingPolicy};

const RECORDS: u64 = 3_000;
const FILE_MID_BATCH: &str = "file-commit-mid-batch";

async fn run_once(out: &Path, checkpoints: bool) -> Result<JobReport, JobError> {
    let sink = FileSink::builder(out, LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(1024),
            ..RollingPolicy::default()
        })
        .build()
        .expect("a valid sink");
    let builder = Job::builder(
        "file-crash",
        SequenceSource::bounded(RECORDS).paced(30_000),
        sink,
    )
    .parallelism(2)
    .batch_size(64)
    .checkpoint_storage(LocalCheckpointStorage::open(out.join(".state"))?);
    let builder = match checkpoints {
        true => builder.checkpointing(CheckpointConfig::every(Duration::from_millis(10))),
        false => builder,
    };
    builder.build().expect("a valid job").run().await
}

/// The crash point a failure was simulated at, if it was a simulated crash.
fn crash_point(error: &JobError) -> Option<&'static str> {
    match error {
        JobError::Crash { failpoint } => Some(failpoint),
        JobError::Sink { source, .. } if source.to_string().contains(FILE_MID_BATCH) => {
            Some(FILE_MID_BATCH)
        }
        _ => None,
    }
}

async fn scenario(point: &'static str, checkpoints: bool) -> u32 {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("out");
    let mut crashes = 0;
    for round in 0.. {
        assert!(round < 12, "{point}: the job did not finish");
        // The re-commit point is reached only by a restore with something to commit
        // again: the first round crashes right after a checkpoint is stored
        // (the primer), the next ones crash at the point itself.
        let primed = point == "during-recovery-recommit";
        if primed && round == 0 {
            fail::cfg("after-checkpoint-stored", "1*return->off").expect("a valid failpoint");
        } else if let Some(skip) = [0u32, 2, 1].get(round - usize::from(primed)) {
            fail::cfg(point, &format!("{skip}*off->1*return->off")).expect("a valid failpoint");
        }
        let result = run_once(&out, checkpoints).await;
        fail::remove(point);
        fail::remove("after-checkpoint-stored");
        // Whatever happened, readers only ever see complete records, each once
        // at most.
        let seen = visible_numbers(&out);
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]) && seen.iter().all(|&n| n < RECORDS),
            "{point}: a reader saw duplicated or broken records after round {round}"
        );
        match result {
            Ok(report) => {
                assert_eq!(report.status, JobStatus::Finished, "{point}");
                break;
            }
            // Only crashes at the point under test count.
            Err(error) if crash_point(&error).is_some() => {
                crashes += u32::from(crash_point(&error) == Some(point));
            }
            Err(error) => {
                panic!("{point} (checkpoints: {checkpoints}): unexpected failure: {error}")
            }
        }
    }
    let problem = exactly_once_problem(&visible_numbers(&out), RECORDS);
    assert_eq!(
        problem, None,
        "{point} (checkpoints: {checkpoints}) after {crashes} crashes"
    );
    assert!(
        crashes >= 1,
        "{point} (checkpoints: {checkpoints}) was never reached"
    );
    crashes
}

#[test]
fn every_crash_point_leaves_every_record_once_in_finished_files() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut scenarios = 0;
    let mut total_crashes = 0;
    for checkpoints in [true, false] {
        for &point in FAILPOINTS.iter().chain([FILE_MID_BATCH].iter()) {
            if point == "after-global-commit" {
                continue; // the file sink has no global committer
            }
            total_crashes += runtime.block_on(scenario(point, checkpoints));
            scenarios += 1;
        }
    }
    println!("file sink crash tests: {scenarios} scenarios, {total_crashes} crashes, 0 violations");
}
