//! The shared store: the "external transactional system" the memory sink
//! writes to, with its counters, its contract checks and its views.
//!
//! A [`MemoryStore`] plays the part of a database with prepared transactions.
//! It is a cheap, cloneable handle to state behind one [`std::sync::Mutex`];
//! every clone sees the same state. Because the store lives outside the job, a
//! test keeps it across job restarts in the same process, exactly as a real
//! database outlives the jobs that write to it.
//!
//! # Transactions
//!
//! ```text
//!                      prepare_commit               Committer::commit
//!  first write ─▶ Open ──────────────▶ Prepared ───────────────────▶ Committed
//!                  │                                 (records appended to the
//!                  │ SinkWriter::close                committed log, once)
//!                  ▼
//!               Aborted
//! ```
//!
//! Records are visible to readers ([`MemoryStore::committed`]) only once their
//! transaction is committed. A prepared transaction survives the writer that
//! prepared it, because its committable may be committed after a restart.
//!
//! # Contract checks
//!
//! The store notices calls the commit contract forbids (a write after end of
//! input, a transaction opened after end of input, a global commit after
//! `end_of_input`, …). It never panics on them: it records a human-readable
//! message in [`MemoryStore::violations`], which every exactly-once test
//! asserts is empty.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sink_api::{CheckpointId, Counter, Generation, SinkMetrics, SubtaskIndex};

use crate::failure::FailurePlan;
use crate::MemoryCommittable;

/// Where a transaction of the store is in its life. Read by tests through
/// [`MemoryStore::transaction_state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionState {
    /// Opened by a writer, receiving records; not visible.
    Open,
    /// Closed by `prepare_commit`; its committable is on its way to a
    /// committer. Not visible yet, but it survives the writer.
    Prepared,
    /// Committed: its records are in the committed log.
    Committed,
    /// Aborted by the writer's `close` before it was prepared; its records are
    /// gone for good.
    Aborted,
}

/// Counters of every call the store saw. A snapshot is returned by
/// [`MemoryStore::stats`]; compare it field by field or as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Records handed to `write` and `write_batch`.
    pub records_written: u64,
    /// Calls of `SinkWriter::write`.
    pub write_calls: u64,
    /// Calls of `SinkWriter::write_batch`.
    pub write_batch_calls: u64,
    /// Calls of `SinkWriter::flush`, whatever `end_of_input` was.
    pub flush_calls: u64,
    /// Calls of `SinkWriter::flush(true)`.
    pub end_of_input_flushes: u64,
    /// Calls of `SinkWriter::prepare_commit`, including injected failures.
    pub prepare_commit_calls: u64,
    /// Calls of `SinkWriter::snapshot_state`.
    pub snapshot_state_calls: u64,
    /// Transactions opened by writers.
    pub transactions_opened: u64,
    /// Open transactions aborted by a writer's `close`.
    pub transactions_aborted: u64,
    /// Calls of `Committer::commit`, including injected failures.
    pub commit_calls: u64,
    /// Commit requests received, including those of failed calls.
    pub commit_requests: u64,
    /// Transactions moved from prepared to committed.
    pub committed_transactions: u64,
    /// Records that became visible with those transactions.
    pub committed_records: u64,
    /// Requests for a transaction that was already committed (signalled as
    /// already committed; nothing duplicated).
    pub replays: u64,
    /// Writes that panicked on purpose ([`MemoryStore::panic_next_writes`]).
    pub injected_write_panics: u64,
    /// Requests ended with an injected `RetryLater`.
    pub injected_retry_later: u64,
    /// Requests ended with an injected known-reason failure.
    pub injected_known_failures: u64,
    /// Requests ended with an injected unknown-reason failure.
    pub injected_unknown_failures: u64,
    /// `prepare_commit` calls failed by injection.
    pub injected_prepare_commit_failures: u64,
    /// `Committer::commit` calls failed by injection.
    pub injected_commit_call_failures: u64,
    /// Requests for a transaction that was neither prepared nor committed
    /// (signalled as failed with a known reason).
    pub known_failures: u64,
    /// Calls of `GlobalCommitter::commit_checkpoint`.
    pub global_commit_calls: u64,
    /// Checkpoints delivered to the global committer a second time.
    pub global_replays: u64,
    /// Writers created by `Sink::create_writer`.
    pub writers_created: u64,
    /// Committers created by `Sink::create_committer`.
    pub committers_created: u64,
    /// Calls of `SinkWriter::close`.
    pub closes: u64,
    /// Calls of `Committer::close`.
    pub committer_closes: u64,
}

