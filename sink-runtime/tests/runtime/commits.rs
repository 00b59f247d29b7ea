//! Commit outcomes through the runtime: subsumption, retries with backoff,
//! exhausted retries, known and unknown failures, failing sinks and failing
//! checkpoints.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sink_api::{async_trait, CheckpointId, InitContext, Sink, SinkError, WriterStateOf};
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobStatus, RestartStrategy, RetryPolicy, SequenceSource,
};
use sinks_memory::{InjectedCommitFailure, MemoryCommittable, MemorySink, MemoryStore};
use tokio::time::Instant;

fn bounded_job(
    store: &MemoryStore<u64>,
) -> sink_runtime::JobBuilder<SequenceSource, MemorySink<u64>> {
    Job::builder(
        "commits",
        SequenceSource::bounded(100),
        MemorySink::new(store.clone()),
    )
}

/// An unbounded job into `store`, checkpointing every 300 ms, whose first
/// `failing` checkpoints fail to store (10 ms after they are handed over).
fn failing_first_checkpoints(store: &MemoryStore<u64>, failing: u64) -> sink_runtime::JobHandle {
    let storage = ScriptedStorage::new(move |id| match id.0 <= failing {
        true => StoreScript::FailAfter(ms(10)),
        false => StoreScript::Succeed,
    });
    Job::builder(
        "failing-first",
        ThrottledSource::unbounded(1_000, 10, ms(10)),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(ms(300)))
    .checkpoint_storage(storage)
    .build()
    .unwrap()
    .start()
}

/// `checkpoints_failed_in_a_row` counts the failures since the last
/// completion (what a health check reads) and is back to 0 at the next
/// completion.
#[tokio::test(start_paused = true)]
async fn failures_in_a_row_are_counted_until_a_checkpoint_completes() {
    let store = MemoryStore::<u64>::new();
    let handle = failing_first_checkpoints(&store, 2);
    tokio::time::sleep(ms(450)).await;
    assert_eq!(handle.metrics().checkpoints_failed_in_a_row, 1);
    tokio::time::sleep(ms(300)).await;
    assert_eq!(handle.metrics().checkpoints_failed_in_a_row, 2);
    tokio::time::sleep(ms(300)).await;
    let metrics = handle.metrics();
    assert_eq!(metrics.checkpoints_completed, 1, "{metrics:?}");
    assert_eq!(metrics.checkpoints_failed, 2);
    assert_eq!(metrics.checkpoints_failed_in_a_row, 0);
    handle.cancel();
    handle.join().await.unwrap();
}

/// A failed checkpoint commits nothing; the next completion commits its
/// committables too (subsumption), in checkpoint order.
#[tokio::test(start_paused = true)]
async fn a_completion_commits_the_failed_checkpoint_before_it() {
    let store = MemoryStore::<u64>::new();
    let handle = failing_first_checkpoints(&store, 1);

    // Checkpoint 1 (at 300 ms) fails: nothing is committed.
    tokio::time::sleep(ms(450)).await;
    assert!(store.committed().is_empty());
    assert_eq!(handle.metrics().checkpoints_failed, 1);
    assert!(!store.pending().is_empty());

    // Checkpoint 2 (at 600 ms) completes and commits 1 and then 2.
    tokio::time::sleep(ms(300)).await;
    let per_checkpoint = store.commits_per_checkpoint();
    assert_eq!(
        per_checkpoint.keys().copied().collect::<Vec<_>>(),
        vec![CheckpointId(1), CheckpointId(2)]
    );
    let committed = store.committed();
    assert!(
        committed.windows(2).all(|w| w[0] < w[1]),
        "oldest checkpoint first"
    );
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    assert_no_violations(&store);
}

