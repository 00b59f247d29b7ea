//! Running jobs against a destination, and checking what they committed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sink_api::InputOf;
use sink_api::Sink;
use sink_api::SubtaskIndex;
use sink_runtime::source::{Boundedness, Source, SourceError};
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobHandle, JobReport, MemoryCheckpointStorage,
    RestartStrategy, RuntimeMode, SequenceSource,
};

use crate::Destination;
use crate::RecordMaker;

/// One job's shape.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub records: u64,
    pub parallelism: usize,
    pub checkpoint_interval: Option<Duration>,
    pub batch: bool,
    pub bounded: bool,
    /// The job's name: one per scenario (see [`new_job_name`]).
    pub job: String,
    /// Whether a failed attempt restarts in the process (from the last
    /// checkpoint), as with a restart strategy.
    pub restarts: bool,
}

impl Shape {
    /// A bounded streaming job with checkpoints every 10 ms, paced so that
    /// the input lasts about a tenth of a second.
    pub(crate) fn streaming(records: u64, parallelism: usize) -> Shape {
        Shape {
            records,
            parallelism,
            checkpoint_interval: Some(Duration::from_millis(10)),
            batch: false,
            bounded: true,
            job: new_job_name(),
            restarts: false,
        }
    }
}

/// Why a run did not finish.
#[derive(Debug)]
pub(crate) enum RunError {
    /// A crash simulated at the named crash point.
    Crash(&'static str),
    /// Anything else, in words.
    Failed(String),
}

impl From<JobError> for RunError {
    fn from(error: JobError) -> RunError {
        match error {
            JobError::Crash { failpoint } => RunError::Crash(failpoint),
            other => RunError::Failed(other.to_string()),
        }
    }
}

/// A job name no other job of this process had: each scenario is a job of
/// its own, as a sink with job-scoped locks and clean-ups needs. Counted
/// process-wide, like the crash points the kit drives.
pub(crate) fn new_job_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("sink-testkit-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Builds and starts a job of `shape` on `destination`, keeping its
/// checkpoints in `storage`.
pub(crate) async fn start<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    shape: &Shape,
    storage: &MemoryCheckpointStorage,
) -> Result<JobHandle, RunError> {
    start_with_sink(destination.sink().await, record, shape, storage)
}

/// Builds and starts a job of `shape` into `sink` (the destination's, or
/// one wrapped by a scenario), keeping its checkpoints in `storage`.
pub(crate) fn start_with_sink<S: Sink>(
    sink: S,
    record: &RecordMaker<InputOf<S>>,
    shape: &Shape,
    storage: &MemoryCheckpointStorage,
) -> Result<JobHandle, RunError> {
    let ids = match shape.bounded {
        true => SequenceSource::bounded(shape.records),
        false => SequenceSource::unbounded(shape.records),
    };
    let per_subtask = shape.records / shape.parallelism.max(1) as u64;
    let record = Arc::clone(record);
    let source = SixSplits(ids.paced((per_subtask * 10).max(100))).map(move |id| record(id));
    let mut builder = Job::builder(shape.job.clone(), source, sink)
        .parallelism(shape.parallelism)
        .batch_size(16)
        .checkpoint_storage(storage.clone());
    if shape.batch {
        builder = builder.mode(RuntimeMode::Batch);
    }
    if shape.restarts {
        builder = builder.restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::from_millis(5),
        });
    }
    if let Some(interval) = shape.checkpoint_interval {
        builder = builder.checkpointing(CheckpointConfig::every(interval));
    }
    let job = builder
        .build()
        .map_err(|e| RunError::Failed(e.to_string()))?;
    Ok(job.start())
}

/// A source cut into at least six splits whatever the parallelism, so that
/// after any change of parallelism every subtask reads some of what is left
/// (readers take their splits one after the other: with one split per
/// subtask, what is left after a stop may all go to one subtask).
struct SixSplits<S>(S);

impl<S: Source> Source for SixSplits<S> {
    type Record = S::Record;
    type Split = S::Split;
    type Reader = S::Reader;

    fn boundedness(&self) -> Boundedness {
        self.0.boundedness()
    }

    fn position_scope(&self) -> Option<String> {
        self.0.position_scope()
    }