/// The shared, in-process transactional store every memory writer, committer
/// and global committer writes to.
///
/// Created by a test with [`MemoryStore::new`], cloned into a
/// [`MemorySink`](crate::MemorySink) (and a
/// [`MemoryGlobalCommitter`](crate::MemoryGlobalCommitter)), and kept by the
/// test to inspect afterwards. Clones share state. Every view returns a
/// snapshot: a copy taken under the lock, consistent at that instant.
///
/// A panic in another thread while it held the lock does not make the store
/// unusable: the state is read as it was left.
pub struct MemoryStore<T> {
    inner: Arc<Mutex<StoreState<T>>>,
    /// The counters the sink registers in the job's metrics; the rest of
    /// [`MemoryStats`] lives behind the lock.
    pub(crate) counters: Arc<StoreCounters>,
}

/// The store's counters that the job's metrics show (`memory_sink_*`), kept
/// as `sink_api::Counter`s and copied into [`MemoryStats`] snapshots.
#[derive(Debug, Default)]
pub(crate) struct StoreCounters {
    pub(crate) records_written: Counter,
    pub(crate) committed_transactions: Counter,
    pub(crate) committed_records: Counter,
    pub(crate) replays: Counter,
}

impl StoreCounters {
    /// Registers the counters in the job's registry. Called by the sink at
    /// every start.
    pub(crate) fn register(&self, metrics: &SinkMetrics) {
        let counters = [
            (
                "memory_sink_records_written",
                "Records handed to the in-memory writers.",
                &self.records_written,
            ),
            (
                "memory_sink_committed_transactions",
                "Transactions moved from prepared to committed.",
                &self.committed_transactions,
            ),
            (
                "memory_sink_committed_records",
                "Records that became visible with those transactions.",
                &self.committed_records,
            ),
            (
                "memory_sink_replays",
                "Commit requests for transactions already committed.",
                &self.replays,
            ),
        ];
        metrics.register_all(counters);
    }
}

/// One transaction of the store.
#[derive(Debug)]
pub(crate) struct Transaction<T> {
    pub(crate) id: String,
    pub(crate) state: TransactionState,
    pub(crate) records: Vec<T>,
    /// False while a prepared transaction waits for the durability work of
    /// its checkpoint (see [`MemorySink::durable_in_background`]): a commit
    /// then is a breach of the runtime's contract.
    ///
    /// [`MemorySink::durable_in_background`]: crate::MemorySink::durable_in_background
    pub(crate) durable: bool,
    /// The position group it belongs to (index in `StoreState::groups`):
    /// the transactions one writer prepared at one checkpoint with the
    /// source positions they advance, committed as one.
    pub(crate) group: Option<usize>,
}

/// The transactions one writer prepared at one checkpoint, with the source
/// positions their records advance: committed all at once with the
/// positions, or superseded all at once (see the `positions` module of
/// `sink-api`).
#[derive(Debug)]
pub(crate) struct PositionGroup {
    pub(crate) members: Vec<usize>,
    pub(crate) advances: Vec<sink_api::PositionAdvance>,
}

