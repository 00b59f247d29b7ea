//! A group reading a topic into the memory sink: bounded, the positions
//! committed with the data.

use sink_runtime::{JobStatus, MemoryCheckpointStorage};
use sinks_memory::MemoryStore;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_group_reads_every_record_once_and_commits_where_each_partition_ends() {
    let topic = unique("source-bounded");
    fill(&topic, 4, 0, 2000).await;
    let store = MemoryStore::new();
    let job = start(
        &topic,
        &unique("g"),
        true,
        2,
        &store,
        &MemoryCheckpointStorage::default(),
    )
    .await;
    let report = job.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(committed(&store), (0..2000).collect::<Vec<_>>());
}

/// A topic written in transactions (the Kafka sink's output) ends each
/// partition with a commit marker, a control record never handed out: a
/// bounded read ends all the same (it waited forever for an offset no
/// record has).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_group_reading_a_topic_written_in_transactions_ends() {
    use sink_runtime::source::Source;
    use sink_runtime::{CheckpointConfig, Job, SequenceSource};
    use sinks_kafka::{KafkaRecord, KafkaSink};
    let topic = unique("source-transactional");
    let sink = KafkaSink::builder(brokers(), &topic)
        .partitions(3)
        .connect()
        .await
        .unwrap();
    let written = Job::builder(
        "kafka-source-test-writer",
        SequenceSource::bounded(1500)
            .paced(5000)
            .map(|id| KafkaRecord::new(id.to_string()).with_key(id.to_string())),
        sink,
    )
    .parallelism(2)
    .checkpoint_storage(MemoryCheckpointStorage::default())
    .checkpointing(CheckpointConfig::every(std::time::Duration::from_millis(
        50,
    )))
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(written.status, JobStatus::Finished);
    let store = MemoryStore::new();
    let job = start(
        &topic,
        &unique("g"),
        true,
        2,
        &store,
        &MemoryCheckpointStorage::default(),
    )
    .await;
    let report = tokio::time::timeout(std::time::Duration::from_secs(60), job.join())
        .await
        .expect("the bounded read ends")
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(committed(&store), (0..1500).collect::<Vec<_>>());
}

/// A bounded run whose input the destination already holds to its end
/// ends without waiting for the group. Here a member that joined and never
/// answers again keeps every rebalance waiting for its rebalance timeout
/// (five minutes); the run ends long before, its members gone from the
/// group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_run_with_nothing_left_to_read_ends_without_waiting_for_a_stuck_rebalance() {
    let (topic, group) = (unique("source-stuck"), unique("g"));
    fill(&topic, 2, 0, 500).await;
    let store = MemoryStore::new();
    let first = start_fresh(&topic, &group, true, 2, &store).await;
    assert_eq!(first.join().await.unwrap().status, JobStatus::Finished);
    join_and_go_silent(&group, std::time::Duration::from_secs(300)).await;
    let again = start_fresh(&topic, &group, true, 2, &store).await;
    let report = tokio::time::timeout(std::time::Duration::from_secs(60), again.join())
        .await
        .expect("the run waited on the group for over a minute with nothing left to read")
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(committed(&store), (0..500).collect::<Vec<_>>());
}

/// A group that never settles (a member that joined and never syncs or
/// rejoins holds every rebalance) fails the job within the bound, naming
/// the group, its state, its members and what to do: it never hangs, and
/// nothing is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_never_settles_fails_the_job_within_the_bound_naming_its_state_and_members() {
    use std::time::Duration;
    let group = unique("g");
    join_and_go_silent(&group, Duration::from_secs(300)).await;
    let (error, _, _) = fails_on_a_group_that_never_settles(&brokers(), &group, |builder| {
        builder
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(10))
            .group_wait_timeout(Duration::from_secs(12))
    })
    .await;
    for part in [
        format!("the consumer group {group} did not deal this member its partitions within"),
        "silent-member".to_string(),
        "Rebalance".to_string(),
        "removeMembersFromConsumerGroup".to_string(),
    ] {
        assert!(error.contains(&part), "{part:?} not in: {error}");
    }
}

