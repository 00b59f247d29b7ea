//! Deterministic simulation: seeded runs on tokio's paused clock that vary
//! the interleavings of checkpoint triggers, acknowledgements, slow, failed
//! and hanging checkpoint stores (aborts and timeouts), lost and late
//! completion notices, uneven ends of input, and task crashes with restarts.
//! After each run the invariant is checked: every record committed exactly
//! once (and delivered once to the global committer), no broken contract.
//!
//! `SIM_SEEDS=N` sets the number of seeds (default 500); `SIM_SEED=S` runs
//! seed `S` alone. A failing seed prints itself with the command that
//! reproduces it.

use crate::common;

use std::time::Duration;

use common::*;
use sink_api::CheckpointId;
use sink_runtime::source::RangeSplit;
use sink_runtime::{
    CheckpointConfig, Job, JobStatus, MetricsSnapshot, NoticeDelivery, RestartStrategy,
};
use sinks_memory::{InjectedCommitFailure, MemoryGlobalCommitter, MemorySink, MemoryStore};

/// A small seeded generator (SplitMix64) so that a seed means the same run
/// on every machine and every version of the dependencies.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Everything a seed decides.
#[derive(Debug, Clone)]
struct Scenario {
    records: u64,
    parallelism: usize,
    splits: Vec<RangeSplit>,
    per_batch: usize,
    read_delay_ms: u64,
    checkpoint_interval_ms: Option<u64>,
    max_concurrent: usize,
    global: bool,
    /// Per checkpoint id (cycled): what the storage does.
    stores: Vec<StoreScript>,
    /// Per (subtask, checkpoint) hash: what happens to completion notices.
    notice_seed: u64,
    /// Crashes to inject: (at ms, kind).
    crashes: Vec<(u64, u8)>,
    /// Checkpoints on demand, with this minimum pause (ms); the interval is
    /// then the maximum one.
    on_demand_pause_ms: Option<u64>,
    /// The sink makes its prepared transactions durable in the background
    /// (acknowledgements wait for it).
    background_durability: bool,
}

impl Scenario {
    fn from_seed(seed: u64) -> Scenario {
        let mut rng = Rng(seed);
        let records = rng.range(50, 1_500);
        let parallelism = rng.range(1, 4) as usize;
        // Uneven splits: subtasks reach end of input at different times.
        let mut cuts: Vec<u64> = (0..parallelism - 1)
            .map(|_| rng.below(records + 1))
            .collect();
        cuts.sort_unstable();
        let mut bounds = vec![0];
        bounds.extend(cuts);
        bounds.push(records);
        let splits = bounds
            .windows(2)
            .map(|w| RangeSplit {
                next: w[0],
                end: w[1],
            })
            .collect();
        let stores = (0..16)
            .map(|_| match rng.below(100) {
                0..=59 => StoreScript::Succeed,
                60..=84 => StoreScript::SucceedAfter(ms(rng.range(1, 150))),
                85..=95 => StoreScript::FailAfter(ms(rng.range(0, 50))),
                _ => StoreScript::Hang,
            })
            .collect();
        let crashes = (0..rng.below(3))
            .map(|_| (rng.range(0, 400), rng.below(3) as u8))
            .collect();
        Scenario {
            records,
            parallelism,
            splits,
            per_batch: rng.range(3, 60) as usize,
            read_delay_ms: rng.range(0, 15),
            checkpoint_interval_ms: (!rng.chance(15)).then(|| rng.range(10, 120)),
            max_concurrent: rng.range(1, 3) as usize,
            global: rng.chance(60),
            stores,
            notice_seed: rng.next(),
            crashes,
            // Drawn last, so that the other draws of a seed stay as they were.
            on_demand_pause_ms: rng.chance(40).then(|| rng.range(0, 10)),
            background_durability: rng.chance(50),
        }
    }
}

