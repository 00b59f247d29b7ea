//! Pipelines: the runtime embedded in a service, fed record by record, and
//! answering each send once its records are committed.
//!
//! A [`Pipeline`] is a job whose source is a bounded channel per subtask.
//! [`Pipeline::send`] queues a batch of records (waiting for room: the
//! channel's capacity is the backpressure) and returns a [`Ticket`]; the
//! ticket resolves to an [`Ack`] once the checkpoint holding the records has
//! been committed by the sink's committer, never before, or fails with a
//! [`TicketError`] when that can no longer happen (the job failed or
//! restarted first). [`Pipeline::shutdown`] ends the input, runs the final
//! checkpoint and its commit, and returns the final report.
//!
//! ```text
//!  service ── send(records, key) ──▶ channel[i] ──▶ subtask i: reader ─▶ writer ─▶ committer
//!     ▲                                            │ barrier n: records read so far are in n
//!     └──────────── ticket: Ack { checkpoint n } ◀─┘ after the commit of n
//! ```
//!
//! A send may carry an idempotency key: keys are routed to the subtask that
//! owns their key partition and kept in its checkpoints (see
//! [`KeyRetention`]), so a send repeated after a lost answer, or after a
//! crash, is answered with the first one's checkpoint and not written again.
//! Their count is budgeted per namespace ([`KeyNamespaces`], such as a
//! service's tenants): one namespace's new keys never push out another's.
//! A key sent with a [`Fingerprint`] of its content
//! ([`Pipeline::send_keyed`]) keeps it: the same key with another
//! fingerprint is refused ([`TicketError::KeyReused`]), not mistaken for a
//! retry.
//!
//! ```
//! # use std::time::Duration;
//! # use sink_runtime::pipeline::Pipeline;
//! # use sink_runtime::CheckpointConfig;
//! # use sinks_memory::{MemorySink, MemoryStore};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::<String>::new();
//! let pipeline = Pipeline::builder("ingest", MemorySink::new(store.clone()))
//!     .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
//!     .start()
//!     .await?;
//! let ticket = pipeline.send(vec!["hello".to_string()], Some("request-1".into())).await?;
//! let ack = ticket.await?; // the record is committed now
//! assert!(store.committed().contains(&"hello".to_string()));
//! // The same key again: answered, not written twice.
//! let again = pipeline.send(vec!["hello".to_string()], Some("request-1".into())).await?.await?;
//! assert!(again.duplicate);
//! assert_eq!(again.checkpoint_id, ack.checkpoint_id);
//! let report = pipeline.shutdown().await?;
//! assert_eq!(report.metrics.records_committed, 1);
//! # Ok(())
//! # }
//! ```

mod channel;
mod key_log;
mod keys;
mod ticket;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use sink_api::{InputOf, Sink, SinkWriter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::info;

// Only the runtime's public API: the pipeline is a client of the job
// builder like any embedding would be, and could live in a crate of its own.
use crate::{
    BuildError, CheckpointConfig, CheckpointStorage, Job, JobBuilder, JobError, JobReport,
    JobStatus, Metrics, MetricsSnapshot, RestartStrategy, RetryPolicy,
};
use channel::{ChannelSource, Envelope, Shared};

pub use keys::{Fingerprint, IdempotencyKey, KeyNamespaces, KeyPartition, KeyRetention};
pub use ticket::{Ack, Ticket, TicketError};

/// Where a pipeline stands, as [`Pipeline::state`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipelineState {
    /// Every subtask reads its channel: sends are taken.
    Running,
    /// The job failed and is restarting from its last checkpoint: sends are
    /// refused with [`Refusal::Unavailable`] until it runs again.
    Restarting,
    /// [`Pipeline::shutdown`] was called: no more sends; what was sent is
    /// being committed.
    ShuttingDown,
    /// The job has ended (shut down, or failed for good).
    Stopped,
}

/// Why a send was refused. The records come back in [`SendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The channel is full ([`Pipeline::try_send`] only): the pipeline is
    /// overloaded; try again later.
    Full,
    /// The pipeline is restarting; try again later.
    Unavailable,
    /// The pipeline is shutting down or has stopped.
    Closed,
}

