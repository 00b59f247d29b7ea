//! The memory writer: the first phase of the two-phase commit, against the
//! shared store.
//!
//! One [`MemoryWriter`] per subtask and per start of the job. It writes
//! straight into an open transaction of the [`MemoryStore`], so nothing is
//! buffered in the writer itself:
//!
//! ```text
//!  write / write_batch ─▶ (opens a transaction lazily) ─▶ records appended to it
//!  (roll_every n)       ─▶ a transaction holding n records is closed, the next opened
//!  prepare_commit       ─▶ closed and open transactions become Prepared ─▶ one MemoryCommittable each
//!  snapshot_state(n)    ─▶ MemoryWriterState { next_transaction_seq, buffered: [] }
//!  close                ─▶ a still-open transaction is Aborted (prepared ones stay)
//! ```
//!
//! On the way it checks the writer's side of the contract (no write, no new
//! transaction and no second `prepare_commit` after end of input, nothing left
//! open at a snapshot) and records every breach in
//! [`MemoryStore::violations`].

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use sink_api::{CheckpointId, Durability, Generation, SinkError, SinkWriter, SubtaskIndex};

use crate::store::StoreState;
use crate::MemoryStore;

/// What [`MemoryWriter::prepare_commit`] hands to the committer: the name of
/// one prepared transaction of the store.
///
/// Produced by the writer, stored in checkpoints by the runtime, committed by
/// [`MemoryCommitter`](crate::MemoryCommitter). Committing it twice is safe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryCommittable {
    /// The prepared transaction, `{lineage}-g{generation}-s{subtask}-t{seq}`
    /// (without the lineage when the writer was made without one): unique
    /// across writers, job starts and runs of the job on fresh checkpoint
    /// storage.
    pub transaction_id: String,
    /// How many records the transaction held when it was prepared.
    pub record_count: u64,
}

/// What [`MemoryWriter::snapshot_state`] returns: enough to resume writing
/// after a restore.
///
/// Stored in checkpoints by the runtime and handed back to
/// [`MemorySink::create_writer`](crate::MemorySink); a writer restored from
/// several states (after a change of parallelism) takes the largest
/// `next_transaction_seq` and the concatenation of the `buffered` records.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemoryWriterState<T> {
    /// The sequence number the writer's next transaction would take.
    pub next_transaction_seq: u64,
    /// Records not yet in any transaction. Always empty in states this sink
    /// writes (records go straight into the open transaction); restored
    /// records are moved into the next transaction at the next write or flush.
    pub buffered: Vec<T>,
}

/// Where a writer is with respect to the end of its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InputPhase {
    /// Records may still come.
    Running,
    /// `flush(true)` was called; the final `prepare_commit` has not run yet.
    EndFlushed,
    /// The final `prepare_commit` ran: nothing may be written or prepared.
    EndPrepared,
}

/// Which write method was called, for the counters.
#[derive(Debug, Clone, Copy)]
enum WriteCall {
    Single,
    Batch,
}

/// The writer of one subtask: writes records into transactions of the shared
/// [`MemoryStore`] and prepares them at each checkpoint.
///
/// Created by [`MemorySink::create_writer`](crate::MemorySink) once per
/// subtask and per start of the job, and driven by the runtime as the
/// [`SinkWriter`] contract describes; never called concurrently.
///
/// # Guarantees
///
/// - A transaction is opened at the first record after the previous
///   `prepare_commit` (or after creation), never at a checkpoint with nothing
///   written: `prepare_commit` returns one committable per transaction
///   (one, or several with `roll_every`), or none.
/// - Records are invisible until their committable is committed.
/// - `close` aborts the open, unprepared transaction; prepared ones belong to
///   their committables and stay prepared.
pub struct MemoryWriter<T> {
    store: MemoryStore<T>,
    subtask: SubtaskIndex,
    generation: Generation,
    next_transaction_seq: u64,
    /// Index in the store of the open transaction, if one is open.
    open_transaction: Option<usize>,
    /// Transactions closed because they reached `roll_every` records, not
    /// yet prepared: `prepare_commit` prepares them with the open one.
    rolled: Vec<usize>,
    /// Most records per transaction, if limited.
    roll_every: Option<usize>,
    /// Restored records not yet moved into a transaction.
    buffered: Vec<T>,
    phase: InputPhase,
    /// The job's lineage, prefixed to transaction ids (empty: no prefix).
    lineage: String,
    /// Prepared transactions become durable only through
    /// [`SinkWriter::durability`]'s future, as a file sink's fsyncs do.
    background_durability: bool,
    /// Prepared since the last durability work, not durable yet.
    not_durable: Vec<usize>,
    /// The source positions the next `prepare_commit`'s transactions
    /// advance (`carry_positions`).
    advances: Vec<sink_api::PositionAdvance>,
}