/// A job reading a topic of 100 records in `group` through `brokers`, its
/// source as `configure` makes it: its error, how long it ran, and how
/// long its members waited on the group by its metrics. It must fail
/// within 60 s (the bounds the tests set, and one `JoinGroup` answered
/// late, are well within it), not hang, and commit nothing.
async fn fails_on_a_group_that_never_settles(
    brokers: &str,
    group: &str,
    configure: impl FnOnce(sources_kafka::KafkaSourceBuilder) -> sources_kafka::KafkaSourceBuilder,
) -> (String, std::time::Duration, std::time::Duration) {
    use std::time::{Duration, Instant};

    use sink_runtime::source::Source;
    use sink_runtime::{CheckpointConfig, Job};
    use sinks_memory::MemorySink;
    use sources_kafka::KafkaSource;
    let topic = unique("source-never-settles");
    fill(&topic, 2, 0, 100).await;
    let builder = configure(KafkaSource::builder(brokers, &topic, group));
    let source = builder.build().await.unwrap().map(id);
    let store = MemoryStore::new();
    let started = Instant::now();
    let job = Job::builder(
        "kafka-source-never-settles",
        source,
        MemorySink::new(store.clone()),
    )
    .checkpoint_storage(MemoryCheckpointStorage::default())
    .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
    .build()
    .unwrap()
    .start();
    while !job.is_finished() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the job hung on a group that never settles"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ran = started.elapsed();
    let waited = KafkaSource::group_wait(&job.metrics());
    let error = job
        .join()
        .await
        .expect_err("the job cannot run without partitions")
        .to_string();
    println!("after {ran:?}, {waited:?} of it waiting on the group: {error}");
    assert!(store.committed().is_empty());
    (error, ran, waited)
}

/// A 6 s session and a 2 s rebalance timeout: the bound derived from them
/// is 10 s.
fn short_group_timeouts(
    builder: sources_kafka::KafkaSourceBuilder,
) -> sources_kafka::KafkaSourceBuilder {
    use std::time::Duration;
    builder
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(2))
}

/// Joining is bounded: a coordinator that answers every `JoinGroup`
/// "rebalance in progress" fails the job past the group-wait bound (8 s
/// here), naming the group and what to do; the job's metrics count the
/// wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_group_that_answers_rebalance_in_progress_for_ever_fails_within_the_bound() {
    use sink_kafka_client::proxy::GroupFault;
    use std::time::Duration;
    let proxy = group_fault_proxy(GroupFault::JoinRebalancing).await;
    let bound = Duration::from_secs(8);
    let (error, ran, waited) =
        fails_on_a_group_that_never_settles(proxy.address(), &unique("g"), |builder| {
            short_group_timeouts(builder).group_wait_timeout(bound)
        })
        .await;
    assert!(
        error.contains("did not deal this member its partitions within"),
        "{error}"
    );
    assert!(error.contains("removeMembersFromConsumerGroup"), "{error}");
    assert!(
        ran >= bound && ran < bound + Duration::from_secs(15),
        "{ran:?}"
    );
    assert!(
        waited >= bound - Duration::from_millis(100) && waited <= ran,
        "{waited:?}"
    );
}

/// Syncing is bounded: `JoinGroup` goes to the broker, every `SyncGroup`
/// is answered "rebalance in progress"; the bound here is the default one,
/// derived from the group's timeouts (twice the rebalance timeout plus the
/// session timeout: 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncing_with_a_group_that_answers_rebalance_in_progress_for_ever_fails_within_the_derived_bound(
) {
    use sink_kafka_client::proxy::GroupFault;
    use std::time::Duration;
    let proxy = group_fault_proxy(GroupFault::SyncRebalancing).await;
    let bound = Duration::from_secs(10);
    let (error, ran, waited) =
        fails_on_a_group_that_never_settles(proxy.address(), &unique("g"), short_group_timeouts)
            .await;
    assert!(
        error.contains("did not deal this member its partitions within 10s"),
        "{error}"
    );
    assert!(
        ran >= bound && ran < bound + Duration::from_secs(15),
        "{ran:?}"
    );
    assert!(waited >= bound - Duration::from_millis(100), "{waited:?}");
}

/// Waiting for an assignment is bounded: a bounded member that every
/// generation deals nothing (`SyncGroup` answered with an empty
/// assignment, every `Heartbeat` "rebalance in progress") fails past the
/// derived bound (10 s), naming each partition no member reads; the
/// assignments never start its clock over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_member_dealt_nothing_in_every_generation_fails_within_the_derived_bound() {
    use sink_kafka_client::proxy::GroupFault;
    use std::time::Duration;
    let proxy = group_fault_proxy(GroupFault::NothingDealt).await;
    let bound = Duration::from_secs(10);
    let (error, ran, _) =
        fails_on_a_group_that_never_settles(proxy.address(), &unique("g"), |builder| {
            short_group_timeouts(builder).bounded()
        })
        .await;
    for part in [
        "cannot end: for 10s no member of the group",
        "partition 0 (the destination holds none of its",
        "partition 1 (the destination holds none of its",
    ] {
        assert!(error.contains(part), "{part:?} not in: {error}");
    }
    assert!(
        ran >= bound && ran < bound + Duration::from_secs(15),
        "{ran:?}"
    );
}
