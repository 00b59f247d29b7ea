//! Crash tests of the file sink: at every crash point of the runtime and in
//! the middle of a commit batch of the file committer, a job is crashed a few
//! times and restarted on the same output and state directory, as a new
//! process would be. Its finished files must hold every record exactly once,
//! and no uncommitted data may ever be visible.
//!
//! `cargo test -p sinks-file --features failpoints,sink-runtime/failpoints --test crash`
//!
//! With the `s3` features, under `scripts/with-s3`, the same matrix runs on
//! an S3-compatible server: output and checkpoints both there.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use sink_runtime::failpoints::FAILPOINTS;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobReport, JobStatus, LocalCheckpointStorage, SequenceSource,
};
use sinks_file::{CompactionPolicy, FileSink, FileSinkBuilder, LineEncoder, RollingPolicy};

const RECORDS: u64 = 3_000;
const FILE_MID_BATCH: &str = "file-commit-mid-batch";

/// Where a scenario's job writes its output and checkpoints.
enum Target {
    /// A local output directory, checkpoints in its `.state`.
    Local(PathBuf),
    /// The same, compacted: every epoch sealed and merged at every
    /// checkpoint, replaced files removed at once.
    Compacted(PathBuf),
    /// An `s3://bucket/prefix` output, checkpoints under `<prefix>-state`.
    #[cfg(feature = "s3")]
    S3(String),
}

impl Target {
    fn sink_builder(
        &self,
    ) -> FileSinkBuilder<u64, LineEncoder, sinks_file::BasePathBucketAssigner> {
        match self {
            Target::Local(out) => FileSink::builder(out, LineEncoder),
            Target::Compacted(out) => FileSink::builder(out, LineEncoder)
                .compaction(CompactionPolicy::every(Duration::ZERO).retention(Duration::ZERO)),
            #[cfg(feature = "s3")]
            Target::S3(url) => FileSink::object_store_builder(
                sinks_file::ObjectOutput::s3(url, &[]).expect("a valid URL"),
                LineEncoder,
            ),
        }
    }

    /// The numbers readers see in the finished files or objects, sorted.
    async fn visible_numbers(&self) -> Vec<u64> {
        match self {
            Target::Local(out) | Target::Compacted(out) => visible_numbers(out),
            #[cfg(feature = "s3")]
            Target::S3(url) => {
                let output = sinks_file::ObjectOutput::s3(url, &[]).expect("a valid URL");
                let mut numbers = Vec::new();
                for object in sinks_file::finished_objects(&output)
                    .await
                    .expect("a listing")
                {
                    let bytes = sinks_file::read_object(&output, &object)
                        .await
                        .expect("a read");
                    numbers.extend(
                        String::from_utf8_lossy(&bytes)
                            .lines()
                            .map(|line| line.parse::<u64>().unwrap_or(u64::MAX)),
                    );
                }
                numbers.sort_unstable();
                numbers
            }
        }
    }
}

/// One run of the job; `checkpoints`: every `interval`, or none.
async fn run_once(
    target: &Target,
    checkpoints: bool,
    interval: Duration,
) -> Result<JobReport, JobError> {
    run_paced(target, checkpoints, interval, 30_000).await
}

