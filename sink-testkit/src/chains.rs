//! A job that lives through several parallelisms, and a job run again on
//! fresh checkpoint storage: the two lives of a job a single restart does
//! not show.
//!
//! A sink that names its committables by subtask and a counter restored
//! from its state passes one rescale from a fresh start, yet reuses names
//! when the job goes 2 → 1 → 2 (the subtask that comes back restores no
//! counter); one that names them by job and generation passes every
//! restart, yet repeats names when the job runs again on new checkpoint
//! storage. Either takes new data for replays and loses it.

use std::time::Duration;

use sink_api::InputOf;
use sink_runtime::MemoryCheckpointStorage;

use crate::modes::describe;
use crate::runner::{exactly_once, exactly_times, join, run, start, Shape};
use crate::Destination;
use crate::RecordMaker;

/// Runs the job through the parallelisms `chain`, on one checkpoint
/// storage: stage `i` of `n` stops once a share `(i + 1) / 2n` of the
/// records is committed and two checkpoints of its own completed (records
/// held by writers across each change), the last finishes the input, so
/// every stage writes. Half of the records are left to the last stage, so
/// that every split still has records there, and a subtask that comes back
/// without state writes (with `(i + 1) / n`, a loaded machine could let a
/// stage read a split to its end, leave that subtask idle, and a sink
/// reusing its names pass).
pub(crate) async fn rescale_chain<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    chain: &[usize],
) -> Result<(), String> {
    let storage = MemoryCheckpointStorage::default();
    let Some((&last, stages)) = chain.split_last() else {
        return Ok(());
    };
    let job = Shape::streaming(records, last).job;
    let shares = chain.len() as u64;
    for (i, &parallelism) in stages.iter().enumerate() {
        let share = records * (i as u64 + 1) / (2 * shares);
        let shape = Shape {
            bounded: false,
            job: job.clone(),
            ..Shape::streaming(records, parallelism)
        };
        let handle = start(destination, record, &shape, &storage)
            .await
            .map_err(describe)?;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let committed = destination.committed_ids().await.len() as u64;
            if committed >= share && handle.metrics().checkpoints_completed >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        handle.cancel();
        join(handle).await.map_err(describe)?;
    }
    let shape = Shape {
        job,
        ..Shape::streaming(records, last)
    };
    run(destination, record, &shape, &storage)
        .await
        .map_err(describe)?;
    let chain: Vec<String> = chain.iter().map(usize::to_string).collect();
    exactly_once(destination.committed_ids().await, records).map_err(|e| {
        format!(
            "through the parallelisms {}: {e}; names of committables must not repeat when a subtask \
             comes back without state (use InitContext::unique_name, or the lineage and generation)",
            chain.join(" -> ")
        )
    })
}

/// Runs the same job (same name) twice into the destination, each time on
/// new, empty checkpoint storage: every record of both runs, each once per
/// run.
pub(crate) async fn run_again_on_fresh_storage<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
) -> Result<(), String> {
    let first = Shape::streaming(records, parallelism);
    for shape in [first.clone(), first] {
        run(
            destination,
            record,
            &shape,
            &MemoryCheckpointStorage::default(),
        )
        .await
        .map_err(describe)?;
    }
    exactly_times(destination.committed_ids().await, records, 2).map_err(|e| {
        format!(
            "the same job run twice on fresh checkpoint storage: {e}; the second run's committables \
             were taken for the first's (name them with InitContext::lineage, which is new on every \
             new checkpoint storage, or InitContext::unique_name)"
        )
    })
}
