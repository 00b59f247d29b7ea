//! One checkpoint's commit, through its retries, as a pure state machine.
//!
//! ```text
//!            take_requests ──▶ Committer::commit ──▶ settle
//!                 ▲                                    │
//!                 └──── Retry { retry } (after backoff)┤
//!                                                      ├──▶ Done: committed committables, tally
//!                                                      └──▶ Err(CommitFailure): the job fails
//! ```
//!
//! Outcomes map as the contract says: committed and already committed go on
//! to the global committer; retry-later (with or without an updated
//! committable) comes back after a backoff, at most `max_retries` times; a
//! known failure is counted and dropped; an unknown failure fails the job;
//! a superseded request (its source positions moved in the destination) is
//! set aside for the caller, who drops it in the re-commit of a restored
//! checkpoint and fails the job otherwise ([`CommitFailure::Superseded`]).

use sink_api::{CheckpointId, CommitOutcome, CommitRequest};

use super::retry::RetryPolicy;

/// A commit that cannot succeed: the job must fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitFailure {
    /// The committer returned without settling a request.
    #[error("the committer returned from commit without settling a request of checkpoint {checkpoint_id}: \
             call request.signal_committed() once the committable is visible, or another outcome \
             (signal_already_committed, retry_later, signal_failed_with_known_reason, ...) on every request")]
    Unsettled {
        /// The checkpoint being committed.
        checkpoint_id: CheckpointId,
    },
    /// The committer signalled a failure it does not understand.
    #[error("the commit of checkpoint {checkpoint_id} failed for an unknown reason: {reason}")]
    UnknownReason {
        /// The checkpoint being committed.
        checkpoint_id: CheckpointId,
        /// The committer's words.
        reason: String,
    },
    /// A committable's source positions had moved in the destination:
    /// another owner of a split committed its records. The job restarts, so
    /// that its source reads every split again from where the destination
    /// says (the committable is dropped in the re-commit after the restart).
    #[error(
        "the commit of checkpoint {checkpoint_id} was superseded: {reason}. The job restarts \
             and reads every split again from the destination's positions"
    )]
    Superseded {
        /// The checkpoint being committed.
        checkpoint_id: CheckpointId,
        /// The committer's words.
        reason: String,
    },
    /// A committable asked to be retried more often than the policy allows.
    #[error("the commit of checkpoint {checkpoint_id} still asked to be retried after {retries} retries; raise the retry limit with JobBuilder::commit_retry or fix the committed-to system")]
    RetriesExhausted {
        /// The checkpoint being committed.
        checkpoint_id: CheckpointId,
        /// Retries made.
        retries: u32,
    },
}

/// Counts of what happened to the requests of one round.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CommitTally {
    /// Requests that ended committed.
    pub committed: u64,
    /// Requests that ended already committed (replays).
    pub already_committed: u64,
    /// Retries made.
    pub retries: u64,
    /// Requests that failed with a known reason (dropped): the reason, and
    /// the records lost with it when the committer said.
    pub known_failures: Vec<(String, Option<u64>)>,
    /// Requests superseded (nothing applied: their source positions moved),
    /// with the committer's reason.
    pub superseded: Vec<String>,
}

/// What the caller does after [`CommitRound::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundStep {
    /// Every request is settled.
    Done,
    /// Some requests must be retried; this is retry number `retry` of the
    /// round. Wait [`RetryPolicy::backoff`] and call
    /// [`CommitRound::take_requests`] again.
    Retry {
        /// The retry number, from 1.
        retry: u32,
        /// How many requests are retried.
        requests: u64,
    },
}

/// The commit of one checkpoint's committables, with its retries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommitRound<C> {
    checkpoint_id: CheckpointId,
    waiting: Vec<(C, u32)>,
    committed: Vec<C>,
    tally: CommitTally,
}

