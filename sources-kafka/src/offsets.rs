//! Where partitions start and end now: `ListOffsets`, sent to each
//! partition's leader.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{millis, str_bytes, Cluster, WireError};

/// Which offset of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Edge {
    /// The first offset it still holds (the log start offset).
    Start,
    /// The end a `read_committed` consumer reads up to: the last stable
    /// offset.
    StableEnd,
}

/// The offset at `edge` of each of `partitions` of `topic`, asking each
/// partition's leader as `described` names it.
pub(crate) async fn offsets(
    cluster: &Cluster,
    topic: &str,
    described: &Topic,
    partitions: &[i32],
    edge: Edge,
) -> Result<BTreeMap<i32, i64>, WireError> {
    let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for partition in partitions {
        let leader = usize::try_from(*partition)
            .ok()
            .and_then(|p| described.leaders.get(p))
            .ok_or_else(|| WireError::Protocol(format!("{topic} has no partition {partition}")))?;
        by_leader.entry(*leader).or_default().push(*partition);
    }
    let timestamp = match edge {
        Edge::Start => -2,
        Edge::StableEnd => -1,
    };
    let mut found = BTreeMap::new();
    for (leader, partitions) in by_leader {
        let link = cluster.broker(leader).await?;
        let request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(1)
            .with_timeout_ms(millis(cluster.config.request_timeout))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|p| {
                            ListOffsetsPartition::default()
                                .with_partition_index(*p)
                                .with_current_leader_epoch(-1)
                                .with_timestamp(timestamp)
                        })
                        .collect(),
                )]);
        let answer = cluster.call(&link, &request).await?;
        for answered in answer.topics.iter().flat_map(|t| t.partitions.iter()) {
            if let Some(code) = ResponseError::try_from_code(answered.error_code) {
                return Err(WireError::Broker {
                    api: "ListOffsets",
                    subject: format!("{topic}/{}", answered.partition_index),
                    code,
                    message: None,
                });
            }
            found.insert(answered.partition_index, answered.offset);
        }
        if let Some(missing) = partitions.iter().find(|p| !found.contains_key(p)) {
            return Err(WireError::Protocol(format!(
                "ListOffsets of {topic}/{missing} answered nothing"
            )));
        }
    }
    Ok(found)
}
