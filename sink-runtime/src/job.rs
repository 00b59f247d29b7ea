//! The job builder, its configuration, and the handle of a running job.
//!
//! ```
//! # use std::time::Duration;
//! # use sink_runtime::{CheckpointConfig, Job, RuntimeMode, SequenceSource};
//! # use sinks_memory::{MemorySink, MemoryStore};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::<u64>::new();
//! let report = Job::builder("numbers", SequenceSource::bounded(160), MemorySink::new(store.clone()))
//!     .parallelism(2)
//!     .mode(RuntimeMode::Streaming)
//!     .checkpointing(CheckpointConfig::every(Duration::from_millis(100)))
//!     .build()?
//!     .run()
//!     .await?;
//! assert_eq!(report.metrics.records_committed, 160);
//! assert_eq!(store.committed().len(), 160);
//! # Ok(())
//! # }
//! ```
//!
//! # What the builder refuses
//!
//! A configuration that could never commit is an error at build time, with
//! the fix in its message: an unbounded source with checkpointing off (unless
//! [`JobBuilder::allow_uncommitted_output`] says that is intended), and batch
//! mode with an unbounded source.

use std::sync::Arc;
use std::time::Duration;

use sink_api::{CheckpointId, GlobalCommitter, Sink, SubtaskIndex};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::core::checkpoints::CheckpointConfig;
use crate::core::restart::RestartStrategy;
use crate::core::retry::RetryPolicy;
use crate::error::{BuildError, JobError};
use crate::metrics::KnownCommitFailure;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::source::{Boundedness, Source};
use crate::storage::{CheckpointStorage, MemoryCheckpointStorage};

/// How the job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RuntimeMode {
    /// Records flow continuously; commits follow completed checkpoints, or
    /// end of input when checkpointing is off. The default.
    #[default]
    Streaming,
    /// A bounded input processed as a whole: checkpointing is ignored and
    /// everything is committed once at end of input.
    Batch,
}

/// Makes the job's global committer, once per start of the job.
pub(crate) type GlobalCommitterFactory<C> =
    Box<dyn Fn() -> Box<dyn GlobalCommitter<Committable = C>> + Send + Sync>;

/// Everything the coordinator needs to run a job. Made by [`JobBuilder::build`].
pub(crate) struct JobSpec<Src, S: Sink> {
    pub name: String,
    pub source: Src,
    pub sink: S,
    pub parallelism: usize,
    pub checkpointing: Option<CheckpointConfig>,
    pub global_committer: Option<GlobalCommitterFactory<S::Committable>>,
    pub restart: RestartStrategy,
    pub storage: Arc<dyn CheckpointStorage>,
    pub retry: RetryPolicy,
    pub batch_size: usize,
    pub idle_poll: Duration,
    pub defer_end_of_stream: bool,
    pub notification_faults: Option<NotificationFaults>,
    /// Whether a finished run marks the storage finished. A pipeline's input
    /// goes on in its next run, so its end is not marked: the next start
    /// restores its final checkpoint instead of doing nothing.
    pub mark_finished: bool,
}

/// What happens to one completion notice, in a simulation (feature
/// `testing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub enum NoticeDelivery {
    /// Delivered at once.
    Deliver,
    /// Lost (never for the final checkpoint).
    Lose,
    /// Delivered after a delay, possibly after later messages.
    Delay(Duration),
}

/// Decides, per subtask and checkpoint, what happens to a completion notice.
pub(crate) type NotificationFaults =
    Arc<dyn Fn(SubtaskIndex, CheckpointId) -> NoticeDelivery + Send + Sync>;

/// A checked job, ready to start. Made by [`Job::builder`] and
/// [`JobBuilder::build`].
pub struct Job<Src, S: Sink> {
    spec: JobSpec<Src, S>,
}

impl<Src, S: Sink> std::fmt::Debug for Job<Src, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("spec", &self.spec).finish()
    }
}

impl<Src, S: Sink> std::fmt::Debug for JobSpec<Src, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSpec")
            .field("name", &self.name)
            .field("parallelism", &self.parallelism)
            .field("checkpointing", &self.checkpointing)
            .field("global_committer", &self.global_committer.is_some())
            .finish_non_exhaustive()
    }
}

/// Builds a job: a source, a sink, and how to drive them.
///
/// Made by [`Job::builder`]; [`build`](Self::build) checks the configuration.
pub struct JobBuilder<Src, S: Sink> {
    spec: JobSpec<Src, S>,
    mode: RuntimeMode,
    allow_uncommitted: bool,
}

