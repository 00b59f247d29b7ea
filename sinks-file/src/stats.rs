//! The counters a file sink keeps of its commits: `sink_api::Counter`s,
//! registered in the job's metrics at every start (see
//! [`FileSinkStats::register`]) and readable through the sink's own API.

use sink_api::{Counter, SinkMetrics};

use crate::state::FileCommittable;

/// What the file committers did, counted over every subtask and restart.
#[derive(Debug, Default)]
pub struct FileSinkStats {
    committed_files: Counter,
    committed_records: Counter,
    committed_bytes: Counter,
    replayed: Counter,
    failed: Counter,
    orphans_removed: Counter,
    compactions: Counter,
    compacted_files: Counter,
    compaction_failures: Counter,
}

/// A copy of [`FileSinkStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileSinkStatsSnapshot {
    /// Part files made visible.
    pub committed_files: u64,
    /// Records in them.
    pub committed_records: u64,
    /// Bytes in them.
    pub committed_bytes: u64,
    /// Commits recognised as done before (replays after recovery).
    pub replayed: u64,
    /// Commits that failed with a known reason (lost or altered files).
    pub failed: u64,
    /// Hidden parts of the job's lineage that no restored checkpoint
    /// referred to, removed at starts.
    pub orphans_removed: u64,
    /// Segments merged into one file each (with compaction on).
    pub compactions: u64,
    /// Committed files merged by them.
    pub compacted_files: u64,
    /// Compaction rounds that failed (their small files stayed visible).
    pub compaction_failures: u64,
}

impl FileSinkStats {
    pub(crate) fn committed(&self, committable: &FileCommittable) {
        self.committed_file(committable.records, committable.size_bytes);
    }

    /// Counts a file of `records` records and `bytes` bytes made visible.
    pub(crate) fn committed_file(&self, records: u64, bytes: u64) {
        self.committed_files.add(1);
        self.committed_records.add(records);
        self.committed_bytes.add(bytes);
    }

    pub(crate) fn replayed(&self) {
        self.replayed.add(1);
    }

    pub(crate) fn failed(&self) {
        self.failed.add(1);
    }

    pub(crate) fn orphans_removed(&self, count: u64) {
        self.orphans_removed.add(count);
    }

    pub(crate) fn compacted(&self, files: u64) {
        self.compactions.add(1);
        self.compacted_files.add(files);
    }

    pub(crate) fn compaction_failed(&self) {
        self.compaction_failures.add(1);
    }

    /// Registers the counters in the job's registry, as `file_sink_*`.
    /// Called by the sink at every start.
    pub(crate) fn register(&self, metrics: &SinkMetrics) {
        let counters = [
            (
                "file_sink_committed_files",
                "Part files made visible.",
                &self.committed_files,
            ),
            (
                "file_sink_committed_records",
                "Records in the part files made visible.",
                &self.committed_records,
            ),
            (
                "file_sink_committed_bytes",
                "Bytes in the part files made visible.",
                &self.committed_bytes,
            ),
            (
                "file_sink_replayed_commits",
                "Commits recognised as done before (replays after a recovery).",
                &self.replayed,
            ),
            (
                "file_sink_failed_commits",
                "Commits that failed with a known reason (lost or altered part files).",
                &self.failed,
            ),
            (
                "file_sink_orphans_removed",
                "Hidden parts of the job's lineage no checkpoint referred to, removed at starts.",
                &self.orphans_removed,
            ),
            (
                "file_sink_compactions",
                "Segments of committed files merged into one file each.",
                &self.compactions,
            ),
            (
                "file_sink_compacted_files",
                "Committed files merged by compaction.",
                &self.compacted_files,
            ),
            (
                "file_sink_compaction_failures",
                "Compaction rounds that failed; their small files stayed visible.",
                &self.compaction_failures,
            ),
        ];
        metrics.register_all(counters);
    }

    /// The counters now.
    pub fn snapshot(&self) -> FileSinkStatsSnapshot {
        FileSinkStatsSnapshot {
            committed_files: self.committed_files.get(),
            committed_records: self.committed_records.get(),
            committed_bytes: self.committed_bytes.get(),
            replayed: self.replayed.get(),
            failed: self.failed.get(),
            orphans_removed: self.orphans_removed.get(),
            compactions: self.compactions.get(),
            compacted_files: self.compacted_files.get(),
            compaction_failures: self.compaction_failures.get(),
        }
    }
}