/// "Retry later" is retried with growing, jittered delays, every retry
/// counted, until the commit succeeds.
#[tokio::test(start_paused = true)]
async fn retry_later_is_retried_with_backoff_until_it_succeeds() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_commits(3, InjectedCommitFailure::RetryLater);
    let policy = RetryPolicy {
        max_retries: 5,
        initial_backoff: ms(100),
        max_backoff: Duration::from_secs(10),
    };
    let started = Instant::now();
    let report = bounded_job(&store)
        .commit_retry(policy)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    let elapsed = started.elapsed();

    assert_exactly_once("committed", &store.committed(), 100);
    assert_eq!(report.metrics.commits_retried, 3);
    assert_eq!(report.metrics.commit_calls, 4);
    assert_eq!(report.metrics.commits_succeeded, 1);
    assert_eq!(store.stats().injected_retry_later, 3);
    // Backoffs of at least 50, 100 and 200 ms (half of 100, 200, 400 with
    // jitter), at most 700 ms in all.
    assert!(
        elapsed >= ms(350) && elapsed <= ms(700) + ms(50),
        "{elapsed:?}"
    );
    assert_no_violations(&store);
}

/// Past the retry limit the job fails with an error that names the
/// checkpoint and the fix.
#[tokio::test(start_paused = true)]
async fn exhausted_retries_fail_the_job() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_commits(1_000, InjectedCommitFailure::RetryLater);
    let policy = RetryPolicy {
        max_retries: 3,
        ..RetryPolicy::default()
    };
    let error = bounded_job(&store)
        .commit_retry(policy)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(
        matches!(error, JobError::Commit { subtask: 0, .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("after 3 retries"), "{message}");
    assert!(message.contains("commit_retry"), "names the fix: {message}");
    assert_eq!(
        store.stats().injected_retry_later,
        4,
        "first try and three retries"
    );
    assert!(store.committed().is_empty());
}

/// A known failure is counted and dropped; the job goes on and ends well.
#[tokio::test(start_paused = true)]
async fn a_known_failure_is_counted_and_the_job_goes_on() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_commits(1, InjectedCommitFailure::KnownReason);
    let report = Job::builder(
        "known",
        ThrottledSource::bounded(100, 10, ms(100)),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(ms(300)))
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.commits_failed, 1);
    assert_eq!(store.stats().injected_known_failures, 1);
    // The first checkpoint's transaction was dropped; everything after it
    // was committed.
    let committed = store.committed();
    assert!(
        !committed.is_empty() && committed.len() < 100,
        "{}",
        committed.len()
    );
    assert_eq!(*committed.last().unwrap(), 99);
    // The loss is in the report, counted and named, not only in a log line.
    let lost = 100 - committed.len() as u64;
    assert!(report.lost_output());
    assert_eq!(report.metrics.records_lost, lost);
    assert_eq!(report.metrics.records_committed, committed.len() as u64);
    assert_eq!(
        report.known_failures.len(),
        1,
        "{:?}",
        report.known_failures
    );
    let failure = &report.known_failures[0];
    assert_eq!(failure.records_lost, Some(lost));
    assert_eq!(failure.subtask, 0);
    assert!(
        failure.reason.contains("injected commit failure"),
        "{failure:?}"
    );
}

/// An unknown failure fails the job.
#[tokio::test(start_paused = true)]
async fn an_unknown_failure_fails_the_job() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_commits(1, InjectedCommitFailure::UnknownReason);
    let error = bounded_job(&store)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(matches!(error, JobError::Commit { .. }), "{error:?}");
    assert!(error.to_string().contains("unknown reason"), "{error}");
    assert!(store.committed().is_empty());
}

/// A committer, writer or checkpoint storage that keeps failing fails the
/// job with an error naming the call.
#[tokio::test(start_paused = true)]
async fn failing_sink_calls_fail_the_job_with_the_call_named() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_commit_calls(1);
    let error = bounded_job(&store)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            JobError::Sink {
                action: "commit",
                ..
            }
        ),
        "{error:?}"
    );

    let store = MemoryStore::<u64>::new();
    store.fail_next_prepare_commits(1);
    let error = bounded_job(&store)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            JobError::Sink {
                action: "prepare_commit",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("subtask 0: prepare_commit failed"),
        "{error}"
    );
    assert_eq!(
        store.stats().commit_calls,
        0,
        "nothing committed after a failed prepare"
    );
}

