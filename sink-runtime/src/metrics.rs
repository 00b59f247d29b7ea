//! Counters a caller can read at any time while a job runs, and after.
//!
//! Every task updates shared atomic counters; [`Metrics::snapshot`] copies
//! them into a plain [`MetricsSnapshot`]. Counters only grow, except the two
//! gauges (`committables_pending`, `last_checkpoint_duration_ms`).

use std::sync::atomic::{AtomicU64, Ordering};

/// A copy of a job's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Records handed to writers.
    pub records_written: u64,
    /// Records whose checkpoint's commit finished (committed, already
    /// committed, or dropped with a known reason).
    pub records_committed: u64,
    /// Records written but not committed: `records_written - records_committed`.
    /// Stays above zero for good when uncommitted output was allowed.
    pub records_uncommitted: u64,
    /// Calls of `SinkWriter::prepare_commit`, over all subtasks.
    pub prepare_commit_calls: u64,
    /// Calls of `Committer::commit`, retries included.
    pub commit_calls: u64,
    /// Committables waiting for a commit now, over all subtasks.
    pub committables_pending: u64,
    /// Commit requests that ended committed.
    pub commits_succeeded: u64,
    /// Commit requests that ended already committed (replays).
    pub commits_already_committed: u64,
    /// Commit requests retried.
    pub commits_retried: u64,
    /// Commit requests that failed with a known reason and were dropped.
    pub commits_failed: u64,
    /// Checkpoints triggered.
    pub checkpoints_triggered: u64,
    /// Checkpoints completed.
    pub checkpoints_completed: u64,
    /// Checkpoints that failed (timeout, storage error).
    pub checkpoints_failed: u64,
    /// Checkpoints abandoned without failing: subsumed by a newer completion,
    /// or still in flight when the final checkpoint completed.
    pub checkpoints_aborted: u64,
    /// How long the last completed checkpoint took from trigger to
    /// completion, in milliseconds.
    pub last_checkpoint_duration_ms: u64,
    /// Checkpoints the global committer acted on.
    pub global_commits: u64,
    /// Restarts after a failure.
    pub restarts: u64,
}

/// A job's live counters, shared by its tasks.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) records_written: AtomicU64,
    pub(crate) records_committed: AtomicU64,
    pub(crate) prepare_commit_calls: AtomicU64,
    pub(crate) commit_calls: AtomicU64,
    pub(crate) committables_pending: AtomicU64,
    pub(crate) commits_succeeded: AtomicU64,
    pub(crate) commits_already_committed: AtomicU64,
    pub(crate) commits_retried: AtomicU64,
    pub(crate) commits_failed: AtomicU64,
    pub(crate) checkpoints_triggered: AtomicU64,
    pub(crate) checkpoints_completed: AtomicU64,
    pub(crate) checkpoints_failed: AtomicU64,
    pub(crate) checkpoints_aborted: AtomicU64,
    pub(crate) last_checkpoint_duration_ms: AtomicU64,
    pub(crate) global_commits: AtomicU64,
    pub(crate) restarts: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}

/// Lowers a gauge, never below zero (a bookkeeping slip must not wrap it to
/// an absurd value).
pub(crate) fn sub(counter: &AtomicU64, amount: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |value| {
        Some(value.saturating_sub(amount))
    });
}

impl Metrics {
    /// Copies the counters. Called by [`JobHandle::metrics`](crate::JobHandle::metrics)
    /// and at the end of a job.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let records_written = get(&self.records_written);
        let records_committed = get(&self.records_committed);
        MetricsSnapshot {
            records_written,
            records_committed,
            records_uncommitted: records_written.saturating_sub(records_committed),
            prepare_commit_calls: get(&self.prepare_commit_calls),
            commit_calls: get(&self.commit_calls),
            committables_pending: get(&self.committables_pending),
            commits_succeeded: get(&self.commits_succeeded),
            commits_already_committed: get(&self.commits_already_committed),
            commits_retried: get(&self.commits_retried),
            commits_failed: get(&self.commits_failed),
            checkpoints_triggered: get(&self.checkpoints_triggered),
            checkpoints_completed: get(&self.checkpoints_completed),
            checkpoints_failed: get(&self.checkpoints_failed),
            checkpoints_aborted: get(&self.checkpoints_aborted),
            last_checkpoint_duration_ms: get(&self.last_checkpoint_duration_ms),
            global_commits: get(&self.global_commits),
            restarts: get(&self.restarts),
        }
    }
}