impl<T> MemoryWriter<T> {
    /// A writer for `subtask` of `generation`, resumed from `restored_states`
    /// (empty on a fresh start). Called by
    /// [`MemorySink::create_writer`](crate::MemorySink); tests may call it
    /// directly.
    pub fn new(
        store: MemoryStore<T>,
        subtask: SubtaskIndex,
        generation: Generation,
        restored_states: Vec<MemoryWriterState<T>>,
    ) -> MemoryWriter<T> {
        let next_transaction_seq = restored_states
            .iter()
            .map(|state| state.next_transaction_seq)
            .max()
            .unwrap_or(0);
        let buffered = restored_states
            .into_iter()
            .flat_map(|state| state.buffered)
            .collect();
        MemoryWriter {
            store,
            subtask,
            generation,
            lineage: String::new(),
            next_transaction_seq,
            open_transaction: None,
            rolled: Vec::new(),
            roll_every: None,
            buffered,
            phase: InputPhase::Running,
            background_durability: false,
            not_durable: Vec::new(),
            advances: Vec::new(),
        }
    }

    /// Prepared transactions become durable only when the future of
    /// [`SinkWriter::durability`] resolves (a few polls later, as a
    /// background fsync would), and the store records a violation when one
    /// is committed before. Called by
    /// [`MemorySink::create_writer`](crate::MemorySink) when the sink was made
    /// with [`MemorySink::durable_in_background`](crate::MemorySink::durable_in_background).
    pub fn with_background_durability(mut self) -> MemoryWriter<T> {
        self.background_durability = true;
        self
    }

    /// The same writer, naming its transactions in the job's `lineage` as
    /// well, so that a run of the job on fresh checkpoint storage (whose
    /// generations start at 1 again) never repeats an earlier run's ids.
    /// Called by [`MemorySink::create_writer`](crate::MemorySink).
    pub fn in_lineage(mut self, lineage: &sink_api::Lineage) -> MemoryWriter<T> {
        self.lineage = lineage.to_string();
        self
    }

    /// Closes a transaction once it holds `records` records and opens the
    /// next, so that one checkpoint yields several committables (as a file
    /// sink rolls part files). Called by
    /// [`MemorySink::create_writer`](crate::MemorySink) when the sink was made
    /// with [`MemorySink::roll_every`](crate::MemorySink::roll_every).
    pub fn with_roll_every(mut self, records: usize) -> MemoryWriter<T> {
        self.roll_every = Some(records.max(1));
        self
    }

    /// The sequence number the next transaction would take.
    pub fn next_transaction_seq(&self) -> u64 {
        self.next_transaction_seq
    }

    /// Restored records not yet moved into a transaction.
    pub fn buffered(&self) -> &[T] {
        &self.buffered
    }

    /// The id of the open transaction, if one is open.
    pub fn open_transaction_id(&self) -> Option<String> {
        let index = self.open_transaction?;
        let state = self.store.lock();
        state
            .transactions
            .get(index)
            .map(|transaction| transaction.id.clone())
    }

    /// The subtask and generation, for messages.
    fn name(&self) -> String {
        format!("subtask {} (generation {})", self.subtask, self.generation)
    }
}

