//! Counters of what the sink did, over every writer and committer made by
//! one [`PostgresSink`](crate::PostgresSink); read with
//! [`PostgresSink::stats`](crate::PostgresSink::stats), and in the job's
//! metrics (`postgres_sink_*`).

use sink_api::{Counter, SinkMetrics};

/// A copy of the sink's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Rows sent with `COPY` (committed or not).
    pub rows_written: u64,
    /// Transactions prepared (`PREPARE TRANSACTION`).
    pub transactions_prepared: u64,
    /// Transactions committed (`COMMIT PREPARED`).
    pub transactions_committed: u64,
    /// Replayed commits that found their transaction already committed.
    pub already_committed: u64,
    /// Commits that found their transaction neither prepared nor committed,
    /// and that carried no source positions: their rows are lost.
    pub lost: u64,
    /// Commits retried after a lost connection.
    pub commit_retries: u64,
    /// Lingering prepared transactions rolled back when a job started.
    pub rolled_back_at_start: u64,
    /// Commits superseded: their source positions had moved (found by the
    /// writer, or their transaction was rolled back by someone else).
    pub superseded: u64,
    /// Transactions rolled back by their writer because a split was not
    /// where their advances expect (counted again in `superseded` at their
    /// commit).
    pub superseded_at_prepare: u64,
    /// Prepared transactions holding the step of a split that a writer
    /// needed, rolled back (no live instance could commit them, or they
    /// were held longer than the hold limit).
    pub position_holders_rolled_back: u64,
}

/// The live counters: `sink_api::Counter`s, registered in the job's
/// metrics at every start (see [`Stats::register`]).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub rows_written: Counter,
    pub transactions_prepared: Counter,
    pub transactions_committed: Counter,
    pub already_committed: Counter,
    pub lost: Counter,
    pub commit_retries: Counter,
    pub rolled_back_at_start: Counter,
    pub superseded: Counter,
    pub superseded_at_prepare: Counter,
    pub position_holders_rolled_back: Counter,
}

pub(crate) fn add(counter: &Counter, n: u64) {
    counter.add(n);
}

impl Stats {
    pub(crate) fn snapshot(&self) -> PostgresStats {
        PostgresStats {
            rows_written: self.rows_written.get(),
            transactions_prepared: self.transactions_prepared.get(),
            transactions_committed: self.transactions_committed.get(),
            already_committed: self.already_committed.get(),
            lost: self.lost.get(),
            commit_retries: self.commit_retries.get(),
            rolled_back_at_start: self.rolled_back_at_start.get(),
            superseded: self.superseded.get(),
            superseded_at_prepare: self.superseded_at_prepare.get(),
            position_holders_rolled_back: self.position_holders_rolled_back.get(),
        }
    }

    /// Registers the counters in the job's registry, as `postgres_sink_*`.
    /// Called by the sink at every start.
    pub(crate) fn register(&self, metrics: &SinkMetrics) {
        let counters = [
            ("postgres_sink_rows_written", "Rows sent with COPY, committed or not.", &self.rows_written),
            ("postgres_sink_transactions_prepared", "Transactions prepared (PREPARE TRANSACTION).", &self.transactions_prepared),
            ("postgres_sink_transactions_committed", "Transactions committed (COMMIT PREPARED).", &self.transactions_committed),
            ("postgres_sink_already_committed", "Replayed commits that found their transaction already committed.", &self.already_committed),
            ("postgres_sink_lost", "Commits that found their transaction neither prepared nor committed: its rows are lost.", &self.lost),
            ("postgres_sink_commit_retries", "Commits retried after a lost connection.", &self.commit_retries),
            ("postgres_sink_rolled_back_at_start", "Lingering prepared transactions rolled back at starts.", &self.rolled_back_at_start),
            ("postgres_sink_superseded", "Commits superseded: their source positions had moved.", &self.superseded),
            ("postgres_sink_superseded_at_prepare", "Transactions rolled back by their writer: a split was not where their advances expect.", &self.superseded_at_prepare),
            ("postgres_sink_position_holders_rolled_back", "Prepared transactions holding the step of a split a writer needed, rolled back.", &self.position_holders_rolled_back),
        ];
        metrics.register_all(counters);
    }
}
