//! Commits run off the writer's path: a committer that takes 2 s per call,
//! with checkpoints every 100 ms, leaves the writer at least 0.8 of the
//! throughput it has with an instant committer. Measured as a ratio of
//! records written in the same span of (paused, virtual) time, both runs in
//! this test; no wall-clock time is asserted. Every record is still
//! committed exactly once, in checkpoint order.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use sink_api::{async_trait, CommitRequest, Committer, InitContext, Sink, SinkError};
use sink_runtime::{CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage, RestartStrategy};
use sinks_memory::{
    MemoryCommittable, MemoryCommitter, MemoryGlobalCommitter, MemorySink, MemoryStore,
    MemoryWriter, MemoryWriterState,
};

/// How long each commit call of the slow committer takes.
const COMMIT_CALL: Duration = Duration::from_secs(2);

/// The memory sink, whose committer takes `delay` per call.
struct SlowCommits {
    inner: MemorySink<u64>,
    delay: Duration,
    calls: Arc<Calls>,
}

/// Commit calls started, and ended (applied), over every committer.
#[derive(Debug, Default)]
struct Calls {
    started: AtomicUsize,
    ended: AtomicUsize,
}

struct SlowCommitter {
    inner: MemoryCommitter<u64>,
    delay: Duration,
    calls: Arc<Calls>,
}

#[async_trait]
impl Sink for SlowCommits {
    type Writer = MemoryWriter<u64>;
    type Committer = SlowCommitter;

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<MemoryWriterState<u64>>,
    ) -> Result<MemoryWriter<u64>, SinkError> {
        self.inner.create_writer(context, restored).await
    }

    async fn create_committer(&self, context: &InitContext) -> Result<SlowCommitter, SinkError> {
        Ok(SlowCommitter {
            inner: self.inner.create_committer(context).await?,
            delay: self.delay,
            calls: self.calls.clone(),
        })
    }
}

#[async_trait]
impl Committer for SlowCommitter {
    type Committable = MemoryCommittable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<MemoryCommittable>],
    ) -> Result<(), SinkError> {
        self.calls.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let result = self.inner.commit(requests).await;
        self.calls.ended.fetch_add(1, Ordering::SeqCst);
        result
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.inner.close().await
    }
}

/// Runs an unbounded job for `span` of virtual time with a committer taking
/// `delay` per call, then stops it; returns the records written.
async fn written_in(span: Duration, delay: Duration) -> u64 {
    let store = MemoryStore::<u64>::new();
    let sink = SlowCommits {
        inner: MemorySink::new(store.clone()),
        delay,
        calls: Default::default(),
    };
    // 100 records every 10 ms: 10 000 a second, far more than `span` reads.
    let handle = Job::builder(
        "slow",
        ThrottledSource::unbounded(1_000_000, 100, ms(10)),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(100)))
    .build()
    .unwrap()
    .start();
    tokio::time::sleep(span).await;
    let written = handle.metrics().records_written;
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    assert!(report.metrics.commit_calls > 0, "{:?}", report.metrics);
    assert_no_violations(&store);
    written
}

#[tokio::test(start_paused = true)]
async fn a_committer_taking_two_seconds_a_call_leaves_the_writer_its_throughput() {
    let span = Duration::from_secs(10);
    let baseline = written_in(span, Duration::ZERO).await;
    let slow = written_in(span, COMMIT_CALL).await;
    let ratio = slow as f64 / baseline as f64;
    println!("records written in {span:?}: {baseline} with instant commits, {slow} with {COMMIT_CALL:?} a call: ratio {ratio:.3}");
    assert!(baseline > 0);
    assert!(
        ratio >= 0.8,
        "the writer kept only {ratio:.3} of its throughput"
    );
}

/// The same slow committer, on bounded input: every record committed once,
/// and the job ends only after the final commit.
#[tokio::test(start_paused = true)]
async fn a_slow_committer_still_commits_everything_once_before_the_job_ends() {
    let store = MemoryStore::<u64>::new();
    let sink = SlowCommits {
        inner: MemorySink::new(store.clone()),
        delay: COMMIT_CALL,
        calls: Default::default(),
    };
    let report = Job::builder("slow", ThrottledSource::bounded(5_000, 100, ms(10)), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(100)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.records_committed, 5_000);
    assert_exactly_once("committed", &store.committed(), 5_000);
    assert_no_violations(&store);
}

