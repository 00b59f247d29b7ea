//! Counters of what the sink did, over every writer and committer made by
//! one [`PostgresSink`](crate::PostgresSink); read with
//! [`PostgresSink::stats`](crate::PostgresSink::stats).

use std::sync::atomic::{AtomicU64, Ordering};

/// A copy of the sink's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostgresStats {
    /// Rows sent with `COPY` (committed or not).
    pub rows_written: u64,
    /// Transactions prepared (`PREPARE TRANSACTION`).
    pub transactions_prepared: u64,
    /// Transactions committed (`COMMIT PREPARED`).
    pub transactions_committed: u64,
    /// Replayed commits that found their transaction already committed.
    pub already_committed: u64,
    /// Commits that found their transaction neither prepared nor committed.
    pub lost: u64,
    /// Commits retried after a lost connection.
    pub commit_retries: u64,
    /// Lingering prepared transactions rolled back when a job started.
    pub rolled_back_at_start: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub rows_written: AtomicU64,
    pub transactions_prepared: AtomicU64,
    pub transactions_committed: AtomicU64,
    pub already_committed: AtomicU64,
    pub lost: AtomicU64,
    pub commit_retries: AtomicU64,
    pub rolled_back_at_start: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    pub(crate) fn snapshot(&self) -> PostgresStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        PostgresStats {
            rows_written: get(&self.rows_written),
            transactions_prepared: get(&self.transactions_prepared),
            transactions_committed: get(&self.transactions_committed),
            already_committed: get(&self.already_committed),
            lost: get(&self.lost),
            commit_retries: get(&self.commit_retries),
            rolled_back_at_start: get(&self.rolled_back_at_start),
        }
    }
}