/// Checkpoints that keep failing fail the job past the tolerated number.
#[tokio::test(start_paused = true)]
async fn checkpoints_failing_past_tolerance_fail_the_job() {
    let store = MemoryStore::<u64>::new();
    let error = Job::builder(
        "failing",
        SequenceSource::unbounded(100),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(ms(100)).tolerable_failures(2))
    .checkpoint_storage(ScriptedStorage::new(|_| StoreScript::FailAfter(ms(1))))
    .build()
    .unwrap()
    .run()
    .await
    .unwrap_err();
    let JobError::CheckpointsFailing { consecutive, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*consecutive, 3);
    assert!(
        error.to_string().contains("nothing is committed"),
        "{error}"
    );
    assert!(store.committed().is_empty());
}

/// A checkpoint whose storage hangs times out and counts as failed; the next
/// one commits everything.
#[tokio::test(start_paused = true)]
async fn a_hanging_checkpoint_times_out_and_the_next_one_commits() {
    let store = MemoryStore::<u64>::new();
    let storage = ScriptedStorage::new(|id| match id.0 {
        1 => StoreScript::Hang,
        _ => StoreScript::Succeed,
    });
    let handle = Job::builder(
        "timeout",
        SequenceSource::unbounded(100),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(ms(100)).timeout(ms(500)))
    .checkpoint_storage(storage)
    .build()
    .unwrap()
    .start();
    tokio::time::sleep(Duration::from_secs(2)).await;
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.metrics.checkpoints_failed, 1);
    assert!(report.metrics.checkpoints_completed >= 1);
    assert_exactly_once("committed", &store.committed(), 100);
}

/// A cancel reaches a job whose commit is stuck in its retries: the job stops
/// at once, commits nothing more, and reports its last checkpoint.
#[tokio::test(start_paused = true)]
async fn a_cancel_stops_a_commit_stuck_in_retries_and_commits_nothing_more() {
    let store = MemoryStore::<u64>::new();
    store.fail_next_commits(9, InjectedCommitFailure::RetryLater);
    let handle = Job::builder(
        "stuck",
        SequenceSource::unbounded(100),
        MemorySink::new(store.clone()),
    )
    .checkpointing(CheckpointConfig::every(ms(100)))
    .commit_retry(RetryPolicy {
        max_retries: 1_000,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(60),
    })
    .build()
    .unwrap()
    .start();
    tokio::time::sleep(ms(150)).await;
    assert!(handle.metrics().commits_retried >= 1);
    let cancelled_at = Instant::now();
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    assert!(
        cancelled_at.elapsed() < ms(100),
        "{:?}",
        cancelled_at.elapsed()
    );
    assert!(
        store.committed().is_empty(),
        "nothing is committed after the cancel"
    );
    assert_eq!(report.last_checkpoint, Some(CheckpointId(1)));
}

/// The backoff is jittered: the same three retries, run five times, never
/// wait the full exponential delay (700 ms) and do not all wait the same.
#[tokio::test(start_paused = true)]
async fn retry_backoff_is_jittered() {
    let policy = RetryPolicy {
        max_retries: 5,
        initial_backoff: ms(100),
        max_backoff: Duration::from_secs(10),
    };
    let mut waits = Vec::new();
    for _ in 0..5 {
        let store = MemoryStore::<u64>::new();
        store.fail_next_commits(3, InjectedCommitFailure::RetryLater);
        let started = Instant::now();
        let report = bounded_job(&store)
            .commit_retry(policy)
            .build()
            .unwrap()
            .run()
            .await
            .unwrap();
        assert_eq!(report.metrics.commits_retried, 3);
        waits.push(started.elapsed());
    }
    assert!(
        waits.iter().all(|w| *w >= ms(350) && *w < ms(700)),
        "each wait in [350 ms, 700 ms): {waits:?}"
    );
    assert!(
        waits.windows(2).any(|w| w[0] != w[1]),
        "jitter varies the waits: {waits:?}"
    );
}

