//! The memory committer: the second phase of the two-phase commit, and the
//! place where duplicates would appear if the runtime replayed carelessly.
//!
//! For each request, the committer looks its transaction up in the store:
//!
//! ```text
//!  armed injected failure? ──yes──▶ RetryLater / FailedWith…Reason (stays prepared)
//!          │ no
//!          ▼
//!  transaction state ─┬─ Prepared  ─▶ Committed: records appended to the committed log
//!                     ├─ Committed ─▶ AlreadyCommitted: a replay, counted, nothing added
//!                     └─ otherwise ─▶ FailedWithKnownReason ("not found"), counted
//! ```
//!
//! Committing is therefore idempotent: however often a committable is
//! replayed, its records appear once in [`MemoryStore::committed`].

use async_trait::async_trait;
use sink_api::{CommitRequest, Committer, SinkError, SubtaskIndex};

use crate::failure::InjectedCommitFailure;
use crate::store::{StoreCounters, StoreState};
use crate::{MemoryCommittable, MemoryStore, TransactionState};

/// Commits prepared transactions of the shared [`MemoryStore`], idempotently.
///
/// Created by [`MemorySink::create_committer`](crate::MemorySink) once per
/// subtask and per start of the job; called by the runtime as the
/// [`Committer`] contract describes. Any committer of the store can commit any
/// transaction of it, as with a real database.
///
/// # Outcomes
///
/// - prepared → [`CommitOutcome::Committed`](sink_api::CommitOutcome::Committed);
/// - already committed → `AlreadyCommitted`, counted in
///   [`MemoryStats::replays`](crate::MemoryStats::replays);
/// - open, aborted or unknown → `FailedWithKnownReason`, counted in
///   [`MemoryStats::known_failures`](crate::MemoryStats::known_failures);
/// - an armed injected failure → the armed outcome; the transaction is left
///   as it was.
pub struct MemoryCommitter<T> {
    store: MemoryStore<T>,
    subtask: SubtaskIndex,
}

impl<T> MemoryCommitter<T> {
    /// A committer of `subtask`. Called by
    /// [`MemorySink::create_committer`](crate::MemorySink); tests may call it
    /// directly.
    pub fn new(store: MemoryStore<T>, subtask: SubtaskIndex) -> MemoryCommitter<T> {
        MemoryCommitter { store, subtask }
    }
}

#[async_trait]
impl<T> Committer for MemoryCommitter<T>
where
    T: Clone + Send + Sync + 'static,
{
    type Committable = MemoryCommittable;

    /// Settles every request under one lock, in order.
    ///
    /// # Errors
    ///
    /// Fails only when a failure was armed with
    /// [`MemoryStore::fail_next_commit_calls`]; nothing of the batch is then
    /// committed.
    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<MemoryCommittable>],
    ) -> Result<(), SinkError> {
        let mut state = self.store.lock();
        state.stats.commit_calls += 1;
        state.stats.commit_requests += requests.len() as u64;
        if state.failures.take_commit_call_failure() {
            state.stats.injected_commit_call_failures += 1;
            return Err(SinkError::msg(format!(
                "injected commit failure on the committer of subtask {}: the batch of {} \
                 request(s) was not committed (armed with MemoryStore::fail_next_commit_calls)",
                self.subtask,
                requests.len()
            )));
        }
        let last = requests.len().saturating_sub(1);
        for (position, request) in requests.iter_mut().enumerate() {
            commit_one(&mut state, &self.store.counters, request);
            if position < last {
                // A crash with part of the batch committed (crash tests only).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("memory-commit-mid-batch", |_| Err(SinkError::msg(
                    "simulated crash at failpoint memory-commit-mid-batch"
                )));
            }
        }
        Ok(())
    }

    /// Counts the close; nothing to release.
    async fn close(&mut self) -> Result<(), SinkError> {
        self.store.lock().stats.committer_closes += 1;
        Ok(())
    }
}