/// A refused send, with its records handed back.
#[derive(Debug, thiserror::Error)]
#[error("{}", match .refusal {
    Refusal::Full => "the pipeline is overloaded: its channel is full",
    Refusal::Unavailable => "the pipeline is restarting",
    Refusal::Closed => "the pipeline is shutting down or has stopped",
})]
pub struct SendError<R> {
    /// Why.
    pub refusal: Refusal,
    /// The records, not sent.
    pub records: Vec<R>,
}

/// Why a pipeline could not start or did not end well.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The configuration was refused.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The job failed.
    #[error(transparent)]
    Job(#[from] JobError),
    /// The job ended before it took any input.
    #[error("pipeline '{name}' ended before it took any input ({status:?})")]
    EndedAtStart {
        /// The pipeline's name.
        name: String,
        /// How the job ended.
        status: JobStatus,
    },
    /// [`Pipeline::shutdown`] was called before.
    #[error("pipeline '{name}' was already shut down")]
    AlreadyShutDown {
        /// The pipeline's name.
        name: String,
    },
}

/// One setting of the job, applied to its builder when the pipeline
/// starts (the channels, and so the source, exist only then).
type JobSetting<S> = Box<
    dyn FnOnce(JobBuilder<ChannelSource<InputOf<S>>, S>) -> JobBuilder<ChannelSource<InputOf<S>>, S>
        + Send,
>;

/// Builds a pipeline. Made by [`Pipeline::builder`].
///
/// It builds its job through the job builder's public methods only, when
/// it starts: a pipeline is a client of the runtime like any other.
pub struct PipelineBuilder<S: Sink> {
    name: String,
    sink: S,
    /// The job's settings, in the order given.
    settings: Vec<JobSetting<S>>,
    parallelism: usize,
    capacity: usize,
    partitions: u32,
    retention: KeyRetention,
    namespaces: KeyNamespaces,
    max_in_flight: usize,
    checkpointing: bool,
    /// Whether a ticket may resolve before its records are visible.
    before_visible: bool,
}

impl<S: Sink> std::fmt::Debug for PipelineBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineBuilder")
            .field("name", &self.name)
            .field("parallelism", &self.parallelism)
            .field("capacity", &self.capacity)
            .field("key_partitions", &self.partitions)
            .field("key_retention", &self.retention)
            .field("key_namespaces", &self.namespaces)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

/// A running pipeline: the service's handle to send records and learn when
/// they are committed. Cheap to clone; every clone is the same pipeline.
///
/// Made by [`PipelineBuilder::start`]. Dropping every clone without
/// [`shutdown`](Self::shutdown) ends the input too; the job then finishes in
/// the background and its report is lost.
pub struct Pipeline<R> {
    inner: Arc<Inner<R>>,
}

impl<R> Clone for Pipeline<R> {
    fn clone(&self) -> Self {
        Pipeline {
            inner: self.inner.clone(),
        }
    }
}

impl<R> std::fmt::Debug for Pipeline<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.inner.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

struct Inner<R> {
    name: String,
    shared: Arc<Shared<R>>,
    /// `None` once shut down.
    senders: RwLock<Option<Vec<mpsc::Sender<Envelope<R>>>>>,
    capacity: usize,
    next: AtomicUsize,
    metrics: Arc<Metrics>,
    ended: Mutex<Option<JoinHandle<Result<JobReport, JobError>>>>,
    shutting_down: AtomicBool,
}

