//! `Sink::uncommitted_lifetime`: a sink whose destination drops uncommitted
//! data after a while (a Kafka transaction's timeout) has the build refuse
//! checkpoint settings under which a committable could wait longer for its
//! commit, naming the setting to change; settings within it build.

use std::time::Duration;

use sink_api::{async_trait, InitContext, Sink, SinkError};
use sink_runtime::{BuildError, CheckpointConfig, Job, RetryPolicy, SequenceSource};
use sinks_memory::{MemoryCommitter, MemorySink, MemoryStore, MemoryWriter, MemoryWriterState};

/// The memory sink, as if its destination dropped uncommitted data after
/// `lifetime`.
struct Expiring {
    inner: MemorySink<u64>,
    lifetime: Duration,
}

#[async_trait]
impl Sink for Expiring {
    type Writer = MemoryWriter<u64>;
    type Committer = MemoryCommitter<u64>;

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<MemoryWriterState<u64>>,
    ) -> Result<MemoryWriter<u64>, SinkError> {
        self.inner.create_writer(context, restored).await
    }

    async fn create_committer(
        &self,
        context: &InitContext,
    ) -> Result<MemoryCommitter<u64>, SinkError> {
        self.inner.create_committer(context).await
    }

    fn uncommitted_lifetime(&self) -> Option<Duration> {
        Some(self.lifetime)
    }
}

fn build(
    lifetime: Duration,
    config: CheckpointConfig,
    retry: RetryPolicy,
) -> Result<(), BuildError> {
    let sink = Expiring {
        inner: MemorySink::new(MemoryStore::default()),
        lifetime,
    };
    Job::builder("expiring", SequenceSource::bounded(10), sink)
        .checkpointing(config)
        .commit_retry(retry)
        .build()
        .map(|_| ())
}

#[test]
fn checkpoint_settings_that_could_outlive_the_destinations_timeout_are_refused_with_the_fix() {
    let no_retries = RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    };
    // 1 s interval + 10 min timeout + the default retries' 42.7 s: within
    // 15 minutes.
    let fifteen = Duration::from_secs(900);
    build(
        fifteen,
        CheckpointConfig::every(Duration::from_secs(1)),
        RetryPolicy::default(),
    )
    .expect("the defaults fit a 15-minute transaction timeout");
    // The checkpoint timeout alone exceeds 5 minutes.
    let five = Duration::from_secs(300);
    let error = build(
        five,
        CheckpointConfig::every(Duration::from_secs(1)),
        no_retries,
    )
    .expect_err("a 10-minute checkpoint timeout cannot fit 5 minutes");
    let message = error.to_string();
    assert!(message.contains("CheckpointConfig::timeout"), "{message}");
    assert!(message.contains("at most 299s"), "{message}");
    // Within: 1 s + 298 s.
    build(
        five,
        CheckpointConfig::every(Duration::from_secs(1)).timeout(Duration::from_secs(298)),
        no_retries,
    )
    .expect("299 s fit 300 s");
    // The commit retries count: 10 retries of up to 10 s each.
    let retries = RetryPolicy {
        max_retries: 10,
        initial_backoff: Duration::from_secs(10),
        max_backoff: Duration::from_secs(10),
    };
    let error = build(
        five,
        CheckpointConfig::every(Duration::from_secs(1)).timeout(Duration::from_secs(298)),
        retries,
    )
    .expect_err("the retries' 100 s do not fit");
    assert!(
        error.to_string().contains("commit retries' backoff 100s"),
        "{error}"
    );
    // A sink that says nothing is never refused.
    let sink = MemorySink::new(MemoryStore::<u64>::default());
    Job::builder("plain", SequenceSource::bounded(10), sink)
        .checkpointing(CheckpointConfig::every(Duration::from_secs(3600)))
        .build()
        .expect("no lifetime, no limit");
}
