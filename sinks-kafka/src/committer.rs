//! The committer: `EndTxn` for each prepared transaction, from this process
//! or a new one, with the outcome read from the commit marker.
//!
//! | the cluster says | outcome |
//! |---|---|
//! | the marker names this transaction, or a later one of its id | already committed (a replay) |
//! | the id's current producer and epoch are the transaction's, and it is open or committing | `EndTxn(commit)`, then the marker, read once stable: this transaction's ─▶ committed |
//! | with source positions: a split not where the transaction expects, once every other open transaction claiming one was fenced (see `positions`) | abort; superseded |
//! | the marker, stable, names another transaction or none | failed with a known reason: aborted (its timeout passed, or a newer producer fenced it before its commit); its records are counted lost. With source positions: superseded (its positions went with it) |
//! | a broker unreachable, a coordinator moving, no answer in time | retry later; the runtime's retry policy bounds the retries, then the job fails |
//! | anything else | failed with an unknown reason: the job fails and restarts |
//!
//! `EndTxn` is never sent for a producer id other than the one the
//! coordinator holds for the transactional id (a wrong producer id wedges a
//! partition of some brokers, noida-db among them), and its answer alone
//! never decides the outcome: Kafka answers `NONE` to a repeated commit,
//! noida-db also to a commit of an aborted transaction.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kafka_protocol::error::ResponseError;
use sink_api::{CommitRequest, Committer, SinkError};
use tracing::{debug, info, warn};

use crate::marker::{self, Marker, Verdict};
use crate::positions;
use crate::slots::Slots;
use crate::stats::Stats;
use crate::transaction::{describe, end, TransactionState};
use crate::writer::KafkaCommittable;
use sink_kafka_client::{Cluster, WireError};

/// Commits prepared transactions of any subtask. Made by
/// [`KafkaSink`](crate::KafkaSink)'s `create_committer`.
pub struct KafkaCommitter {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) topic: Arc<str>,
    pub(crate) slots: Arc<Slots>,
    pub(crate) stats: Arc<Stats>,
    /// Claims on splits found settled (see the `positions` module).
    pub(crate) settled: positions::Settled,
    /// For the `InitProducerId` that fences a transaction claiming a split.
    pub(crate) transaction_timeout: Duration,
}

impl std::fmt::Debug for KafkaCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaCommitter")
            .field("brokers", &self.cluster.brokers())
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// What one commit came to.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Committed,
    AlreadyCommitted,
    Lost(String),
    /// Its source positions moved, or it was aborted with them: nothing
    /// of it applied, its records are read again from the destination.
    Superseded(String),
}