fn notice(seed: u64, subtask: usize, checkpoint: CheckpointId) -> NoticeDelivery {
    let mut rng = Rng(seed ^ (subtask as u64) << 32 ^ checkpoint.0);
    match rng.below(100) {
        0..=74 => NoticeDelivery::Deliver,
        75..=87 => NoticeDelivery::Lose,
        _ => NoticeDelivery::Delay(ms(rng.range(1, 200))),
    }
}

/// Runs one seed; returns the store to check, or a description of a hang or
/// failure.
async fn simulate(
    seed: u64,
    defer_end_of_stream: bool,
) -> Result<(MemoryStore<u64>, MetricsSnapshot), String> {
    fastrand::seed(seed);
    let scenario = Scenario::from_seed(seed);
    let store = MemoryStore::<u64>::new();
    let stores = scenario.stores.clone();
    let storage = ScriptedStorage::new(move |id| stores[id.0 as usize % stores.len()]);
    let mut source = ThrottledSource::bounded(
        scenario.records,
        scenario.per_batch,
        ms(scenario.read_delay_ms),
    );
    source.splits = Some(scenario.splits.clone());
    let sink = MemorySink::new(store.clone()).roll_every(25);
    let sink = match scenario.background_durability {
        true => sink.durable_in_background(),
        false => sink,
    };
    let mut builder = Job::builder("simulation", source, sink)
        .parallelism(scenario.parallelism)
        .checkpoint_storage(storage)
        .restart_strategy(RestartStrategy::FixedDelay {
            attempts: 20,
            delay: ms(30),
        });
    if let Some(interval) = scenario.checkpoint_interval_ms {
        let trigger = match scenario.on_demand_pause_ms {
            Some(pause) => CheckpointConfig::on_demand(ms(pause), ms(interval)),
            None => CheckpointConfig::every(ms(interval)),
        };
        builder = builder.checkpointing(
            trigger
                .max_concurrent(scenario.max_concurrent)
                .timeout(ms(500))
                .tolerable_failures(1_000),
        );
    }
    if scenario.global {
        let store = store.clone();
        builder = builder.global_committer(move || MemoryGlobalCommitter::new(store.clone()));
    }
    if !defer_end_of_stream {
        builder = builder.unsafe_disable_end_of_stream_deferral();
    }
    let notice_seed = scenario.notice_seed;
    builder = builder.simulate_notification_faults(move |subtask, checkpoint| {
        notice(notice_seed, subtask, checkpoint)
    });
    let handle = builder.build().map_err(|e| e.to_string())?.start();
    for &(at, kind) in &scenario.crashes {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ms(at)).await;
            match kind {
                0 => store.fail_next_commits(1, InjectedCommitFailure::UnknownReason),
                1 => store.fail_next_prepare_commits(1),
                _ => store.fail_next_commits(2, InjectedCommitFailure::RetryLater),
            }
        });
    }
    let report = tokio::time::timeout(Duration::from_secs(3_600), handle.join())
        .await
        .map_err(|_| format!("hung (no end after an hour of simulated time): {scenario:?}"))?
        .map_err(|e| format!("failed: {e}; {scenario:?}"))?;
    if report.status != JobStatus::Finished {
        return Err(format!("ended {:?}; {scenario:?}", report.status));
    }
    Ok((store, report.metrics))
}

/// Checks the invariant; returns what is wrong.
fn check(seed: u64, store: &MemoryStore<u64>) -> Result<(), String> {
    let scenario = Scenario::from_seed(seed);
    let exactly_once = |what: &str, records: Vec<u64>| {
        std::panic::catch_unwind(|| assert_exactly_once(what, &records, scenario.records)).map_err(
            |e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| format!("{what} not exactly once"))
            },
        )
    };
    exactly_once("committed", store.committed())?;
    if scenario.global {
        exactly_once("global committer", store.global_records())?;
    }
    let violations = store.violations();
    if !violations.is_empty() {
        return Err(format!("contract violations: {violations:?}"));
    }
    Ok(())
}

