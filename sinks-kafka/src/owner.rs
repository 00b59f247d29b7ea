//! Who runs the lineage now: a transactional id of its own,
//! `<prefix>.<lineage>.owner`, taken (`InitProducerId`) by every start of
//! the job. It tells the two reasons a producer can be fenced apart:
//!
//! - another process started the same lineage since (an instance restored
//!   from the same checkpoints): the owner id's epoch moved on. This
//!   instance stops (a permanent error), the newer one goes on; restarting
//!   would fence the newer one in turn, and the two would take turns.
//! - the broker aborted the transaction (its timeout passed): the owner id
//!   is still this start's. The error is transient: the job restarts from
//!   its last checkpoint and writes the aborted transaction's records
//!   again, once.
//!
//! The owner id never holds a transaction.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sink_api::SinkError;
use tracing::warn;

use crate::errors::sink_error;
use crate::transaction::{describe, init_producer_id};
use sink_kafka_client::{Cluster, WireError};

/// Why a writer or committer stopped for good: a newer instance of the job
/// took the lineage (its start moved the owner id's epoch on). Found in the
/// cause chain of the job's error; programs that supervise the job must not
/// start this instance again (it would fence the newer one in turn).
#[derive(Debug, thiserror::Error)]
#[error(
    "fenced by a newer instance of this job (the owner id {owner_id} moved from epoch {epoch} \
     to {newer_epoch}): this instance stops, the newer one goes on"
)]
pub struct NewerInstance {
    /// The lineage's owner id.
    pub owner_id: String,
    /// This instance's epoch of it.
    pub epoch: i16,
    /// The epoch the cluster holds now.
    pub newer_epoch: i16,
    /// The fenced request's error.
    #[source]
    pub source: WireError,
}

/// The owner id of this sink's current start. Shared by the sink, its
/// writers and its committers.
#[derive(Debug)]
pub(crate) struct Owner {
    cluster: Arc<Cluster>,
    claimed: Mutex<Option<Claim>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    id: String,
    producer_id: i64,
    epoch: i16,
}

impl Owner {
    pub(crate) fn new(cluster: Arc<Cluster>) -> Owner {
        Owner {
            cluster,
            claimed: Mutex::new(None),
        }
    }

    /// Takes the lineage for this start: fences every earlier start's
    /// claim. Called by the start hook, before anything else.
    pub(crate) async fn claim(
        &self,
        prefix: &str,
        lineage: &str,
        timeout: Duration,
    ) -> Result<(), WireError> {
        let id = format!("{prefix}.{lineage}.owner");
        let (producer_id, epoch) = init_producer_id(&self.cluster, &id, timeout).await?;
        *self.claimed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Claim {
            id,
            producer_id,
            epoch,
        });
        Ok(())
    }

    /// Fails with [`NewerInstance`] (permanent) when a newer start took the
    /// lineage since this one claimed it. Called by writers before each
    /// `InitProducerId`, which would otherwise abort the newer instance's
    /// transactions of the same ids. A lookup that fails is transient.
    pub(crate) async fn check(&self) -> Result<(), SinkError> {
        let claim = self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(claim) = claim else {
            return Ok(());
        };
        let now = describe(&self.cluster, &claim.id)
            .await
            .map_err(|e| sink_error(format!("reading the owner id {}", claim.id), e))?;
        if now.producer_id != claim.producer_id || now.epoch != claim.epoch {
            let fenced = WireError::Protocol(format!(
                "the owner id {} is at producer {} epoch {}",
                claim.id, now.producer_id, now.epoch
            ));
            return Err(SinkError::other(
                "beginning a transaction",
                NewerInstance {
                    owner_id: claim.id,
                    epoch: claim.epoch,
                    newer_epoch: now.epoch,
                    source: fenced,
                },
            )
            .permanent());
        }
        Ok(())
    }

    /// `error`, met while `doing`, as the runtime should see it: a fenced
    /// producer is permanent when a newer start owns the lineage, and
    /// transient otherwise (the broker aborted the transaction).
    pub(crate) async fn explain(&self, doing: impl Into<String>, error: WireError) -> SinkError {
        let doing = doing.into();
        if !error.is_fenced() {
            return sink_error(doing, error);
        }
        let claim = self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(claim) = claim else {
            return sink_error(doing, error);
        };
        match describe(&self.cluster, &claim.id).await {
            Ok(now) if now.producer_id != claim.producer_id || now.epoch != claim.epoch => {
                SinkError::other(
                    doing,
                    NewerInstance {
                        owner_id: claim.id,
                        epoch: claim.epoch,
                        newer_epoch: now.epoch,
                        source: error,
                    },
                )
                .permanent()
            }
            Ok(_) => SinkError::other(
                format!(
                    "{doing}: the broker aborted the transaction (its timeout passed, or an \
                     administrator aborted it); the job restarts from its last checkpoint and \
                     writes its records again"
                ),
                error,
            ),
            Err(describe_error) => {
                warn!(%describe_error, "cannot tell who fenced the producer");
                sink_error(doing, error)
            }
        }
    }
}