impl<C> CommitRound<C> {
    /// A round over every committable of checkpoint `checkpoint_id`.
    pub fn new(checkpoint_id: CheckpointId, committables: Vec<C>) -> CommitRound<C> {
        CommitRound {
            checkpoint_id,
            waiting: committables.into_iter().map(|c| (c, 0)).collect(),
            committed: Vec::new(),
            tally: CommitTally::default(),
        }
    }

    /// The requests to hand to the committer now; empty when the round is
    /// done.
    pub fn take_requests(&mut self) -> Vec<CommitRequest<C>> {
        let checkpoint_id = self.checkpoint_id;
        self.waiting
            .drain(..)
            .map(|(committable, retries)| CommitRequest::new(committable, checkpoint_id, retries))
            .collect()
    }

    /// Sorts the settled requests by outcome.
    pub fn settle(
        &mut self,
        requests: Vec<CommitRequest<C>>,
        policy: &RetryPolicy,
    ) -> Result<RoundStep, CommitFailure> {
        let mut max_retry = 0;
        let mut retried = 0;
        for request in requests {
            let retries = request.retry_count();
            let records_lost = request.records_lost();
            let (committable, outcome) = request.into_parts();
            match outcome {
                CommitOutcome::Unsettled => {
                    return Err(CommitFailure::Unsettled {
                        checkpoint_id: self.checkpoint_id,
                    });
                }
                CommitOutcome::Committed => {
                    self.tally.committed += 1;
                    self.committed.push(committable);
                }
                CommitOutcome::AlreadyCommitted => {
                    self.tally.already_committed += 1;
                    self.committed.push(committable);
                }
                CommitOutcome::RetryLater | CommitOutcome::UpdatedAndRetryLater => {
                    if policy.exhausted(retries) {
                        return Err(CommitFailure::RetriesExhausted {
                            checkpoint_id: self.checkpoint_id,
                            retries,
                        });
                    }
                    self.tally.retries += 1;
                    retried += 1;
                    max_retry = max_retry.max(retries + 1);
                    self.waiting.push((committable, retries + 1));
                }
                CommitOutcome::FailedWithKnownReason(reason) => {
                    self.tally.known_failures.push((reason, records_lost));
                }
                CommitOutcome::Superseded(reason) => self.tally.superseded.push(reason),
                CommitOutcome::FailedWithUnknownReason(reason) => {
                    return Err(CommitFailure::UnknownReason {
                        checkpoint_id: self.checkpoint_id,
                        reason,
                    });
                }
                other => {
                    return Err(CommitFailure::UnknownReason {
                        checkpoint_id: self.checkpoint_id,
                        reason: format!("an outcome this runtime does not know: {other:?}"),
                    });
                }
            }
        }
        Ok(if self.waiting.is_empty() {
            RoundStep::Done
        } else {
            RoundStep::Retry {
                retry: max_retry,
                requests: retried,
            }
        })
    }

    /// What this round counted so far.
    pub fn tally(&self) -> &CommitTally {
        &self.tally
    }

    /// The known failures settled since the last call, taken out of the
    /// tally: the caller reports each as soon as it is settled, so that a
    /// round cut short (a cancel, a later unknown failure) hides none.
    pub fn take_known_failures(&mut self) -> Vec<(String, Option<u64>)> {
        std::mem::take(&mut self.tally.known_failures)
    }

