//! Certify your own sink exactly-once in one test.
//!
//! Give the kit a way to make a fresh destination (where your sink writes,
//! and how to read back what was committed) and a way to turn an id into one
//! of your records; it runs your sink through everything the runtime can do
//! to it and reports each property:
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_sink_is_exactly_once() {
//!     sink_testkit::certify(MyDestination::new, |id| MyRecord::new(id)).await.assert_passed();
//! }
//! ```
//!
//! | property | checks |
//! |---|---|
//! | `modes/streaming-checkpoints` | bounded input with checkpoints: every record committed once |
//! | `modes/streaming-no-checkpoints` | without checkpoints: everything committed once at end of input, one `prepare_commit` per subtask |
//! | `modes/batch` | batch mode: likewise |
//! | `modes/unbounded-checkpoints` | an input that never ends is committed while the job runs |
//! | `modes/end-of-input-remainder` | records after the last barrier, handed over with the end of input, are committed once |
//! | `rerun/fresh-checkpoint-storage` | the same job run twice on new checkpoint storage: every record once per run |
//! | `contract/nothing-visible-before-commit` | `prepare_commit` does not make data visible |
//! | `contract/commit-makes-visible` | after the commit, every record is visible once |
//! | `contract/commit-is-idempotent` | a replayed commit, by the committer of a restored start, is recognised (`already committed`) and duplicates nothing; for a sink that brings a global committer (which the kit's hand-run commits call after the committers), the replay through both duplicates nothing |
//! | `contract/global-replay-regrouped` | for a sink that brings a global committer: checkpoints handed to it several at once (`commit_checkpoints`, as on a commit schedule), then by later starts again grouped otherwise (overlapping what was committed together): every record once after each |
//! | `contract/restore-keeps-written-records` | a writer restored from its checkpointed state loses nothing |
//! | `contract/no-transaction-after-end-of-input` | nothing is opened after `flush(true)` (needs [`Destination::open_transactions`]) |
//! | `contract/damaged-state-is-an-error` | stored committables and writer states, damaged (flipped, cut, inserted bytes, hostile length fields), decode to a value or an error, never a panic |
//! | `crash/<point>` | crashed at that point of the runtime up to three times and restarted: every record once |
//! | `rescale/2-to-3`, `rescale/3-to-1` | stopped and restarted with another parallelism: every record once |
//! | `rescale/2-to-1-to-2`, `rescale/1-to-3-to-2` | stopped and restored through several parallelisms: every record once |
//! | `unknown-outcome/<where>` | a commit applied but its answer lost (first call, middle or last of a batch; the global committer's first checkpoint, for sinks that bring one), then a restart; or a slow commit: every record once |
//! | `unknown-outcome/retried-in-place` | a commit call applied but its answer lost, reported as `retry_later` and retried by the same committer, without a restart (the job's first call, then a call in the middle of the job): every record once, the lost call's requests back at the same committer (a global committer has no retry in place: its errors fail the job, covered by `unknown-outcome/global-commit`) |
//! | `handover/new-owner` | an instance killed with a checkpoint stored and not committed; another, on fresh checkpoint storage, reads the same splits (a source whose positions are committed with the data) to the end: every record once |
//! | `handover/old-owner-returns` | then the killed instance comes back from its checkpoint: what it had prepared is superseded, every record once |
//! | `handover/two-owners-at-once` | two instances read the same splits at the same time, each restarting when its commit is superseded: every record once |
//! | `simulation` | seeded scenarios: random parallelism (changed at restarts in one seed of two), checkpoint interval, crash point and timing |
//!
//! The `handover/*` properties are run for a sink that commits source
//! positions with its data ([`Sink::commits_positions`]),
//! as `unknown-outcome/global-commit` is for a sink with a global
//! committer: the job's build refuses the others such a source.
//!
//! A property the kit could not check fails [`Report::assert_passed`] unless
//! allowed by name ([`Report::allow_unchecked`]).
//!
//! A failed property names the smallest failing scenario found and its seed;
//! `TESTKIT_SEED=<seed>` runs that seed alone. The runtime's crash points are
//! process-wide (the `fail` crate), so the kit runs one certification at a
//! time in a process.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod chains;
mod contract;
mod crashes;
mod decoders;
mod destination;
mod handover;
pub mod hosts;
mod in_place;
mod modes;
mod outcomes;
pub mod power_loss;
mod remainder;
mod report;
mod runner;
pub mod servers;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sink_api::{InputOf, Sink};

pub use destination::{Destination, HandOverSource, HAND_OVER_PARTITIONS};
pub use report::{PropertyResult, Report, Verdict};

/// Makes the record with id `id`: the kit's source is the ids `0..n`, mapped
/// through it (`SequenceSource::map`).
pub(crate) type RecordMaker<I> = Arc<dyn Fn(u64) -> I + Send + Sync>;

/// How much the kit does. [`Knobs::default`] runs in seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knobs {
    /// Records per scenario (ids `0..records`). Default 400.
    pub records: u64,
    /// Subtasks of the jobs (rescaling uses 1, 2 and 3). Default 2.
    pub parallelism: usize,
    /// Seeds of the simulation. Default 16.
    pub seeds: u64,
    /// Once this much time is spent, the properties left are not run, and
    /// reported as failed. Default 5 minutes.
    pub time_budget: Duration,
    /// Only the properties of these names are run (and reported); empty:
    /// all. For running one failing property again.
    pub only: Vec<String>,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            records: 400,
            parallelism: 2,
            seeds: 16,
            time_budget: Duration::from_secs(300),
            only: Vec::new(),
        }
    }
}