impl KafkaCommitter {
    async fn commit_one(&mut self, committable: &KafkaCommittable) -> Result<Outcome, WireError> {
        let identity = &committable.transaction;
        let id = identity.transactional_id.as_str();
        let before = marker::read(&self.cluster, id, &self.topic, false).await?;
        if Marker::verdict(before, identity) != Verdict::NotCommitted {
            return Ok(Outcome::AlreadyCommitted);
        }
        let now = match describe(&self.cluster, id).await {
            Ok(now) => now,
            // The id expired (`transactional.id.expiration.ms`, 7 days by
            // default): no transaction of it is open; the marker tells.
            Err(error) if error.code() == Some(ResponseError::TransactionalIdNotFound) => {
                TransactionState {
                    state: "unknown to the coordinator".to_string(),
                    producer_id: -1,
                    epoch: -1,
                }
            }
            Err(error) => return Err(error),
        };
        let ours = now.producer_id == identity.producer_id && now.epoch == identity.epoch;
        if ours && now.state == "Ongoing" && !committable.positions.is_empty() {
            let checked = positions::settle(
                &self.cluster,
                identity,
                &committable.positions,
                &mut self.settled,
                self.transaction_timeout,
            )
            .await?;
            if let Err(conflict) = checked {
                if let Err(error) = end(&self.cluster, identity, false).await {
                    if !error.is_fenced() {
                        return Err(error);
                    }
                }
                return Ok(Outcome::Superseded(format!(
                    "transaction {identity} of checkpoint {}: {conflict}",
                    committable.checkpoint
                )));
            }
        }
        if ours && matches!(now.state.as_str(), "Ongoing" | "PrepareCommit") {
            #[cfg(feature = "failpoints")]
            fail::fail_point!("kafka-before-end-txn", |_| Err(WireError::Protocol(
                "simulated crash at failpoint kafka-before-end-txn".into()
            )));
            if let Err(error) = end(&self.cluster, identity, true).await {
                // Fenced: a newer producer of the id aborted it; the marker
                // below says so. Anything else is for the caller.
                if !error.is_fenced() {
                    return Err(error);
                }
                debug!(%identity, %error, "fenced at commit; reading the marker");
            }
        } else {
            debug!(%identity, state = %now.state, now.producer_id, now.epoch,
                "the coordinator holds another transaction or none; reading the marker");
        }
        let after = marker::read(&self.cluster, id, &self.topic, true).await?;
        Ok(match Marker::verdict(after, identity) {
            Verdict::This => Outcome::Committed,
            Verdict::Later => Outcome::AlreadyCommitted,
            // With positions, an aborted transaction took its positions
            // with it: its records are read again from the destination.
            Verdict::NotCommitted if !committable.positions.is_empty() => {
                Outcome::Superseded(format!(
                    "transaction {identity} of checkpoint {} was aborted before its commit (the \
                     coordinator holds {} at producer {} epoch {}): another owner of its splits \
                     fenced it, or its timeout passed; its positions did not move, so its {} \
                     records are read again from the destination",
                    committable.checkpoint,
                    now.state,
                    now.producer_id,
                    now.epoch,
                    committable.records
                ))
            }
            Verdict::NotCommitted => Outcome::Lost(format!(
                "transaction {identity} of checkpoint {} was aborted before its commit (the \
                 coordinator holds {} at producer {} epoch {}; the commit marker names {}): \
                 its {} records are lost. Keep the checkpoint timeout and the commit retries \
                 within the transaction timeout (docs/kafka.md)",
                committable.checkpoint,
                now.state,
                now.producer_id,
                now.epoch,
                after.map_or("no transaction".to_string(), |m| format!(
                    "checkpoint {} (producer {} epoch {})",
                    m.checkpoint, m.producer_id, m.epoch
                )),
                committable.records
            )),
        })
    }
}

#[async_trait]
impl Committer for KafkaCommitter {
    type Committable = KafkaCommittable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<KafkaCommittable>],
    ) -> Result<(), SinkError> {
        for request in requests.iter_mut() {
            let committable = request.committable().clone();
            match self.commit_one(&committable).await {
                Ok(outcome) => {
                    // A lost transaction keeps its slot until the next
                    // start (see `slots`).
                    if !matches!(outcome, Outcome::Lost(_)) {
                        let identity = &committable.transaction;
                        self.slots.give_back(
                            committable.subtask,
                            committable.slot,
                            Some((identity.producer_id, identity.epoch)),
                        );
                    }
                    match outcome {
                        Outcome::Committed => {
                            self.stats.committed(committable.records);
                            request.signal_committed();
                        }
                        Outcome::AlreadyCommitted => {
                            self.stats.replayed();
                            request.signal_already_committed();
                        }
                        Outcome::Lost(reason) => {
                            warn!(%reason, "a prepared transaction was lost");
                            self.stats.lost(committable.records);
                            request.signal_records_lost(committable.records, reason);
                        }
                        Outcome::Superseded(reason) => {
                            info!(%reason, "a prepared transaction was superseded");
                            self.stats.superseded();
                            request.signal_superseded(reason);
                        }
                    }
                }
                Err(error) if error.is_retriable() => {
                    self.stats.commit_retried();
                    warn!(transaction = %committable.transaction, %error, "commit retried later");
                    request.retry_later();
                }
                Err(error) => {
                    request.signal_failed_with_unknown_reason(format!(
                        "committing transaction {} of checkpoint {}: {error}",
                        committable.transaction, committable.checkpoint
                    ));
                }
            }
        }
        Ok(())
    }
}