/// As [`run_once`], reading `per_second` records a second per subtask.
async fn run_paced(
    target: &Target,
    checkpoints: bool,
    interval: Duration,
    per_second: u64,
) -> Result<JobReport, JobError> {
    let sink = target
        .sink_builder()
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(1024),
            ..RollingPolicy::default()
        })
        .build()
        .expect("a valid sink");
    let builder = Job::builder(
        "file-crash",
        SequenceSource::bounded(RECORDS).paced(per_second),
        sink,
    )
    .parallelism(2)
    .batch_size(64);
    let builder = match target {
        Target::Local(out) | Target::Compacted(out) => {
            builder.checkpoint_storage(LocalCheckpointStorage::open(out.join(".state"))?)
        }
        #[cfg(feature = "s3")]
        Target::S3(url) => builder.checkpoint_storage(
            sink_runtime::storage::ObjectCheckpointStorage::s3(&format!("{url}-state"), &[])?,
        ),
    };
    let builder = match checkpoints {
        true => builder.checkpointing(CheckpointConfig::every(interval)),
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

async fn scenario(target: &Target, point: &'static str, checkpoints: bool) -> u32 {
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
        // The mid-batch point needs a commit of several parts: checkpoints
        // that each span several rolls, even when the store is slow to
        // start parts (on S3 a part costs three requests before its first
        // byte, and at 10 ms a checkpoint often held one part).
        let interval = match point {
            FILE_MID_BATCH => Duration::from_millis(100),
            _ => Duration::from_millis(10),
        };
        let result = run_once(target, checkpoints, interval).await;
        fail::remove(point);
        fail::remove("after-checkpoint-stored");
        // Whatever happened, readers only ever see complete records, each once
        // at most.
        let seen = target.visible_numbers().await;
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
    let problem = exactly_once_problem(&target.visible_numbers().await, RECORDS);
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

/// A runtime of two workers, as the machine has.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Failpoints are process-wide: the tests of this file take turns.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every crash point, with and without checkpoints, on targets made by
/// `target`; returns (scenarios, crashes).
fn matrix(target: impl Fn() -> (Target, Option<tempfile::TempDir>)) -> (u32, u32) {
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = runtime();
    let mut scenarios = 0;
    let mut total_crashes = 0;
    for checkpoints in [true, false] {
        for &point in FAILPOINTS.iter().chain([FILE_MID_BATCH].iter()) {
            if point == "after-global-commit" && !matches!(target().0, Target::Compacted(_)) {
                continue; // the file sink has a global committer only when it compacts
            }
            let (target, _dir) = target();
            total_crashes += runtime.block_on(scenario(&target, point, checkpoints));
            scenarios += 1;
        }
    }
    (scenarios, total_crashes)
}

#[test]
fn every_crash_point_leaves_every_record_once_in_finished_files() {
    let (scenarios, crashes) = matrix(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        (Target::Local(dir.path().join("out")), Some(dir))
    });
    println!("file sink crash tests: {scenarios} scenarios, {crashes} crashes, 0 violations");
}

/// The same with compaction at every checkpoint: crashes while segments
/// are sealed and merged (a merge of the crashed start may still run when
/// the next one starts, and repairs what it left).
#[test]
fn with_compaction_every_crash_point_leaves_every_record_once_in_finished_files() {
    let (scenarios, crashes) = matrix(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        (Target::Compacted(dir.path().join("out")), Some(dir))
    });
    println!(
        "file sink crash tests with compaction: {scenarios} scenarios, {crashes} crashes, 0 violations"
    );
}

/// Merges cut short before and after the exchange, every time the first
/// start tries, which then crashes before its final checkpoint: readers see
/// every record once all along, and the next start repairs what was left,
/// merges the segments, and ends with every record once, in merged files,
/// with no working or replaced directory left.
#[test]
fn merges_cut_short_are_repaired_by_the_next_start() {
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = runtime();
    for point in ["compaction-before-exchange", "compaction-after-exchange"] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("out");
        let target = Target::Compacted(out.clone());
        fail::cfg(point, "return").expect("a valid failpoint");
        fail::cfg("during-final-checkpoint", "1*return->off").expect("a valid failpoint");
        // Paced over about half a second (at 30 000 a second, the run took
        // 50 ms, and a loaded machine could end it before any checkpoint
        // completed, leaving nothing visible to check: it failed so once).
        let first = runtime.block_on(run_paced(&target, true, Duration::from_millis(10), 3_000));
        fail::remove(point);
        fail::remove("during-final-checkpoint");
        match first {
            Err(error) if crash_point(&error) == Some("during-final-checkpoint") => {}
            other => panic!("{point}: the first start should crash at its end: {other:?}"),
        }
        // What was committed before the crash, each record once.
        let seen = visible_numbers(&out);
        let twice: Vec<u64> = (seen.windows(2))
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        assert!(
            !seen.is_empty() && twice.is_empty(),
            "{point}: a cut-short merge changed what readers see: {} records visible, {} \
             twice (the first: {:?})",
            seen.len(),
            twice.len(),
            &twice[..twice.len().min(10)]
        );
        runtime
            .block_on(run_once(&target, true, Duration::from_millis(10)))
            .expect("the second start");
        assert_eq!(
            exactly_once_problem(&visible_numbers(&out), RECORDS),
            None,
            "{point}"
        );
        let names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|name| !name.contains(".compacting") && !name.contains(".replaced-")),
            "{point}: left behind: {names:?}"
        );
        let segments: Vec<&String> = names.iter().filter(|n| n.starts_with("seg-")).collect();
        assert!(!segments.is_empty(), "{point}");
        for segment in segments {
            let path = out.join(segment);
            let files = std::fs::read_dir(&path).unwrap().flatten().count();
            assert!(
                path.join(".compacted").exists() || files <= 1,
                "{point}: {segment} left unmerged"
            );
        }
    }
}

