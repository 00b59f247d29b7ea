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

use sink_api::{BadRecord, Clock, GlobalCommitter, Sink, SystemClock};
use sink_api::{CommittableOf, InputOf};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::bad_records::BadRecordPolicy;
use crate::core::admission::{admit, Admission, JobShape, Refusal};
use crate::core::checkpoints::{CheckpointConfig, TriggerMode};
use crate::core::restart::RestartStrategy;
use crate::core::retry::RetryPolicy;
use crate::dead_letter::DeadLettered;
use crate::error::{BuildError, JobError};
use crate::metrics::{KnownCommitFailure, Metrics, MetricsSnapshot};
use crate::report::JobReport;
use crate::source::{Boundedness, Source};
use crate::spec::{JobSpec, RuntimeMode};
use crate::storage::{CheckpointStorage, MemoryCheckpointStorage};

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

/// Builds a job: a source, a sink, and how to drive them.
///
/// Made by [`Job::builder`]; [`build`](Self::build) checks the configuration.
pub struct JobBuilder<Src, S: Sink> {
    spec: JobSpec<Src, S>,
    mode: RuntimeMode,
    allow_uncommitted: bool,
    /// A global committer was given although the sink brings its own.
    second_global_committer: bool,
    /// The global committer was given to the builder, not brought by the
    /// sink.
    user_global_committer: bool,
    /// A combination of settings found wrong before `build`, which reports
    /// it.
    refused: Option<String>,
}

impl<Src, S> Job<Src, S>
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    /// Starts building a job named `name` that reads `source` and writes to
    /// `sink`. Defaults: parallelism 1, streaming, checkpointing off, the
    /// sink's own global committer ([`Sink::global_committer`]) or none,
    /// checkpoints kept in memory, commit retries per [`RetryPolicy::default`].
    pub fn builder(name: impl Into<String>, source: Src, sink: S) -> JobBuilder<Src, S> {
        let global_committer = sink.global_committer();
        JobBuilder {
            spec: JobSpec {
                name: name.into(),
                source,
                sink: Arc::new(sink),
                parallelism: 1,
                checkpointing: None,
                global_committer,
                restart: RestartStrategy::Never,
                storage: Arc::new(MemoryCheckpointStorage::default()),
                retry: RetryPolicy::default(),
                batch_size: 4096,
                idle_poll: Duration::from_millis(20),
                defer_end_of_stream: true,
                notification_faults: None,
                mark_finished: true,
                clock: Arc::new(SystemClock),
                visible_commits: false,
                counters: Vec::new(),
                bad_records: BadRecordPolicy::Fail,
            },
            mode: RuntimeMode::Streaming,
            allow_uncommitted: false,
            second_global_committer: false,
            user_global_committer: false,
            refused: None,
        }
    }

    /// Starts the job on the current tokio runtime and returns its handle.
    pub fn start(self) -> JobHandle {
        let metrics = Arc::new(Metrics::default());
        for counter in &self.spec.counters {
            metrics.counts.register(counter);
        }
        let (cancel, cancelled) = watch::channel(false);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(crate::coordinator::run(
            self.spec,
            metrics.clone(),
            cancelled,
            stopped,
        ));
        JobHandle {
            metrics,
            control: JobControl {
                signals: Arc::new(Signals { cancel, stop }),
            },
            task,
        }
    }

    /// Runs the job to its end: until a bounded input is committed, or
    /// forever for an unbounded one (use [`start`](Self::start), and
    /// [`JobControl::stop`] or [`JobHandle::cancel`] to end it).
    pub async fn run(self) -> Result<JobReport, JobError> {
        self.start().join().await
    }
}