impl<Src, S> Job<Src, S>
where
    Src: Source<Record = S::Input>,
    S: Sink,
{
    /// Starts building a job named `name` that reads `source` and writes to
    /// `sink`. Defaults: parallelism 1, streaming, checkpointing off, no
    /// global committer, checkpoints kept in memory, commit retries per
    /// [`RetryPolicy::default`].
    pub fn builder(name: impl Into<String>, source: Src, sink: S) -> JobBuilder<Src, S> {
        JobBuilder {
            spec: JobSpec {
                name: name.into(),
                source,
                sink,
                parallelism: 1,
                checkpointing: None,
                global_committer: None,
                restart: RestartStrategy::Never,
                storage: Arc::new(MemoryCheckpointStorage::default()),
                retry: RetryPolicy::default(),
                batch_size: 4096,
                idle_poll: Duration::from_millis(20),
                defer_end_of_stream: true,
                notification_faults: None,
                mark_finished: true,
            },
            mode: RuntimeMode::Streaming,
            allow_uncommitted: false,
        }
    }

    /// Starts the job on the current tokio runtime and returns its handle.
    pub fn start(self) -> JobHandle {
        let metrics = Arc::new(Metrics::default());
        let (cancel, cancelled) = watch::channel(false);
        let task = tokio::spawn(crate::coordinator::run(
            self.spec,
            metrics.clone(),
            cancelled,
        ));
        JobHandle {
            metrics,
            cancel,
            task,
        }
    }

    /// Runs the job to its end: until a bounded input is committed, or
    /// forever for an unbounded one (use [`start`](Self::start) and
    /// [`JobHandle::cancel`] to stop it).
    pub async fn run(self) -> Result<JobReport, JobError> {
        self.start().join().await
    }
}