/// Stopped while checkpoints wait for (or are in) a slow commit, with a
/// global committer: the subtasks' snapshots keep what was not reported
/// committed, the global committer's keep what was forwarded, and a restore
/// (with another parallelism, so parts change hands) delivers every part
/// to the global committer exactly once.
#[tokio::test(start_paused = true)]
async fn commits_in_flight_at_a_stop_reach_the_global_committer_once_after_the_restore() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let job = |source: ThrottledSource, parallelism: usize, delay: Duration| {
        let sink = SlowCommits {
            inner: MemorySink::new(store.clone()),
            delay,
            calls: Default::default(),
        };
        Job::builder("slow", source, sink)
            .parallelism(parallelism)
            .checkpointing(CheckpointConfig::every(ms(100)))
            .checkpoint_storage(storage.clone())
            .global_committer({
                let store = store.clone();
                move || MemoryGlobalCommitter::new(store.clone())
            })
            .build()
            .unwrap()
    };
    let first = job(ThrottledSource::unbounded(5_000, 10, ms(10)), 2, ms(250)).start();
    tokio::time::sleep(ms(1_230)).await;
    first.cancel();
    first.join().await.unwrap();
    let stopped = storage.checkpoints().last().unwrap().clone();
    let waiting: usize = stopped.subtasks.iter().map(|s| s.pending.len()).sum();
    assert!(
        waiting > 2,
        "checkpoints waited for the slow committer: {waiting}"
    );
    assert!(store.global_records().len() < 5_000);

    let report = job(
        ThrottledSource::bounded(5_000, 10, ms(10)),
        3,
        Duration::ZERO,
    )
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 5_000);
    assert_exactly_once("global committer", &store.global_records(), 5_000);
    assert_no_violations(&store);
}

/// A subtask that fails still closes its committer (after the commit under
/// way, starting no other), as the contract promises.
#[tokio::test(start_paused = true)]
async fn a_failed_subtask_closes_its_committer() {
    let store = MemoryStore::<u64>::new();
    let sink = SlowCommits {
        inner: MemorySink::new(store.clone()),
        delay: ms(300),
        calls: Default::default(),
    };
    let handle = Job::builder("slow", ThrottledSource::unbounded(5_000, 10, ms(10)), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(100)))
        .restart_strategy(RestartStrategy::Never)
        .build()
        .unwrap()
        .start();
    tokio::time::sleep(ms(450)).await;
    store.fail_next_prepare_commits(1);
    handle.join().await.expect_err("a prepare_commit failed");
    let stats = store.stats();
    assert_eq!(stats.committers_created, 2);
    assert_eq!(stats.committer_closes, 2, "{stats:?}");
}

/// A commit call still running when the job is cancelled is not cut off
/// when the job's grace period (5 s) ends: the job returns only once the
/// call has ended. Cut off, what a sink handed to a blocking thread or a
/// server could still take effect after the job (or its next attempt, which
/// commits the same committables again) moved on.
#[tokio::test(start_paused = true)]
async fn a_commit_call_running_past_the_grace_period_is_waited_for() {
    let store = MemoryStore::<u64>::new();
    let calls = Arc::new(Calls::default());
    let sink = SlowCommits {
        inner: MemorySink::new(store.clone()),
        delay: Duration::from_secs(30),
        calls: calls.clone(),
    };
    let handle = Job::builder("slow", ThrottledSource::unbounded(5_000, 10, ms(10)), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(100)))
        .build()
        .unwrap()
        .start();
    tokio::time::sleep(ms(450)).await;
    assert!(
        calls.started.load(Ordering::SeqCst) > 0,
        "a call is under way"
    );
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    assert_eq!(
        calls.ended.load(Ordering::SeqCst),
        calls.started.load(Ordering::SeqCst),
        "every commit call ended before the job returned"
    );
    assert_no_violations(&store);
}
