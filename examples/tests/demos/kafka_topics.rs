//! What the demo tests against the test broker share: its address, unique
//! names, an input topic filled with values, and child processes killed
//! with SIGKILL.

use std::process::{Child, Command, Stdio};

/// The test broker (`scripts/with-kafka` sets it).
pub fn brokers() -> String {
    std::env::var("KAFKA_TEST_BROKERS").unwrap_or_else(|_| {
        panic!("KAFKA_TEST_BROKERS is not set: run through scripts/with-kafka (./scripts/test-all does)")
    })
}

/// `what`, made unique to this run.
pub fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{what}-{}-{nanos}", std::process::id())
}

/// Writes the values `v<id>` for ids `from..to` into `topic` (created with
/// `partitions` partitions), keyed by id.
pub fn fill(topic: &str, partitions: u32, from: u64, to: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut producer = sinks_kafka::IdempotentProducer::connect(&brokers(), topic, partitions)
            .await
            .unwrap();
        let records: Vec<sinks_kafka::KafkaRecord> = (from..to)
            .map(|id| sinks_kafka::KafkaRecord::new(format!("v{id}")).with_key(id.to_string()))
            .collect();
        for chunk in records.chunks(2000) {
            producer.send_batch(chunk.to_vec()).await.unwrap();
        }
        producer.flush().await.unwrap();
    });
}

/// The id of a value `v<id>`.
pub fn value_id(value: &str) -> u64 {
    value
        .strip_prefix('v')
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("not a value of the input topic: {value:?}"))
}

/// Starts `command`, its output dropped.
pub fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// SIGKILL, and the wait for it.
pub fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}
