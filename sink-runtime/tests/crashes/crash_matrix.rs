//! The crash matrix: for every named crash point, in streaming mode with
//! periodic checkpoints and with checkpoints on demand, and in bounded mode
//! without checkpoints, with and without a global
//! committer, a job of several thousand records is crashed at that point a
//! few times, started again on the same state directory after each crash (as
//! a new process would be), and let finish. Then every record must be
//! committed exactly once, and delivered once to the global committer.
//!
//! Needs the `crash-tests` feature (`cargo test -p sink-runtime --features
//! crash-tests --test crash_matrix`): the runtime's crash points and the
//! memory sink's. `fail`'s configuration is process-wide, so the whole
//! matrix is one test.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use sink_runtime::failpoints::{hits, FAILPOINTS};
use sink_runtime::{CheckpointConfig, Job, JobError, JobReport, JobStatus, LocalCheckpointStorage};
use sinks_memory::{MemoryGlobalCommitter, MemorySink, MemoryStore};

const RECORDS: u64 = 3_000;
const MEMORY_MID_BATCH: &str = "memory-commit-mid-batch";
/// Hits to let pass before crashing, in successive rounds: the first crash
/// comes at the first hit, the next at the fourth, the last at the second.
const SKIPS: [u32; 3] = [0, 3, 1];

#[derive(Debug, Clone, Copy)]
enum Mode {
    StreamingWithCheckpoints,
    /// Checkpoints on demand: one as soon as the last ended, records
    /// permitting; the sink's durability work in the background.
    StreamingOnDemand,
    BoundedWithoutCheckpoints,
}

async fn run_once(
    mode: Mode,
    global: bool,
    store: &MemoryStore<u64>,
    dir: &std::path::Path,
) -> Result<JobReport, JobError> {
    let storage = LocalCheckpointStorage::open(dir)?;
    let builder = Job::builder(
        "crash-matrix",
        ThrottledSource::bounded(RECORDS, 100, Duration::from_millis(1)),
        // On demand, prepared transactions become durable in the background
        // (as the file sink's fsyncs): a crash with acknowledgements waiting
        // for it, at every point.
        match mode {
            Mode::StreamingOnDemand => MemorySink::new(store.clone())
                .roll_every(40)
                .durable_in_background(),
            _ => MemorySink::new(store.clone()).roll_every(40),
        },
    )
    .parallelism(2)
    .batch_size(50)
    .checkpoint_storage(storage);
    let builder = match mode {
        Mode::StreamingWithCheckpoints => {
            builder.checkpointing(CheckpointConfig::every(Duration::from_millis(15)))
        }
        Mode::StreamingOnDemand => builder.checkpointing(CheckpointConfig::on_demand(
            Duration::ZERO,
            Duration::from_secs(1),
        )),
        Mode::BoundedWithoutCheckpoints => builder,
    };
    let builder = if global {
        let store = store.clone();
        builder.global_committer(move || MemoryGlobalCommitter::new(store.clone()))
    } else {
        builder
    };
    builder.build().expect("a valid job").run().await
}

/// The crash point a failure was simulated at, if it was a simulated crash.
fn crash_point(error: &JobError) -> Option<&'static str> {
    match error {
        JobError::Crash { failpoint } => Some(failpoint),
        JobError::Sink { source, .. } if source.to_string().contains(MEMORY_MID_BATCH) => {
            Some(MEMORY_MID_BATCH)
        }
        _ => None,
    }
}

/// Runs one scenario; returns how many crashes happened.
async fn scenario(mode: Mode, global: bool, failpoint: &'static str) -> u32 {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = MemoryStore::<u64>::new();
    let mut crashes = 0;
    for round in 0.. {
        assert!(
            round < 12,
            "{failpoint} {mode:?}: the job did not finish after {round} runs"
        );
        // The re-commit point is reached only by a restore with something to commit
        // again: the first round crashes right after a checkpoint is stored
        // (the primer), the next ones crash at the point itself.
        let primed = failpoint == "during-recovery-recommit";
        if primed && round == 0 {
            fail::cfg("after-checkpoint-stored", "1*return->off").expect("valid failpoint");
        } else if let Some(skip) = SKIPS.get(round - usize::from(primed)) {
            fail::cfg(failpoint, &format!("{skip}*off->1*return->off")).expect("valid failpoint");
        }
        let result = run_once(mode, global, &store, dir.path()).await;
        fail::remove(failpoint);
        fail::remove("after-checkpoint-stored");
        match result {
            Ok(report) => {
                assert_eq!(report.status, JobStatus::Finished, "{failpoint} {mode:?}");
                break;
            }
            // Only crashes at the point under test count.
            Err(error) if crash_point(&error).is_some() => {
                crashes += u32::from(crash_point(&error) == Some(failpoint));
            }
            Err(error) => {
                panic!("{failpoint} {mode:?} global={global}: unexpected failure: {error}")
            }
        }
    }
    let what = format!("{failpoint} {mode:?} global={global}");
    assert_exactly_once(&format!("committed ({what})"), &store.committed(), RECORDS);
    if global {
        assert_exactly_once(
            &format!("global committer ({what})"),
            &store.global_records(),
            RECORDS,
        );
    }
    let violations = store.violations();
    assert!(violations.is_empty(), "{what}: {violations:#?}");
    // A commit is replayed only by a restore: at most once per crash.
    let replays = store.replays_per_transaction();
    if let Some((transaction, count)) = replays.iter().max_by_key(|(_, &count)| count) {
        assert!(
            *count <= u64::from(crashes),
            "{what}: transaction {transaction} replayed {count} times after {crashes} crashes"
        );
    }
    assert!(crashes >= 1, "{what}: the crash point was never reached");
    crashes
}

#[test]
fn every_crash_point_recovers_exactly_once() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut points: Vec<&'static str> = FAILPOINTS.to_vec();
    points.push(MEMORY_MID_BATCH);
    let mut crashes: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut runs = 0;
    for mode in [
        Mode::StreamingWithCheckpoints,
        Mode::StreamingOnDemand,
        Mode::BoundedWithoutCheckpoints,
    ] {
        for global in [false, true] {
            for &point in &points {
                if point == "after-global-commit" && !global {
                    continue;
                }
                let crashed = runtime.block_on(scenario(mode, global, point));
                *crashes.entry(point).or_default() += crashed;
                runs += 1;
            }
        }
    }
    println!(
        "crash matrix: {} failpoints, {runs} scenarios, 0 violations",
        points.len()
    );
    for (point, count) in &crashes {
        // The memory sink's point is counted by its crashes alone.
        let hit = if FAILPOINTS.contains(point) {
            hits(point).to_string()
        } else {
            "-".into()
        };
        println!("  {point:<28} crashes {count:>3}   hits {hit}");
    }
    // A point that never crashed the job was never reached: renamed, moved
    // out of the path, or compiled out. Every one must be exercised.
    let never: Vec<_> = crashes
        .iter()
        .filter(|(_, &c)| c == 0)
        .map(|(p, _)| *p)
        .collect();
    assert!(never.is_empty(), "crash points never reached: {never:?}");
    for point in FAILPOINTS {
        assert!(hits(point) > 0, "{point} was never hit");
    }
}