impl<R: Send + 'static> Pipeline<R> {
    /// Starts building a pipeline named `name` into `sink`. Defaults:
    /// parallelism 1, 1024 queued sends per subtask, 64 key partitions,
    /// [`KeyRetention::default`] for one key namespace
    /// ([`KeyNamespaces::Single`]), checkpoints kept in memory (use
    /// [`PipelineBuilder::checkpoint_storage`] to survive a crash of the
    /// process), commit retries per [`RetryPolicy::default`]. Checkpointing
    /// must be set: tickets resolve at checkpoint commits.
    pub fn builder<S: Sink<Writer: SinkWriter<Input = R>>>(
        name: impl Into<String>,
        sink: S,
    ) -> PipelineBuilder<S> {
        PipelineBuilder {
            name: name.into(),
            sink,
            settings: Vec::new(),
            parallelism: 1,
            capacity: 1024,
            partitions: 64,
            retention: KeyRetention::default(),
            namespaces: KeyNamespaces::default(),
            max_in_flight: 16_384,
            checkpointing: false,
            before_visible: false,
        }
    }
}

impl<S: Sink> PipelineBuilder<S> {
    fn with_job(
        mut self,
        setting: impl FnOnce(
                JobBuilder<ChannelSource<InputOf<S>>, S>,
            ) -> JobBuilder<ChannelSource<InputOf<S>>, S>
            + Send
            + 'static,
    ) -> Self {
        self.settings.push(Box::new(setting));
        self
    }

    /// How many subtasks read, write and commit. Default 1.
    pub fn parallelism(mut self, parallelism: usize) -> Self {
        self.parallelism = parallelism;
        self
    }

    /// Lets tickets resolve when their records are committed but not yet
    /// visible to the destination's readers: for a sink that keeps
    /// committed records out of sight for a while on purpose (a file sink
    /// rolling large parts by size or time, whose records appear when
    /// their part rolls). Without it, a pipeline asks its sink to publish
    /// at every commit ([`JobBuilder::visible_commits`]) and refuses one
    /// that would not; a ticket's "committed" then means "durable, and
    /// visible after the part rolls".
    pub fn acknowledge_before_visible(mut self) -> Self {
        self.before_visible = true;
        self
    }

    /// How often checkpoints are taken: the time a ticket waits is about
    /// half an interval plus the checkpoint and the commit. Required.
    pub fn checkpointing(mut self, config: CheckpointConfig) -> Self {
        self.checkpointing = true;
        self.with_job(move |job| job.checkpointing(config))
    }

    /// Where checkpoints are kept. A pipeline that must survive a crash of
    /// its process (and keep its idempotency keys) needs durable storage,
    /// such as [`crate::LocalCheckpointStorage`]. A pipeline started again on
    /// the same storage resumes from its last checkpoint, also after a clean
    /// shutdown.
    pub fn checkpoint_storage(self, storage: impl CheckpointStorage) -> Self {
        self.with_job(move |job| job.checkpoint_storage(storage))
    }

    /// What to do when a task fails; see [`JobBuilder::restart_strategy`].
    /// Tickets of records not yet committed fail at each restart.
    pub fn restart_strategy(self, strategy: RestartStrategy) -> Self {
        self.with_job(move |job| job.restart_strategy(strategy))
    }

    /// How commits that ask to be retried are retried.
    pub fn commit_retry(self, retry: RetryPolicy) -> Self {
        self.with_job(move |job| job.commit_retry(retry))
    }

    /// How many sends may wait in each subtask's channel before
    /// [`Pipeline::send`] waits and [`Pipeline::try_send`] refuses with
    /// [`Refusal::Full`]. Default 1024.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// How many sends each subtask may have taken in and not yet answered
    /// (waiting for their checkpoint's commit). Past it, the subtask takes
    /// nothing more from its channel, which fills up: while commits or
    /// checkpoints stall, senders meet [`Refusal::Full`] (or wait in
    /// [`Pipeline::send`]) instead of the service's memory growing. Default
    /// 16 384; it bounds the sends per subtask per checkpoint interval.
    pub fn max_in_flight(mut self, sends: usize) -> Self {
        self.max_in_flight = sends;
        self
    }

    /// How many key partitions idempotency keys are spread over: the most
    /// subtasks keyed sends can use, for this storage's whole life (the
    /// count is stored with the keys, and a restore keeps the stored one).
    /// Default 64, at most 65 536.
    pub fn key_partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    /// How long committed idempotency keys are remembered: for
    /// `max_age`, and `max_keys` of them per namespace (see
    /// [`key_namespaces`](Self::key_namespaces)). Default
    /// [`KeyRetention::default`].
    pub fn key_retention(mut self, retention: KeyRetention) -> Self {
        self.retention = retention;
        self
    }