/// What the global committer received, and what it made of it.
#[derive(Debug)]
pub(crate) struct GlobalLog<T> {
    /// Checkpoints in the order they were first delivered.
    pub(crate) checkpoints: Vec<CheckpointId>,
    /// The committables delivered per checkpoint (first delivery).
    pub(crate) committables: BTreeMap<CheckpointId, Vec<MemoryCommittable>>,
    /// Transactions whose records are already in `records`.
    pub(crate) transactions: HashSet<String>,
    /// Records of every delivered transaction, in delivery order.
    pub(crate) records: Vec<T>,
    /// Whether `end_of_input` was called.
    pub(crate) end_of_input: bool,
}

impl<T> Default for GlobalLog<T> {
    fn default() -> GlobalLog<T> {
        GlobalLog {
            checkpoints: Vec::new(),
            committables: BTreeMap::new(),
            transactions: HashSet::new(),
            records: Vec::new(),
            end_of_input: false,
        }
    }
}

/// Everything behind the store's lock. Writers, committers and the global
/// committer change it in place, each call under one lock.
#[derive(Debug)]
pub(crate) struct StoreState<T> {
    /// Every transaction ever opened, in opening order.
    pub(crate) transactions: Vec<Transaction<T>>,
    /// Transaction id → index in `transactions`.
    pub(crate) index: HashMap<String, usize>,
    /// Every record that entered a transaction, in write order.
    pub(crate) written: Vec<T>,
    /// Records of committed transactions, in commit order.
    pub(crate) committed: Vec<T>,
    pub(crate) stats: MemoryStats,
    pub(crate) violations: Vec<String>,
    /// Per checkpoint: committables newly committed.
    pub(crate) commits_per_checkpoint: BTreeMap<CheckpointId, u64>,
    /// Per transaction: how often a commit of it was replayed.
    pub(crate) replays_per_transaction: BTreeMap<String, u64>,
    pub(crate) failures: FailurePlan,
    pub(crate) global: GlobalLog<T>,
    /// Source positions, moved only by the commit of a position group.
    pub(crate) positions: sink_api::PositionTable,
    pub(crate) groups: Vec<PositionGroup>,
    /// Commit requests superseded: their positions had moved.
    pub(crate) superseded: u64,
    /// A flaw to show the kit catches it; `None`: correct.
    pub(crate) position_flaw: Option<PositionFlaw>,
}

/// How the store can be told to keep source positions wrongly, to show that
/// the conformance kit's hand-over scenarios catch sinks that do so. Set
/// with [`MemoryStore::flaw_positions`]; never in a real job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionFlaw {
    /// The destination answers no positions and checks none: as a sink
    /// that keeps them only in the job's checkpoints, so that a new owner
    /// reads every split from its start.
    NotInDestination,
    /// Commits apply their positions without checking where the splits
    /// are: an old owner's commit lands after a new owner's.
    Unchecked,
}

impl<T> Default for StoreState<T> {
    fn default() -> StoreState<T> {
        StoreState {
            transactions: Vec::new(),
            index: HashMap::new(),
            written: Vec::new(),
            committed: Vec::new(),
            stats: MemoryStats::default(),
            violations: Vec::new(),
            commits_per_checkpoint: BTreeMap::new(),
            replays_per_transaction: BTreeMap::new(),
            failures: FailurePlan::default(),
            global: GlobalLog::default(),
            positions: sink_api::PositionTable::new(),
            groups: Vec::new(),
            superseded: 0,
            position_flaw: None,
        }
    }
}

impl<T> StoreState<T> {
    /// Records a broken contract. Never panics: tests read them afterwards.
    pub(crate) fn violation(&mut self, message: String) {
        self.violations.push(message);
    }

