//! The client's failures as the runtime sees them: transient (a restart
//! from the last checkpoint may help) or permanent (someone must change
//! something), each with what to do.

use kafka_protocol::error::ResponseError;
use sink_api::SinkError;

use sink_kafka_client::WireError;

/// Why [`KafkaSinkBuilder::connect`](crate::KafkaSinkBuilder::connect) refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A setting out of its range.
    #[error("{0}")]
    Setting(String),
    /// The cluster could not be reached, or answered with an error.
    #[error("the Kafka cluster at {brokers}: {source}")]
    Cluster {
        /// The bootstrap brokers.
        brokers: String,
        /// Why.
        #[source]
        source: WireError,
    },
    /// The topic is missing and could not be created.
    #[error(
        "the topic {topic} does not exist and cannot be created with {partitions} partitions \
         (create it yourself, or give the sink's principal the CREATE ACL, or fix the partitions \
         and replication factor): {source}"
    )]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The partitions asked for.
        partitions: i32,
        /// The broker's refusal.
        #[source]
        source: WireError,
    },
}

/// `error`, while doing `doing`, as a [`SinkError`] of the right class,
/// with the fix named where there is one.
pub(crate) fn sink_error(doing: impl Into<String>, error: WireError) -> SinkError {
    let doing = doing.into();
    let Some(code) = error.code() else {
        return match error {
            WireError::Unsupported { .. } | WireError::Encode { .. } => {
                SinkError::other(doing, error).permanent()
            }
            _ if error.is_retriable() => SinkError::other(
                format!("{doing} (the broker is down or unreachable: a transient error, which a job with a restart strategy retries from its last checkpoint)"),
                error,
            ),
            _ => SinkError::other(doing, error),
        };
    };
    let (fix, permanent) = match code {
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => (
            "a batch is larger than the broker or the topic takes (message.max.bytes, the topic's \
             max.message.bytes): raise them, or lower KafkaSinkBuilder::batch_bytes and \
             KafkaSinkBuilder::max_record_bytes",
            true,
        ),
        ResponseError::InvalidTransactionTimeout => (
            "the transaction timeout is longer than the broker's transaction.max.timeout.ms: \
             raise that, or lower KafkaSinkBuilder::transaction_timeout",
            true,
        ),
        ResponseError::TransactionalIdAuthorizationFailed
        | ResponseError::GroupAuthorizationFailed
        | ResponseError::TopicAuthorizationFailed
        | ResponseError::ClusterAuthorizationFailed => (
            "the sink's principal lacks an ACL: WRITE and DESCRIBE on the transactional ids and \
             READ on the groups of the sink's prefix, WRITE and DESCRIBE on the topic \
             (docs/kafka.md)",
            true,
        ),
        ResponseError::InvalidRecord
        | ResponseError::InvalidTimestamp
        | ResponseError::PolicyViolation
        | ResponseError::UnsupportedVersion
        | ResponseError::UnsupportedForMessageFormat => (
            "the broker refuses these records or this request as they are (a record without a \
             key on a compacted topic, a timestamp out of the topic's range, a policy): writing \
             them again cannot help",
            true,
        ),
        ResponseError::UnknownTopicOrPartition => (
            "the topic or partition does not exist (deleted while the job runs?)",
            false,
        ),
        ResponseError::InvalidRequiredAcks | ResponseError::NotEnoughReplicas => (
            "fewer in-sync replicas than the topic's min.insync.replicas",
            false,
        ),
        // Anything else fails this transaction only: the restart aborts it
        // and writes its records again; the restart strategy bounds how
        // often.
        _ => ("", false),
    };
    let context = if fix.is_empty() {
        doing
    } else {
        format!("{doing}: {fix}")
    };
    let sink_error = SinkError::other(context, error);
    if permanent {
        sink_error.permanent()
    } else {
        sink_error
    }
}