/// One certification at a time: crash points are process-wide.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Certifies the sink made by `new_destination` with [`Knobs::default`].
///
/// `new_destination` is called for every scenario and must return a fresh,
/// empty destination; `record` makes the record with a given id, which
/// [`Destination::committed_ids`] must read back.
pub async fn certify<D, F, Fut, R>(new_destination: F, record: R) -> Report
where
    D: Destination,
    F: Fn() -> Fut,
    Fut: Future<Output = D>,
    R: Fn(u64) -> InputOf<D::Sink> + Send + Sync + 'static,
{
    certify_with(Knobs::default(), new_destination, record).await
}

/// [`certify`], with other knobs.
pub async fn certify_with<D, F, Fut, R>(knobs: Knobs, new_destination: F, record: R) -> Report
where
    D: Destination,
    F: Fn() -> Fut,
    Fut: Future<Output = D>,
    R: Fn(u64) -> InputOf<D::Sink> + Send + Sync + 'static,
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let record: RecordMaker<InputOf<D::Sink>> = Arc::new(record);
    let mut kit = Kit {
        knobs: knobs.clone(),
        started: Instant::now(),
        report: Report::default(),
    };
    let records = knobs.records;
    let p = knobs.parallelism;

    kit.check(
        "modes/streaming-checkpoints",
        "bounded input with checkpoints: every record committed once",
        async {
            modes::streaming_with_checkpoints(&new_destination().await, &record, &knobs)
                .await
                .into()
        },
    )
    .await;
    kit.check(
        "modes/streaming-no-checkpoints",
        "without checkpoints: everything committed once at end of input",
        async {
            modes::at_end_of_input(&new_destination().await, &record, &knobs, false)
                .await
                .into()
        },
    )
    .await;
    kit.check(
        "modes/batch",
        "batch mode: everything committed once at end of input",
        async {
            modes::at_end_of_input(&new_destination().await, &record, &knobs, true)
                .await
                .into()
        },
    )
    .await;
    kit.check(
        "modes/unbounded-checkpoints",
        "an endless input is committed while the job runs",
        async {
            modes::unbounded_with_checkpoints(&new_destination().await, &record, &knobs)
                .await
                .into()
        },
    )
    .await;

    kit.check(
        "modes/end-of-input-remainder",
        "checkpoints, and records after the last barrier: the end-of-input remainder committed once",
        async {
            remainder::end_of_input_remainder(&new_destination().await, &record, records, p)
                .await
                .into()
        },
    )
    .await;
    kit.check(
        "rerun/fresh-checkpoint-storage",
        "the same job run twice on new checkpoint storage: every record of both runs, once per run",
        async {
            chains::run_again_on_fresh_storage(&new_destination().await, &record, records, p)
                .await
                .into()
        },
    )
    .await;

    let mut two_phase = None;
    kit.check(
        "contract/nothing-visible-before-commit",
        "prepare_commit does not make data visible",
        async {
            match contract::two_phase(&new_destination().await, &record, records).await {
                Ok(seen) => {
                    let verdict = seen.not_visible_early.clone().into();
                    two_phase = Some(seen);
                    verdict
                }
                Err(why) => Verdict::Failed(format!("the check could not run: {why}")),
            }
        },
    )
    .await;
    let two_phase = two_phase.as_ref();
    kit.check(
        "contract/commit-makes-visible",
        "after the commit, every record is visible once",
        async {
            match two_phase.and_then(|seen| seen.commit_makes_visible.clone()) {
                Some(result) => result.into(),
                None => Verdict::NotChecked("the two-phase check could not run".into()),
            }
        },
    )
    .await;
    kit.check(
        "contract/commit-is-idempotent",
        "a replayed commit is recognised and duplicates nothing",
        async {
            match two_phase.map(|seen| (&seen.commit_makes_visible, &seen.replay_recognised)) {
                Some((_, Some(result))) => result.clone().into(),
                Some((Some(Err(_)), None)) => Verdict::NotChecked(
                    "the first commit did not make every record visible (see contract/commit-makes-visible)"
                        .into(),
                ),
                _ => Verdict::NotChecked("the two-phase check could not run".into()),
            }
        },
    )
    .await;
    // Only a sink with a global committer is handed checkpoints grouped.
    if new_destination()
        .await
        .sink()
        .await
        .global_committer()
        .is_some()
    {
        kit.check(
            "contract/global-replay-regrouped",
            "checkpoints handed to the global committer together, then again grouped otherwise: \
             every record once",
            async {
                contract::global_replay_regrouped(&new_destination().await, &record, records)
                    .await
                    .into()
            },
        )
        .await;
    }
    kit.check(
        "contract/restore-keeps-written-records",
        "a writer restored from its checkpointed state loses nothing",
        async {
            contract::restore_keeps_written_records(&new_destination().await, &record, records)
                .await
                .into()
        },
    )
    .await;
    kit.check(
        "contract/damaged-state-is-an-error",
        "damaged stored committables and writer states decode to an error, never a panic",
        async {
            match decoders::damaged_state(&new_destination().await, &record, records, p).await {
                Ok(Some(_)) => Verdict::Passed,
                Ok(None) => Verdict::NotChecked(
                    "no checkpoint held a committable or a writer state to damage".into(),
                ),
                Err(why) => Verdict::Failed(why),
            }
        },
    )
    .await;
    kit.check(
        "contract/no-transaction-after-end-of-input",
        "the writer opens nothing after flush(end_of_input = true)",
        async {
            match contract::no_transaction_after_end_of_input(
                &new_destination().await,
                &record,
                records,
            )
            .await
            {
                Ok(Some(())) => Verdict::Passed,
                Ok(None) => {
                    Verdict::NotChecked("Destination::open_transactions is not implemented".into())
                }
                Err(why) => Verdict::Failed(why),
            }
        },
    )
    .await;

    for point in crashes::crash_points() {
        let name = format!("crash/{point}");
        kit.check(
            &name,
            "crashed there up to three times and restarted: every record once",
            async {
                let shape = runner::Shape::streaming(records, p);
                let result = crashes::crash_and_recover(
                    &new_destination().await,
                    &record,
                    &shape,
                    point,
                    &[0, 3, 1],
                    None,
                )
                .await;
                match result {
                    Ok(0) => {
                        Verdict::NotChecked(format!("the crash point {point} was never reached"))
                    }
                    Ok(_) => Verdict::Passed,
                    Err(why) => {
                        // The smallest record count that still fails.
                        let mut smallest = (records, why);
                        let mut n = records / 2;
                        while n >= 8 {
                            let shape = runner::Shape::streaming(n, p);
                            match crashes::crash_and_recover(
                                &new_destination().await,
                                &record,
                                &shape,
                                point,
                                &[0, 3, 1],
                                None,
                            )
                            .await
                            {
                                Err(why) => smallest = (n, why),
                                Ok(_) => break,
                            }
                            n /= 2;
                        }
                        Verdict::Failed(format!(
                            "with {} records, parallelism {p}: {}",
                            smallest.0, smallest.1
                        ))
                    }
                }
            },
        )
        .await;
    }
    for (from, to) in [(2, 3), (3, 1)] {
        kit.check(
            &format!("rescale/{from}-to-{to}"),
            "restarted with another parallelism: every record once",
            async {
                crashes::rescale(&new_destination().await, &record, records, from, to)
                    .await
                    .into()
            },
        )
        .await;
    }
    for chain in [[2, 1, 2], [1, 3, 2]] {
        let name = format!("rescale/{}-to-{}-to-{}", chain[0], chain[1], chain[2]);
        kit.check(
            &name,
            "stopped and restored through several parallelisms: every record once",
            async {
                chains::rescale_chain(&new_destination().await, &record, records, &chain)
                    .await
                    .into()
            },
        )
        .await;
    }
    // Only a sink that commits source positions can be handed a source
    // whose splits move between instances (the job's build refuses the
    // others), as only a sink with a global committer meets one.
    let commits_positions = new_destination().await.sink().await.commits_positions();
    if commits_positions {
        handovers(&mut kit, &new_destination, &record, records, p).await;
    }
    let brings_global = new_destination()
        .await
        .sink()
        .await
        .global_committer()
        .is_some();
    for injection in outcomes::Injection::ALL {
        if injection == outcomes::Injection::GlobalCommit && !brings_global {
            continue;
        }
        let name = format!("unknown-outcome/{}", injection.name());
        kit.check(
            &name,
            "a commit applied but its answer lost, then the job restarted: every record once",
            async {
                for interval in outcomes::INTERVALS {
                    let result = outcomes::lose_one_outcome(
                        &new_destination().await,
                        &record,
                        records,
                        p,
                        injection,
                        interval,
                    )
                    .await;
                    match result {
                        Ok(true) => return Verdict::Passed,
                        // Only a call of two requests or more is worth
                        // waiting for at longer intervals.
                        Ok(false) if injection.needs_a_batch() => continue,
                        Ok(false) => break,
                        Err(why) => return Verdict::Failed(why),
                    }
                }
                Verdict::NotChecked(injection.not_fired().into())
            },
        )
        .await;
    }
    kit.check(
        "unknown-outcome/retried-in-place",
        "a commit applied but its answer lost, retried by the same committer without a restart: every record once",
        async {
            for position in in_place::Position::ALL {
                match in_place::retry_in_place(
                    &new_destination().await,
                    &record,
                    records,
                    p,
                    position,
                )
                .await
                {
                    Ok(true) => {}
                    Ok(false) => return Verdict::NotChecked(position.not_fired().into()),
                    Err(why) => return Verdict::Failed(why),
                }
            }
            Verdict::Passed
        },
    )
    .await;
    kit.check(
        "simulation",
        "seeded scenarios of crashes, timings and parallelism: every record once",
        async {
            let seeds: Vec<u64> = match std::env::var("TESTKIT_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
            {
                Some(seed) => vec![seed],
                None => (0..knobs.seeds).collect(),
            };
            for seed in seeds {
                if let Err(why) =
                    crashes::simulate(&new_destination().await, &record, seed, records).await
                {
                    let mut smallest = (records, why);
                    let mut n = records / 2;
                    while n >= 8 {
                        match crashes::simulate(&new_destination().await, &record, seed, n).await {
                            Err(why) => smallest = (n, why),
                            Ok(()) => break,
                        }
                        n /= 2;
                    }
                    return Verdict::Failed(format!(
                        "seed {seed} with {} records: {} (reproduce with TESTKIT_SEED={seed})",
                        smallest.0, smallest.1
                    ));
                }
            }
            Verdict::Passed
        },
    )
    .await;
    kit.report
}

