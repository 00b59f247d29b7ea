//! The memory global committer: records what the job-wide step receives once
//! per checkpoint, and checks it against what the committers committed.
//!
//! ```text
//!  commit_checkpoint(n, committables) ─┬─ n seen before ─▶ a replay: counted, nothing added
//!                                      └─ n is new ─────▶ records of its (committed)
//!                                                          transactions appended, once each
//!  end_of_input ─▶ remembered; anything delivered afterwards is a violation
//! ```

use std::collections::BTreeSet;

use async_trait::async_trait;
use sink_api::{CheckpointId, GlobalCommitter, SinkError};

use crate::{MemoryCommittable, MemoryStore, TransactionState};

/// A global committer that records, per checkpoint, the committables it
/// received and the records they carry.
///
/// Created by a test with [`MemoryGlobalCommitter::new`] on the same store as
/// the [`MemorySink`](crate::MemorySink), and given to the job builder. Called
/// by the runtime as the [`GlobalCommitter`] contract describes.
///
/// # What it checks
///
/// Every breach is recorded in [`MemoryStore::violations`]:
///
/// - a committable whose transaction is not committed in the store (the
///   global committer must only see what the committers committed);
/// - a transaction delivered under two different checkpoints;
/// - a replayed checkpoint whose committables differ from its first delivery;
/// - anything delivered after `end_of_input`, or `end_of_input` called twice.
///
/// It is idempotent: a checkpoint delivered again adds nothing and is counted
/// in [`MemoryStats::global_replays`](crate::MemoryStats::global_replays).
pub struct MemoryGlobalCommitter<T> {
    store: MemoryStore<T>,
}

impl<T> MemoryGlobalCommitter<T> {
    /// A global committer writing to `store`. Called by tests, once per start
    /// of the job.
    pub fn new(store: MemoryStore<T>) -> MemoryGlobalCommitter<T> {
        MemoryGlobalCommitter { store }
    }
}

#[async_trait]
impl<T> GlobalCommitter for MemoryGlobalCommitter<T>
where
    T: Clone + Send + Sync + 'static,
{
    type Committable = MemoryCommittable;

    /// Records checkpoint `checkpoint_id` and the records of its committables,
    /// or counts a replay if it was recorded before. Never fails.
    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<MemoryCommittable>,
    ) -> Result<(), SinkError> {
        let mut state = self.store.lock();
        state.stats.global_commit_calls += 1;
        if state.global.end_of_input {
            state.violation(format!(
                "global committer: checkpoint {checkpoint_id} delivered after end_of_input"
            ));
        }

        if let Some(first) = state.global.committables.get(&checkpoint_id) {
            let first_ids = transaction_ids(first);
            let replay_ids = transaction_ids(&committables);
            if first_ids != replay_ids {
                let message = format!(
                    "global committer: checkpoint {checkpoint_id} delivered again with \
                     transactions {replay_ids:?}, first delivered with {first_ids:?}"
                );
                state.violation(message);
            }
            state.stats.global_replays += 1;
            return Ok(());
        }

        for committable in &committables {
            let id = &committable.transaction_id;
            let committed_records = match state.transaction(id) {
                Some(transaction) if transaction.state == TransactionState::Committed => {
                    transaction.records.clone()
                }
                other => {
                    let found = match other {
                        Some(transaction) => format!("{:?}", transaction.state),
                        None => "unknown".to_owned(),
                    };
                    state.violation(format!(
                        "global committer: checkpoint {checkpoint_id} carries transaction {id}, \
                         which is not committed (state: {found})"
                    ));
                    continue;
                }
            };
            if !state.global.transactions.insert(id.clone()) {
                state.violation(format!(
                    "global committer: transaction {id} delivered again under checkpoint \
                     {checkpoint_id}; its records were already recorded"
                ));
                continue;
            }
            state.global.records.extend(committed_records);
        }
        state.global.checkpoints.push(checkpoint_id);
        state
            .global
            .committables
            .insert(checkpoint_id, committables);
        Ok(())
    }

    /// Remembers that the input ended. Never fails.
    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        let mut state = self.store.lock();
        if state.global.end_of_input {
            state.violation("global committer: end_of_input called more than once".to_owned());
        }
        state.global.end_of_input = true;
        Ok(())
    }
}