impl<T: Clone> MemoryWriter<T> {
    /// The open transaction's index, opening one (and moving restored records
    /// into it) if none is open.
    fn ensure_open_transaction(&mut self, state: &mut StoreState<T>) -> usize {
        if let Some(index) = self.open_transaction {
            return index;
        }
        if self.phase != InputPhase::Running {
            state.violation(format!(
                "{}: transaction opened after end of input (flush(end_of_input = true))",
                self.name()
            ));
        }
        let index = state.open_transaction(
            &self.lineage,
            self.generation,
            self.subtask,
            &mut self.next_transaction_seq,
        );
        self.open_transaction = Some(index);
        if !self.buffered.is_empty() {
            let restored = std::mem::take(&mut self.buffered);
            state.written.extend(restored.iter().cloned());
            state.transactions[index].records.extend(restored);
        }
        index
    }

    /// `write` and `write_batch`: one lock for the whole batch.
    fn write_records(&mut self, records: Vec<T>, call: WriteCall) {
        let store = self.store.clone();
        let mut state = store.lock();
        if state.failures.take_write_panic() {
            state.stats.injected_write_panics += 1;
            drop(state);
            panic!(
                "injected panic in a write of {} (armed with MemoryStore::panic_next_writes)",
                self.name()
            );
        }
        match call {
            WriteCall::Single => state.stats.write_calls += 1,
            WriteCall::Batch => state.stats.write_batch_calls += 1,
        }
        self.store
            .counters
            .records_written
            .add(records.len() as u64);
        if self.phase != InputPhase::Running {
            state.violation(format!(
                "{}: write of {} record(s) after flush(end_of_input = true)",
                self.name(),
                records.len()
            ));
        }
        state.written.extend(records.iter().cloned());
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let index = self.ensure_open_transaction(&mut state);
            let transaction = &mut state.transactions[index];
            let room = match self.roll_every {
                Some(limit) => limit.saturating_sub(transaction.records.len()),
                None => usize::MAX,
            };
            transaction.records.extend(records.by_ref().take(room));
            if self
                .roll_every
                .is_some_and(|limit| transaction.records.len() >= limit)
            {
                self.rolled.extend(self.open_transaction.take());
            }
        }
    }
}