    /// Which idempotency keys share the `max_keys` budget of
    /// [`key_retention`](Self::key_retention): called by a service whose keys
    /// belong to different owners, such as tenants, so that one owner's new
    /// keys push out only its own oldest ones, never another's still within
    /// their retention. Default [`KeyNamespaces::Single`]: one budget for
    /// all keys. The namespaces are derived from the keys, not stored: the
    /// setting may change between two starts on the same storage (it changes
    /// only which keys share a budget). Each namespace that holds keys may
    /// keep `max_keys` of them, so the namespaces must be a bounded set.
    pub fn key_namespaces(mut self, namespaces: KeyNamespaces) -> Self {
        self.namespaces = namespaces;
        self
    }

    /// Checks the configuration, starts the job on the current tokio
    /// runtime, and returns once every subtask's reader exists. After a
    /// restore, reading starts once the restored checkpoint was committed
    /// again; sends queue in the channels meanwhile.
    pub async fn start(self) -> Result<Pipeline<InputOf<S>>, PipelineError> {
        let invalid = |message: &str| BuildError::InvalidSetting {
            job: self.name.clone(),
            message: message.to_string(),
        };
        if !self.checkpointing {
            return Err(invalid(
                "a pipeline needs checkpointing: tickets resolve when a checkpoint is committed; \
                 call .checkpointing(CheckpointConfig::every(...))",
            )
            .into());
        }
        if self.capacity == 0 {
            return Err(invalid("the channel capacity must be at least 1").into());
        }
        if self.partitions == 0 || self.partitions > keys::MAX_KEY_PARTITIONS {
            return Err(invalid("the key partitions must be between 1 and 65536").into());
        }
        if self.max_in_flight == 0 {
            return Err(invalid("at least one send must be allowed in flight").into());
        }
        let parallelism = self.parallelism.max(1);
        let (shared, senders) = Shared::new(parallelism, self.capacity);
        let source = ChannelSource {
            shared: shared.clone(),
            partitions: self.partitions,
            retention: self.retention,
            namespaces: self.namespaces,
            max_in_flight: self.max_in_flight,
        };
        // A pipeline's input goes on after a clean shutdown: its storage is
        // not marked finished, so the next start resumes from it.
        let mut job = Job::builder(self.name.clone(), source, self.sink)
            .parallelism(parallelism)
            .resumable_after_finish();
        // A ticket's answer means visible, unless the user said otherwise.
        if !self.before_visible {
            job = job.visible_commits();
        }
        for setting in self.settings {
            job = setting(job);
        }
        let handle = job.build()?.start();
        let metrics = handle.live_metrics();
        let watcher_shared = shared.clone();
        let ended = tokio::spawn(async move {
            let result = handle.join().await;
            watcher_shared.end();
            result
        });
        let pipeline = Pipeline {
            inner: Arc::new(Inner {
                name: self.name,
                shared,
                senders: RwLock::new(Some(senders)),
                capacity: self.capacity,
                next: AtomicUsize::new(0),
                metrics,
                ended: Mutex::new(Some(ended)),
                shutting_down: AtomicBool::new(false),
            }),
        };
        pipeline.wait_until_running().await?;
        info!(pipeline = %pipeline.inner.name, parallelism, "pipeline running");
        Ok(pipeline)
    }
}

impl<R> Pipeline<R> {
    /// Where the pipeline stands now.
    pub fn state(&self) -> PipelineState {
        let shared = &self.inner.shared;
        if shared.ended.load(Ordering::SeqCst) {
            PipelineState::Stopped
        } else if self.inner.shutting_down.load(Ordering::SeqCst) {
            PipelineState::ShuttingDown
        } else if shared.live_readers.load(Ordering::SeqCst) == self.parallelism() {
            PipelineState::Running
        } else {
            PipelineState::Restarting
        }
    }