impl<Src, S> JobBuilder<Src, S>
where
    Src: Source<Record = InputOf<S>>,
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
    /// first and every restart). Refused by [`build`](Self::build) when the
    /// sink brings its own ([`Sink::global_committer`]), and with a source
    /// whose positions are committed with the data: a hand-over's new owner
    /// reads from the destination's positions and never does what the old
    /// owner's checkpoint left for this committer.
    pub fn global_committer<G>(mut self, factory: impl Fn() -> G + Send + Sync + 'static) -> Self
    where
        G: GlobalCommitter<Committable = CommittableOf<S>>,
    {
        self.second_global_committer |= self.spec.sink.global_committer().is_some();
        self.user_global_committer = true;
        self.spec.global_committer = Some(Box::new(move |_| Box::new(factory())));
        self
    }

    /// What to do when a task fails: by default the job fails; with a
    /// restart strategy it restarts from its last completed checkpoint. A
    /// commit superseded by another owner of a split restarts the job
    /// whatever the strategy, without using up its restarts
    /// ([`JobError::is_superseded`]).
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
        faults: impl Fn(sink_api::SubtaskIndex, sink_api::CheckpointId) -> crate::spec::NoticeDelivery
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.spec.notification_faults = Some(Arc::new(faults));
        self
    }

    /// Keeps the checkpoint storage resumable after the job finished: a
    /// finished run does not mark the storage finished, so the next start on
    /// it restores the final checkpoint (committing again what it held) and
    /// goes on, instead of doing nothing. For jobs whose input goes on
    /// after a clean shutdown, such as an embedding service's channels
    /// ([`Pipeline`](crate::Pipeline) sets it); a bounded batch job should
    /// not, or it would run again.
    pub fn resumable_after_finish(mut self) -> Self {
        self.spec.mark_finished = false;
        self
    }

    /// The clock the sink's writers and committers see
    /// ([`InitContext::clock`](sink_api::InitContext::clock)): for tests and
    /// simulations that move time by hand. Default: [`SystemClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.spec.clock = Arc::new(clock);
        self
    }

    /// Registers `counter`, a counter of the job's own, so that the job's
    /// metrics show it from the start (at 0) with its help: see
    /// [`JobCounter`](crate::JobCounter). Its counts are kept in checkpoints and restored with
    /// them.
    pub fn counter(mut self, counter: &crate::JobCounter) -> Self {
        self.spec.counters.push(counter.clone());
        self
    }

    /// Skips the records the source's parse step refuses (a [`BadRecord`]
    /// from [`Source::try_map`] or a
    /// [`Transform`](crate::source::Transform)) instead of failing, and
    /// counts them in the job counter `bad_records_skipped` (kept in
    /// checkpoints: each refused record counted once across restarts). The
    /// first ten of each subtask are logged at WARN with their position and
    /// reason. See [`BadRecordPolicy`].
    pub fn skip_bad_records(mut self) -> Self {
        self.spec.bad_records = BadRecordPolicy::Skip;
        self
    }

    /// Sends the records the source's parse step refuses to
    /// `dead_letters`, a second sink, instead of failing: each
    /// [`BadRecord`] (its bytes, its position and the reason) becomes the
    /// dead-letter sink's input (a Kafka record, a JSON line of a file
    /// sink) and is committed exactly once, with the checkpoint that read
    /// it, before the main output of that checkpoint. Counted in the job
    /// counter `bad_records_dead_lettered`. See
    /// [`DeadLettered`](crate::dead_letter::DeadLettered).
    ///
    /// Give the dead-letter sink a destination of its own (another topic,
    /// directory or table); it sees the job as `<name>-dead-letters`, so
    /// that names derived from the job (a Kafka sink's default
    /// transactional ids) differ from the main sink's. Refused by
    /// [`build`](Self::build) with a global committer given to the builder,
    /// and with a dead-letter sink that brings a global committer of its
    /// own.
    pub fn dead_letters<D>(self, dead_letters: D) -> JobBuilder<Src, DeadLettered<S, D>>
    where
        D: Sink,
        InputOf<D>: From<BadRecord>,
        CommittableOf<S>: Clone,
        CommittableOf<D>: Clone,
    {
        let mut refused = self.refused;
        if self.user_global_committer {
            refused.get_or_insert_with(|| {
                "a global committer given to the builder (JobBuilder::global_committer) cannot be \
                 combined with dead letters: remove one of them"
                    .to_string()
            });
        }
        if dead_letters.global_committer().is_some() {
            refused.get_or_insert_with(|| {
                "the dead-letter sink brings a global committer (Sink::global_committer), which \
                 a dead-letter destination cannot have: use a sink whose committers make its \
                 data visible (the Kafka, file, memory and PostgreSQL sinks; a file sink without \
                 compaction)"
                    .to_string()
            });
        }
        let spec = self.spec;
        let sink = Arc::new(DeadLettered::new(spec.sink, dead_letters));
        let mut counters = spec.counters;
        counters.extend(crate::bad_records::counters());
        JobBuilder {
            spec: JobSpec {
                name: spec.name,
                source: spec.source,
                global_committer: sink.global_committer(),
                sink,
                parallelism: spec.parallelism,
                checkpointing: spec.checkpointing,
                restart: spec.restart,
                storage: spec.storage,
                retry: spec.retry,
                batch_size: spec.batch_size,
                idle_poll: spec.idle_poll,
                defer_end_of_stream: spec.defer_end_of_stream,
                notification_faults: spec.notification_faults,
                mark_finished: spec.mark_finished,
                clock: spec.clock,
                visible_commits: spec.visible_commits,
                counters,
                bad_records: BadRecordPolicy::DeadLetter,
            },
            mode: self.mode,
            allow_uncommitted: self.allow_uncommitted,
            second_global_committer: self.second_global_committer,
            user_global_committer: self.user_global_committer,
            refused,
        }
    }

    /// Promises that a commit's records are visible to the destination's
    /// readers once it returns, as a service that answers its clients after
    /// the commit needs: the sink is told
    /// ([`InitContext::visible_commits`](sink_api::InitContext::visible_commits);
    /// a file sink with its default rolling policy then rolls its parts at
    /// every checkpoint), and [`build`](Self::build) refuses a sink that
    /// would still keep committed records out of sight
    /// ([`Sink::deferred_visibility`]), with its fix. A
    /// [`Pipeline`](crate::Pipeline) promises it unless told
    /// [otherwise](crate::PipelineBuilder::acknowledge_before_visible).
    pub fn visible_commits(mut self) -> Self {
        self.spec.visible_commits = true;
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
        if let Some(refused) = &self.refused {
            return Err(invalid(refused));
        }
        if self.spec.parallelism == 0 {
            return Err(invalid("parallelism must be at least 1"));
        }
        if self.spec.bad_records == BadRecordPolicy::Skip {
            self.spec.counters.extend(crate::bad_records::counters());
        }
        if self.spec.batch_size == 0 {
            return Err(invalid("batch size must be at least 1"));
        }
        if self.spec.visible_commits {
            if let Some(why) = self.spec.sink.deferred_visibility() {
                return Err(invalid(&format!(
                    "the job promises that each commit makes its records visible (a pipeline's \
                     tickets do), but {why}. For acknowledgements that mean durable, not yet \
                     visible, call PipelineBuilder::acknowledge_before_visible"
                )));
            }
        }
        if self.second_global_committer {
            return Err(invalid(
                "the sink brings its own global committer (Sink::global_committer); \
                 remove the call of JobBuilder::global_committer",
            ));
        }
        if let Some(scope) = self.spec.source.position_scope() {
            if !self.spec.sink.commits_positions() {
                return Err(invalid(&format!(
                    "the source commits its positions with the data (scope {scope:?}), so that \
                     its splits can move between instances of the job, but the sink cannot \
                     (Sink::commits_positions is false): use a sink that commits positions (the \
                     memory, file, PostgreSQL and Kafka sinks of this project do), or a source \
                     that keeps its positions in the job's checkpoints"
                )));
            }
            if self.user_global_committer {
                return Err(invalid(&format!(
                    "the source commits its positions with the data (scope {scope:?}), so that \
                     its splits can move between instances of the job, and a new owner never does \
                     what an old owner's checkpoint left for a global committer given to the \
                     builder: remove the call of JobBuilder::global_committer (a sink's own global \
                     committer, which only acts on what its committers committed, is allowed)"
                )));
            }
        }
        let shape = JobShape {
            batch: self.mode == RuntimeMode::Batch,
            unbounded: self.spec.source.boundedness() == Boundedness::Unbounded,
            checkpointing: self.spec.checkpointing.is_some(),
            allow_uncommitted: self.allow_uncommitted,
        };
        let admission = match admit(shape) {
            Ok(admission) => admission,
            Err(Refusal::BatchWithUnboundedSource) => {
                return Err(BuildError::BatchWithUnboundedSource { job });
            }
            Err(Refusal::UnboundedWithoutCheckpointing) => {
                return Err(BuildError::UnboundedWithoutCheckpointing { job });
            }
        };
        if admission != Admission::Checkpoints {
            // Batch mode ignores the interval: one commit at end of input.
            self.spec.checkpointing = None;
        }
        if admission == Admission::Uncommitted {
            warn!(job = %job, "the source is unbounded and checkpointing is off: nothing will ever be committed (allowed by allow_uncommitted_output)");
        }
        if let Some(config) = &self.spec.checkpointing {
            if config.interval.is_zero() {
                return Err(invalid("the checkpoint interval must be longer than zero"));
            }
            if config.timeout.is_zero() {
                return Err(invalid("the checkpoint timeout must be longer than zero"));
            }
            if config.trigger == TriggerMode::OnDemand && config.min_pause > config.interval {
                return Err(invalid(
                    "with on-demand checkpoints the minimum pause must not exceed the maximum interval",
                ));
            }
            if config.max_concurrent == 0 {
                return Err(invalid("at least one checkpoint must be allowed in flight"));
            }
            if let Some(lifetime) = self.spec.sink.uncommitted_lifetime() {
                // From the first record after a barrier to its commit: the
                // next barrier, the checkpoint's completion, and the
                // commit's retries.
                let retries = self.spec.retry.longest_backoff();
                let longest = config
                    .interval
                    .saturating_add(config.min_pause)
                    .saturating_add(config.timeout)
                    .saturating_add(retries);
                if longest > lifetime {
                    let room = lifetime
                        .saturating_sub(config.interval)
                        .saturating_sub(config.min_pause)
                        .saturating_sub(retries);
                    return Err(invalid(&format!(
                        "the sink's destination drops uncommitted data after {lifetime:?} (for \
                         Kafka: the transaction timeout), but a checkpoint's data may wait {longest:?} \
                         for its commit (checkpoint interval {:?} + minimum pause {:?} + checkpoint \
                         timeout {:?} + commit retries' backoff {retries:?}), and would be lost. \
                         Lower the checkpoint timeout (CheckpointConfig::timeout) to at most {room:?}, \
                         shorten the interval or the commit retries (JobBuilder::commit_retry), or \
                         raise the sink's timeout (KafkaSinkBuilder::transaction_timeout, up to the \
                         broker's transaction.max.timeout.ms)",
                        config.interval, config.min_pause, config.timeout
                    )));
                }
            }
        }
        Ok(Job { spec: self.spec })
    }
}