#[async_trait]
impl<T> SinkWriter for MemoryWriter<T>
where
    T: Clone + Send + Sync + 'static + Serialize + DeserializeOwned,
{
    type Input = T;
    type Committable = MemoryCommittable;
    type State = MemoryWriterState<T>;

    /// Appends `record` to the open transaction, opening one if needed.
    async fn write(&mut self, record: T) -> Result<(), SinkError> {
        self.write_records(vec![record], WriteCall::Single);
        Ok(())
    }

    /// Appends `records` to the open transaction under a single lock.
    async fn write_batch(&mut self, records: Vec<T>) -> Result<(), SinkError> {
        self.write_records(records, WriteCall::Batch);
        Ok(())
    }

    /// Counts the flush; at end of input, remembers it so that later writes
    /// and transactions are reported. Restored records still buffered are
    /// moved into a transaction here.
    /// Keeps the advances for the coming `prepare_commit`, whose
    /// transactions then commit as one group with them.
    fn carry_positions(
        &mut self,
        advances: Vec<sink_api::PositionAdvance>,
    ) -> Result<(), SinkError> {
        self.advances = advances;
        Ok(())
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        let store = self.store.clone();
        let mut state = store.lock();
        state.stats.flush_calls += 1;
        if !self.buffered.is_empty() {
            self.ensure_open_transaction(&mut state);
        }
        if end_of_input {
            state.stats.end_of_input_flushes += 1;
            if self.phase != InputPhase::Running {
                state.violation(format!(
                    "{}: flush(end_of_input = true) called more than once",
                    self.name()
                ));
            } else {
                self.phase = InputPhase::EndFlushed;
            }
        }
        Ok(())
    }

    /// Prepares the open transaction and returns its committable, or returns
    /// nothing if no record was written since the last call.
    ///
    /// # Errors
    ///
    /// Fails only when a failure was armed with
    /// [`MemoryStore::fail_next_prepare_commits`]; the open transaction then
    /// stays open.
    async fn prepare_commit(
        &mut self,
        _checkpoint_id: sink_api::CheckpointId,
    ) -> Result<Vec<MemoryCommittable>, SinkError> {
        let store = self.store.clone();
        let mut state = store.lock();
        state.stats.prepare_commit_calls += 1;
        if self.phase == InputPhase::EndPrepared {
            state.violation(format!(
                "{}: prepare_commit called again after the end-of-input prepare_commit",
                self.name()
            ));
        }
        if state.failures.take_prepare_commit_failure() {
            state.stats.injected_prepare_commit_failures += 1;
            return Err(SinkError::msg(format!(
                "injected prepare_commit failure on {} \
                 (armed with MemoryStore::fail_next_prepare_commits)",
                self.name()
            )));
        }
        if self.phase == InputPhase::EndFlushed {
            self.phase = InputPhase::EndPrepared;
        }
        let advances = std::mem::take(&mut self.advances);
        if !advances.is_empty() && self.rolled.is_empty() && self.open_transaction.is_none() {
            // Positions moved without records (offsets skipped): an empty
            // transaction carries them, at end of input too (it holds no
            // record, so it is no transaction after the end).
            let index = state.open_transaction(
                &self.lineage,
                self.generation,
                self.subtask,
                &mut self.next_transaction_seq,
            );
            self.open_transaction = Some(index);
        }
        let mut prepared: Vec<usize> = std::mem::take(&mut self.rolled);
        prepared.extend(self.open_transaction.take());
        if !advances.is_empty() {
            // Committed as one, with the positions: see `commit_group`.
            state.group(prepared.clone(), advances);
        }
        let background = self.background_durability;
        if background {
            self.not_durable.extend(&prepared);
        }
        Ok(prepared
            .into_iter()
            .map(|index| {
                let transaction = &mut state.transactions[index];
                transaction.state = crate::TransactionState::Prepared;
                transaction.durable = !background;
                MemoryCommittable {
                    transaction_id: transaction.id.clone(),
                    record_count: transaction.records.len() as u64,
                }
            })
            .collect())
    }

    /// Returns one state with the next transaction number (and any restored
    /// records not yet moved into a transaction).
    async fn snapshot_state(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<MemoryWriterState<T>>, SinkError> {
        let store = self.store.clone();
        let mut state = store.lock();
        state.stats.snapshot_state_calls += 1;
        if let Some(&index) = self.open_transaction.as_ref().or(self.rolled.first()) {
            // Its records are in neither a committable nor this state: a
            // restore from this checkpoint would lose them.
            let message = format!(
                "{}: snapshot_state({checkpoint_id}) with transaction {} still open \
                 (prepare_commit must come first)",
                self.name(),
                state.transactions[index].id
            );
            state.violation(message);
        }
        Ok(vec![MemoryWriterState {
            next_transaction_seq: self.next_transaction_seq,
            buffered: self.buffered.clone(),
        }])
    }

    /// With background durability: the transactions prepared since the
    /// last call become durable a few polls later.
    fn durability(&mut self, _checkpoint_id: CheckpointId) -> Option<Durability> {
        if self.not_durable.is_empty() {
            return None;
        }
        Some(Box::pin(Later {
            store: self.store.clone(),
            transactions: std::mem::take(&mut self.not_durable),
            polls_left: 3,
        }))
    }

    /// Aborts the open, unprepared transaction, if any. Prepared transactions
    /// stay prepared: their committables may still be committed.
    async fn close(&mut self) -> Result<(), SinkError> {
        let store = self.store.clone();
        let mut state = store.lock();
        state.stats.closes += 1;
        for index in self.rolled.drain(..).chain(self.open_transaction.take()) {
            state.transactions[index].state = crate::TransactionState::Aborted;
            state.stats.transactions_aborted += 1;
        }
        self.buffered.clear();
        Ok(())
    }
}

/// The memory writer's durability work: pending for a few polls (waking
/// itself), then marks its transactions durable.
struct Later<T> {
    store: MemoryStore<T>,
    transactions: Vec<usize>,
    polls_left: u8,
}

impl<T> Future for Later<T> {
    type Output = Result<(), SinkError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polls_left > 0 {
            self.polls_left -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let mut state = self.store.lock();
        for &index in &self.transactions {
            if let Some(transaction) = state.transactions.get_mut(index) {
                transaction.durable = true;
            }
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use sink_api::{CheckpointId, Generation, SinkWriter};

    use super::*;
    use crate::{MemoryStore, TransactionState};

    fn writer(store: &MemoryStore<u32>, subtask: usize, generation: u64) -> MemoryWriter<u32> {
        MemoryWriter::new(store.clone(), subtask, Generation(generation), Vec::new())
    }

    #[tokio::test]
    async fn transactions_open_lazily_and_are_numbered_per_writer() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 3, 7);

        assert_eq!(
            writer
                .prepare_commit(sink_api::CheckpointId(1))
                .await
                .unwrap(),
            Vec::new()
        );
        writer.write(1).await.unwrap();
        assert_eq!(writer.open_transaction_id().as_deref(), Some("g7-s3-t0"));
        let first = writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        writer.write_batch(vec![2, 3]).await.unwrap();
        let second = writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();

        assert_eq!(
            first,
            vec![MemoryCommittable {
                transaction_id: "g7-s3-t0".into(),
                record_count: 1
            }]
        );
        assert_eq!(
            second,
            vec![MemoryCommittable {
                transaction_id: "g7-s3-t1".into(),
                record_count: 2
            }]
        );
        let stats = store.stats();
        assert_eq!(stats.transactions_opened, 2);
        assert_eq!(stats.prepare_commit_calls, 3);
        assert_eq!(stats.write_calls, 1);
        assert_eq!(stats.write_batch_calls, 1);
        assert_eq!(stats.records_written, 3);
        assert_eq!(store.written(), vec![1, 2, 3]);
        assert_eq!(store.pending(), vec![1, 2, 3]);
        assert!(store.committed().is_empty());
        assert!(store.violations().is_empty());
    }

    #[tokio::test]
    async fn the_end_of_input_sequence_is_clean() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 0, 1);
        writer.write(1).await.unwrap();
        writer.flush(false).await.unwrap();
        writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        writer.snapshot_state(CheckpointId(1)).await.unwrap();
        writer.write(2).await.unwrap();
        writer.flush(true).await.unwrap();
        assert_eq!(
            writer
                .prepare_commit(sink_api::CheckpointId(1))
                .await
                .unwrap()
                .len(),
            1
        );
        // A later checkpoint snapshots an empty writer.
        writer.snapshot_state(CheckpointId(2)).await.unwrap();
        writer.close().await.unwrap();

        let stats = store.stats();
        assert_eq!(stats.flush_calls, 2);
        assert_eq!(stats.end_of_input_flushes, 1);
        assert_eq!(stats.closes, 1);
        assert_eq!(stats.transactions_aborted, 0);
        assert!(store.violations().is_empty(), "{:?}", store.violations());
    }

    #[tokio::test]
    async fn a_write_after_end_of_input_is_a_violation() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 1, 1);
        writer.flush(true).await.unwrap();
        writer.write(9).await.unwrap();

        let violations = store.violations();
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("subtask 1"), "{violations:?}");
        assert!(violations[0].contains("write of 1 record(s) after flush(end_of_input = true)"));
        assert!(violations[1].contains("transaction opened after end of input"));
    }

    #[tokio::test]
    async fn a_second_prepare_commit_after_end_of_input_is_a_violation() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 0, 1);
        writer.write(1).await.unwrap();
        writer.flush(true).await.unwrap();
        writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        assert!(store.violations().is_empty());

        assert_eq!(
            writer
                .prepare_commit(sink_api::CheckpointId(1))
                .await
                .unwrap(),
            Vec::new()
        );
        let violations = store.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("subtask 0"));
        assert!(violations[0].contains("prepare_commit called again after the end-of-input"));
    }

    #[tokio::test]
    async fn a_snapshot_with_an_open_transaction_is_a_violation() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 0, 1);
        writer.write(1).await.unwrap();
        writer.snapshot_state(CheckpointId(4)).await.unwrap();
        let violations = store.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("snapshot_state(4) with transaction g1-s0-t0 still open"));
    }

    #[tokio::test]
    async fn restore_takes_the_largest_sequence_and_concatenates_buffers() {
        let store = MemoryStore::new();
        let states = vec![
            MemoryWriterState {
                next_transaction_seq: 4,
                buffered: vec![1],
            },
            MemoryWriterState {
                next_transaction_seq: 9,
                buffered: vec![2, 3],
            },
        ];
        let mut writer = MemoryWriter::new(store.clone(), 0, Generation(2), states);
        assert_eq!(writer.next_transaction_seq(), 9);
        assert_eq!(writer.buffered(), &[1, 2, 3]);
        assert_eq!(
            writer.snapshot_state(CheckpointId(5)).await.unwrap(),
            vec![MemoryWriterState {
                next_transaction_seq: 9,
                buffered: vec![1, 2, 3]
            }]
        );

        // Restored records go first into the next transaction.
        writer.write(4).await.unwrap();
        let committables = writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        assert_eq!(
            committables,
            vec![MemoryCommittable {
                transaction_id: "g2-s0-t9".into(),
                record_count: 4
            }]
        );
        assert_eq!(store.pending(), vec![1, 2, 3, 4]);
        assert_eq!(
            writer.snapshot_state(CheckpointId(6)).await.unwrap(),
            vec![MemoryWriterState {
                next_transaction_seq: 10,
                buffered: Vec::new()
            }]
        );
        assert!(store.violations().is_empty(), "{:?}", store.violations());
    }

    #[tokio::test]
    async fn close_aborts_the_open_transaction_but_not_prepared_ones() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 0, 1);
        writer.write(1).await.unwrap();
        writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        writer.write(2).await.unwrap();
        writer.close().await.unwrap();

        assert_eq!(
            store.transactions(),
            vec![
                ("g1-s0-t0".to_owned(), TransactionState::Prepared),
                ("g1-s0-t1".to_owned(), TransactionState::Aborted),
            ]
        );
        assert_eq!(store.stats().transactions_aborted, 1);
        assert_eq!(store.pending(), vec![1]);
        assert_eq!(store.written(), vec![1, 2]);
    }

    #[tokio::test]
    async fn an_injected_prepare_commit_failure_leaves_the_transaction_open() {
        let store = MemoryStore::new();
        let mut writer = writer(&store, 0, 1);
        writer.write(1).await.unwrap();
        store.fail_next_prepare_commits(1);

        let err = writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("injected prepare_commit failure"),
            "{err}"
        );
        assert_eq!(
            store.transaction_state("g1-s0-t0"),
            Some(TransactionState::Open)
        );
        assert_eq!(store.stats().injected_prepare_commit_failures, 1);

        // Fired once: the next call prepares.
        assert_eq!(
            writer
                .prepare_commit(sink_api::CheckpointId(1))
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            store.transaction_state("g1-s0-t0"),
            Some(TransactionState::Prepared)
        );
    }

    #[tokio::test]
    async fn a_reused_transaction_id_is_a_violation_and_gets_a_fresh_id() {
        let store = MemoryStore::new();
        let mut first = writer(&store, 0, 1);
        let mut second = writer(&store, 0, 1);
        first.write(1).await.unwrap();
        second.write(2).await.unwrap();

        assert_eq!(second.open_transaction_id().as_deref(), Some("g1-s0-t1"));
        let violations = store.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("g1-s0-t0 already exists"));
    }

    #[tokio::test]
    async fn rolling_yields_one_committable_per_full_transaction() {
        let store = MemoryStore::<u32>::new();
        let mut writer =
            MemoryWriter::new(store.clone(), 0, Generation(1), Vec::new()).with_roll_every(2);
        writer.write_batch(vec![1, 2, 3, 4, 5]).await.unwrap();
        writer.flush(false).await.unwrap();
        let committables = writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap();
        let counts: Vec<u64> = committables.iter().map(|c| c.record_count).collect();
        assert_eq!(counts, vec![2, 2, 1]);
        writer.snapshot_state(CheckpointId(1)).await.unwrap();
        assert!(store.violations().is_empty(), "{:?}", store.violations());
        assert_eq!(store.pending(), vec![1, 2, 3, 4, 5]);
    }
}