    /// Opens a new transaction for `subtask` of `generation`, numbered from
    /// `*next_seq`, and returns its index. Advances `*next_seq` past the id
    /// used.
    pub(crate) fn open_transaction(
        &mut self,
        lineage: &str,
        generation: Generation,
        subtask: SubtaskIndex,
        next_seq: &mut u64,
    ) -> usize {
        let mut id = transaction_id(lineage, generation, subtask, *next_seq);
        if self.index.contains_key(&id) {
            // Two writers with the same generation and subtask: a runtime that
            // did not increment the generation on restart. Keep going with a
            // fresh id so that no data is mixed, but say so.
            self.violation(format!(
                "subtask {subtask} (generation {generation}): transaction id {id} \
                 already exists; was the generation not incremented on restart?"
            ));
            while self.index.contains_key(&id) {
                *next_seq += 1;
                id = transaction_id(lineage, generation, subtask, *next_seq);
            }
        }
        *next_seq += 1;
        let index = self.transactions.len();
        self.index.insert(id.clone(), index);
        self.transactions.push(Transaction {
            id,
            state: TransactionState::Open,
            records: Vec::new(),
            durable: true,
            group: None,
        });
        self.stats.transactions_opened += 1;
        index
    }

    /// The transaction called `id`, if it was ever opened.
    pub(crate) fn transaction_mut(&mut self, id: &str) -> Option<&mut Transaction<T>> {
        let index = *self.index.get(id)?;
        self.transactions.get_mut(index)
    }

    /// Makes the transactions `members` one position group carrying
    /// `advances`. Called by a writer's `prepare_commit` after
    /// `carry_positions`.
    pub(crate) fn group(&mut self, members: Vec<usize>, advances: Vec<sink_api::PositionAdvance>) {
        let group = self.groups.len();
        for member in &members {
            if let Some(transaction) = self.transactions.get_mut(*member) {
                transaction.group = Some(group);
            }
        }
        self.groups.push(PositionGroup { members, advances });
    }

    /// The transaction called `id`, if it was ever opened.
    pub(crate) fn transaction(&self, id: &str) -> Option<&Transaction<T>> {
        let index = *self.index.get(id)?;
        self.transactions.get(index)
    }
}

/// The id of the `seq`-th transaction of `subtask` in `generation` of
/// `lineage`: `{lineage}-g{generation}-s{subtask}-t{seq}` (without the
/// lineage when it is empty). Unique across writers (subtask), job starts
/// (generation) and runs on fresh checkpoint storage (lineage).
pub(crate) fn transaction_id(
    lineage: &str,
    generation: Generation,
    subtask: SubtaskIndex,
    seq: u64,
) -> String {
    match lineage {
        "" => format!("g{generation}-s{subtask}-t{seq}"),
        lineage => format!("{lineage}-g{generation}-s{subtask}-t{seq}"),
    }
}

impl<T> MemoryStore<T> {
    /// An empty store: no transactions, no records, every counter at zero.
    /// Called by tests, once per scenario; clone it to share it.
    pub fn new() -> MemoryStore<T> {
        MemoryStore {
            inner: Arc::new(Mutex::new(StoreState::default())),
            counters: Arc::default(),
        }
    }

