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

/// Joins `group` as a static member of the "consumer" protocol and never
/// answers again (no SyncGroup, no heartbeat, no rejoin) for
/// `rebalance_timeout`: every rebalance of the group meanwhile waits for
/// it.
pub async fn join_and_go_silent(group: &str, rebalance_timeout: Duration) {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest};
    use kafka_protocol::protocol::StrBytes;
    use sink_kafka_client::{Brokers, CoordinatorKind};
    let cluster = Brokers::from(brokers().as_str()).cluster("silent-member");
    let link = cluster
        .coordinator(CoordinatorKind::Group, group)
        .await
        .unwrap();
    let mut member_id = String::new();
    for _ in 0..2 {
        let ms = i32::try_from(rebalance_timeout.as_millis()).unwrap();
        let request = JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_session_timeout_ms(ms)
            .with_rebalance_timeout_ms(ms)
            .with_member_id(StrBytes::from_string(member_id.clone()))
            .with_group_instance_id(Some(StrBytes::from_static_str("silent-member")))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Default::default())]);
        let answer = cluster.call(&link, &request).await.unwrap();
        member_id = answer.member_id.to_string();
        if answer.error_code == 0 {
            return;
        }
    }
    panic!("the silent member could not join {group}");
}

/// A proxy in front of the broker that plays a consumer group that never
/// settles (`fault`) and forwards everything else; the source reaches the
/// broker through [`address`](sink_kafka_client::proxy::AuthProxy::address).
pub async fn group_fault_proxy(
    fault: sink_kafka_client::proxy::GroupFault,
) -> sink_kafka_client::proxy::AuthProxy {
    let upstream = brokers().split(',').next().unwrap_or_default().to_string();
    sink_kafka_client::proxy::AuthProxy::start(sink_kafka_client::proxy::ProxyConfig {
        upstream,
        tls: None,
        client_ca: None,
        sasl: None,
        not_leader_produces: 0,
        group_fault: Some(fault),
    })
    .await
    .expect("the proxy starts")
}
