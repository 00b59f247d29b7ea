//! A topic: its partitions and their leaders, its creation when missing,
//! its deletion.

use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{CreateTopicsRequest, DeleteTopicsRequest, TopicName};

use crate::{millis, str_bytes, Brokers, Cluster, WireError};

/// Deletes `topic` on the cluster reached through `brokers`, and waits
/// until the cluster no longer knows it; `false` if it did not exist.
/// Called by demos that start over (`--fresh`); every record of the topic
/// is gone, committed or not.
pub async fn delete_topic(brokers: impl Into<Brokers>, topic: &str) -> Result<bool, WireError> {
    let cluster = brokers.into().cluster("eo-kafka-admin");
    let request = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(str_bytes(topic))])
        .with_timeout_ms(millis(cluster.config.request_timeout));
    let link = cluster.any().await?;
    let answer = cluster.call(&link, &request).await?;
    for result in &answer.responses {
        match ResponseError::try_from_code(result.error_code) {
            None => {}
            Some(ResponseError::UnknownTopicOrPartition) => return Ok(false),
            Some(code) => {
                return Err(WireError::Broker {
                    api: "DeleteTopics",
                    subject: format!("topic {topic}"),
                    code,
                    message: result.error_message.as_ref().map(|m| m.to_string()),
                })
            }
        }
    }
    let deadline = Instant::now() + cluster.config.request_timeout;
    while Topic::describe(&cluster, topic).await?.is_some() {
        if Instant::now() >= deadline {
            return Err(WireError::Protocol(format!(
                "the topic {topic} still exists {:?} after its deletion",
                cluster.config.request_timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(true)
}

/// A topic as the last metadata described it.
#[derive(Debug, Clone)]
pub struct Topic {
    /// The leader of each partition, by index.
    pub leaders: Vec<i32>,
    /// Its topic id, which a topic deleted and created again under the
    /// same name does not keep; `None` when the broker gives none.
    pub id: Option<String>,
}

/// What became of the topic at the sink's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// It was there.
    Existing,
    /// It was created now.
    Created,
}

impl Topic {
    /// The partitions of `name` and their leaders; `None` when the topic
    /// does not exist. Waits (up to the request timeout) for partitions
    /// that have no leader yet (a topic just created).
    pub async fn describe(cluster: &Cluster, name: &str) -> Result<Option<Topic>, WireError> {
        let deadline = Instant::now() + cluster.config.request_timeout;
        loop {
            let answer = cluster.metadata(&[name]).await?;
            let Some(topic) = answer
                .topics
                .iter()
                .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name))
            else {
                return Err(WireError::Protocol(format!(
                    "the cluster's metadata does not mention the topic {name}"
                )));
            };
            match ResponseError::try_from_code(topic.error_code) {
                Some(ResponseError::UnknownTopicOrPartition) => return Ok(None),
                Some(ResponseError::LeaderNotAvailable) if Instant::now() < deadline => {}
                Some(code) => {
                    return Err(WireError::Broker {
                        api: "Metadata",
                        subject: format!("topic {name}"),
                        code,
                        message: None,
                    })
                }
                None => {
                    let mut partitions: Vec<(i32, i32)> = topic
                        .partitions
                        .iter()
                        .map(|p| (p.partition_index, p.leader_id.0))
                        .collect();
                    partitions.sort_unstable();
                    let complete = !partitions.is_empty()
                        && partitions
                            .iter()
                            .enumerate()
                            .all(|(i, (index, leader))| *index == i as i32 && *leader >= 0);
                    if complete {
                        let id = (!topic.topic_id.is_nil()).then(|| topic.topic_id.to_string());
                        return Ok(Some(Topic {
                            leaders: partitions.into_iter().map(|(_, l)| l).collect(),
                            id,
                        }));
                    }
                    if Instant::now() >= deadline {
                        return Err(WireError::Protocol(format!(
                            "the topic {name} has partitions without a leader"
                        )));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The topic `name`, created with `partitions` partitions of
    /// `replication` replicas if it does not exist.
    pub async fn describe_or_create(
        cluster: &Cluster,
        name: &str,
        partitions: i32,
        replication: i16,
    ) -> Result<(Topic, Found), WireError> {
        if let Some(topic) = Self::describe(cluster, name).await? {
            return Ok((topic, Found::Existing));
        }
        let request = CreateTopicsRequest::default()
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(str_bytes(name)))
                .with_num_partitions(partitions)
                .with_replication_factor(replication)])
            .with_timeout_ms(millis(cluster.config.request_timeout));
        // Topics are created by the controller; any broker forwards.
        let link = cluster.any().await?;
        let answer = cluster.call(&link, &request).await?;
        for topic in &answer.topics {
            match ResponseError::try_from_code(topic.error_code) {
                None | Some(ResponseError::TopicAlreadyExists) => {}
                Some(code) => {
                    return Err(WireError::Broker {
                        api: "CreateTopics",
                        subject: format!("topic {name}"),
                        code,
                        message: topic.error_message.as_ref().map(|m| m.to_string()),
                    })
                }
            }
        }
        match Self::describe(cluster, name).await? {
            Some(topic) => Ok((topic, Found::Created)),
            None => Err(WireError::Protocol(format!(
                "the topic {name} was created, but the cluster does not know it"
            ))),
        }
    }
}
