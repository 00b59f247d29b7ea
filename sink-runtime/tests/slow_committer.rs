//! Commits run off the writer's path: a committer that takes 2 s per call,
//! with checkpoints every 100 ms, leaves the writer at least 0.8 of the
//! throughput it has with an instant committer. Measured as a ratio of
//! records written in the same span of (paused, virtual) time, both runs in
//! this test; no wall-clock time is asserted. Every record is still
//! committed exactly once, in checkpoint order.

mod common;

use std::time::Duration;

use common::*;
use sink_api::{async_trait, CommitRequest, Committer, InitContext, Sink, SinkError};
use sink_runtime::{CheckpointConfig, Job, JobStatus};
use sinks_memory::{
    MemoryCommittable, MemoryCommitter, MemorySink, MemoryStore, MemoryWriter, MemoryWriterState,
};

/// How long each commit call of the slow committer takes.
const COMMIT_CALL: Duration = Duration::from_secs(2);

/// The memory sink, whose committer takes `delay` per call.
struct SlowCommits {
    inner: MemorySink<u64>,
    delay: Duration,
}

struct SlowCommitter {
    inner: MemoryCommitter<u64>,
    delay: Duration,
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
        tokio::time::sleep(self.delay).await;
        self.inner.commit(requests).await
    }
}

/// Runs an unbounded job for `span` of virtual time with a committer taking
/// `delay` per call, then stops it; returns the records written.
async fn written_in(span: Duration, delay: Duration) -> u64 {
    let store = MemoryStore::<u64>::new();
    let sink = SlowCommits {
        inner: MemorySink::new(store.clone()),
        delay,
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