/// A running job. Made by [`Job::start`].
///
/// [`join`](Self::join) takes the handle; to stop or cancel the job from
/// elsewhere while a task awaits it (a signal handler, an admin endpoint),
/// take a [`JobControl`] first with [`control`](Self::control).
#[derive(Debug)]
pub struct JobHandle {
    metrics: Arc<Metrics>,
    control: JobControl,
    task: JoinHandle<Result<JobReport, JobError>>,
}

/// Stops or cancels a running job from anywhere. Made by
/// [`JobHandle::control`]; cheap to clone, `Send` and `Sync`, usable after
/// the handle was given to a task that [`join`](JobHandle::join)s it, and
/// harmless after the job ended.
///
/// ```
/// # use std::time::Duration;
/// # use sink_runtime::{CheckpointConfig, Job, JobStatus, SequenceSource};
/// # use sinks_memory::{MemorySink, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let store = MemoryStore::<u64>::new();
/// let handle = Job::builder("events", SequenceSource::unbounded(u64::MAX).paced(1000), MemorySink::new(store.clone()))
///     .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
///     .build()?
///     .start();
/// let control = handle.control();
/// let job = tokio::spawn(handle.join());
/// // In a signal handler (`tokio::signal::ctrl_c().await`), say:
/// # tokio::time::sleep(Duration::from_millis(100)).await;
/// control.stop();
/// let report = job.await??;
/// assert_eq!(report.status, JobStatus::Stopped);
/// assert_eq!(report.metrics.records_committed, store.committed().len() as u64);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct JobControl {
    signals: Arc<Signals>,
}

