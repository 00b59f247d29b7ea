//! What operators (and the tests standing in for them) do to a topic
//! while jobs read it: delete its oldest records, add partitions.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::{CreatePartitionsRequest, DeleteRecordsRequest, TopicName};

use crate::topic::Topic;
use crate::{millis, str_bytes, Brokers, Cluster, WireError};

fn admin(brokers: impl Into<Brokers>) -> Cluster {
    brokers.into().cluster("eo-kafka-admin")
}

/// Deletes the records of `partition` of `topic` before `offset`, as
/// retention does; the partition then starts at `offset`. Called by tests
/// of readers that find records gone.
pub async fn delete_records_before(
    brokers: impl Into<Brokers>,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<(), WireError> {
    let cluster = admin(brokers);
    let described = Topic::describe(&cluster, topic)
        .await?
        .ok_or_else(|| WireError::Protocol(format!("no topic {topic}")))?;
    let leader = usize::try_from(partition)
        .ok()
        .and_then(|p| described.leaders.get(p).copied())
        .ok_or_else(|| WireError::Protocol(format!("{topic} has no partition {partition}")))?;
    let link = cluster.broker(leader).await?;
    let request = DeleteRecordsRequest::default()
        .with_timeout_ms(millis(cluster.config.request_timeout))
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(TopicName(str_bytes(topic)))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(partition)
                .with_offset(offset)])]);
    let answer = cluster.call(&link, &request).await?;
    for result in answer.topics.iter().flat_map(|t| t.partitions.iter()) {
        WireError::check(
            "DeleteRecords",
            || format!("{topic}/{partition}"),
            result.error_code,
        )?;
    }
    Ok(())
}

/// Grows `topic` to `count` partitions. Called by tests of readers that
/// meet partitions added while they run.
pub async fn add_partitions(
    brokers: impl Into<Brokers>,
    topic: &str,
    count: i32,
) -> Result<(), WireError> {
    let cluster = admin(brokers);
    let request = CreatePartitionsRequest::default()
        .with_timeout_ms(millis(cluster.config.request_timeout))
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(TopicName(str_bytes(topic)))
            .with_count(count)]);
    let link = cluster.any().await?;
    let answer = cluster.call(&link, &request).await?;
    for result in &answer.results {
        match ResponseError::try_from_code(result.error_code) {
            None => {}
            Some(code) => {
                return Err(WireError::Broker {
                    api: "CreatePartitions",
                    subject: format!("topic {topic}"),
                    code,
                    message: result.error_message.as_ref().map(|m| m.to_string()),
                })
            }
        }
    }
    Ok(())
}
