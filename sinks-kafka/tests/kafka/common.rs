//! What the tests share: the broker, fresh topics and prefixes, records
//! that carry their id, and the committed ids read back.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use sinks_kafka::{read_committed, KafkaRecord};

/// The tests' broker. Never skipped: without it the tests fail and say how
/// to run them.
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

/// The record of id `id`: its value is the id, its key too.
pub fn record(id: u64) -> KafkaRecord {
    KafkaRecord::new(id.to_string()).with_key(id.to_string())
}

/// The ids a `read_committed` consumer sees in `topic`, duplicates kept.
pub async fn committed_ids(topic: &str) -> Vec<u64> {
    let read = read_committed(&brokers(), topic)
        .await
        .unwrap_or_else(|e| panic!("reading {topic}: {e}"));
    read.messages
        .iter()
        .map(|m| {
            std::str::from_utf8(m.value_bytes())
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("not an id: {:?}", m.value))
        })
        .collect()
}
