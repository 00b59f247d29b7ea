//! The Kafka sink certified exactly-once by the conformance kit, against
//! the test broker: every property, each scenario a topic and a
//! transactional id prefix of its own.

use sink_api::async_trait;
use sink_testkit::{certify, Destination, HandOverSource, HAND_OVER_PARTITIONS};
use sinks_kafka::{open_transactions, KafkaSink};

use crate::common::{brokers, committed_ids, record, unique};

struct Topic {
    name: String,
}

#[async_trait]
impl Destination for Topic {
    type Sink = KafkaSink;

    async fn sink(&self) -> KafkaSink {
        KafkaSink::builder(brokers(), &self.name)
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
        let open = open_transactions(&brokers(), &format!("{}.", self.name))
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
        KafkaSink::builder(brokers(), &input)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_sink_is_certified() {
    let report = certify(
        || async {
            Topic {
                name: unique("certified"),
            }
        },
        record,
    )
    .await;
    println!(
        "kafka sink, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    // One transaction per checkpoint and subtask: a commit call holds one
    // request, and no batch can be half-applied.
    report
        .allow_unchecked([
            "unknown-outcome/middle-of-batch",
            "unknown-outcome/last-of-batch",
        ])
        .assert_passed();
}