impl From<Result<(), String>> for Verdict {
    fn from(result: Result<(), String>) -> Verdict {
        match result {
            Ok(()) => Verdict::Passed,
            Err(why) => Verdict::Failed(why),
        }
    }
}

/// Runs properties in order within the time budget.
struct Kit {
    knobs: Knobs,
    started: Instant,
    report: Report,
}

impl Kit {
    async fn check(
        &mut self,
        name: &str,
        checks: &'static str,
        property: impl Future<Output = Verdict>,
    ) {
        if !self.knobs.only.is_empty() && !self.knobs.only.iter().any(|n| n == name) {
            return;
        }
        let began = Instant::now();
        let verdict = if began.duration_since(self.started) > self.knobs.time_budget {
            Verdict::Failed(format!(
                "not run: the time budget of {:?} was used up; raise Knobs::time_budget",
                self.knobs.time_budget
            ))
        } else {
            property.await
        };
        self.report.properties.push(PropertyResult {
            name: name.to_string(),
            checks,
            verdict,
            took: began.elapsed(),
        });
    }
}

/// The hand-over properties, for a sink that commits source positions.
async fn handovers<D, F, Fut>(
    kit: &mut Kit,
    new_destination: &F,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    p: usize,
) where
    D: Destination,
    F: Fn() -> Fut,
    Fut: Future<Output = D>,
{
    let mut handed_over = None;
    kit.check(
        "handover/new-owner",
        "a killed instance's splits read by another on fresh checkpoint storage: every record once",
        async {
            match handover::handover(&new_destination().await, record, records, p).await {
                Ok(found) => {
                    let verdict = found.new_owner.clone().into();
                    handed_over = Some(found);
                    verdict
                }
                Err(why) => Verdict::Failed(why),
            }
        },
    )
    .await;
    kit.check(
        "handover/old-owner-returns",
        "the killed instance back from its checkpoint: what it prepared is superseded, every record once",
        async {
            match handed_over.and_then(|found| found.old_owner_returns) {
                Some(result) => result.into(),
                None => Verdict::NotChecked(
                    "the hand-over to a new owner failed (see handover/new-owner)".into(),
                ),
            }
        },
    )
    .await;
    kit.check(
        "handover/two-owners-at-once",
        "two instances reading the same splits at once: every record once",
        async {
            handover::two_owners_at_once(&new_destination().await, record, records, p)
                .await
                .into()
        },
    )
    .await;
}