    fn split_codec(&self) -> std::sync::Arc<dyn sink_runtime::source::SplitCodec<S::Split>> {
        self.0.split_codec()
    }

    fn create_splits(&self, parallelism: usize) -> Vec<S::Split> {
        self.0.create_splits(parallelism.max(6))
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<S::Split>,
    ) -> Result<S::Reader, SourceError> {
        self.0.create_reader(subtask, splits)
    }
}

/// Runs a job of `shape` to its end.
pub(crate) async fn run<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    shape: &Shape,
    storage: &MemoryCheckpointStorage,
) -> Result<JobReport, RunError> {
    let handle = start(destination, record, shape, storage).await?;
    join(handle).await
}

/// Waits for a started job to end, at most 120 s; a job that ended but
/// reports output lost is refused ([`no_false_losses`]).
pub(crate) async fn join(handle: JobHandle) -> Result<JobReport, RunError> {
    match tokio::time::timeout(Duration::from_secs(120), handle.join()).await {
        Ok(result) => no_false_losses(result?),
        Err(_) => Err(RunError::Failed(
            "the job did not end within 120 s: a call of the sink hangs".into(),
        )),
    }
}

/// Refuses a report with commits failed for a known reason. The kit never
/// removes or changes what a sink wrote, so a commit that says its data is
/// lost is wrong: either the data is gone (which the check of the
/// destination finds too) or the committer did not recognise its own
/// committed data. The second is a false alarm with a real cost: an
/// embedding service answers the records' senders that they were not
/// stored, they send them again, and the records are there twice.
pub(crate) fn no_false_losses(report: JobReport) -> Result<JobReport, RunError> {
    let Some(failure) = report.known_failures.first() else {
        return Ok(report);
    };
    Err(RunError::Failed(format!(
        "{} commit(s) reported their data lost ({} records), although nothing removed it from the \
         destination; the first, of checkpoint {} by subtask {}: {}. A committer must recognise \
         data it committed before (a replay after a restart) from the destination, wherever it is \
         now",
        report.metrics.commits_failed,
        report.metrics.records_lost,
        failure.checkpoint_id,
        failure.subtask,
        failure.reason
    )))
}

/// What is wrong with `ids` as "each of `0..count` once", if anything.
pub(crate) fn exactly_once(ids: Vec<u64>, count: u64) -> Result<(), String> {
    exactly_times(ids, count, 1)
}

/// What is wrong with `ids` as "each of `0..count` exactly `times` times"
/// (several runs into one destination), if anything.
pub(crate) fn exactly_times(ids: Vec<u64>, count: u64, times: usize) -> Result<(), String> {
    if times == 1 {
        return exactly_once_sorted(ids, count);
    }
    let mut seen = std::collections::BTreeMap::<u64, usize>::new();
    for id in ids {
        *seen.entry(id).or_default() += 1;
    }
    let short: Vec<u64> = (0..count)
        .filter(|id| seen.get(id).copied().unwrap_or(0) < times)
        .collect();
    if !short.is_empty() {
        return Err(format!(
            "{} of {count} records committed fewer than {times} times (once per run), e.g. ids {:?}",
            short.len(),
            &short[..short.len().min(10)]
        ));
    }
    let over: Vec<u64> = seen
        .iter()
        .filter(|(_, n)| **n > times)
        .map(|(id, _)| *id)
        .collect();
    if !over.is_empty() {
        return Err(format!(
            "{} records committed more than {times} times, e.g. ids {:?}",
            over.len(),
            &over[..over.len().min(10)]
        ));
    }
    Ok(())
}

fn exactly_once_sorted(mut ids: Vec<u64>, count: u64) -> Result<(), String> {
    ids.sort_unstable();
    let duplicates: Vec<u64> = ids
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if !duplicates.is_empty() {
        return Err(format!(
            "{} records committed twice or more, e.g. ids {:?}",
            duplicates.len(),
            &duplicates[..duplicates.len().min(10)]
        ));
    }
    let missing: Vec<u64> = (0..count)
        .filter(|id| ids.binary_search(id).is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} of {count} records never committed, e.g. ids {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    if let Some(extra) = ids.iter().find(|&&id| id >= count) {
        return Err(format!(
            "a record with id {extra} was committed, but only 0..{count} were written"
        ));
    }
    Ok(())
}