/// A sink whose writers cannot be created: the error is made with a driver
/// error as its cause, of the class under test. Counts the attempts.
#[derive(Clone)]
struct Unopenable {
    class: sink_api::ErrorClass,
    attempts: Arc<AtomicU64>,
}

#[derive(Debug, thiserror::Error)]
#[error("relation \"t\" does not exist (42P01)")]
struct DriverError(#[source] std::io::Error);

#[async_trait]
impl Sink for Unopenable {
    type Writer = sinks_memory::MemoryWriter<u64>;
    type Committer = sinks_memory::MemoryCommitter<u64>;

    async fn create_writer(
        &self,
        context: &InitContext,
        _: Vec<WriterStateOf<Self>>,
    ) -> Result<Self::Writer, SinkError> {
        if context.subtask_index == 0 {
            self.attempts.fetch_add(1, Ordering::SeqCst);
        }
        let cause = DriverError(std::io::Error::other("server said no"));
        let error = SinkError::other("opening table t", cause);
        Err(match self.class {
            sink_api::ErrorClass::Permanent => error.permanent(),
            _ => error,
        })
    }

    async fn create_committer(&self, context: &InitContext) -> Result<Self::Committer, SinkError> {
        MemorySink::new(MemoryStore::<u64>::new())
            .create_committer(context)
            .await
    }
}

async fn run_unopenable(class: sink_api::ErrorClass) -> (JobError, u64) {
    let attempts = Arc::new(AtomicU64::new(0));
    let sink = Unopenable {
        class,
        attempts: attempts.clone(),
    };
    let error = Job::builder("unopenable", SequenceSource::bounded(10), sink)
        .restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: ms(10),
        })
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    (error, attempts.load(Ordering::SeqCst))
}

/// A permanent error (a missing table) fails the job at once: no restart,
/// and the message holds the whole cause chain.
#[tokio::test(start_paused = true)]
async fn a_permanent_sink_error_fails_the_job_without_restarts_and_shows_its_causes() {
    let (error, attempts) = run_unopenable(sink_api::ErrorClass::Permanent).await;
    assert_eq!(attempts, 1, "not restarted: {error}");
    assert!(!error.is_restartable());
    let message = error.to_string();
    assert!(
        message.contains("opening table t: relation \"t\" does not exist (42P01): server said no"),
        "the whole chain: {message}"
    );
}

/// A transient error restarts the job under its strategy, then fails it.
#[tokio::test(start_paused = true)]
async fn a_transient_sink_error_is_restarted_under_the_strategy() {
    let (error, attempts) = run_unopenable(sink_api::ErrorClass::Transient).await;
    assert_eq!(attempts, 4, "the first start and three restarts: {error}");
    assert!(error.is_restartable());
}

/// The memory sink with a committer that returns without settling anything
/// (or, `replays`, that takes every committable for a replay).
struct Forgetful(MemorySink<u64>, bool);

struct ForgetfulCommitter {
    replays: bool,
}

#[async_trait]
impl sink_api::Committer for ForgetfulCommitter {
    type Committable = MemoryCommittable;

    async fn commit(
        &mut self,
        requests: &mut [sink_api::CommitRequest<MemoryCommittable>],
    ) -> Result<(), SinkError> {
        if self.replays {
            requests
                .iter_mut()
                .for_each(sink_api::CommitRequest::signal_already_committed);
        }
        Ok(())
    }
}

#[async_trait]
impl Sink for Forgetful {
    type Writer = sinks_memory::MemoryWriter<u64>;
    type Committer = ForgetfulCommitter;

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<WriterStateOf<Self>>,
    ) -> Result<Self::Writer, SinkError> {
        self.0.create_writer(context, restored).await
    }

    async fn create_committer(&self, _: &InitContext) -> Result<ForgetfulCommitter, SinkError> {
        Ok(ForgetfulCommitter { replays: self.1 })
    }
}

