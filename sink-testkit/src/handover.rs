//! Hand-overs of a source's splits between instances of a job: the
//! scenarios of a sink that commits source positions with its data
//! ([`Sink::commits_positions`](sink_api::Sink::commits_positions)).
//!
//! Each instance keeps its checkpoints in storage of its own (another
//! machine, or a restart on fresh state), so only the destination tells a
//! new owner of a split where its data ends:
//!
//! - `handover/new-owner`: instance A is killed with a checkpoint stored
//!   and not committed; instance B, on fresh checkpoint storage, reads
//!   every split from where the destination's data of it ends, to the end.
//!   A sink that keeps positions only in its checkpoints makes B read
//!   everything again: duplicates.
//! - `handover/old-owner-returns`: then A comes back from its checkpoint
//!   and commits what it had prepared: the destination must refuse it
//!   (superseded), since B committed those splits past it. A sink that does
//!   not check where the splits are when it commits duplicates A's records.
//! - `handover/two-owners-at-once`: A and B read the same splits at the
//!   same time, each restarting whenever its commit is superseded, until
//!   both end: every record once, whichever commits won.

use std::sync::Arc;
use std::time::Duration;

use sink_api::{InputOf, Sink};
use sink_runtime::source::Source;
use sink_runtime::{
    CheckpointConfig, Job, JobHandle, JobReport, MemoryCheckpointStorage, PartitionedSequence,
    RestartStrategy,
};

use crate::modes::describe;
use crate::runner::{exactly_once, join, new_job_name, RunError};
use crate::{Destination, HandOverSource, RecordMaker, HAND_OVER_PARTITIONS as PARTITIONS};

/// What the hand-over scenarios found.
pub(crate) struct HandOver {
    /// `handover/new-owner`.
    pub new_owner: Result<(), String>,
    /// `handover/old-owner-returns`; `None`: not reached.
    pub old_owner_returns: Option<Result<(), String>>,
}

/// One instance of the hand-over job.
#[derive(Clone, Copy)]
struct Instance<'a> {
    job: &'a str,
    source: &'a HandOverSource,
    records: u64,
    parallelism: usize,
    /// Restarts in the process allowed (from its last checkpoint).
    restarts: u32,
}

/// Starts `instance` into `sink`: its records' ids in [`PARTITIONS`]
/// partitions under its scope, paced over about a tenth of a second per
/// subtask, checkpoints every 10 ms, kept in `storage`.
fn start_instance<S: Sink>(
    sink: S,
    record: &RecordMaker<InputOf<S>>,
    instance: &Instance<'_>,
    storage: &MemoryCheckpointStorage,
) -> Result<JobHandle, RunError> {
    let Instance {
        job,
        source: names,
        records,
        parallelism,
        restarts,
    } = *instance;
    let per_subtask = records / parallelism.max(1) as u64;
    let record = Arc::clone(record);
    let source = PartitionedSequence::bounded(records, PARTITIONS, names.scope.clone())
        .split_prefix(names.split_prefix.clone())
        .paced((per_subtask * 10).max(100))
        .map(move |id| record(id));
    let mut builder = Job::builder(job, source, sink)
        .parallelism(parallelism)
        .batch_size(16)
        .checkpoint_storage(storage.clone())
        .checkpointing(CheckpointConfig::every(Duration::from_millis(10)));
    if restarts > 0 {
        builder = builder.restart_strategy(RestartStrategy::FixedDelay {
            attempts: restarts,
            delay: Duration::from_millis(2),
        });
    }
    let job = builder
        .build()
        .map_err(|e| RunError::Failed(e.to_string()))?;
    Ok(job.start())
}