    /// Locks the state. A poisoned lock (a panic elsewhere while it was held)
    /// is entered anyway: the oracle must stay readable after a failed test
    /// thread.
    pub(crate) fn lock(&self) -> MutexGuard<'_, StoreState<T>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> MemoryStats {
        let counters = &self.counters;
        MemoryStats {
            records_written: counters.records_written.get(),
            committed_transactions: counters.committed_transactions.get(),
            committed_records: counters.committed_records.get(),
            replays: counters.replays.get(),
            ..self.lock().stats.clone()
        }
    }

    /// Every broken contract the store noticed, in order, each naming the
    /// subtask (or the global committer) that broke it. Empty in a correct
    /// run: exactly-once tests assert so.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Per transaction, how often its commit was replayed (committed again
    /// after it had been committed): what a crash between a commit and the
    /// checkpoint recording it costs.
    pub fn replays_per_transaction(&self) -> BTreeMap<String, u64> {
        self.lock().replays_per_transaction.clone()
    }

    /// Per checkpoint, how many committables were newly committed (replays
    /// and failures excluded). Checkpoints with no commit are absent.
    pub fn commits_per_checkpoint(&self) -> BTreeMap<CheckpointId, u64> {
        self.lock().commits_per_checkpoint.clone()
    }

    /// The state of transaction `transaction_id`, or `None` if no writer of
    /// this store ever opened it.
    pub fn transaction_state(&self, transaction_id: &str) -> Option<TransactionState> {
        self.lock()
            .transaction(transaction_id)
            .map(|transaction| transaction.state)
    }

    /// Every transaction ever opened, in opening order, with its state.
    pub fn transactions(&self) -> Vec<(String, TransactionState)> {
        self.lock()
            .transactions
            .iter()
            .map(|transaction| (transaction.id.clone(), transaction.state))
            .collect()
    }

    /// The checkpoints the global committer handled, in the order they were
    /// first delivered (a replayed checkpoint appears once).
    pub fn global_checkpoints(&self) -> Vec<CheckpointId> {
        self.lock().global.checkpoints.clone()
    }

    /// The committables the global committer received, per checkpoint, as
    /// first delivered.
    pub fn global_committables(&self) -> BTreeMap<CheckpointId, Vec<MemoryCommittable>> {
        self.lock().global.committables.clone()
    }

    /// Whether the global committer's `end_of_input` was called.
    pub fn global_end_of_input_called(&self) -> bool {
        self.lock().global.end_of_input
    }

    /// How many checkpoints were delivered to the global committer a second
    /// time (also in [`MemoryStats::global_replays`]).
    pub fn global_replays(&self) -> u64 {
        self.lock().stats.global_replays
    }
}

impl<T: Clone> MemoryStore<T> {
    /// Every record that entered a transaction, whatever became of it (open,
    /// prepared, committed or aborted), in write order.
    pub fn written(&self) -> Vec<T> {
        self.lock().written.clone()
    }

    /// Records of open or prepared transactions: written, not visible yet.
    /// In transaction opening order.
    pub fn pending(&self) -> Vec<T> {
        self.lock()
            .transactions
            .iter()
            .filter(|transaction| {
                matches!(
                    transaction.state,
                    TransactionState::Open | TransactionState::Prepared
                )
            })
            .flat_map(|transaction| transaction.records.iter().cloned())
            .collect()
    }

    /// The visible output: records of committed transactions, in commit order.
    /// Each committed transaction appears exactly once, whatever was replayed.
    pub fn committed(&self) -> Vec<T> {
        self.lock().committed.clone()
    }

    /// The source positions of `scope` the committed transactions moved
    /// (see [`Sink::committed_positions`](sink_api::Sink::committed_positions)).
    pub fn positions(&self, scope: &str) -> sink_api::CommittedPositions {
        self.lock().positions.scope(scope)
    }

    /// From now on, keeps source positions with `flaw`: only to show that a
    /// test catches it.
    pub fn flaw_positions(&self, flaw: PositionFlaw) {
        self.lock().position_flaw = Some(flaw);
    }

    /// Commit requests superseded so far: their source positions had moved
    /// (another owner committed those splits), so nothing of them was
    /// applied.
    pub fn superseded(&self) -> u64 {
        self.lock().superseded
    }

    /// The records of every transaction the global committer received, in
    /// delivery order, each transaction once.
    pub fn global_records(&self) -> Vec<T> {
        self.lock().global.records.clone()
    }
}

impl<T> Clone for MemoryStore<T> {
    /// Another handle to the same store.
    fn clone(&self) -> MemoryStore<T> {
        MemoryStore {
            inner: Arc::clone(&self.inner),
            counters: Arc::clone(&self.counters),
        }
    }
}

impl<T> Default for MemoryStore<T> {
    /// An empty store, as [`MemoryStore::new`].
    fn default() -> MemoryStore<T> {
        MemoryStore::new()
    }
}

impl<T> fmt::Debug for MemoryStore<T> {
    /// The counters and the number of transactions and violations, not the
    /// records.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryStore")
            .field("transactions", &state.transactions.len())
            .field("violations", &state.violations.len())
            .field("stats", &state.stats)
            .finish()
    }
}
