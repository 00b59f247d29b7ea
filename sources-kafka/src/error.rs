//! Why the source cannot start or go on, each naming the fix or the choice.

use sink_kafka_client::kafka_protocol::error::ResponseError;
use sink_kafka_client::WireError;

/// A failure of the Kafka source.
///
/// Returned by [`KafkaSourceBuilder::build`](crate::KafkaSourceBuilder::build)
/// and, as a `SourceError`'s message, by the readers; the job fails with
/// it. Each permanent one names what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaSourceError {
    /// The cluster could not be reached or answered an error.
    #[error("Kafka at {brokers}: {source}")]
    Wire {
        /// The bootstrap list.
        brokers: String,
        /// The client's error.
        #[source]
        source: WireError,
    },
    /// The topic does not exist.
    #[error(
        "the topic {topic} does not exist on {brokers}: create it, or check --topic and --brokers"
    )]
    NoTopic {
        /// The topic.
        topic: String,
        /// The bootstrap list.
        brokers: String,
    },
    /// A setting out of its range.
    #[error("{0}")]
    Setting(String),
    /// The destination's position of a partition is before the first
    /// offset the partition still holds: records were deleted (retention)
    /// before the job read them.
    #[error(
        "partition {partition} of {topic}: the destination's data ends at offset {committed}, but \
         the partition starts at {log_start} now: the records in between were deleted (by \
         retention) before the group read them. Nothing was skipped: to go on from {log_start} and \
         accept that those {} records are lost, build the source with \
         KafkaSourceBuilder::skip_deleted_records (the demos' --skip-deleted-records)",
        log_start - committed
    )]
    RecordsDeleted {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// Where the destination's data of it ends.
        committed: i64,
        /// The partition's first offset now.
        log_start: i64,
    },
    /// The destination holds positions of a topic of the same name but
    /// another topic id: the topic was deleted and created again.
    #[error(
        "the topic {topic} was deleted and created again (its id is {now}, but the destination \
         holds the group's positions of id {before}): its offsets start over, so the positions \
         mean nothing for it. Nothing was read: to read the new topic from its start, build the \
         source with KafkaSourceBuilder::read_recreated_topic_from_start (the demos' \
         --recreated-topic-from-start), or use another group"
    )]
    TopicRecreated {
        /// The topic.
        topic: String,
        /// The id the destination's positions are of.
        before: String,
        /// The topic's id now.
        now: String,
    },
    /// The destination's position of a partition is past its end: the
    /// topic was deleted and created again (on a broker that gives no
    /// topic ids), or the destination holds positions of another input
    /// under this group.
    #[error(
        "partition {partition} of {topic}: the destination's data ends at offset {committed}, \
         past the partition's end {end}: the topic was deleted and created again, or the \
         destination holds positions of another input under the group {group}. Nothing was \
         read: to read the topic from its start, build the source with \
         KafkaSourceBuilder::read_recreated_topic_from_start (the demos' \
         --recreated-topic-from-start), or use another group"
    )]
    PastTheEnd {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// The partition.
        partition: i32,
        /// Where the destination's data of it ends.
        committed: i64,
        /// The partition's end now.
        end: i64,
    },
    /// Bounded: partitions of the input stayed unread, none of them moving
    /// in the destination, for the whole bound while this member waited
    /// with its own partitions read: the group deals them to no member
    /// that reads them.
    #[error(
        "the bounded read of {topic} cannot end: for {waited:?} no member of the group {group} \
         moved {partitions}, though the group dealt again or was asked to. Nothing \
         was lost and the run did not end short: look for members of the group that are not \
         this job's (kafka-consumer-groups --describe --group {group}), or stuck; run the job \
         again (it resumes from the destination), or raise \
         KafkaSourceBuilder::unread_partition_timeout if another instance of the group commits \
         less often than that"
    )]
    Unread {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// How long nothing moved.
        waited: std::time::Duration,
        /// Each partition unread, and where the destination holds it.
        partitions: String,
    },
    /// The group did not deal this member its partitions within the
    /// bound ([`KafkaSourceBuilder::group_wait_timeout`](crate::KafkaSourceBuilder::group_wait_timeout)):
    /// a rebalance waits for members that do not rejoin.
    #[error(
        "the consumer group {group} did not deal this member its partitions within {waited:.0?} \
         (KafkaSourceBuilder::group_wait_timeout, the demos' --group-wait-timeout): {seen}. A \
         rebalance waits for every member to rejoin; a member that is gone holds it until its \
         session times out (a static member of a lost host too), and some brokers keep such \
         members for ever. Nothing was read or lost. Wait out the session timeout of members \
         that left, remove the static members that are gone (Kafka's Admin API \
         removeMembersFromConsumerGroup: a LeaveGroup with their group.instance.id), or give \
         the job another group; raise the bound if the group is only slow"
    )]
    Unsettled {
        /// The group.
        group: String,
        /// How long this member waited.
        waited: std::time::Duration,
        /// What the coordinator said of the group last: its state, members
        /// and leader.
        seen: String,
    },
    /// The group could not be joined or left.
    #[error("the consumer group {group}: {message}")]
    Group {
        /// The group.
        group: String,
        /// What happened.
        message: String,
    },
}

impl KafkaSourceError {
    /// Whether no restart gets past it: every refusal of the source's own
    /// (they name what to change), a fetched batch that cannot be decoded,
    /// and the broker's refusals that retrying cannot change (the client
    /// not allowed, a codec or version it does not speak). The broker not
    /// answering, or answering an error Kafka marks retriable, is not.
    pub fn is_permanent(&self) -> bool {
        match self {
            KafkaSourceError::Wire { source, .. } => match source {
                WireError::Protocol(_) | WireError::Unsupported { .. } => true,
                WireError::Broker { code, .. } => matches!(
                    code,
                    ResponseError::TopicAuthorizationFailed
                        | ResponseError::GroupAuthorizationFailed
                        | ResponseError::ClusterAuthorizationFailed
                        | ResponseError::SaslAuthenticationFailed
                        | ResponseError::UnsupportedCompressionType
                        | ResponseError::UnsupportedVersion
                        | ResponseError::InvalidSessionTimeout
                        | ResponseError::InconsistentGroupProtocol
                        | ResponseError::GroupMaxSizeReached
                ),
                _ => false,
            },
            KafkaSourceError::Group { .. } => false,
            _ => true,
        }
    }

    pub(crate) fn wire(brokers: &str) -> impl FnOnce(WireError) -> KafkaSourceError + '_ {
        move |source| KafkaSourceError::Wire {
            brokers: brokers.to_string(),
            source,
        }
    }
}
