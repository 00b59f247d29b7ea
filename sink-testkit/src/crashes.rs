//! Crashes at every crash point of the runtime, rescaling, and a seeded
//! simulation, on the sink under test.

use std::time::Duration;

use sink_api::InputOf;
use sink_runtime::MemoryCheckpointStorage;

use crate::modes::describe;
use crate::runner::{exactly_once, run, start, RunError, Shape};
use crate::Destination;
use crate::RecordMaker;

/// The crash points a user's sink meets (the global committer's is not).
pub(crate) fn crash_points() -> Vec<&'static str> {
    sink_runtime::failpoints::FAILPOINTS
        .iter()
        .copied()
        .filter(|p| *p != "after-global-commit")
        .collect()
}

/// Crashes the job at `point` (`crashes` times at most, after `skips[i]`
/// hits each), restarting it on the same checkpoints and destination, until
/// it finishes; the restarts run with `restart_parallelism` subtasks when
/// given (a job that comes back with another parallelism). Returns how many
/// crashes happened.
pub(crate) async fn crash_and_recover<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    shape: &Shape,
    point: &'static str,
    skips: &[u32],
    restart_parallelism: Option<usize>,
) -> Result<u32, String> {
    let restarted = Shape {
        parallelism: restart_parallelism.unwrap_or(shape.parallelism),
        ..shape.clone()
    };
    let storage = MemoryCheckpointStorage::default();
    let mut crashes = 0;
    for round in 0..(skips.len() + 8) {
        // The re-commit point is reached only by a restore with something to commit
        // again: the first round crashes right after a checkpoint is stored
        // (the primer), the next ones crash at the point itself.
        let primed = point == "during-recovery-recommit";
        if primed && round == 0 {
            let _ = fail::cfg("after-checkpoint-stored", "1*return->off");
        } else if let Some(skip) = skips.get(round - usize::from(primed)) {
            let _ = fail::cfg(point, &format!("{skip}*off->1*return->off"));
        }
        let this_round = match round {
            0 => shape,
            _ => &restarted,
        };
        let result = run(destination, record, this_round, &storage).await;
        fail::remove(point);
        fail::remove("after-checkpoint-stored");
        match result {
            Ok(_) => {
                exactly_once(destination.committed_ids().await, shape.records)
                    .map_err(|e| format!("after {crashes} crash(es) at {point}: {e}"))?;
                return Ok(crashes);
            }
            // Only crashes at the point under test count: a scenario that
            // crashed elsewhere (the primer of the re-commit point) but
            // never there has not checked it.
            Err(RunError::Crash(at)) => crashes += u32::from(at == point),
            Err(RunError::Failed(why)) => {
                return Err(format!(
                    "after {crashes} crash(es) at {point}, the restarted job failed: {why}"
                ))
            }
        }
    }
    Err(format!(
        "the job did not finish after {crashes} crashes at {point}"
    ))
}

/// Stops a job of `from` subtasks after a few checkpoints and finishes it
/// with `to` subtasks.
pub(crate) async fn rescale<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    from: usize,
    to: usize,
) -> Result<(), String> {
    let storage = MemoryCheckpointStorage::default();
    let first = Shape {
        bounded: false,
        ..Shape::streaming(records, from)
    };
    let handle = start(destination, record, &first, &storage)
        .await
        .map_err(describe)?;
    let started = std::time::Instant::now();
    while handle.metrics().checkpoints_completed < 3 && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    handle.cancel();
    crate::runner::no_false_losses(handle.join().await.map_err(|e| describe(e.into()))?)
        .map_err(describe)?;
    let second = Shape {
        job: first.job.clone(),
        ..Shape::streaming(records, to)
    };
    run(destination, record, &second, &storage)
        .await
        .map_err(describe)?;
    exactly_once(destination.committed_ids().await, records)
        .map_err(|e| format!("stopped at parallelism {from}, finished at {to}: {e}"))
}

/// A small seeded generator (SplitMix64): a seed means the same scenario on
/// every machine.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// One seeded scenario: parallelism, checkpoint interval, a crash point and
/// when to crash there, derived from `seed`; `records` records.
pub(crate) async fn simulate<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    seed: u64,
    records: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let points = crash_points();
    let point = points[rng.below(points.len() as u64) as usize];
    let shape = Shape {
        checkpoint_interval: (rng.below(5) > 0).then(|| Duration::from_millis(3 + rng.below(25))),
        ..Shape::streaming(records, 1 + rng.below(3) as usize)
    };
    let skips: Vec<u32> = (0..rng.below(3) + 1).map(|_| rng.below(6) as u32).collect();
    // One seed in two comes back from its crashes with another parallelism.
    let restart_parallelism = (rng.below(2) == 0).then(|| 1 + rng.below(3) as usize);
    crash_and_recover(
        destination,
        record,
        &shape,
        point,
        &skips,
        restart_parallelism,
    )
    .await
    .map(|_| ())
    .map_err(|e| {
        format!(
            "{e} (parallelism {}, restarted with {}, checkpoints {:?})",
            shape.parallelism,
            restart_parallelism.unwrap_or(shape.parallelism),
            shape.checkpoint_interval
        )
    })
}
