//! What the tests share: the broker, fresh topics and prefixes, records
//! that carry their id, and the committed ids read back.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use sink_api::async_trait;
use sink_testkit::{Destination, HandOverSource, HAND_OVER_PARTITIONS};
use sinks_kafka::{open_transactions, read_committed, Brokers, KafkaRecord, KafkaSink};

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
    let read = match read_committed(&brokers(), topic).await {
        Ok(read) => read,
        Err(e) => {
            // Which transaction holds the reader back (the tests' sinks use
            // the topic's name as their transactional id prefix).
            let open = open_transactions(&brokers(), &format!("{topic}."))
                .await
                .map_or_else(|e| format!("unknown ({e})"), |open| format!("{open:?}"));
            panic!("reading {topic}: {e}; transactions of its prefix open now: {open}")
        }
    };
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

/// A topic of its own for each of the kit's scenarios, reached through
/// `brokers` (plaintext, or through the TLS and SASL proxy), with a
/// transactional id prefix of its own; read back from the test broker.
pub struct Topic {
    pub name: String,
    pub brokers: Brokers,
}

#[async_trait]
impl Destination for Topic {
    type Sink = KafkaSink;

    async fn sink(&self) -> KafkaSink {
        KafkaSink::builder(&self.brokers, &self.name)
            .partitions(3)
            .transactional_id_prefix(&self.name)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connecting the sink to {}: {e}", self.name))
    }

    async fn committed_ids(&self) -> Vec<u64> {
        committed_ids(&self.name).await
    }

    /// The sink's transactions open now (its ids start with the prefix).
    async fn open_transactions(&self) -> Option<usize> {
        let open = open_transactions(&self.brokers, &format!("{}.", self.name))
            .await
            .unwrap_or_else(|e| panic!("listing transactions: {e}"));
        Some(open.len())
    }

    /// The sink keeps a Kafka source's positions only, as its group's
    /// offsets of the topic's partitions: the hand-over source is named as
    /// one, of a topic of its own (made here; only its partitions are
    /// named, nothing is read from it).
    async fn hand_over_source(&self, job: &str) -> HandOverSource {
        let input = format!("{}-input", self.name);
        KafkaSink::builder(&self.brokers, &input)
            .partitions(HAND_OVER_PARTITIONS)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("creating the topic {input}: {e}"));
        HandOverSource {
            scope: format!("kafka/{input}/{job}"),
            split_prefix: "-/".to_string(),
        }
    }
}