/// Settles one request against the store.
fn commit_one<T: Clone>(
    state: &mut StoreState<T>,
    counters: &StoreCounters,
    request: &mut CommitRequest<MemoryCommittable>,
) {
    let transaction_id = request.committable().transaction_id.clone();
    if let Some(kind) = state.failures.take_commit_failure() {
        match kind {
            InjectedCommitFailure::RetryLater => {
                state.stats.injected_retry_later += 1;
                request.retry_later();
            }
            InjectedCommitFailure::KnownReason => {
                state.stats.injected_known_failures += 1;
                let records = request.committable().record_count;
                request.signal_records_lost(
                    records,
                    format!("injected commit failure (known reason) for transaction {transaction_id} ({records} records lost)"),
                );
            }
            InjectedCommitFailure::UnknownReason => {
                state.stats.injected_unknown_failures += 1;
                request.signal_failed_with_unknown_reason(format!(
                    "injected commit failure (unknown reason) for transaction {transaction_id}"
                ));
            }
        }
        return;
    }

    let Some(transaction) = state.transaction_mut(&transaction_id) else {
        state.stats.known_failures += 1;
        let records = request.committable().record_count;
        request.signal_records_lost(records, not_found(&transaction_id));
        return;
    };
    if transaction.state == TransactionState::Prepared {
        if let Some(group) = transaction.group {
            commit_group(state, counters, request, group);
            return;
        }
    }
    let Some(transaction) = state.transaction_mut(&transaction_id) else {
        return;
    };
    match transaction.state {
        TransactionState::Prepared => {
            let early = !transaction.durable;
            transaction.state = TransactionState::Committed;
            request.signal_committed();
            let records = transaction.records.clone();
            if early {
                state.violation(format!(
                    "transaction {transaction_id} committed before the durability work of its \
                     checkpoint was done: the checkpoint was acknowledged too early"
                ));
            }
            let claimed = request.committable().record_count;
            if claimed != records.len() as u64 {
                state.violation(format!(
                    "committable for transaction {transaction_id} claims {claimed} record(s) \
                     but the transaction holds {}",
                    records.len()
                ));
            }
            counters.committed_transactions.add(1);
            counters.committed_records.add(records.len() as u64);
            state.committed.extend(records);
            *state
                .commits_per_checkpoint
                .entry(request.checkpoint_id())
                .or_insert(0) += 1;
        }
        TransactionState::Committed => {
            counters.replays.add(1);
            *state
                .replays_per_transaction
                .entry(transaction_id.clone())
                .or_default() += 1;
            request.signal_already_committed();
        }
        TransactionState::Open | TransactionState::Aborted => {
            state.stats.known_failures += 1;
            let records = request.committable().record_count;
            request.signal_records_lost(records, not_found(&transaction_id));
        }
    }
}

/// Commits the position group `group` of a prepared transaction: if every
/// split it advances is where it expects, its positions and every member
/// transaction at once (the other members' later requests are replays);
/// otherwise none of it, and the request is superseded. The members stay
/// prepared then, so each of their requests is superseded in turn.
fn commit_group<T: Clone>(
    state: &mut StoreState<T>,
    counters: &StoreCounters,
    request: &mut CommitRequest<MemoryCommittable>,
    group: usize,
) {
    let (members, advances) = match state.groups.get(group) {
        Some(group) => (group.members.clone(), group.advances.clone()),
        None => {
            return request.signal_failed_with_unknown_reason("a position group the store lost")
        }
    };
    let applied = match state.position_flaw {
        // Positions kept nowhere (or not checked): nothing to check against.
        Some(_) => {
            let mut forced = advances.clone();
            for advance in &mut forced {
                advance.from = state.positions.get(&advance.key);
            }
            state.positions.apply(&forced)
        }
        None => state.positions.apply(&advances),
    };
    if let Err(conflict) = applied {
        state.superseded += 1;
        return request.signal_superseded(conflict);
    }
    for member in members {
        let Some(transaction) = state.transactions.get_mut(member) else {
            continue;
        };
        if transaction.state != TransactionState::Prepared {
            continue;
        }
        if !transaction.durable {
            let id = transaction.id.clone();
            state.violation(format!(
                "transaction {id} committed before the durability work of its checkpoint was \
                 done: the checkpoint was acknowledged too early"
            ));
        }
        let Some(transaction) = state.transactions.get_mut(member) else {
            continue;
        };
        transaction.state = TransactionState::Committed;
        let records = transaction.records.clone();
        counters.committed_transactions.add(1);
        counters.committed_records.add(records.len() as u64);
        state.committed.extend(records);
    }
    *state
        .commits_per_checkpoint
        .entry(request.checkpoint_id())
        .or_insert(0) += 1;
    request.signal_committed();
}

