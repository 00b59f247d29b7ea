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