/// Kills instance A right after a checkpoint is stored (a few checkpoints
/// in), so that its last checkpoint holds committables never committed;
/// B drains the input on fresh storage; A comes back from its checkpoint.
pub(crate) async fn handover<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
) -> Result<HandOver, String> {
    let job = new_job_name();
    let names = destination.hand_over_source(&job).await;
    let a_storage = MemoryCheckpointStorage::default();
    // A crash right after the fourth checkpoint is stored: its
    // committables are in the checkpoint and were never committed.
    let _ = fail::cfg("after-checkpoint-stored", "3*off->1*return->off");
    let a_instance = Instance {
        job: &job,
        source: &names,
        records,
        parallelism,
        restarts: 0,
    };
    let a = start_instance(destination.sink().await, record, &a_instance, &a_storage)
        .map_err(describe)?;
    let a_ended = join(a).await;
    fail::remove("after-checkpoint-stored");
    match a_ended {
        Err(RunError::Crash(_)) => {}
        Ok(_) => {
            return Err(
                "instance A ended before its fourth checkpoint was stored: the kit could not \
                 kill it with a checkpoint not committed (a fault of the kit)"
                    .into(),
            )
        }
        Err(RunError::Failed(why)) => return Err(format!("instance A failed: {why}")),
    }

    let b_instance = Instance {
        parallelism: parallelism + 1,
        ..a_instance
    };
    let b = start_instance(
        destination.sink().await,
        record,
        &b_instance,
        &MemoryCheckpointStorage::default(),
    )
    .map_err(describe)?;
    join(b).await.map_err(|e| {
        format!(
            "instance B, started on fresh checkpoint storage after A was killed, failed: {}",
            describe(e)
        )
    })?;
    let mut new_owner = exactly_once(destination.committed_ids().await, records).map_err(|e| {
        format!(
            "after instance A was killed and instance B read the same splits on fresh checkpoint \
             storage: {e}; the sink must keep each split's position in the destination, \
             committed with the data, and answer it in Sink::committed_positions (positions kept \
             only in a job's checkpoints make a new owner read from the start)"
        )
    });
    if let Err(why) = &mut new_owner {
        // Which side lost them: records committed but held back by a
        // transaction left open (by A, which B's commits did not settle),
        // or never committed at all.
        match destination.open_transactions().await {
            Some(0) => why.push_str("; no transaction of the sink is open now"),
            Some(open) => why.push_str(&format!(
                "; {open} transaction(s) of the sink are still open now: one left open (by \
                 killed instance A, which no commit of B fenced) holds read_committed readers \
                 back at its first record, so records committed after it do not show"
            )),
            None => {}
        }
    }
    if new_owner.is_err() {
        return Ok(HandOver {
            new_owner,
            old_owner_returns: None,
        });
    }

    let returned = start_instance(destination.sink().await, record, &a_instance, &a_storage)
        .map_err(describe)?;
    let old_owner_returns = match join(returned).await {
        Err(e) => Err(format!(
            "instance A, back from its checkpoint after B drained the input, failed: {}",
            describe(e)
        )),
        Ok(report) => old_owner_checked(destination, records, &report).await,
    };
    Ok(HandOver {
        new_owner,
        old_owner_returns: Some(old_owner_returns),
    })
}

async fn old_owner_checked<D: Destination>(
    destination: &D,
    records: u64,
    report: &JobReport,
) -> Result<(), String> {
    exactly_once(destination.committed_ids().await, records).map_err(|e| {
        format!(
            "instance A came back from its checkpoint after instance B had committed its splits \
             further, and committed what it had prepared: {e}; a committer must apply a \
             committable's positions (and its data) only if each split is still where the \
             committable expects (PositionAdvance::from), and signal superseded otherwise"
        )
    })?;
    if report.metrics.commits_superseded == 0 {
        return Err(
            "instance A came back from its checkpoint, but none of its commits was superseded: \
             it had prepared records of splits that instance B committed since, and its commit \
             of them must be refused (CommitRequest::signal_superseded), not recognised as a \
             replay nor applied"
                .into(),
        );
    }
    Ok(())
}

/// A and B read the same splits at once, each restarting when superseded.
pub(crate) async fn two_owners_at_once<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
) -> Result<(), String> {
    let job = new_job_name();
    let names = destination.hand_over_source(&job).await;
    let mut handles = Vec::new();
    for parallelism in [parallelism, parallelism + 1] {
        let instance = Instance {
            job: &job,
            source: &names,
            records,
            parallelism,
            restarts: 1000,
        };
        let handle = start_instance(
            destination.sink().await,
            record,
            &instance,
            &MemoryCheckpointStorage::default(),
        )
        .map_err(describe)?;
        handles.push(handle);
    }
    let (Some(b), Some(a)) = (handles.pop(), handles.pop()) else {
        return Err("the kit started fewer than two instances (a fault of the kit)".into());
    };
    let (a, b) = tokio::join!(join(a), join(b));
    for (name, ended) in [("A", a), ("B", b)] {
        ended.map_err(|e| {
            format!(
                "instance {name}, reading the same splits as another instance at the same time, \
                 failed: {}",
                describe(e)
            )
        })?;
    }
    exactly_once(destination.committed_ids().await, records).map_err(|e| {
        format!(
            "two instances read the same splits at the same time (each restarting when its \
             commit was superseded): {e}"
        )
    })
}
