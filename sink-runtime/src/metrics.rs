//! Counters a caller can read at any time while a job runs, and after.
//!
//! Every task updates shared atomic counters; [`Metrics::snapshot`] copies
//! them into a plain [`MetricsSnapshot`]. Counters only grow, except the
//! gauges (`committables_pending`, `last_checkpoint_duration_ms`,
//! `checkpoints_failed_in_a_row`). Commits
//! that failed with a known reason are also kept with their reasons (the
//! first [`MAX_KEPT_FAILURES`]), so a report can say what was lost, not only
//! how much.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, CounterValue, SinkMetrics, SubtaskIndex};

/// How many known commit failures a job keeps with their reasons; the
/// counters go on counting past it.
pub const MAX_KEPT_FAILURES: usize = 100;

/// A committable that failed with a known reason and was dropped: output the
/// job will never deliver. Kept by the runtime for the job's report and its
/// handle, so that a loss is reported where the job's outcome is, not only in
/// a log line, and in the job's finished marker, so that a later start that
/// finds the job finished reports it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KnownCommitFailure {
    /// The checkpoint whose commit failed.
    pub checkpoint_id: CheckpointId,
    /// The subtask that committed it.
    pub subtask: SubtaskIndex,
    /// The committer's reason, naming what was lost.
    pub reason: String,
    /// Records lost with it, when the committer said how many (see
    /// `CommitRequest::signal_records_lost`).
    pub records_lost: Option<u64>,
}

impl KnownCommitFailure {
    /// A failure of the commit of `checkpoint_id` by `subtask`. Made by the
    /// runtime when a committer drops a committable with a known reason;
    /// public for tests and tools that build reports or finished markers.
    pub fn new(
        checkpoint_id: CheckpointId,
        subtask: SubtaskIndex,
        reason: impl Into<String>,
        records_lost: Option<u64>,
    ) -> KnownCommitFailure {
        KnownCommitFailure {
            checkpoint_id,
            subtask,
            reason: reason.into(),
            records_lost,
        }
    }
}

/// A copy of a job's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Records handed to writers.
    pub records_written: u64,
    /// Records whose checkpoint's commit finished (committed, already
    /// committed, or dropped with a known reason without a count of its
    /// records), less the records counted in `records_lost`.
    pub records_committed: u64,
    /// Records of commits that only replayed what was visible before (every
    /// committable of their checkpoint part was already committed): not
    /// counted in `records_committed`, which counts only what became
    /// visible now. Above zero outside a recovery, a sink's names repeat.
    pub records_replayed: u64,
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
    /// Commit requests that failed with a known reason and were dropped:
    /// their output is lost. Above zero, the job lost data.
    pub commits_failed: u64,
    /// Records lost with those failed requests, as far as their committers
    /// counted them (not included in `records_committed`).
    pub records_lost: u64,
    /// Commit requests superseded: their source positions had moved in the
    /// destination (another owner of a split committed its records), so
    /// nothing of them was applied; their records are not lost, they are
    /// the other owner's, or read again. A global committer's checkpoint
    /// that dropped such committables counts once.
    pub commits_superseded: u64,
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
    /// Checkpoints that failed since one last completed (a gauge, back to 0
    /// at every completion): above zero nothing new is committed, and past
    /// the checkpoint configuration's tolerance the job fails. What a health
    /// check reads to say a running job is degraded.
    pub checkpoints_failed_in_a_row: u64,
    /// Checkpoints the global committer acted on.
    pub global_commits: u64,
    /// Restarts after a failure.
    pub restarts: u64,
    /// The sink's and the source's own counters, registered through
    /// [`InitContext::metrics`](sink_api::InitContext::metrics),
    /// [`JobStart::metrics`](sink_api::JobStart::metrics) or
    /// [`SourceStart::metrics`](crate::source::SourceStart::metrics), by
    /// name.
    pub sink: Vec<CounterValue>,
    /// The job's own counters ([`JobCounter`](crate::JobCounter)), by
    /// name: each record counted once across restarts.
    pub counters: Vec<CounterValue>,
}

impl MetricsSnapshot {
    /// The value of the job counter named `name`
    /// ([`counters`](Self::counters)), if it is registered or counted.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.value)
    }
}

/// A job's live counters, shared by its tasks.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) records_written: AtomicU64,
    pub(crate) records_committed: AtomicU64,
    pub(crate) records_replayed: AtomicU64,
    pub(crate) prepare_commit_calls: AtomicU64,
    pub(crate) commit_calls: AtomicU64,
    pub(crate) committables_pending: AtomicU64,
    pub(crate) commits_succeeded: AtomicU64,
    pub(crate) commits_already_committed: AtomicU64,
    pub(crate) commits_retried: AtomicU64,
    pub(crate) commits_failed: AtomicU64,
    pub(crate) records_lost: AtomicU64,
    pub(crate) commits_superseded: AtomicU64,
    pub(crate) known_failures: Mutex<KnownFailures>,
    pub(crate) checkpoints_triggered: AtomicU64,
    pub(crate) checkpoints_completed: AtomicU64,
    pub(crate) checkpoints_failed: AtomicU64,
    pub(crate) checkpoints_aborted: AtomicU64,
    pub(crate) last_checkpoint_duration_ms: AtomicU64,
    pub(crate) checkpoints_failed_in_a_row: AtomicU64,
    pub(crate) global_commits: AtomicU64,
    pub(crate) restarts: AtomicU64,
    /// The sink's counters, handed to it in every context.
    pub(crate) sink: SinkMetrics,
    /// The job's own counters.
    pub(crate) counts: crate::counters::JobCounts,
}