fn transaction_ids(committables: &[MemoryCommittable]) -> BTreeSet<&str> {
    committables
        .iter()
        .map(|committable| committable.transaction_id.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use sink_api::{CheckpointId, GlobalCommitter, Sink, SinkWriter};

    use super::*;
    use crate::test_support::{commit_all, context};
    use crate::MemorySink;

    /// Writes and commits `batches` (one transaction each) as subtask 0 and
    /// returns their committables.
    async fn committed(store: &MemoryStore<u32>, batches: Vec<Vec<u32>>) -> Vec<MemoryCommittable> {
        let sink = MemorySink::new(store.clone());
        let mut writer = sink
            .create_writer(&context(0, 1), Vec::new())
            .await
            .unwrap();
        let mut committer = sink.create_committer(&context(0, 1)).await.unwrap();
        let mut committables = Vec::new();
        for batch in batches {
            writer.write_batch(batch).await.unwrap();
            committables.extend(
                writer
                    .prepare_commit(sink_api::CheckpointId(1))
                    .await
                    .unwrap(),
            );
        }
        commit_all(&mut committer, &committables, 1).await;
        committables
    }

    #[tokio::test]
    async fn records_each_checkpoint_and_ignores_replays() {
        let store = MemoryStore::new();
        let committables = committed(&store, vec![vec![1, 2], vec![3]]).await;
        let mut global = MemoryGlobalCommitter::new(store.clone());

        global
            .commit_checkpoint(CheckpointId(1), vec![committables[0].clone()])
            .await
            .unwrap();
        global
            .commit_checkpoint(CheckpointId(2), vec![committables[1].clone()])
            .await
            .unwrap();
        // Recovery replays checkpoint 2.
        global
            .commit_checkpoint(CheckpointId(2), vec![committables[1].clone()])
            .await
            .unwrap();
        global.end_of_input().await.unwrap();

        assert_eq!(
            store.global_checkpoints(),
            vec![CheckpointId(1), CheckpointId(2)]
        );
        assert_eq!(store.global_records(), vec![1, 2, 3]);
        assert_eq!(store.global_replays(), 1);
        assert_eq!(store.stats().global_commit_calls, 3);
        assert_eq!(
            store.global_committables().get(&CheckpointId(2)),
            Some(&vec![committables[1].clone()])
        );
        assert!(store.global_end_of_input_called());
        assert!(store.violations().is_empty(), "{:?}", store.violations());
    }

    #[tokio::test]
    async fn an_uncommitted_transaction_is_a_violation() {
        let store = MemoryStore::<u32>::new();
        let mut global = MemoryGlobalCommitter::new(store.clone());
        let unknown = MemoryCommittable {
            transaction_id: "g1-s0-t0".into(),
            record_count: 1,
        };
        global
            .commit_checkpoint(CheckpointId(1), vec![unknown])
            .await
            .unwrap();

        assert!(store.global_records().is_empty());
        let violations = store.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("g1-s0-t0, which is not committed (state: unknown)"));
    }

    #[tokio::test]
    async fn a_transaction_under_two_checkpoints_is_recorded_once() {
        let store = MemoryStore::new();
        let committables = committed(&store, vec![vec![1]]).await;
        let mut global = MemoryGlobalCommitter::new(store.clone());
        global
            .commit_checkpoint(CheckpointId(1), committables.clone())
            .await
            .unwrap();
        global
            .commit_checkpoint(CheckpointId(2), committables)
            .await
            .unwrap();

        assert_eq!(store.global_records(), vec![1]);
        assert_eq!(store.violations().len(), 1, "{:?}", store.violations());
    }

    #[tokio::test]
    async fn deliveries_after_end_of_input_are_violations() {
        let store = MemoryStore::new();
        let committables = committed(&store, vec![vec![1]]).await;
        let mut global = MemoryGlobalCommitter::new(store.clone());
        global.end_of_input().await.unwrap();
        global
            .commit_checkpoint(CheckpointId(1), committables)
            .await
            .unwrap();
        global.end_of_input().await.unwrap();

        let violations = store.violations();
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("checkpoint 1 delivered after end_of_input"));
        assert!(violations[1].contains("end_of_input called more than once"));
    }

    #[tokio::test]
    async fn a_replay_with_different_committables_is_a_violation() {
        let store = MemoryStore::new();
        let committables = committed(&store, vec![vec![1], vec![2]]).await;
        let mut global = MemoryGlobalCommitter::new(store.clone());
        global
            .commit_checkpoint(CheckpointId(1), vec![committables[0].clone()])
            .await
            .unwrap();
        global
            .commit_checkpoint(CheckpointId(1), committables)
            .await
            .unwrap();

        assert_eq!(store.global_records(), vec![1]);
        assert_eq!(store.global_replays(), 1);
        let violations = store.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("checkpoint 1 delivered again"));
    }
}