impl<Src, S> JobBuilder<Src, S>
where
    Src: Source<Record = S::Input>,
    S: Sink,
{
    /// How many subtasks run the source, writer and committer. Default 1.
    pub fn parallelism(mut self, parallelism: usize) -> Self {
        self.spec.parallelism = parallelism;
        self
    }

    /// Streaming (the default) or batch.
    pub fn mode(mut self, mode: RuntimeMode) -> Self {
        self.mode = mode;
        self
    }

    /// Turns checkpointing on. Without it, a bounded job commits once at end
    /// of input and an unbounded one is refused.
    pub fn checkpointing(mut self, config: CheckpointConfig) -> Self {
        self.spec.checkpointing = Some(config);
        self
    }

    /// Adds a global committer, which acts once per checkpoint on what every
    /// subtask committed. `factory` makes it, once per start of the job (the
    /// first and every restart).
    pub fn global_committer<G>(mut self, factory: impl Fn() -> G + Send + Sync + 'static) -> Self
    where
        G: GlobalCommitter<Committable = S::Committable>,
    {
        self.spec.global_committer = Some(Box::new(move || Box::new(factory())));
        self
    }

    /// What to do when a task fails: by default the job fails; with a
    /// restart strategy it restarts from its last completed checkpoint.
    pub fn restart_strategy(mut self, strategy: RestartStrategy) -> Self {
        self.spec.restart = strategy;
        self
    }

    /// Lets an unbounded job run with checkpointing off, although it will
    /// never commit anything: the output stays written but uncommitted, and
    /// the metrics count it in `records_uncommitted`.
    pub fn allow_uncommitted_output(mut self) -> Self {
        self.allow_uncommitted = true;
        self
    }

    /// Where completed checkpoints are kept. Default: in memory, the newest 3.
    pub fn checkpoint_storage(mut self, storage: impl CheckpointStorage) -> Self {
        self.spec.storage = Arc::new(storage);
        self
    }

    /// How commits that ask to be retried are retried.
    pub fn commit_retry(mut self, retry: RetryPolicy) -> Self {
        self.spec.retry = retry;
        self
    }

    /// Most records read and written as one batch. Default 4096.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.spec.batch_size = batch_size;
        self
    }

    /// Switches off the deferral of end of stream to the global committer,
    /// reproducing Flink's FLINK-38614 data loss. Only for tests that prove
    /// the deferral matters (feature `testing`); never use it otherwise.
    #[cfg(feature = "testing")]
    pub fn unsafe_disable_end_of_stream_deferral(mut self) -> Self {
        self.spec.defer_end_of_stream = false;
        self
    }

    /// Loses or delays completion notices as `faults` decides, to test that
    /// commits survive lost and late notifications (subsumption). Only for
    /// simulations (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn simulate_notification_faults(
        mut self,
        faults: impl Fn(SubtaskIndex, CheckpointId) -> NoticeDelivery + Send + Sync + 'static,
    ) -> Self {
        self.spec.notification_faults = Some(Arc::new(faults));
        self
    }

    /// Replaces the source given to [`Job::builder`]. For pipelines, whose
    /// channels are made when they start.
    pub(crate) fn with_source(mut self, source: Src) -> Self {
        self.spec.source = source;
        self
    }

    /// Lets the next start on the same storage resume after this run
    /// finished (see [`JobSpec::mark_finished`]). For pipelines.
    pub(crate) fn resumable_after_finish(mut self) -> Self {
        self.spec.mark_finished = false;
        self
    }

    /// Checks the configuration and returns the job, or the reason it could
    /// never work and how to fix it.
    pub fn build(mut self) -> Result<Job<Src, S>, BuildError> {
        let job = self.spec.name.clone();
        let invalid = |message: &str| BuildError::InvalidSetting {
            job: job.clone(),
            message: message.to_string(),
        };
        if self.spec.parallelism == 0 {
            return Err(invalid("parallelism must be at least 1"));
        }
        if self.spec.batch_size == 0 {
            return Err(invalid("batch size must be at least 1"));
        }
        let unbounded = self.spec.source.boundedness() == Boundedness::Unbounded;
        match self.mode {
            RuntimeMode::Batch if unbounded => {
                return Err(BuildError::BatchWithUnboundedSource { job });
            }
            RuntimeMode::Batch => {
                // Batch mode commits once at end of input.
                self.spec.checkpointing = None;
            }
            RuntimeMode::Streaming => {}
        }
        if let Some(config) = &self.spec.checkpointing {
            if config.interval.is_zero() {
                return Err(invalid("the checkpoint interval must be longer than zero"));
            }
            if config.timeout.is_zero() {
                return Err(invalid("the checkpoint timeout must be longer than zero"));
            }
            if config.max_concurrent == 0 {
                return Err(invalid("at least one checkpoint must be allowed in flight"));
            }
        } else if unbounded {
            if !self.allow_uncommitted {
                return Err(BuildError::UnboundedWithoutCheckpointing { job });
            }
            warn!(job = %job, "the source is unbounded and checkpointing is off: nothing will ever be committed (allowed by allow_uncommitted_output)");
        }
        Ok(Job { spec: self.spec })
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobStatus {
    /// The input ended and everything was committed.
    Finished,
    /// [`JobHandle::cancel`] stopped it; uncommitted output stays
    /// uncommitted.
    Cancelled,
    /// The checkpoint storage says this job finished before: nothing was
    /// read, written or committed.
    AlreadyFinished,
}

/// What a job reports when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobReport {
    /// How it ended.
    pub status: JobStatus,
    /// Its counters at the end, over every restart.
    pub metrics: MetricsSnapshot,
    /// The newest completed checkpoint, if any.
    pub last_checkpoint: Option<CheckpointId>,
    /// Every commit that failed with a known reason (the first
    /// [`MAX_KEPT_FAILURES`](crate::MAX_KEPT_FAILURES)): output this
    /// job lost, with the committers' reasons. A job can end
    /// [`JobStatus::Finished`] and still have lost output: check
    /// [`lost_output`](Self::lost_output).
    pub known_failures: Vec<KnownCommitFailure>,
}

impl JobReport {
    /// Whether the job lost output: some commit failed with a known reason
    /// (`metrics.commits_failed > 0`). A program that runs a job should say
    /// so and exit with an error, naming [`known_failures`](Self::known_failures).
    pub fn lost_output(&self) -> bool {
        self.metrics.commits_failed > 0
    }
}

/// A running job. Made by [`Job::start`].
#[derive(Debug)]
pub struct JobHandle {
    metrics: Arc<Metrics>,
    cancel: watch::Sender<bool>,
    task: JoinHandle<Result<JobReport, JobError>>,
}

impl JobHandle {
    /// The job's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// The commits that failed with a known reason so far (see
    /// [`JobReport::known_failures`]).
    pub fn known_failures(&self) -> Vec<KnownCommitFailure> {
        self.metrics.known_failures()
    }

    /// Asks the job to stop: tasks stop at their next step, no commit starts
    /// or is retried any more, and writers are closed (aborting what they
    /// held open). What was prepared but not committed stays in the last
    /// completed checkpoint, for a restart on the same storage.
    /// [`join`](Self::join) then returns a report with
    /// [`JobStatus::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// The job's live counters, shared.
    pub(crate) fn shared_metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Whether the job has ended (then [`join`](Self::join) returns at once).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the job to end.
    pub async fn join(self) -> Result<JobReport, JobError> {
        match self.task.await {
            Ok(result) => result,
            Err(error) => Err(JobError::Panicked {
                task: "the checkpoint coordinator".into(),
                message: error.to_string(),
            }),
        }
    }
}