    /// The committables that ended committed or already committed, for the
    /// global committer, and the tally (without the known failures already
    /// taken by [`take_known_failures`](Self::take_known_failures)).
    pub fn into_committed(self) -> (Vec<C>, CommitTally) {
        (self.committed, self.tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_retries: u32) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn committed_requests_are_forwarded_and_unsettled_ones_fail_the_round() {
        let mut round = CommitRound::new(CheckpointId(3), vec!["a", "b"]);
        let mut requests = round.take_requests();
        assert_eq!(requests[0].checkpoint_id(), CheckpointId(3));
        requests
            .iter_mut()
            .for_each(CommitRequest::signal_committed);
        assert_eq!(round.settle(requests, &policy(1)), Ok(RoundStep::Done));
        assert!(round.take_requests().is_empty());
        let (committed, tally) = round.into_committed();
        assert_eq!(committed, vec!["a", "b"]);
        assert_eq!(tally.committed, 2);

        // No silent success: a request left as it came fails the round.
        let mut round = CommitRound::new(CheckpointId(4), vec!["c", "d"]);
        let mut requests = round.take_requests();
        requests[0].signal_committed();
        assert_eq!(
            round.settle(requests, &policy(1)),
            Err(CommitFailure::Unsettled {
                checkpoint_id: CheckpointId(4)
            })
        );
    }

    #[test]
    fn retry_later_comes_back_with_a_higher_count_and_an_updated_committable() {
        let mut round = CommitRound::new(CheckpointId(1), vec!["a", "b"]);
        let mut requests = round.take_requests();
        requests[0].retry_later();
        requests[1].update_and_retry_later("b2");
        assert_eq!(
            round.settle(requests, &policy(3)),
            Ok(RoundStep::Retry {
                retry: 1,
                requests: 2
            })
        );
        let requests = round.take_requests();
        assert_eq!(
            requests
                .iter()
                .map(|r| *r.committable())
                .collect::<Vec<_>>(),
            vec!["a", "b2"]
        );
        assert!(requests.iter().all(|r| r.retry_count() == 1));
        let mut requests = requests;
        requests
            .iter_mut()
            .for_each(CommitRequest::signal_committed);
        assert_eq!(round.settle(requests, &policy(3)), Ok(RoundStep::Done));
        assert_eq!(round.tally().retries, 2);
    }

    #[test]
    fn superseded_requests_are_set_aside_not_committed() {
        let mut round = CommitRound::new(CheckpointId(5), vec!["a", "b"]);
        let mut requests = round.take_requests();
        requests[0].signal_superseded("moved");
        requests[1].signal_committed();
        assert_eq!(round.settle(requests, &policy(1)), Ok(RoundStep::Done));
        let (committed, tally) = round.into_committed();
        assert_eq!(
            committed,
            vec!["b"],
            "nothing of a superseded request goes on"
        );
        assert_eq!(tally.superseded, vec!["moved".to_string()]);
        assert!(tally.known_failures.is_empty(), "not a loss");
    }

    #[test]
    fn retries_are_exhausted_into_a_failure() {
        let mut round = CommitRound::new(CheckpointId(9), vec!["a"]);
        for retry in 1..=2 {
            let mut requests = round.take_requests();
            requests[0].retry_later();
            assert_eq!(
                round.settle(requests, &policy(2)),
                Ok(RoundStep::Retry { retry, requests: 1 })
            );
        }
        let mut requests = round.take_requests();
        requests[0].retry_later();
        assert_eq!(
            round.settle(requests, &policy(2)),
            Err(CommitFailure::RetriesExhausted {
                checkpoint_id: CheckpointId(9),
                retries: 2
            })
        );
    }

    #[test]
    fn known_failures_are_dropped_and_unknown_ones_fail() {
        let mut round = CommitRound::new(CheckpointId(1), vec!["a", "b"]);
        let mut requests = round.take_requests();
        requests[0].signal_failed_with_known_reason("expired");
        requests[1].signal_already_committed();
        assert_eq!(round.settle(requests, &policy(1)), Ok(RoundStep::Done));
        assert_eq!(
            round.take_known_failures(),
            vec![("expired".to_string(), None)]
        );
        assert!(round.take_known_failures().is_empty(), "taken once");
        let (committed, tally) = round.into_committed();
        assert_eq!(committed, vec!["b"]);
        assert!(tally.known_failures.is_empty());
        assert_eq!(tally.already_committed, 1);

        let mut round = CommitRound::new(CheckpointId(2), vec!["c"]);
        let mut requests = round.take_requests();
        requests[0].signal_failed_with_unknown_reason("disk on fire");
        assert!(matches!(
            round.settle(requests, &policy(1)),
            Err(CommitFailure::UnknownReason { reason, .. }) if reason == "disk on fire"
        ));
    }
}
