//! Counters of what the sink did, over every writer and committer made by
//! one [`KafkaSink`](crate::KafkaSink); read with
//! [`KafkaSink::stats`](crate::KafkaSink::stats), and in the job's metrics
//! (`kafka_sink_*`).

use sink_api::{Counter, SinkMetrics};

/// A copy of the sink's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaStats {
    /// Records in prepared transactions.
    pub records_prepared: u64,
    /// Transactions prepared (flushed, with their commit marker).
    pub transactions_prepared: u64,
    /// Transactions committed (`EndTxn`, then the marker read back).
    pub transactions_committed: u64,
    /// Records in committed transactions.
    pub records_committed: u64,
    /// Replayed commits that found their transaction already committed.
    pub already_committed: u64,
    /// Transactions found aborted at their commit: their records are lost.
    pub transactions_lost: u64,
    /// Commits retried later (a broker unreachable, a coordinator moving).
    pub commit_retries: u64,
    /// Open transactions of the lineage aborted at starts.
    pub aborted_at_start: u64,
    /// Transactions superseded at their commit: their source positions had
    /// moved (or they were aborted with them); nothing of them applied.
    pub transactions_superseded: u64,
}

/// The live counters, registered in the job's metrics at every start.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    records_prepared: Counter,
    transactions_prepared: Counter,
    transactions_committed: Counter,
    records_committed: Counter,
    already_committed: Counter,
    transactions_lost: Counter,
    commit_retries: Counter,
    aborted_at_start: Counter,
    transactions_superseded: Counter,
}

impl Stats {
    pub(crate) fn prepared(&self, records: u64) {
        self.records_prepared.add(records);
        self.transactions_prepared.add(1);
    }

    pub(crate) fn committed(&self, records: u64) {
        self.records_committed.add(records);
        self.transactions_committed.add(1);
    }

    pub(crate) fn replayed(&self) {
        self.already_committed.add(1);
    }

    pub(crate) fn lost(&self, _records: u64) {
        self.transactions_lost.add(1);
    }

    pub(crate) fn commit_retried(&self) {
        self.commit_retries.add(1);
    }

    pub(crate) fn superseded(&self) {
        self.transactions_superseded.add(1);
    }

    pub(crate) fn aborted_at_start(&self, n: u64) {
        self.aborted_at_start.add(n);
    }

    pub(crate) fn snapshot(&self) -> KafkaStats {
        KafkaStats {
            records_prepared: self.records_prepared.get(),
            transactions_prepared: self.transactions_prepared.get(),
            transactions_committed: self.transactions_committed.get(),
            records_committed: self.records_committed.get(),
            already_committed: self.already_committed.get(),
            transactions_lost: self.transactions_lost.get(),
            commit_retries: self.commit_retries.get(),
            aborted_at_start: self.aborted_at_start.get(),
            transactions_superseded: self.transactions_superseded.get(),
        }
    }

    /// Registers the counters in the job's registry, as `kafka_sink_*`.
    /// Called by the sink at every start.
    pub(crate) fn register(&self, metrics: &SinkMetrics) {
        let counters = [
            (
                "kafka_sink_records_prepared",
                "Records in prepared transactions.",
                &self.records_prepared,
            ),
            (
                "kafka_sink_transactions_prepared",
                "Transactions prepared.",
                &self.transactions_prepared,
            ),
            (
                "kafka_sink_transactions_committed",
                "Transactions committed.",
                &self.transactions_committed,
            ),
            (
                "kafka_sink_records_committed",
                "Records in committed transactions.",
                &self.records_committed,
            ),
            (
                "kafka_sink_already_committed",
                "Replayed commits that found their transaction already committed.",
                &self.already_committed,
            ),
            (
                "kafka_sink_transactions_lost",
                "Transactions found aborted at their commit: their records are lost.",
                &self.transactions_lost,
            ),
            (
                "kafka_sink_commit_retries",
                "Commits retried later.",
                &self.commit_retries,
            ),
            (
                "kafka_sink_aborted_at_start",
                "Open transactions of the lineage aborted at starts.",
                &self.aborted_at_start,
            ),
            (
                "kafka_sink_transactions_superseded",
                "Transactions superseded at their commit: their source positions had moved.",
                &self.transactions_superseded,
            ),
        ];
        metrics.register_all(counters);
    }
}
