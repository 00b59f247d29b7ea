//! Failure injection: make the next calls of a writer or committer fail on
//! purpose, to test how the runtime reacts.
//!
//! Failures are armed through the shared [`MemoryStore`], so a test can arm
//! them before the job starts or while it runs, and they apply to whichever
//! writer or committer of the store is called next. Each armed failure fires
//! exactly once and is counted in [`MemoryStats`](crate::MemoryStats):
//!
//! | armed with | fires on | effect | counted in |
//! |---|---|---|---|
//! | [`MemoryStore::fail_next_prepare_commits`] | the next `prepare_commit` calls | `Err(SinkError)`; the open transaction stays open | `injected_prepare_commit_failures` |
//! | [`MemoryStore::fail_next_commits`] | the next commit *requests* | the request ends with the chosen outcome; its transaction stays prepared | `injected_retry_later`, `injected_known_failures`, `injected_unknown_failures` |
//! | [`MemoryStore::fail_next_commit_calls`] | the next `Committer::commit` calls | `Err(SinkError)`; nothing of the batch is committed | `injected_commit_call_failures` |
//! | [`MemoryStore::panic_next_writes`] | the next `write` or `write_batch` calls | the writer panics (a bug in a sink); nothing of the batch is written | `injected_write_panics` |

use std::collections::VecDeque;

use crate::MemoryStore;

/// How an injected failure settles one commit request, armed with
/// [`MemoryStore::fail_next_commits`].
///
/// Whatever the kind, the transaction is **not** committed: it stays prepared,
/// so a retry (or a replay after a restart) can still commit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InjectedCommitFailure {
    /// The request ends with
    /// [`CommitOutcome::RetryLater`](sink_api::CommitOutcome::RetryLater): a
    /// transient failure the runtime retries with backoff.
    RetryLater,
    /// The request ends with
    /// [`CommitOutcome::FailedWithKnownReason`](sink_api::CommitOutcome::FailedWithKnownReason):
    /// the runtime logs, counts and drops it; the job goes on.
    KnownReason,
    /// The request ends with
    /// [`CommitOutcome::FailedWithUnknownReason`](sink_api::CommitOutcome::FailedWithUnknownReason):
    /// the job fails and restarts from the last completed checkpoint.
    UnknownReason,
}

/// The failures armed but not fired yet. Lives inside the store's lock.
#[derive(Debug, Default)]
pub(crate) struct FailurePlan {
    prepare_commit_failures: u64,
    /// Runs of `(kind, how many requests)`, fired front first.
    commit_failures: VecDeque<(InjectedCommitFailure, u64)>,
    commit_call_failures: u64,
    write_panics: u64,
}

impl FailurePlan {
    /// Consumes one armed `prepare_commit` failure, if any.
    pub(crate) fn take_prepare_commit_failure(&mut self) -> bool {
        take_one(&mut self.prepare_commit_failures)
    }

    /// Consumes one armed commit-request failure, if any.
    pub(crate) fn take_commit_failure(&mut self) -> Option<InjectedCommitFailure> {
        let (kind, remaining) = self.commit_failures.front_mut()?;
        let kind = *kind;
        *remaining -= 1;
        if *remaining == 0 {
            self.commit_failures.pop_front();
        }
        Some(kind)
    }

    /// Consumes one armed write panic, if any.
    pub(crate) fn take_write_panic(&mut self) -> bool {
        take_one(&mut self.write_panics)
    }

    /// Consumes one armed `Committer::commit` call failure, if any.
    pub(crate) fn take_commit_call_failure(&mut self) -> bool {
        take_one(&mut self.commit_call_failures)
    }
}

fn take_one(armed: &mut u64) -> bool {
    if *armed == 0 {
        return false;
    }
    *armed -= 1;
    true
}

impl<T> MemoryStore<T> {
    /// Makes the next `n` calls of
    /// [`SinkWriter::prepare_commit`](sink_api::SinkWriter::prepare_commit), on
    /// any writer of this store, return `Err` with the message
    /// "injected prepare_commit failure …". The open transaction stays open
    /// (and is aborted when the writer is closed).
    ///
    /// Called by tests, before or during a job. Adds to failures armed before.
    pub fn fail_next_prepare_commits(&self, n: u64) {
        let mut state = self.lock();
        state.failures.prepare_commit_failures += n;
    }

    /// Makes the next `n` calls of `write` or `write_batch`, on any writer of
    /// this store, panic before writing anything: a sink with a bug. The
    /// runtime treats a panicking task as a failed one.
    ///
    /// Called by tests, before or during a job. Adds to panics armed before.
    pub fn panic_next_writes(&self, n: u64) {
        self.lock().failures.write_panics += n;
    }

    /// Makes the next `n` commit *requests*, on any committer of this store,
    /// end with the outcome `kind` instead of committing. Their transactions
    /// stay prepared.
    ///
    /// Called by tests, before or during a job. Failures armed by several calls
    /// fire in the order they were armed.
    pub fn fail_next_commits(&self, n: u64, kind: InjectedCommitFailure) {
        if n == 0 {
            return;
        }
        let mut state = self.lock();
        state.failures.commit_failures.push_back((kind, n));
    }

    /// Makes the next `n` calls of
    /// [`Committer::commit`](sink_api::Committer::commit), on any committer of
    /// this store, return `Err` before touching any request: nothing of those
    /// batches is committed.
    ///
    /// Called by tests, before or during a job. Adds to failures armed before.
    pub fn fail_next_commit_calls(&self, n: u64) {
        let mut state = self.lock();
        state.failures.commit_call_failures += n;
    }

    /// Disarms every failure armed and not fired yet. Called by tests that
    /// want the rest of a job to run cleanly.
    pub fn clear_injected_failures(&self) {
        let mut state = self.lock();
        state.failures = FailurePlan::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_failures_fire_in_the_order_they_were_armed() {
        let mut plan = FailurePlan::default();
        plan.commit_failures
            .push_back((InjectedCommitFailure::RetryLater, 2));
        plan.commit_failures
            .push_back((InjectedCommitFailure::UnknownReason, 1));
        assert_eq!(
            plan.take_commit_failure(),
            Some(InjectedCommitFailure::RetryLater)
        );
        assert_eq!(
            plan.take_commit_failure(),
            Some(InjectedCommitFailure::RetryLater)
        );
        assert_eq!(
            plan.take_commit_failure(),
            Some(InjectedCommitFailure::UnknownReason)
        );
        assert_eq!(plan.take_commit_failure(), None);
    }

    #[test]
    fn counted_failures_fire_exactly_n_times() {
        let mut plan = FailurePlan {
            prepare_commit_failures: 2,
            ..FailurePlan::default()
        };
        assert!(plan.take_prepare_commit_failure());
        assert!(plan.take_prepare_commit_failure());
        assert!(!plan.take_prepare_commit_failure());
        assert!(!plan.take_commit_call_failure());
    }
}