/// How many reported failures are remembered to count each once.
const MAX_REMEMBERED_FAILURES: usize = 100_000;

/// The known commit failures reported so far.
#[derive(Debug, Default)]
pub(crate) struct KnownFailures {
    /// The first [`MAX_KEPT_FAILURES`], for the report.
    kept: Vec<KnownCommitFailure>,
    /// (checkpoint, reason) of every failure reported (up to
    /// [`MAX_REMEMBERED_FAILURES`]): a re-commit after an in-process restart
    /// meets the same failure again, which is one loss, not two.
    seen: HashSet<(CheckpointId, String)>,
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
    /// Records a known commit failure; returns false when this process
    /// reported the same one (checkpoint and reason) before, which the
    /// caller then does not count again. Called by the subtask tasks.
    pub(crate) fn record_failure(&self, failure: KnownCommitFailure) -> bool {
        let mut failures = self
            .known_failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (failure.checkpoint_id, failure.reason.clone());
        if failures.seen.contains(&key) {
            return false;
        }
        if failures.seen.len() < MAX_REMEMBERED_FAILURES {
            failures.seen.insert(key);
        }
        if failures.kept.len() < MAX_KEPT_FAILURES {
            failures.kept.push(failure);
        }
        true
    }

    /// The known commit failures so far, oldest first (at most
    /// [`MAX_KEPT_FAILURES`]; `commits_failed` counts them all). Called by
    /// [`JobHandle::known_failures`](crate::JobHandle::known_failures) and at
    /// the end of a job.
    pub fn known_failures(&self) -> Vec<KnownCommitFailure> {
        self.known_failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .kept
            .clone()
    }

    /// Copies the counters. Called by [`JobHandle::metrics`](crate::JobHandle::metrics)
    /// and at the end of a job.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let records_written = get(&self.records_written);
        let records_committed = get(&self.records_committed);
        MetricsSnapshot {
            records_written,
            records_committed,
            records_replayed: get(&self.records_replayed),
            records_uncommitted: records_written.saturating_sub(records_committed),
            prepare_commit_calls: get(&self.prepare_commit_calls),
            commit_calls: get(&self.commit_calls),
            committables_pending: get(&self.committables_pending),
            commits_succeeded: get(&self.commits_succeeded),
            commits_already_committed: get(&self.commits_already_committed),
            commits_retried: get(&self.commits_retried),
            commits_failed: get(&self.commits_failed),
            records_lost: get(&self.records_lost),
            commits_superseded: get(&self.commits_superseded),
            checkpoints_triggered: get(&self.checkpoints_triggered),
            checkpoints_completed: get(&self.checkpoints_completed),
            checkpoints_failed: get(&self.checkpoints_failed),
            checkpoints_aborted: get(&self.checkpoints_aborted),
            last_checkpoint_duration_ms: get(&self.last_checkpoint_duration_ms),
            checkpoints_failed_in_a_row: get(&self.checkpoints_failed_in_a_row),
            global_commits: get(&self.global_commits),
            restarts: get(&self.restarts),
            sink: self.sink.read(),
            counters: self.counts.read(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(checkpoint: u64, reason: &str) -> KnownCommitFailure {
        KnownCommitFailure {
            checkpoint_id: CheckpointId(checkpoint),
            subtask: 0,
            reason: reason.into(),
            records_lost: Some(3),
        }
    }

    #[test]
    fn a_failure_met_again_is_reported_once() {
        let metrics = Metrics::default();
        assert!(metrics.record_failure(failure(1, "file a is gone")));
        assert!(metrics.record_failure(failure(1, "file b is gone")));
        assert!(metrics.record_failure(failure(2, "file a is gone")));
        assert!(
            !metrics.record_failure(failure(1, "file a is gone")),
            "a re-commit after an in-process restart meets the same loss"
        );
        assert_eq!(metrics.known_failures().len(), 3);
    }

    #[test]
    fn only_the_first_failures_are_kept() {
        let metrics = Metrics::default();
        for i in 0..(MAX_KEPT_FAILURES as u64 + 10) {
            assert!(metrics.record_failure(failure(i, "gone")));
        }
        assert_eq!(metrics.known_failures().len(), MAX_KEPT_FAILURES);
    }
}
