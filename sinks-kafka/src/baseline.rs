//! A plain idempotent producer, without transactions: what the sink's
//! throughput is measured against (`kafka-sink-demo --baseline`, the
//! benchmark). Same client, same batching and pipelining as the sink's
//! writers; no transaction, no commit marker, no runtime. The ratio of the
//! two is what exactly-once costs.

use std::sync::Arc;

use kafka_protocol::messages::{InitProducerIdRequest, ProducerId};

use crate::batcher::Batcher;
use crate::errors::ConnectError;
use crate::record::KafkaRecord;
use crate::session::Session;
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{Brokers, WireError};

/// A producer with a producer id (Kafka's idempotence: no duplicate from a
/// retried batch) and no transactions, writing to one topic.
///
/// Made by [`IdempotentProducer::connect`]; called by benchmarks and demos
/// as the baseline the sink is compared with.
#[derive(Debug)]
pub struct IdempotentProducer {
    session: Session,
    batcher: Batcher,
    leaders: Vec<i32>,
    topic: String,
}

impl IdempotentProducer {
    /// Reaches the cluster through `brokers`, creates `topic` with
    /// `partitions` partitions if it is missing, and takes a producer id.
    pub async fn connect(
        brokers: impl Into<Brokers>,
        topic: &str,
        partitions: u32,
    ) -> Result<IdempotentProducer, ConnectError> {
        let brokers: Brokers = brokers.into();
        let cluster = Arc::new(brokers.cluster("eo-kafka-baseline"));
        let failed = |source| ConnectError::Cluster {
            brokers: brokers.to_string(),
            source,
        };
        let partitions = i32::try_from(partitions).unwrap_or(i32::MAX);
        let (described, _) = Topic::describe_or_create(&cluster, topic, partitions, -1)
            .await
            .map_err(failed)?;
        let link = cluster.any().await.map_err(failed)?;
        let answer = cluster
            .call(
                &link,
                &InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_transaction_timeout_ms(-1)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
            .await
            .map_err(failed)?;
        WireError::check(
            "InitProducerId",
            || "an idempotent producer".into(),
            answer.error_code,
        )
        .map_err(failed)?;
        let leaders = described.leaders;
        Ok(IdempotentProducer {
            batcher: Batcher::new(leaders.len(), 0, 256 << 10, 1 << 20),
            session: Session::new(
                cluster,
                topic.into(),
                None,
                answer.producer_id.0,
                answer.producer_epoch,
            ),
            leaders,
            topic: topic.to_string(),
        })
    }

    /// Sends `records` (batches go out as they fill).
    pub async fn send_batch(&mut self, records: Vec<KafkaRecord>) -> Result<(), WireError> {
        let now = Batcher::now_ms();
        for record in records {
            match self.batcher.push(record, now) {
                Ok(None) => {}
                Ok(Some(full)) => self.send(full).await?,
                Err(refused) => {
                    return Err(WireError::Protocol(refused.message(&self.topic, "1 MiB")))
                }
            }
        }
        Ok(())
    }

    async fn send(&mut self, partition: usize) -> Result<(), WireError> {
        let records = self.batcher.take(partition);
        let leader = self.leaders[partition];
        self.session.send(partition as i32, leader, records).await
    }

    /// Sends what waits and returns once every record is written.
    pub async fn flush(&mut self) -> Result<(), WireError> {
        for partition in 0..self.batcher.partitions() {
            self.send(partition).await?;
        }
        self.session.flush().await
    }
}