fn not_found(transaction_id: &str) -> String {
    format!("transaction {transaction_id} not found: neither prepared nor committed")
}

#[cfg(test)]
mod tests {
    use sink_api::{CheckpointId, CommitOutcome, Sink, SinkWriter};

    use super::*;
    use crate::test_support::{commit_all, context};
    use crate::{MemorySink, MemoryWriter};

    /// A store, a writer and a committer of subtask 0, generation 1.
    async fn setup() -> (MemoryStore<u32>, MemoryWriter<u32>, MemoryCommitter<u32>) {
        let store = MemoryStore::new();
        let sink = MemorySink::new(store.clone());
        let writer = sink
            .create_writer(&context(0, 1), Vec::new())
            .await
            .unwrap();
        let committer = sink.create_committer(&context(0, 1)).await.unwrap();
        (store, writer, committer)
    }

    async fn prepare(writer: &mut MemoryWriter<u32>, records: Vec<u32>) -> Vec<MemoryCommittable> {
        writer.write_batch(records).await.unwrap();
        writer.flush(false).await.unwrap();
        writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn records_move_from_written_to_pending_to_committed() {
        let (store, mut writer, mut committer) = setup().await;
        writer.write_batch(vec![1, 2]).await.unwrap();
        assert_eq!(store.written(), vec![1, 2]);
        assert_eq!(store.pending(), vec![1, 2]);
        assert!(store.committed().is_empty());

        writer.flush(false).await.unwrap();
        let committables = writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        assert_eq!(store.pending(), vec![1, 2]);
        assert!(store.committed().is_empty());

        let outcomes = commit_all(&mut committer, &committables, 1).await;
        assert_eq!(outcomes, vec![CommitOutcome::Committed]);
        assert_eq!(store.written(), vec![1, 2]);
        assert!(store.pending().is_empty());
        assert_eq!(store.committed(), vec![1, 2]);

        let stats = store.stats();
        assert_eq!(stats.commit_calls, 1);
        assert_eq!(stats.commit_requests, 1);
        assert_eq!(stats.committed_transactions, 1);
        assert_eq!(stats.committed_records, 2);
        assert_eq!(stats.writers_created, 1);
        assert_eq!(stats.committers_created, 1);
        assert!(store.violations().is_empty());
    }

    #[tokio::test]
    async fn commits_are_logged_in_commit_order_and_per_checkpoint() {
        let (store, mut writer, mut committer) = setup().await;
        let first = prepare(&mut writer, vec![1]).await;
        let second = prepare(&mut writer, vec![2, 3]).await;
        let third = prepare(&mut writer, vec![4]).await;

        commit_all(&mut committer, &second, 2).await;
        commit_all(&mut committer, &[first[0].clone(), third[0].clone()], 3).await;

        assert_eq!(store.committed(), vec![2, 3, 1, 4]);
        assert_eq!(
            store
                .commits_per_checkpoint()
                .into_iter()
                .collect::<Vec<_>>(),
            vec![(CheckpointId(2), 1), (CheckpointId(3), 2)]
        );
    }

    #[tokio::test]
    async fn a_replayed_committable_is_already_committed_and_not_duplicated() {
        let (store, mut writer, mut committer) = setup().await;
        let committables = prepare(&mut writer, vec![1, 2]).await;
        commit_all(&mut committer, &committables, 1).await;

        let outcomes = commit_all(&mut committer, &committables, 1).await;
        assert_eq!(outcomes, vec![CommitOutcome::AlreadyCommitted]);
        assert_eq!(store.committed(), vec![1, 2]);
        let stats = store.stats();
        assert_eq!(stats.replays, 1);
        assert_eq!(stats.committed_transactions, 1);
        assert_eq!(
            store.commits_per_checkpoint().get(&CheckpointId(1)),
            Some(&1)
        );
    }

    #[tokio::test]
    async fn a_missing_or_aborted_transaction_fails_with_a_known_reason() {
        let (store, mut writer, mut committer) = setup().await;
        writer.write(1).await.unwrap();
        writer.close().await.unwrap();
        let committables = vec![
            MemoryCommittable {
                transaction_id: "g9-s9-t9".into(),
                record_count: 1,
            },
            MemoryCommittable {
                transaction_id: "g1-s0-t0".into(),
                record_count: 1,
            },
        ];

        let outcomes = commit_all(&mut committer, &committables, 1).await;
        assert_eq!(
            outcomes,
            vec![
                CommitOutcome::FailedWithKnownReason(
                    "transaction g9-s9-t9 not found: neither prepared nor committed".into()
                ),
                CommitOutcome::FailedWithKnownReason(
                    "transaction g1-s0-t0 not found: neither prepared nor committed".into()
                ),
            ]
        );
        assert_eq!(store.stats().known_failures, 2);
        assert!(store.committed().is_empty());
    }

    #[tokio::test]
    async fn injected_request_failures_leave_the_transaction_prepared() {
        let (store, mut writer, mut committer) = setup().await;
        let committables = prepare(&mut writer, vec![1]).await;
        let id = committables[0].transaction_id.clone();
        store.fail_next_commits(1, InjectedCommitFailure::RetryLater);
        store.fail_next_commits(1, InjectedCommitFailure::KnownReason);
        store.fail_next_commits(1, InjectedCommitFailure::UnknownReason);

        let mut outcomes = Vec::new();
        for _ in 0..3 {
            outcomes.extend(commit_all(&mut committer, &committables, 1).await);
            assert_eq!(
                store.transaction_state(&id),
                Some(TransactionState::Prepared)
            );
            assert!(store.committed().is_empty());
        }
        assert_eq!(
            outcomes,
            vec![
                CommitOutcome::RetryLater,
                CommitOutcome::FailedWithKnownReason(format!(
                    "injected commit failure (known reason) for transaction {id} (1 records lost)"
                )),
                CommitOutcome::FailedWithUnknownReason(format!(
                    "injected commit failure (unknown reason) for transaction {id}"
                )),
            ]
        );
        let stats = store.stats();
        assert_eq!(stats.injected_retry_later, 1);
        assert_eq!(stats.injected_known_failures, 1);
        assert_eq!(stats.injected_unknown_failures, 1);
        assert_eq!(stats.known_failures, 0);

        // Every armed failure fired: the retry commits.
        let outcomes = commit_all(&mut committer, &committables, 1).await;
        assert_eq!(outcomes, vec![CommitOutcome::Committed]);
        assert_eq!(store.committed(), vec![1]);
    }

    #[tokio::test]
    async fn an_injected_commit_call_failure_commits_nothing_of_the_batch() {
        let (store, mut writer, mut committer) = setup().await;
        let committables = prepare(&mut writer, vec![1]).await;
        store.fail_next_commit_calls(1);

        let mut requests = vec![CommitRequest::new(
            committables[0].clone(),
            CheckpointId(1),
            0,
        )];
        let err = committer.commit(&mut requests).await.unwrap_err();
        assert!(err.to_string().contains("injected commit failure"), "{err}");
        assert_eq!(
            store.transaction_state(&committables[0].transaction_id),
            Some(TransactionState::Prepared)
        );
        let stats = store.stats();
        assert_eq!(stats.commit_calls, 1);
        assert_eq!(stats.injected_commit_call_failures, 1);
        assert_eq!(stats.committed_transactions, 0);

        assert_eq!(
            commit_all(&mut committer, &committables, 1).await,
            vec![CommitOutcome::Committed]
        );
    }

    #[tokio::test]
    async fn cleared_failures_do_not_fire() {
        let (store, mut writer, mut committer) = setup().await;
        let committables = prepare(&mut writer, vec![1]).await;
        store.fail_next_commits(5, InjectedCommitFailure::UnknownReason);
        store.fail_next_commit_calls(2);
        store.clear_injected_failures();

        assert_eq!(
            commit_all(&mut committer, &committables, 1).await,
            vec![CommitOutcome::Committed]
        );
    }

    #[tokio::test]
    async fn a_wrong_record_count_is_a_violation() {
        let (store, mut writer, mut committer) = setup().await;
        let mut committables = prepare(&mut writer, vec![1, 2]).await;
        committables[0].record_count = 5;
        commit_all(&mut committer, &committables, 1).await;

        let violations = store.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("claims 5 record(s) but the transaction holds 2"));
    }
}