#[derive(Debug)]
struct Signals {
    cancel: watch::Sender<bool>,
    stop: watch::Sender<bool>,
}

impl JobControl {
    /// Asks the job to stop cleanly: every subtask's input ends at its
    /// next record (records read are written; nothing more is read), the
    /// final checkpoint is taken and committed as at an end of input, the
    /// writers close, and [`join`](JobHandle::join) returns a report with
    /// [`JobStatus::Stopped`](crate::JobStatus::Stopped).
    ///
    /// The checkpoint storage is left resumable (not marked finished): a
    /// start of the job on it restores the final checkpoint and reads on
    /// from where this one stopped. A job that is restarting after a
    /// failure stops once its next attempt has started. Returns at once;
    /// calling it again, or after the job ended, does nothing.
    pub fn stop(&self) {
        self.signals.stop.send_replace(true);
    }

    /// Asks the job to stop at once, committing nothing more: see
    /// [`JobHandle::cancel`]. Overrides a stop under way.
    pub fn cancel(&self) {
        self.signals.cancel.send_replace(true);
    }
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
    /// [`JobStatus::Cancelled`](crate::JobStatus::Cancelled). For a stop
    /// that commits what was read, see [`JobControl::stop`].
    pub fn cancel(&self) {
        self.control.cancel();
    }

    /// A control of this job, to [stop](JobControl::stop) or
    /// [cancel](JobControl::cancel) it from another task while this handle
    /// is [joined](Self::join).
    pub fn control(&self) -> JobControl {
        self.control.clone()
    }

    /// The job's live counters, readable after the handle was given away
    /// (to a task that [`join`](Self::join)s it, say): for services that
    /// export them while the job runs.
    pub fn live_metrics(&self) -> Arc<Metrics> {
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