/// No silent success: a committer that leaves a request unsettled fails the
/// job, with a message that says what to call; nothing counts as committed.
#[tokio::test(start_paused = true)]
async fn a_request_left_unsettled_fails_the_job_loudly() {
    let store = MemoryStore::<u64>::new();
    let error = Job::builder(
        "forgetful",
        SequenceSource::bounded(10),
        Forgetful(MemorySink::new(store.clone()), false),
    )
    .build()
    .unwrap()
    .run()
    .await
    .unwrap_err();
    assert!(matches!(error, JobError::Commit { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("without settling a request") && message.contains("signal_committed()"),
        "{message}"
    );
    assert!(store.committed().is_empty());
}

/// Commits that only replay what was visible before are counted apart:
/// `records_committed` counts only what became visible now (a sink whose
/// names repeat across runs shows up as replays, not as output).
#[tokio::test(start_paused = true)]
async fn replays_are_counted_apart_from_new_commits() {
    let store = MemoryStore::<u64>::new();
    let report = Job::builder(
        "replays",
        SequenceSource::bounded(100),
        Forgetful(MemorySink::new(store.clone()), true),
    )
    .parallelism(2)
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.records_written, 100);
    assert_eq!(report.metrics.records_committed, 0);
    assert_eq!(report.metrics.records_replayed, 100);
    assert_eq!(report.metrics.commits_already_committed, 2);
}

/// The in-memory sink names its transactions in the job's lineage: the same
/// job run twice on one store, each time on fresh checkpoint storage, meets
/// no id of the first run (the store would report a repeated id as a
/// violation) and keeps both runs' records.
#[tokio::test(start_paused = true)]
async fn the_memory_sink_run_again_on_fresh_checkpoint_storage_repeats_no_transaction_id() {
    let store = MemoryStore::<u64>::new();
    for _ in 0..2 {
        let report = Job::builder(
            "twice",
            SequenceSource::bounded(100),
            MemorySink::new(store.clone()),
        )
        .parallelism(2)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
        assert_eq!(report.metrics.records_committed, 100);
    }
    assert_no_violations(&store);
    let mut committed = store.committed();
    committed.sort_unstable();
    let twice: Vec<u64> = (0..100).flat_map(|n| [n, n]).collect();
    assert_eq!(committed, twice);
}

/// A sink's own counters, registered in `Sink::on_start`, are in the job's
/// metrics: live through the handle and in the report.
#[tokio::test(start_paused = true)]
async fn the_sinks_own_counters_land_in_the_jobs_metrics() {
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "counters",
        ThrottledSource::bounded(1_000, 10, ms(10)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(100)))
    .build()
    .unwrap()
    .start();
    tokio::time::sleep(ms(300)).await;
    let live = handle.metrics();
    let report = handle.join().await.unwrap();
    let counter = |metrics: &sink_runtime::MetricsSnapshot, name: &str| {
        let found = metrics.sink.iter().find(|c| c.name == name);
        found
            .unwrap_or_else(|| panic!("no {name} in {:?}", metrics.sink))
            .value
    };
    let written_then = counter(&live, "memory_sink_records_written");
    assert!(written_then > 0 && written_then < 1_000, "{written_then}");
    assert_eq!(
        counter(&report.metrics, "memory_sink_records_written"),
        1_000
    );
    assert_eq!(
        counter(&report.metrics, "memory_sink_committed_records"),
        1_000
    );
    let stats = store.stats();
    assert_eq!(
        counter(&report.metrics, "memory_sink_committed_transactions"),
        stats.committed_transactions
    );
    assert_eq!(
        counter(&report.metrics, "memory_sink_replays"),
        stats.replays
    );
    let help = report.metrics.sink.iter().map(|c| c.help.as_str());
    assert!(help.clone().all(|h| !h.is_empty()));
}