/// The same on an S3-compatible server (`scripts/with-s3`): the output's
/// parts are multipart uploads, the checkpoints are on the server too.
#[cfg(feature = "s3")]
#[test]
fn on_s3_every_crash_point_leaves_every_record_once_in_finished_objects() {
    let Some(bucket) = sink_testkit::servers::s3().map(|s3| s3.bucket) else {
        return;
    };
    let (scenarios, crashes) = matrix(|| {
        let url = format!("s3://{bucket}/crash-{}", uuid::Uuid::new_v4().simple());
        (Target::S3(url), None)
    });
    println!("file sink crash tests on S3: {scenarios} scenarios, {crashes} crashes, 0 violations");
}

/// A part's sync that fails (in the background, every 16 MiB, or at a
/// checkpoint) fails the checkpoint that refers to the part: the job stops
/// with the cause, and no checkpoint completes over data that may not be on
/// disk.
#[test]
fn a_failed_sync_of_a_part_fails_its_checkpoint() {
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("out");
    // 1 KiB records, 40 MiB in all: background syncs run before the
    // checkpoints' own.
    let sink = FileSink::builder(&out, sinks_file::JsonLinesEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(64 * 1024 * 1024),
            ..RollingPolicy::on_checkpoint()
        })
        .build()
        .expect("a valid sink");
    let source = sink_runtime::source::Source::map(SequenceSource::bounded(40_000), |id| {
        format!("{id:01024}")
    });
    fail::cfg("file-sync-fails", "1*return->off").expect("a valid failpoint");
    let result = runtime.block_on(
        Job::builder("sync-fails", source, sink)
            .parallelism(1)
            .checkpointing(CheckpointConfig::every(Duration::from_millis(100)))
            .checkpoint_storage(
                LocalCheckpointStorage::open(out.join(".state")).expect("a state directory"),
            )
            .build()
            .expect("a valid job")
            .run(),
    );
    fail::remove("file-sync-fails");
    let error = result.expect_err("the job stops");
    let text = error.to_string();
    assert!(
        matches!(
            &error,
            JobError::Sink {
                action: "durability",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(text.contains("file-sync-fails"), "{text}");
    assert!(visible_numbers(&out).is_empty(), "nothing was committed");
}

/// A commit of a position group cut short right after its entry in the
/// position log (the commit point), before its parts were renamed: the
/// next start of the lineage rolls the log forward before it removes the
/// lineage's hidden parts no checkpoint names, so the group's parts are
/// made visible, never removed as orphans, and a replay of the commit is
/// recognised.
#[test]
fn a_group_cut_after_its_log_entry_is_completed_by_the_next_start() {
    use sink_api::{
        CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, JobStart,
        Lineage, PositionAdvance, Sink, SinkWriter, SplitKey,
    };
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("out");
    let sink = FileSink::builder(&out, LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .build()
        .expect("a valid sink");
    let lineage = Lineage::new("cut");
    let context = InitContext::new("cut", lineage.clone(), Generation(1), 0, 1);
    runtime().block_on(async {
        let mut writer = sink.create_writer(&context, Vec::new()).await.unwrap();
        writer.write_batch((0..5).collect()).await.unwrap();
        writer
            .carry_positions(vec![PositionAdvance {
                key: SplitKey::new("input", "p0"),
                from: None,
                to: 5,
            }])
            .unwrap();
        let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
        if let Some(durability) = writer.durability(CheckpointId(1)) {
            durability.await.unwrap();
        }
        let requests = || {
            committables
                .iter()
                .map(|c| CommitRequest::new(c.clone(), CheckpointId(1), 0))
                .collect::<Vec<_>>()
        };
        let mut committer = sink.create_committer(&context).await.unwrap();
        fail::cfg("file-positions-after-entry", "1*return->off").expect("a valid failpoint");
        let cut = committer.commit(&mut requests()).await;
        fail::remove("file-positions-after-entry");
        assert!(cut.is_err(), "the commit was cut short");
        assert!(
            visible_numbers(&out).is_empty(),
            "committed, not yet visible"
        );

        // The next start of the lineage, restoring nothing.
        sink.on_start(&JobStart::fresh("cut", &lineage, Generation(2), 1))
            .await
            .unwrap();
        assert_eq!(visible_numbers(&out), (0..5).collect::<Vec<_>>());
        assert_eq!(sink.committed_positions("input").await.unwrap()["p0"], 5);
        let context = InitContext::new("cut", lineage.clone(), Generation(2), 0, 1);
        let mut committer = sink.create_committer(&context).await.unwrap();
        let mut replay = requests();
        committer.commit(&mut replay).await.unwrap();
        for request in replay {
            assert_eq!(request.into_parts().1, CommitOutcome::AlreadyCommitted);
        }
        assert_eq!(visible_numbers(&out), (0..5).collect::<Vec<_>>());
    });
}
