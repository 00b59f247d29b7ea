//! What the tests share: the broker, fresh names, a topic filled with
//! records that carry their id, and jobs reading it into the memory sink.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobHandle, MemoryCheckpointStorage};
use sinks_kafka::{IdempotentProducer, KafkaRecord};
use sinks_memory::{MemorySink, MemoryStore};
use sources_kafka::{KafkaMessage, KafkaSource};

/// The tests' broker. Never skipped.
pub fn brokers() -> String {
    std::env::var("KAFKA_TEST_BROKERS").unwrap_or_else(|_| {
        panic!(
            "KAFKA_TEST_BROKERS is not set: run these tests through scripts/with-kafka \
             (./scripts/test-all does), which starts a throwaway broker"
        )
    })
}

/// A name no other test of any run on this broker uses.
pub fn unique(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{what}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates `topic` with `partitions` partitions and writes the ids
/// `from..to` into it (keyed by id, so spread over the partitions).
pub async fn fill(topic: &str, partitions: u32, from: u64, to: u64) {
    let mut producer = IdempotentProducer::connect(&brokers(), topic, partitions)
        .await
        .unwrap_or_else(|e| panic!("connecting a producer: {e}"));
    let records: Vec<KafkaRecord> = (from..to)
        .map(|id| KafkaRecord::new(id.to_string()).with_key(id.to_string()))
        .collect();
    for chunk in records.chunks(1000) {
        producer.send_batch(chunk.to_vec()).await.unwrap();
    }
    producer.flush().await.unwrap();
}

/// The id a message carries.
pub fn id(message: KafkaMessage) -> u64 {
    std::str::from_utf8(message.value_bytes())
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("not an id: {message:?}"))
}

/// Starts a job reading `topic` as a member of `group` into `store`, with
/// `parallelism` subtasks, checkpoints every 50 ms.
pub async fn start(
    topic: &str,
    group: &str,
    bounded: bool,
    parallelism: usize,
    store: &MemoryStore<u64>,
    storage: &MemoryCheckpointStorage,
) -> JobHandle {
    let mut builder = KafkaSource::builder(brokers(), topic, group)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(10))
        .metadata_refresh(Duration::from_millis(500));
    if bounded {
        builder = builder.bounded();
    }
    let source = builder.build().await.unwrap().map(id);
    Job::builder("kafka-source-test", source, MemorySink::new(store.clone()))
        .parallelism(parallelism)
        .checkpoint_storage(storage.clone())
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .unwrap()
        .start()
}

/// The ids committed to `store`, sorted, duplicates kept.
pub fn committed(store: &MemoryStore<u64>) -> Vec<u64> {
    let violations = store.violations();
    assert!(violations.is_empty(), "{violations:?}");
    let mut ids = store.committed();
    ids.sort_unstable();
    ids
}

/// Waits until `store` holds at least `count` committed records.
pub async fn until_committed(store: &MemoryStore<u64>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.committed().len() < count {
        assert!(
            Instant::now() < deadline,
            "{} committed after 60 s",
            store.committed().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`start`] on checkpoint storage of its own: another instance of the
/// group, or the same job started on fresh state.
pub async fn start_fresh(
    topic: &str,
    group: &str,
    bounded: bool,
    parallelism: usize,
    store: &MemoryStore<u64>,
) -> JobHandle {
    start(
        topic,
        group,
        bounded,
        parallelism,
        store,
        &MemoryCheckpointStorage::default(),
    )
    .await
}
