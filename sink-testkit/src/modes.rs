//! The write-up's modes, on the sink under test.

use std::time::{Duration, Instant};

use sink_api::InputOf;
use sink_runtime::MemoryCheckpointStorage;

use crate::runner::{exactly_once, run, start, RunError, Shape};
use crate::RecordMaker;
use crate::{Destination, Knobs};

/// Bounded input with checkpoints: every record committed once.
pub(crate) async fn streaming_with_checkpoints<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    knobs: &Knobs,
) -> Result<(), String> {
    let shape = Shape::streaming(knobs.records, knobs.parallelism);
    finish(destination, record, &shape).await?;
    exactly_once(destination.committed_ids().await, knobs.records)
}

/// Bounded input without checkpoints, or in batch mode: every record
/// committed once, at end of input, with one `prepare_commit` per subtask.
pub(crate) async fn at_end_of_input<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    knobs: &Knobs,
    batch: bool,
) -> Result<(), String> {
    let shape = Shape {
        checkpoint_interval: None,
        batch,
        ..Shape::streaming(knobs.records, knobs.parallelism)
    };
    let report = finish(destination, record, &shape).await?;
    exactly_once(destination.committed_ids().await, knobs.records)?;
    let calls = report.metrics.prepare_commit_calls;
    if calls != knobs.parallelism as u64 {
        return Err(format!(
            "{calls} prepare_commit calls instead of one per subtask"
        ));
    }
    Ok(())
}

/// Unbounded input with checkpoints: everything is committed while the job
/// still runs, within a few checkpoints.
pub(crate) async fn unbounded_with_checkpoints<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    knobs: &Knobs,
) -> Result<(), String> {
    let shape = Shape {
        bounded: false,
        ..Shape::streaming(knobs.records, knobs.parallelism)
    };
    let handle = start(
        destination,
        record,
        &shape,
        &MemoryCheckpointStorage::default(),
    )
    .await
    .map_err(describe)?;
    let started = Instant::now();
    while (destination.committed_ids().await.len() as u64) < knobs.records
        && started.elapsed() < Duration::from_secs(10)
    {
        if handle.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.cancel();
    crate::runner::no_false_losses(handle.join().await.map_err(|e| describe(e.into()))?)
        .map_err(describe)?;
    exactly_once(destination.committed_ids().await, knobs.records)
}

async fn finish<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    shape: &Shape,
) -> Result<sink_runtime::JobReport, String> {
    run(
        destination,
        record,
        shape,
        &MemoryCheckpointStorage::default(),
    )
    .await
    .map_err(describe)
}

pub(crate) fn describe(error: RunError) -> String {
    match error {
        RunError::Crash(point) => {
            format!("the job crashed at the crash point {point}, which nobody configured")
        }
        RunError::Failed(why) => format!("the job failed: {why}"),
    }
}
