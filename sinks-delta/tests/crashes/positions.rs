//! Source positions in the Delta table across restarts: a start reads each
//! split from the positions its restored checkpoint commits, not from the
//! table as it was before that checkpoint's transaction.

use std::time::Duration;

use crate::common::{exactly_once, ids, sink, Event};
use sink_api::Sink;
use sink_runtime::{
    CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage, PartitionedSequence,
    RestartStrategy, Source,
};
use sinks_delta::TableLocation;

const RECORDS: u64 = 3_000;

/// A job killed right after a checkpoint was stored (its transaction not
/// yet in the table) restarts from that checkpoint: the global committer
/// commits it before any reader looks up the table's positions, so no
/// reader starts behind them and no commit of the restarted job is
/// superseded. Fails if readers start before the restored checkpoint's
/// transaction (then their first checkpoint starts where that transaction
/// moved the splits from, and is superseded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reads_from_the_positions_its_restored_checkpoint_commits() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let location = TableLocation::local(dir.path().join("table")).expect("a table directory");
    let delta = sink(&location, true);
    assert!(delta.commits_positions());
    let source = PartitionedSequence::bounded(RECORDS, 4, "restart/input")
        .paced(10_000)
        .map(Event::new);
    let job = Job::builder("restart", source, delta)
        .parallelism(2)
        .batch_size(16)
        .checkpoint_storage(MemoryCheckpointStorage::default())
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::from_millis(2),
        })
        .build()
        .expect("a valid job");
    fail::cfg("after-checkpoint-stored", "3*off->1*return->off").expect("a valid failpoint");
    let report = job.run().await.expect("the job finishes");
    fail::remove("after-checkpoint-stored");
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(
        report.metrics.restarts, 1,
        "the crash restarted the job once"
    );
    exactly_once(&ids(&location, None).await, RECORDS).expect("every record once");
    assert_eq!(
        report.metrics.commits_superseded, 0,
        "a reader started behind the restored checkpoint's positions"
    );
}
