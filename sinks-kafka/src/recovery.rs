//! What a start of the job finds on the cluster: open transactions of its
//! lineage that no restored checkpoint holds, and their abort.
//!
//! An open transaction of the lineage that the restored checkpoint does not
//! hold as a committable will never be committed: it was begun by an
//! earlier start after its last completed checkpoint, by a start that died
//! before its first one, or by a subtask a downscale removed. Open, it pins
//! every `read_committed` consumer of its partitions at its first offset
//! (the last stable offset cannot pass it) until the broker's transaction
//! timeout aborts it, and noida-db never does. So the start aborts it: a
//! new `InitProducerId` of its id, which bumps the epoch and aborts what
//! the older epoch left open. The transactions the restored checkpoint
//! holds (same id, producer id and epoch) are left open for the committers.
//!
//! The cluster is asked which transactions exist (`ListTransactions`, every
//! broker, since each lists those it coordinates), so the ids of subtasks
//! that no longer exist after a downscale are found as well as the others.

use std::collections::HashSet;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ListTransactionsRequest;
use tracing::info;

use crate::names::TransactionalIdName;
use crate::transaction::{describe, init_producer_id, TransactionIdentity};
use sink_kafka_client::{str_bytes, Cluster, WireError};

/// The transactional ids of `prefix` and `lineage` the cluster knows in one
/// of `states` (all: empty), with the state each is in.
pub(crate) async fn lineage_transactions(
    cluster: &Cluster,
    prefix: &str,
    lineage: &str,
    states: &[&str],
) -> Result<Vec<(String, String)>, WireError> {
    let ids = TransactionalIdName::lineage_prefix(prefix, lineage);
    Ok(transactions(cluster, &ids, states)
        .await?
        .into_iter()
        .filter(|(id, _)| TransactionalIdName::parse(id).is_some())
        .collect())
}

/// The transactional ids starting with `ids` that the cluster knows in one
/// of `states` (all: empty), with the state each is in. The brokers are
/// asked for those states only (`ListTransactions`' state filter, so that
/// the answer does not grow with every transaction completed and not yet
/// expired); a broker that ignores the filter is filtered here.
pub(crate) async fn transactions(
    cluster: &Cluster,
    ids: &str,
    states: &[&str],
) -> Result<Vec<(String, String)>, WireError> {
    let metadata = cluster.metadata(&[]).await?;
    let request = ListTransactionsRequest::default()
        .with_duration_filter(-1)
        .with_state_filters(states.iter().map(|s| str_bytes(s)).collect());
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    for broker in &metadata.brokers {
        let link = cluster.broker(broker.node_id.0).await?;
        let answer = cluster.call(&link, &request).await?;
        WireError::check(
            "ListTransactions",
            || format!("broker {}", broker.node_id.0),
            answer.error_code,
        )?;
        for state in answer.transaction_states {
            let id = state.transactional_id.0.to_string();
            let wanted = states.is_empty() || states.contains(&state.transaction_state.as_str());
            if wanted && id.starts_with(ids) && seen.insert(id.clone()) {
                found.push((id, state.transaction_state.to_string()));
            }
        }
    }
    Ok(found)
}

/// Aborts the open transactions of `prefix` and `lineage` that are not
/// `kept`; returns how many.
pub(crate) async fn abort_lingering(
    cluster: &Cluster,
    prefix: &str,
    lineage: &str,
    kept: &HashSet<&TransactionIdentity>,
    timeout: Duration,
) -> Result<u64, WireError> {
    let mut aborted = 0;
    for (id, state) in lineage_transactions(cluster, prefix, lineage, &["Ongoing"]).await? {
        if state != "Ongoing" {
            continue;
        }
        // The list may be older than the answer to this: ask again.
        let now = match describe(cluster, &id).await {
            Ok(now) => now,
            // Expired since it was listed: nothing of it is open.
            Err(error) if error.code() == Some(ResponseError::TransactionalIdNotFound) => continue,
            Err(error) => return Err(error),
        };
        if now.state != "Ongoing" {
            continue;
        }
        let identity = TransactionIdentity {
            transactional_id: id.clone(),
            producer_id: now.producer_id,
            epoch: now.epoch,
        };
        if kept.contains(&identity) {
            continue;
        }
        init_producer_id(cluster, &id, timeout).await?;
        info!(transaction = %identity, "aborted an open transaction no checkpoint holds");
        aborted += 1;
    }
    Ok(aborted)
}