    /// Waits until the pipeline has stopped: shut down, or failed past its
    /// restart strategy (then [`shutdown`](Pipeline::shutdown) returns the
    /// failure). For a service that must stop serving when its pipeline is
    /// gone.
    pub async fn stopped(&self) {
        let mut changed = self.inner.shared.changed.subscribe();
        while self.state() != PipelineState::Stopped {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// How many subtasks read the pipeline's channels.
    pub fn parallelism(&self) -> usize {
        self.inner.shared.parallelism()
    }

    /// The job's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// How many sends wait in the channels now, over all subtasks.
    pub fn queued(&self) -> usize {
        let senders = self.inner.senders.read().unwrap_or_else(|p| p.into_inner());
        senders.as_ref().map_or(0, |senders| {
            senders
                .iter()
                .map(|sender| self.inner.capacity.saturating_sub(sender.capacity()))
                .sum()
        })
    }
}

impl<R: Send + 'static> Pipeline<R> {
    async fn wait_until_running(&self) -> Result<(), PipelineError> {
        let mut changed = self.inner.shared.changed.subscribe();
        loop {
            match self.state() {
                PipelineState::Running => return Ok(()),
                PipelineState::Stopped => break,
                PipelineState::Restarting | PipelineState::ShuttingDown => {}
            }
            if changed.changed().await.is_err() {
                break;
            }
        }
        let report = self.join().await?;
        Err(PipelineError::EndedAtStart {
            name: self.inner.name.clone(),
            status: report.status,
        })
    }

    /// The channel a send goes to, or why it cannot go.
    fn route(&self, key: Option<&str>) -> Result<mpsc::Sender<Envelope<R>>, Refusal> {
        match self.state() {
            PipelineState::Running => {}
            PipelineState::Restarting => return Err(Refusal::Unavailable),
            PipelineState::ShuttingDown | PipelineState::Stopped => return Err(Refusal::Closed),
        }
        let senders = self.inner.senders.read().unwrap_or_else(|p| p.into_inner());
        let senders = senders.as_ref().ok_or(Refusal::Closed)?;
        let subtask = match key {
            None => self.inner.next.fetch_add(1, Ordering::Relaxed) % senders.len(),
            Some(key) => {
                let routes = self
                    .inner
                    .shared
                    .routes
                    .read()
                    .unwrap_or_else(|p| p.into_inner());
                let partition = keys::partition_of(key, routes.of);
                routes
                    .owners
                    .get(partition as usize)
                    .copied()
                    .flatten()
                    .ok_or(Refusal::Unavailable)?
            }
        };
        senders.get(subtask).cloned().ok_or(Refusal::Unavailable)
    }

    /// Queues `records` (and their idempotency key, if any) for writing,
    /// waiting while the channel is full; returns the ticket that resolves
    /// once they are committed.
    ///
    /// Called by the service for each request. The records of one send are
    /// written in one checkpoint, never split over two. With a key that an
    /// earlier send used (and that has not expired, see [`KeyRetention`]),
    /// nothing is written and the ticket resolves with the earlier send's
    /// checkpoint and [`Ack::duplicate`] set. Refused while restarting or
    /// after shutdown, with the records handed back.
    ///
    /// The key alone decides here, whatever the records; to have a key
    /// reused for other content refused, send it with a fingerprint through
    /// [`send_keyed`](Self::send_keyed).
    pub async fn send(&self, records: Vec<R>, key: Option<String>) -> Result<Ticket, SendError<R>> {
        self.enqueue(records, key.map(IdempotencyKey::new)).await
    }

    /// Like [`send`](Self::send), with an [`IdempotencyKey`] that may carry a
    /// [`Fingerprint`] of the records (for a service: a stable hash of the
    /// request).
    ///
    /// Called by a service that wants a key reused for other content refused
    /// rather than answered as a duplicate (the IETF Idempotency-Key draft's
    /// 422). When the key is known with another fingerprint, nothing is
    /// written and the ticket fails with [`TicketError::KeyReused`], whether
    /// the earlier send is still waiting for its commit or committed (also
    /// before a restart: fingerprints are kept in the checkpoints with the
    /// keys). With the same fingerprint (or none on either side), it is the
    /// duplicate [`send`](Self::send) describes.
    pub async fn send_keyed(
        &self,
        records: Vec<R>,
        key: IdempotencyKey,
    ) -> Result<Ticket, SendError<R>> {
        self.enqueue(records, Some(key)).await
    }

    async fn enqueue(
        &self,
        records: Vec<R>,
        key: Option<IdempotencyKey>,
    ) -> Result<Ticket, SendError<R>> {
        let sender = match self.route(key.as_ref().map(IdempotencyKey::key)) {
            Ok(sender) => sender,
            Err(refusal) => return Err(SendError { refusal, records }),
        };
        let (waiter, ticket) = ticket::ticket();
        match sender
            .send(Envelope {
                records,
                key,
                waiter,
            })
            .await
        {
            Ok(()) => Ok(ticket),
            Err(mpsc::error::SendError(envelope)) => Err(SendError {
                refusal: Refusal::Closed,
                records: envelope.records,
            }),
        }
    }

    /// Like [`send`](Self::send), but refuses with [`Refusal::Full`] instead
    /// of waiting when the channel is full: for services that answer
    /// "overloaded, retry later" rather than hold the request.
    pub fn try_send(&self, records: Vec<R>, key: Option<String>) -> Result<Ticket, SendError<R>> {
        self.try_enqueue(records, key.map(IdempotencyKey::new))
    }

    /// Like [`send_keyed`](Self::send_keyed) (a key reused with another
    /// fingerprint is refused), but refuses with [`Refusal::Full`] instead of
    /// waiting when the channel is full. What `ingest-service` calls for a
    /// request with an `Idempotency-Key`.
    pub fn try_send_keyed(
        &self,
        records: Vec<R>,
        key: IdempotencyKey,
    ) -> Result<Ticket, SendError<R>> {
        self.try_enqueue(records, Some(key))
    }

    fn try_enqueue(
        &self,
        records: Vec<R>,
        key: Option<IdempotencyKey>,
    ) -> Result<Ticket, SendError<R>> {
        let sender = match self.route(key.as_ref().map(IdempotencyKey::key)) {
            Ok(sender) => sender,
            Err(refusal) => return Err(SendError { refusal, records }),
        };
        let (waiter, ticket) = ticket::ticket();
        match sender.try_send(Envelope {
            records,
            key,
            waiter,
        }) {
            Ok(()) => Ok(ticket),
            Err(mpsc::error::TrySendError::Full(envelope)) => Err(SendError {
                refusal: Refusal::Full,
                records: envelope.records,
            }),
            Err(mpsc::error::TrySendError::Closed(envelope)) => Err(SendError {
                refusal: Refusal::Closed,
                records: envelope.records,
            }),
        }
    }

    /// Ends the input and waits for the job to end: every send taken so far
    /// is written, the final checkpoint is taken and committed (resolving
    /// every ticket), and the writers are closed. Returns the final report.
    ///
    /// Sends after this call are refused with [`Refusal::Closed`]. The
    /// storage is not marked finished: a pipeline started again on it
    /// resumes from the final checkpoint, with its idempotency keys.
    pub async fn shutdown(&self) -> Result<JobReport, PipelineError> {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        // Dropping the senders closes the channels once they are drained.
        drop(
            self.inner
                .senders
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        info!(pipeline = %self.inner.name, "pipeline shutting down");
        self.join().await
    }

    async fn join(&self) -> Result<JobReport, PipelineError> {
        let ended = self
            .inner
            .ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(ended) = ended else {
            return Err(PipelineError::AlreadyShutDown {
                name: self.inner.name.clone(),
            });
        };
        match ended.await {
            Ok(result) => Ok(result?),
            Err(error) => Err(JobError::Panicked {
                task: format!("pipeline '{}'", self.inner.name),
                message: error.to_string(),
            }
            .into()),
        }
    }
}
