//! Faults that lose data silently in other systems, each refused with the
//! choice named: records deleted before the group read them, a topic
//! deleted and created again; and partitions added while a job runs, read
//! from their start.

use std::time::Duration;

use sink_kafka_client::admin::{add_partitions, delete_records_before};
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage};
use sinks_memory::{MemorySink, MemoryStore};
use sources_kafka::KafkaSource;

use crate::common::*;

/// Runs a bounded job of `source` into `store` to its end, its checkpoints
/// in `storage`: a run started again after a refusal keeps its state (and
/// so its lineage and its static members of the group), as a user running
/// the same command again with the choice named does.
async fn run(
    source: KafkaSource,
    store: &MemoryStore<u64>,
    storage: &MemoryCheckpointStorage,
) -> Result<(), String> {
    let report = Job::builder(
        "kafka-source-faults",
        source.map(id),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpoint_storage(storage.clone())
    .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
    .build()
    .unwrap()
    .start()
    .join()
    .await
    .map_err(|e| e.to_string())?;
    assert_eq!(report.status, JobStatus::Finished);
    Ok(())
}

fn bounded(topic: &str, group: &str) -> sources_kafka::KafkaSourceBuilder {
    KafkaSource::builder(brokers(), topic, group)
        .bounded()
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_deleted_before_the_group_read_them_are_refused_and_skipped_only_when_told() {
    let topic = unique("source-deleted");
    let group = unique("g");
    fill(&topic, 1, 0, 100).await;
    let store = MemoryStore::new();
    run(
        bounded(&topic, &group).build().await.unwrap(),
        &store,
        &MemoryCheckpointStorage::default(),
    )
    .await
    .unwrap();
    assert_eq!(committed(&store), (0..100).collect::<Vec<_>>());
    // 100 more; retention deletes the first 40 of them before the group
    // reads them.
    fill(&topic, 1, 100, 200).await;
    delete_records_before(&brokers(), &topic, 0, 140)
        .await
        .unwrap();
    let state = MemoryCheckpointStorage::default();
    let refused = run(
        bounded(&topic, &group).build().await.unwrap(),
        &store,
        &state,
    )
    .await
    .unwrap_err();
    assert!(
        refused.contains("deleted") && refused.contains("skip_deleted_records"),
        "{refused}"
    );
    assert_eq!(committed(&store).len(), 100, "nothing read past the gap");
    let told = bounded(&topic, &group)
        .skip_deleted_records()
        .build()
        .await
        .unwrap();
    run(told, &store, &state).await.unwrap();
    let expected: Vec<u64> = (0..100).chain(140..200).collect();
    assert_eq!(committed(&store), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_created_again_is_refused_and_read_from_its_start_only_when_told() {
    let topic = unique("source-recreated");
    let group = unique("g");
    fill(&topic, 2, 0, 300).await;
    let store = MemoryStore::new();
    run(
        bounded(&topic, &group).build().await.unwrap(),
        &store,
        &MemoryCheckpointStorage::default(),
    )
    .await
    .unwrap();
    sinks_kafka::delete_topic(&brokers(), &topic).await.unwrap();
    fill(&topic, 2, 1000, 1020).await;
    let state = MemoryCheckpointStorage::default();
    let refused = run(
        bounded(&topic, &group).build().await.unwrap(),
        &store,
        &state,
    )
    .await
    .unwrap_err();
    assert!(
        refused.contains("created again") && refused.contains("read_recreated_topic_from_start"),
        "{refused}"
    );
    let told = bounded(&topic, &group)
        .read_recreated_topic_from_start()
        .build()
        .await
        .unwrap();
    run(told, &store, &state).await.unwrap();
    let expected: Vec<u64> = (0..300).chain(1000..1020).collect();
    assert_eq!(committed(&store), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_while_a_job_runs_are_read_from_their_start() {
    let topic = unique("source-grown");
    let group = unique("g");
    fill(&topic, 2, 0, 500).await;
    let store = MemoryStore::new();
    let job = start_fresh(&topic, &group, false, 2, &store).await;
    until_committed(&store, 500).await;
    add_partitions(&brokers(), &topic, 4).await.unwrap();
    // Keyed records now spread over four partitions, two of them new.
    fill(&topic, 4, 500, 1500).await;
    until_committed(&store, 1500).await;
    job.cancel();
    job.join().await.unwrap();
    assert_eq!(committed(&store), (0..1500).collect::<Vec<_>>());
}
