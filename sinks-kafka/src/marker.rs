//! The commit marker: how the committer learns from the cluster whether a
//! transaction committed, never from an `EndTxn` answer alone.
//!
//! Each transaction commits, with its records, an offset in a group of its
//! own (the group is named as the transactional id): partition 0 of the
//! sink's topic, offset = the checkpoint id, metadata = `eo1:<producer
//! id>:<epoch>`. Offsets committed in a transaction (`TxnOffsetCommit`)
//! become visible when, and only when, the transaction commits; so the
//! marker of an id names the last transaction of that id that committed.
//!
//! - Before `EndTxn`, the committer reads the marker as it is (`require_stable`
//!   off: an open transaction's own offsets are not waited for): this
//!   transaction's identity, or a later transaction of the same id, means
//!   it committed already (a replay).
//! - After `EndTxn`, it reads the marker once no transaction of the group
//!   is pending (`require_stable`, where the broker has it): this
//!   transaction's identity means committed, anything else means it was
//!   aborted (a broker-side abort after its timeout, or a newer producer of
//!   the id) and its records are lost: a failure with a known reason.
//!
//! Kafka keeps a group's offsets for `offsets.retention.minutes` (7 days by
//! default) after its last commit: a checkpoint restored after longer than
//! that finds no marker for its oldest transactions, and reports them lost
//! rather than guess (docs/kafka.md).

use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{GroupId, OffsetFetchRequest, TopicName};

use crate::transaction::TransactionIdentity;
use sink_kafka_client::{str_bytes, Cluster, CoordinatorKind, WireError};

/// The last transaction of an id that committed, as its marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    pub(crate) checkpoint: u64,
    pub(crate) producer_id: i64,
    pub(crate) epoch: i16,
}

/// What a marker says of one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It is this transaction's.
    This,
    /// A later transaction of the same id committed: this one was settled
    /// before the slot was used again.
    Later,
    /// Neither: no marker, or an earlier transaction's.
    NotCommitted,
}

impl Marker {
    /// The marker's metadata for `identity`.
    pub(crate) fn metadata(identity: &TransactionIdentity) -> String {
        format!("eo1:{}:{}", identity.producer_id, identity.epoch)
    }

    fn parse(offset: i64, metadata: Option<&str>) -> Option<Marker> {
        let checkpoint = u64::try_from(offset).ok()?;
        let mut parts = metadata?.strip_prefix("eo1:")?.split(':');
        let producer_id = parts.next()?.parse().ok()?;
        let epoch = parts.next()?.parse().ok()?;
        Some(Marker {
            checkpoint,
            producer_id,
            epoch,
        })
    }

    /// What this marker says of the transaction `identity`.
    ///
    /// Each transaction of an id takes a new epoch of its producer id, and
    /// the coordinator hands out a new, larger producer id when an epoch
    /// runs out: a marker of a larger (producer id, epoch) is a later
    /// transaction of the slot. A slot is given back only after its
    /// transaction was found committed (`slots`), so a later committed
    /// transaction proves this one committed. Checkpoint ids are not
    /// compared: they repeat after a restore from an older checkpoint.
    pub(crate) fn verdict(marker: Option<Marker>, identity: &TransactionIdentity) -> Verdict {
        let Some(marker) = marker else {
            return Verdict::NotCommitted;
        };
        if marker.producer_id == identity.producer_id && marker.epoch == identity.epoch {
            return Verdict::This;
        }
        if (marker.producer_id, marker.epoch) > (identity.producer_id, identity.epoch) {
            Verdict::Later
        } else {
            Verdict::NotCommitted
        }
    }
}

/// Reads the marker of transactional id `id` (its group) for `topic`.
/// With `stable`, waits (up to the request timeout) while a transaction
/// of the group is pending, where the broker supports it.
pub(crate) async fn read(
    cluster: &Cluster,
    id: &str,
    topic: &str,
    stable: bool,
) -> Result<Option<Marker>, WireError> {
    let request = OffsetFetchRequest::default()
        .with_group_id(GroupId(str_bytes(id)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(str_bytes(topic)))
            .with_partition_indexes(vec![0])]))
        .with_require_stable(stable);
    let deadline = Instant::now() + cluster.config.request_timeout;
    loop {
        let result = async {
            let link = cluster.coordinator(CoordinatorKind::Group, id).await?;
            let answer = cluster.call(&link, &request).await?;
            WireError::check("OffsetFetch", || format!("group {id}"), answer.error_code)?;
            let mut found = None;
            for t in &answer.topics {
                for p in &t.partitions {
                    WireError::check("OffsetFetch", || format!("group {id}"), p.error_code)?;
                    if p.partition_index == 0 {
                        found = Marker::parse(p.committed_offset, p.metadata.as_deref());
                    }
                }
            }
            Ok::<_, WireError>(found)
        }
        .await;
        match result {
            Err(error)
                if (error.is_retriable()
                    || error.code() == Some(ResponseError::UnstableOffsetCommit))
                    && Instant::now() < deadline =>
            {
                if error.is_misdirected() {
                    cluster.forget_coordinator(CoordinatorKind::Group, id).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(producer_id: i64, epoch: i16) -> TransactionIdentity {
        TransactionIdentity {
            transactional_id: "job.l.s0.t0".into(),
            producer_id,
            epoch,
        }
    }

    #[test]
    fn a_marker_names_its_transaction_or_a_later_one() {
        let metadata = Marker::metadata(&identity(7, 3));
        let marker = Marker::parse(12, Some(&metadata));
        assert_eq!(
            marker,
            Some(Marker {
                checkpoint: 12,
                producer_id: 7,
                epoch: 3
            })
        );
        assert_eq!(Marker::verdict(marker, &identity(7, 3)), Verdict::This);
        assert_eq!(Marker::verdict(marker, &identity(7, 2)), Verdict::Later);
        // The producer id the coordinator gave when an epoch ran out.
        assert_eq!(Marker::verdict(marker, &identity(6, 32767)), Verdict::Later);
        // An earlier transaction's marker, or one of another producer.
        assert_eq!(
            Marker::verdict(marker, &identity(7, 4)),
            Verdict::NotCommitted
        );
        assert_eq!(
            Marker::verdict(marker, &identity(8, 0)),
            Verdict::NotCommitted
        );
        assert_eq!(
            Marker::verdict(None, &identity(7, 3)),
            Verdict::NotCommitted
        );
        // Offsets of others (no metadata, another format) are no marker.
        assert_eq!(Marker::parse(5, None), None);
        assert_eq!(Marker::parse(5, Some("x:1:2")), None);
        assert_eq!(Marker::parse(-1, Some(&metadata)), None);
    }
}