fn simulate_on_paused_clock(
    seed: u64,
    defer: bool,
) -> Result<(MemoryStore<u64>, MetricsSnapshot), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(simulate(seed, defer))
}

fn run_seed(seed: u64, defer: bool) -> Result<MetricsSnapshot, String> {
    let (store, metrics) = simulate_on_paused_clock(seed, defer)?;
    check(seed, &store)?;
    Ok(metrics)
}

/// A seed is a run: the same seed gives the same calls in the same order.
#[test]
fn a_seed_reproduces_its_run() {
    for seed in [3, 11, 42] {
        let (first, _) = simulate_on_paused_clock(seed, true).unwrap();
        let (second, _) = simulate_on_paused_clock(seed, true).unwrap();
        assert_eq!(first.stats(), second.stats(), "seed {seed}");
        assert_eq!(
            first.committed(),
            second.committed(),
            "seed {seed}: commit order"
        );
        // The lineage is drawn at random at every fresh start, by design:
        // compare the ids without it.
        let without_lineage = |store: &MemoryStore<u64>| -> Vec<_> {
            store
                .transactions()
                .into_iter()
                .map(|(id, state)| (id.split_once('-').map(|(_, rest)| rest.to_string()), state))
                .collect()
        };
        assert_eq!(
            without_lineage(&first),
            without_lineage(&second),
            "seed {seed}"
        );
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        return vec![seed.parse().expect("SIM_SEED must be a number")];
    }
    let count = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(500);
    (0..count).collect()
}

#[test]
fn seeded_simulations_keep_exactly_once() {
    let seeds = seeds();
    let mut failures = Vec::new();
    let mut totals = MetricsSnapshot::default();
    for &seed in &seeds {
        match run_seed(seed, true) {
            Ok(metrics) => {
                totals.restarts += metrics.restarts;
                totals.checkpoints_completed += metrics.checkpoints_completed;
                totals.checkpoints_failed += metrics.checkpoints_failed;
                totals.checkpoints_aborted += metrics.checkpoints_aborted;
                totals.commits_already_committed += metrics.commits_already_committed;
                totals.commits_retried += metrics.commits_retried;
            }
            Err(problem) => {
                eprintln!(
                    "seed {seed} FAILED: {problem}\n  reproduce: SIM_SEED={seed} cargo test -p sink-runtime --test simulation"
                );
                failures.push(seed);
            }
        }
    }
    let on_demand = seeds
        .iter()
        .filter(|&&seed| {
            let scenario = Scenario::from_seed(seed);
            scenario.on_demand_pause_ms.is_some() && scenario.checkpoint_interval_ms.is_some()
        })
        .count();
    println!(
        "simulation: {} seeds ({on_demand} with checkpoints on demand), {} violations",
        seeds.len(),
        failures.len()
    );
    println!(
        "  over all seeds: {} restarts, {} checkpoints completed, {} failed, {} abandoned, \
         {} replayed commits, {} commit retries",
        totals.restarts,
        totals.checkpoints_completed,
        totals.checkpoints_failed,
        totals.checkpoints_aborted,
        totals.commits_already_committed,
        totals.commits_retried
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}

/// The simulation reaches the first seed's race: with the deferral of end of
/// stream switched off, some seeds end with committables delivered to the
/// global committer after its end of input.
#[test]
fn the_simulation_catches_the_end_of_stream_race_when_the_deferral_is_off() {
    let caught: Vec<u64> = (0..200)
        .filter(|&seed| Scenario::from_seed(seed).global)
        .filter(|&seed| match run_seed(seed, false) {
            Err(problem) => problem.contains("after end_of_input"),
            Ok(_) => false,
        })
        .collect();
    println!(
        "deferral off: {} seeds caught the race, e.g. {:?}",
        caught.len(),
        &caught[..caught.len().min(5)]
    );
    assert!(
        !caught.is_empty(),
        "no seed reached the FLINK-38614 race with the deferral switched off"
    );
}
