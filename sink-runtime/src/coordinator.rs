//! The checkpoint coordinator: starts the tasks, triggers checkpoints,
//! collects acknowledgements, stores completed checkpoints, tells the tasks
//! to commit, and decides when the job has ended.
//!
//! ```text
//!   tick ──▶ try_trigger ──Trigger(n)──▶ subtasks ──Ack(n, state)──▶ all acknowledged?
//!                                                                        │ yes
//!   Complete(n, final?) ◀── on_stored ◀── storage.store (in order, one at a time)
//! ```
//!
//! Decisions come from [`CheckpointTracker`]; this loop only waits for
//! events, times and stores. Stores run one at a time in checkpoint order, so
//! storage never sees an older checkpoint after a newer one.
//!
//! # Error handling
//!
//! A failing task fails the job: the other tasks are told to cancel (closing
//! their writers, which aborts what was not committed) and the first error is
//! returned. Failed checkpoints are counted; past the tolerated number the job
//! fails with [`JobError::CheckpointsFailing`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use sink_api::InputOf;
use sink_api::{CheckpointId, InitContext, JobStart, Sink};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::bad_records::Refusals;
use crate::core::checkpoints::{
    AckStep, CheckpointConfig, CheckpointTracker, FailureVerdict, TaskId, TriggerMode,
};
use crate::core::ledger::CommitLedger;
use crate::core::lifecycle::SubtaskLifecycle;
use crate::core::restart::{SupersededRestarts, SUPERSEDED_DELAY};
use crate::counters::SubtaskCounts;
use crate::error::JobError;
use crate::failpoints::failpoint;
use crate::metrics::{self, Metrics};
use crate::report::{JobReport, JobStatus};
use crate::restore;
use crate::source::{PositionLookup, Source};
use crate::spec::{JobSpec, NoticeDelivery, NotificationFaults};
use crate::storage::{
    CompletedCheckpoint, FinishedMarker, GlobalCommitterSnapshot, LostOutput, StorageError,
    SubtaskSnapshot,
};
use crate::task::calls::CommitCalls;
use crate::task::committer::CommitterTask;
use crate::task::global::GlobalTask;
use crate::task::subtask::{
    RecommitGate, Serializers, SourcePositions, SubtaskSettings, SubtaskTask,
};
use crate::task::{Control, TaskEvent, TaskState, GLOBAL_CHANNEL_CAPACITY};

/// How long tasks get to close after a failure or a cancel before they are
/// aborted.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The acknowledged states of one checkpoint, as they arrive.
#[derive(Default)]
struct Collecting {
    subtasks: BTreeMap<usize, SubtaskSnapshot>,
    global: Option<GlobalCommitterSnapshot>,
    /// The subtasks' job counters at their barriers, summed.
    counts: BTreeMap<String, u64>,
}

type StoreTask = (CheckpointId, JoinHandle<Result<(), StorageError>>);

/// `error` as the failure of an instance that a newer one took over, if
/// the checkpoint storage says one did since this attempt began: the newer
/// instance's start most likely caused it (it aborts what older starts
/// left, such as uploads in progress), and a fenced instance must not be
/// restarted. The failure itself is logged.
async fn fenced_instead<Src, S>(spec: &JobSpec<Src, S>, error: JobError) -> JobError
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    if matches!(error, JobError::Storage(StorageError::Fenced { .. })) {
        return error;
    }
    match spec.storage.fenced().await {
        Ok(Some(fenced)) => {
            warn!(%error, "the job failed after a newer instance took its checkpoint storage over");
            JobError::Storage(fenced)
        }
        Ok(None) => error,
        Err(check) => {
            warn!(error = %check, "cannot tell whether a newer instance took the checkpoint storage over");
            error
        }
    }
}

/// Runs a job to its end, restarting it after failures as its restart
/// strategy allows. Spawned by [`crate::Job::start`].
pub(crate) async fn run<Src, S>(
    spec: JobSpec<Src, S>,
    metrics: Arc<Metrics>,
    mut cancelled: watch::Receiver<bool>,
    mut stopped: watch::Receiver<bool>,
) -> Result<JobReport, JobError>
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    let span = info_span!("job", name = %spec.name);
    async move {
        let mut restarts = 0;
        let mut superseded = SupersededRestarts::default();
        // Every commit call of every attempt, waited for before the job
        // restarts or returns (see `CommitCalls`).
        let calls = CommitCalls::new();
        loop {
            let mut tasks = JoinSet::new();
            let signals = Signals {
                cancelled: &mut cancelled,
                stopped: &mut stopped,
            };
            let result = run_attempt(&spec, metrics.clone(), signals, &mut tasks, &calls).await;
            let Err(error) = result else {
                drop(tasks);
                calls.settle(CLOSE_GRACE).await;
                return result;
            };
            let error = fenced_instead(&spec, error).await;
            // The failing task has returned; give the others a moment to
            // close (they were told to cancel), then stop them. Either way
            // none of them runs on when the next attempt starts.
            let drained = tokio::time::timeout(CLOSE_GRACE, async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
            if drained.is_err() {
                tasks.shutdown().await;
            }
            drop(tasks);
            calls.settle(CLOSE_GRACE).await;
            if *cancelled.borrow() {
                return Err(error);
            }
            let delay = if error.is_superseded() && superseded.restart(std::time::Instant::now()) {
                info!(%error, "a commit was superseded (another owner committed those records); \
                    restarting to read from the destination's positions");
                SUPERSEDED_DELAY
            } else {
                restarts += 1;
                let delay = match spec.restart.delay_before(restarts, fastrand::f64()) {
                    Some(delay) if error.is_restartable() => delay,
                    _ => return Err(error),
                };
                warn!(%error, restart = restarts, ?delay, "the job failed; restarting from its last completed checkpoint");
                delay
            };
            metrics::add(&metrics.restarts, 1);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = cancelled.wait_for(|&cancel| cancel) => return Err(error),
            }
        }
    }
    .instrument(span)
    .await
}

/// What the job's handle and its controls ask of an attempt.
struct Signals<'a> {
    /// Raised by a cancel.
    cancelled: &'a mut watch::Receiver<bool>,
    /// Raised by a stop: the input ends, then the final checkpoint and its
    /// commit. Kept raised across restarts, so that an attempt started
    /// after it ends its input at once.
    stopped: &'a mut watch::Receiver<bool>,
}

async fn run_attempt<Src, S>(
    spec: &JobSpec<Src, S>,
    metrics: Arc<Metrics>,
    signals: Signals<'_>,
    tasks: &mut JoinSet<(TaskId, Result<(), JobError>)>,
    calls: &CommitCalls,
) -> Result<JobReport, JobError>
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    let start = Instant::now();
    let serializers = Serializers::<S, Src> {
        committable: spec.sink.committable_serializer(),
        writer_state: spec.sink.writer_state_serializer(),
        splits: spec.source.split_codec(),
    };
    if let Some(marker) = spec.storage.finished().await? {
        info!(generation = %marker.generation, last_checkpoint = ?marker.last_checkpoint,
            "the job already finished on this checkpoint storage; nothing to do");
        let lost = marker.lost;
        if lost.commits_failed > 0 {
            warn!(
                commits_failed = lost.commits_failed,
                records_lost = lost.records_lost,
                "the job finished earlier and lost output then: commits failed with a known reason (see the report's known_failures)"
            );
        }
        // The loss the finished job recorded is this report's too.
        let mut counters = metrics.snapshot();
        counters.commits_failed = lost.commits_failed;
        counters.records_lost = lost.records_lost;
        return Ok(JobReport {
            status: JobStatus::AlreadyFinished,
            metrics: counters,
            last_checkpoint: marker.last_checkpoint,
            // The lineage it finished in, as its newest checkpoint says (a
            // report only: an unreadable one is not this start's error).
            lineage: spec
                .storage
                .latest()
                .await
                .ok()
                .flatten()
                .and_then(|c| c.lineage),
            known_failures: lost.known_failures,
        });
    }
    let generation = spec.storage.begin().await?;
    let latest = spec.storage.latest().await?;
    // The job counters start from the totals of the checkpoint restored;
    // what the attempt before counted after it is counted again.
    let restored_counts = latest.as_ref().map(|c| c.counters.clone());
    let counts = metrics
        .counts
        .start_attempt(restored_counts.unwrap_or_default(), spec.parallelism);
    let mut plan = restore::plan(
        &spec.name,
        &spec.source,
        spec.parallelism,
        &serializers,
        latest,
        generation,
    )?;
    // A start without a checkpoint continues the lineage the storage keeps
    // (that of earlier starts killed before their first checkpoint), so that
    // the sink's start hook finds what they left.
    if plan.restored.is_none() {
        plan.lineage = spec.storage.lineage(plan.lineage).await?;
    }
    let restored = plan.restored.unwrap_or(CheckpointId::NONE);
    info!(parallelism = spec.parallelism, generation = %plan.generation, lineage = %plan.lineage, restored = ?plan.restored,
        checkpointing = ?spec.checkpointing.map(|c| c.interval), "job starting");

    let generation = plan.generation;
    let lineage = plan.lineage.clone();
    let restored_id = plan.restored;
    let Started {
        controls,
        mut events,
        cancel: cancel_tx,
    } = start_tasks(spec, plan, &metrics, &serializers, tasks, calls, counts).await?;

    let mut coordinator = Coordinator {
        name: spec.name.clone(),
        parallelism: spec.parallelism,
        generation,
        lineage,
        start,
        // Without checkpointing only the final checkpoint is taken: the
        // commit at end of input then survives a crash like any other.
        tracker: Some(CheckpointTracker::new(
            spec.checkpointing
                .unwrap_or_else(|| CheckpointConfig::every(Duration::from_secs(1))),
            spec.checkpointing.is_some(),
            spec.parallelism,
            spec.global_committer.is_some(),
            restored,
        )),
        storage: spec.storage.clone(),
        controls,
        metrics,
        collecting: BTreeMap::new(),
        triggered_at: BTreeMap::new(),
        store_queue: VecDeque::new(),
        storing: None,
        notification_faults: spec.notification_faults.clone(),
        cancel: cancel_tx,
        last_completed: restored_id.unwrap_or(CheckpointId::NONE),
    };

    let Signals { cancelled, stopped } = signals;
    // A stop asked before this attempt (or during its restart's pause)
    // ends the input as soon as the subtasks run.
    let mut stopping = *stopped.borrow_and_update();
    if stopping {
        coordinator.end_input();
    }
    let outcome: Result<JobStatus, JobError> = async {
        let mut running = tasks.len();
        let mut status = JobStatus::Finished;
        let mut cancel_watch_open = true;
        let mut stop_watch_open = true;
        // Set once cancelled: tasks still running then (a commit stuck in its
        // retries, say) are stopped. What they were committing is either done or
        // replayed after a restore; commits are idempotent.
        let mut cancel_deadline = None;
        while running > 0 {
            let deadline = coordinator.next_deadline();
            tokio::select! {
                // Polled in order, so that a run is reproducible on a paused clock.
                biased;
                changed = cancelled.changed(), if cancel_watch_open => {
                    match changed {
                        Ok(()) if *cancelled.borrow() => {
                            info!("cancelling");
                            status = JobStatus::Cancelled;
                            coordinator.cancel_tasks();
                            coordinator.tracker = None;
                            cancel_watch_open = false;
                            cancel_deadline = Some(Instant::now() + CLOSE_GRACE);
                        }
                        Ok(()) => {}
                        // The handle was dropped: nobody can cancel any more.
                        Err(_) => cancel_watch_open = false,
                    }
                }
                changed = stopped.changed(), if stop_watch_open => {
                    match changed {
                        Ok(()) if *stopped.borrow() && !stopping && status != JobStatus::Cancelled => {
                            info!("stopping: the input ends, then the final checkpoint and its commit");
                            stopping = true;
                            coordinator.end_input();
                        }
                        Ok(()) => {}
                        Err(_) => stop_watch_open = false,
                    }
                }
                joined = tasks.join_next() => {
                    let Some(joined) = joined else { break };
                    match joined {
                        Ok((task, Ok(()))) => {
                            debug!(?task, "task ended");
                            running -= 1;
                        }
                        Ok((task, Err(JobError::Cancelled))) if status == JobStatus::Cancelled => {
                            debug!(?task, "task stopped by the cancel");
                            running -= 1;
                        }
                        Ok((task, Err(error))) => {
                            warn!(?task, %error, "task failed; failing the job");
                            return Err(error);
                        }
                        Err(join_error) => {
                            return Err(JobError::Panicked {
                                task: "a task".into(),
                                message: join_error.to_string(),
                            });
                        }
                    }
                }
                Some(event) = events.recv() => coordinator.on_event(event),
                (id, stored) = wait_for_store(&mut coordinator.storing) => {
                    coordinator.storing = None;
                    coordinator.on_store_result(id, stored)?;
                }
                () = sleep_until(deadline) => coordinator.on_tick()?,
                () = sleep_until(cancel_deadline) => {
                    warn!(running, grace = ?CLOSE_GRACE, "tasks did not close in time after the cancel; stopping them");
                    tasks.shutdown().await;
                    break;
                }
            }
        }
        Ok(status)
    }
    .await;
    // Whatever ended the attempt, no task and no store outlives it: a
    // restart must not find the old generation still at work.
    if outcome.is_err() {
        coordinator.cancel_tasks();
    }
    coordinator.settle_store().await;
    let status = match outcome? {
        // Everything read was committed, but the input did not end by
        // itself: the storage stays resumable.
        JobStatus::Finished if stopping => JobStatus::Stopped,
        status => status,
    };
    let last = Some(coordinator.last_completed).filter(|&id| id > CheckpointId::NONE);
    let metrics = coordinator.metrics.snapshot();
    if status == JobStatus::Finished && spec.mark_finished {
        // What was lost goes into the marker: a start that finds the job
        // finished reports it again, even if this process dies before its
        // report reaches anyone.
        coordinator
            .storage
            .mark_finished(FinishedMarker {
                generation: coordinator.generation,
                last_checkpoint: last,
                lost: LostOutput {
                    commits_failed: metrics.commits_failed,
                    records_lost: metrics.records_lost,
                    known_failures: coordinator.metrics.known_failures(),
                },
            })
            .await?;
        // A process killed here has reported nothing: the marker must.
        failpoint!("after-mark-finished");
    }
    info!(
        ?status,
        records_written = metrics.records_written,
        records_committed = metrics.records_committed,
        "job ended"
    );
    if metrics.commits_failed > 0 {
        warn!(
            ?status,
            commits_failed = metrics.commits_failed,
            records_lost = metrics.records_lost,
            "the job lost output: commits failed with a known reason (see the report's known_failures)"
        );
    }
    Ok(JobReport {
        status,
        metrics,
        last_checkpoint: last,
        lineage: Some(coordinator.lineage.clone()),
        known_failures: coordinator.metrics.known_failures(),
    })
}

/// What [`start_tasks`] hands back to the coordinator loop.
struct Started {
    /// One control channel per subtask.
    controls: Vec<mpsc::UnboundedSender<Control>>,
    /// Every task's acknowledgements and ends of input.
    events: mpsc::UnboundedReceiver<TaskEvent>,
    /// Raised to stop every task at once.
    cancel: watch::Sender<bool>,
}

/// Creates every subtask's reader, writer and committer (and the global
/// committer) from `plan`, and spawns their tasks into `tasks`.
async fn start_tasks<Src, S>(
    spec: &JobSpec<Src, S>,
    plan: restore::StartPlan<Src, S>,
    metrics: &Arc<Metrics>,
    serializers: &Serializers<S, Src>,
    tasks: &mut JoinSet<(TaskId, Result<(), JobError>)>,
    calls: &CommitCalls,
    counts: Vec<Arc<SubtaskCounts>>,
) -> Result<Started, JobError>
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    call_on_start(spec, &plan, metrics).await?;
    let restored = plan.restored.unwrap_or(CheckpointId::NONE);
    let (events_tx, events) = mpsc::unbounded_channel();
    let (global_tx, global_rx) = match spec.global_committer.is_some() {
        true => {
            let (tx, rx) = mpsc::channel(GLOBAL_CHANNEL_CAPACITY);
            (Some(tx), Some(rx))
        }
        false => (None, None),
    };
    // What the global committer committed: the subtasks' readers hear of a
    // commit only after it (nothing is known committed before it reports).
    let mut global_progress = global_tx
        .as_ref()
        .map(|_| watch::channel(CheckpointId::NONE).0);
    let settings = SubtaskSettings {
        batch_size: spec.batch_size,
        idle_poll: spec.idle_poll,
        report_writes: spec
            .checkpointing
            .is_some_and(|c| c.trigger == TriggerMode::OnDemand),
    };

    // A source whose positions are committed with the data reads each split
    // from the destination's position, once every subtask re-committed.
    let positions = spec.source.position_scope().map(|scope| SourcePositions {
        scope,
        job_name: spec.name.clone(),
        lineage: plan.lineage.clone(),
        lookup: PositionLookup::of_sink(Arc::clone(&spec.sink)),
        recommitted: Arc::new(RecommitGate::new(spec.parallelism)),
        metrics: metrics.sink.clone(),
    });
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let mut controls = Vec::with_capacity(spec.parallelism);
    for (index, start_state) in plan.subtasks.into_iter().enumerate() {
        let name = format!("subtask {index}");
        let context = InitContext::new(
            spec.name.clone(),
            plan.lineage.clone(),
            plan.generation,
            index,
            spec.parallelism,
        )
        .restored_from(plan.restored)
        .with_clock(spec.clock.clone())
        .with_metrics(metrics.sink.clone())
        .with_visible_commits(spec.visible_commits);
        let sink_error = |action| {
            let task = name.clone();
            move |source| JobError::Sink {
                task,
                action,
                source,
            }
        };
        let writer = spec
            .sink
            .create_writer(&context, start_state.writer_states)
            .await
            .map_err(sink_error("create_writer"))?;
        let committer = spec
            .sink
            .create_committer(&context)
            .await
            .map_err(sink_error("create_committer"))?;
        let reader = spec
            .source
            .create_reader(index, start_state.splits)
            .map_err(|source| JobError::Source {
                subtask: index,
                source,
            })?;
        let mut ledger = CommitLedger::new([index]);
        for part in start_state.pending {
            metrics::add(
                &metrics.committables_pending,
                part.committables.len() as u64,
            );
            ledger
                .restore_part(part)
                .map_err(|e| JobError::invariant(name.clone(), e))?;
        }
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        controls.push(control_tx);
        let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let committer_task = CommitterTask {
            index,
            name: format!("{name} committer"),
            committer: Some(committer),
            calls: calls.clone(),
            jobs: jobs_rx,
            done: done_tx,
            metrics: Arc::clone(metrics),
            retry: spec.retry,
            cancel: cancel_rx.clone(),
            stop: stop_rx,
        }
        .spawn();
        let task = SubtaskTask::<S, Src> {
            index,
            name,
            reader,
            writer,
            ledger,
            commits: Some(jobs_tx),
            committed: done_rx,
            stop: stop_tx,
            committer_task: Some(committer_task),
            in_flight: VecDeque::new(),
            lifecycle: SubtaskLifecycle::new(restored, spec.defer_end_of_stream),
            control: control_rx,
            events: events_tx.clone(),
            global: global_tx.clone(),
            metrics: Arc::clone(metrics),
            serializers: serializers.clone(),
            settings: settings.clone(),
            restored: plan.restored,
            closed: false,
            records_since_barrier: 0,
            last_barrier: restored,
            awaiting: std::collections::VecDeque::new(),
            global_progress: global_progress.as_ref().map(watch::Sender::subscribe),
            notices: VecDeque::new(),
            positions: positions.clone(),
            counts: counts[index].clone(),
            refusals: Arc::new(Refusals::new(spec.bad_records, index)),
        };
        let (counts, refusals) = (counts[index].clone(), task.refusals.clone());
        let run = async move { (TaskId::Subtask(index), task.run().await) };
        tasks.spawn(
            refusals
                .scope(counts.scope(run))
                .instrument(info_span!("subtask", index)),
        );
    }
    drop(global_tx);

    if let (Some(factory), Some(input)) = (&spec.global_committer, global_rx) {
        let context = InitContext::new(
            spec.name.clone(),
            plan.lineage.clone(),
            plan.generation,
            0,
            spec.parallelism,
        )
        .restored_from(plan.restored)
        .with_clock(spec.clock.clone())
        .with_metrics(metrics.sink.clone())
        .with_visible_commits(spec.visible_commits);
        let committer = factory(&context);
        let schedule = committer.schedule();
        let mut ledger = CommitLedger::new(0..spec.parallelism);
        if let Some(restored) = plan.restored {
            ledger.expect_until(restored, 0..plan.restored_parallelism);
        }
        for part in plan.global_pending {
            ledger
                .add(part.summary, part.committables)
                .map_err(|e| JobError::invariant("global committer", e))?;
        }
        let task = GlobalTask {
            committer: Some(committer),
            calls: calls.clone(),
            parallelism: spec.parallelism,
            ledger,
            input,
            events: events_tx.clone(),
            serializer: serializers.committable.clone(),
            metrics: Arc::clone(metrics),
            ended: Default::default(),
            end_of_input_called: false,
            restored: plan.restored,
            recommitted: Default::default(),
            schedule,
            deferred: Vec::new(),
            last_commit: tokio::time::Instant::now(),
            progress: global_progress
                .take()
                .unwrap_or_else(|| watch::channel(CheckpointId::NONE).0),
        };
        tasks.spawn(
            async move { (TaskId::GlobalCommitter, task.run().await) }
                .instrument(info_span!("global_committer")),
        );
    }
    drop(events_tx);

    Ok(Started {
        controls,
        events,
        cancel: cancel_tx,
    })
}

/// Tells the sink a start begins ([`Sink::on_start`]), with what the
/// restored checkpoint holds for it, before any writer or committer exists.
async fn call_on_start<Src, S>(
    spec: &JobSpec<Src, S>,
    plan: &restore::StartPlan<Src, S>,
    metrics: &Metrics,
) -> Result<(), JobError>
where
    Src: Source<Record = InputOf<S>>,
    S: Sink,
{
    let mut start = JobStart::fresh(&spec.name, &plan.lineage, plan.generation, spec.parallelism)
        .with_clock(spec.clock.clone())
        .with_metrics(metrics.sink.clone());
    if let Some(restored) = plan.restored {
        let parts = plan.subtasks.iter().flat_map(|s| &s.pending);
        let committables = parts
            .chain(&plan.global_pending)
            .flat_map(|part| &part.committables)
            .collect();
        let states = plan
            .subtasks
            .iter()
            .flat_map(|s| &s.writer_states)
            .collect();
        start = start.restored(restored, plan.restored_parallelism, committables, states);
    }
    spec.sink
        .on_start(&start)
        .await
        .map_err(|source| JobError::Sink {
            task: "job start".into(),
            action: "on_start",
            source,
        })
}

async fn wait_for_store(
    storing: &mut Option<StoreTask>,
) -> (CheckpointId, Result<(), StorageError>) {
    match storing {
        Some((id, handle)) => {
            let result = match handle.await {
                Ok(stored) => stored,
                Err(join_error) => Err(StorageError::Message(format!(
                    "the store task ended abnormally: {join_error}"
                ))),
            };
            (*id, result)
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`, forever without one. A deadline already reached
/// is ready at once rather than through the timer: tokio rounds a deadline
/// up to its next millisecond tick, so a checkpoint due at once (on demand,
/// right after the last one was stored) would wait up to a millisecond.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) if deadline <= Instant::now() => {}
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

struct Coordinator {
    name: String,
    parallelism: usize,
    generation: sink_api::Generation,
    lineage: sink_api::Lineage,
    start: Instant,
    tracker: Option<CheckpointTracker>,
    storage: Arc<dyn crate::storage::CheckpointStorage>,
    controls: Vec<mpsc::UnboundedSender<Control>>,
    metrics: Arc<Metrics>,
    collecting: BTreeMap<CheckpointId, Collecting>,
    triggered_at: BTreeMap<CheckpointId, Duration>,
    store_queue: VecDeque<CompletedCheckpoint>,
    storing: Option<StoreTask>,
    notification_faults: Option<NotificationFaults>,
    /// Raised when tasks must stop: cancel or failure.
    cancel: watch::Sender<bool>,
    /// The newest completed checkpoint (kept when the tracker is dropped at
    /// a cancel).
    last_completed: CheckpointId,
}

impl Coordinator {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn next_deadline(&self) -> Option<Instant> {
        let due = self.tracker.as_ref()?.next_deadline()?;
        // A deadline past what an instant can hold (a checkpoint interval of
        // centuries) never comes: no deadline, rather than an overflow.
        self.start.checked_add(due)
    }

    fn send_all(&self, control: Control) {
        for tx in &self.controls {
            // A task that already exited needs no more messages.
            let _ = tx.send(control);
        }
    }

    /// Tells every subtask that `checkpoint_id` completed. A simulation may
    /// lose or delay these notices (never the final one's loss: nothing would
    /// follow to subsume it).
    fn notify_complete(&self, checkpoint_id: CheckpointId, is_final: bool) {
        let control = Control::Complete {
            checkpoint_id,
            is_final,
        };
        for (subtask, tx) in self.controls.iter().enumerate() {
            let delivery = match &self.notification_faults {
                Some(faults) => faults(subtask, checkpoint_id),
                None => NoticeDelivery::Deliver,
            };
            match delivery {
                NoticeDelivery::Lose if !is_final => {
                    debug!(subtask, checkpoint = %checkpoint_id, "simulation: completion notice lost");
                }
                NoticeDelivery::Delay(delay) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = tx.send(control);
                    });
                }
                _ => {
                    let _ = tx.send(control);
                }
            }
        }
    }

    /// Tells every subtask to end its input now (a stop).
    fn end_input(&self) {
        for control in &self.controls {
            // A subtask that is gone has ended or failed; the job's end
            // says which.
            let _ = control.send(Control::EndInput);
        }
    }

    fn cancel_tasks(&self) {
        self.cancel.send_replace(true);
        self.send_all(Control::Cancel);
    }

    fn on_event(&mut self, event: TaskEvent) {
        match event {
            TaskEvent::RecordsWritten { since } => {
                if let Some(tracker) = &mut self.tracker {
                    tracker.on_records_written(since);
                }
            }
            TaskEvent::EndOfInput { subtask } => {
                if let Some(tracker) = &mut self.tracker {
                    tracker.on_end_of_input(subtask);
                }
            }
            TaskEvent::Ack {
                task,
                checkpoint_id,
                state,
            } => {
                let Some(tracker) = &mut self.tracker else {
                    return;
                };
                let step = tracker.on_ack(checkpoint_id, task);
                if step == AckStep::Stale {
                    debug!(?task, checkpoint = %checkpoint_id, "late acknowledgement ignored");
                    return;
                }
                let collecting = self.collecting.entry(checkpoint_id).or_default();
                match state {
                    TaskState::Subtask(snapshot, counts) => {
                        crate::counters::add_into(&mut collecting.counts, &counts);
                        collecting.subtasks.insert(snapshot.subtask, snapshot);
                    }
                    TaskState::GlobalCommitter(snapshot) => collecting.global = Some(snapshot),
                }
                if step == AckStep::AllAcknowledged {
                    let is_final = tracker.is_final_candidate(checkpoint_id);
                    let collected = self.collecting.remove(&checkpoint_id).unwrap_or_default();
                    self.store_queue.push_back(CompletedCheckpoint {
                        checkpoint_id,
                        job_name: self.name.clone(),
                        generation: self.generation,
                        lineage: Some(self.lineage.clone()),
                        parallelism: self.parallelism,
                        subtasks: collected.subtasks.into_values().collect(),
                        global_committer: collected.global,
                        is_final,
                        counters: self.metrics.counts.totals(&collected.counts),
                    });
                    self.start_next_store();
                }
            }
        }
    }

    /// Waits (a bounded time) for a store still in flight when the attempt
    /// ends, so that it does not race the next attempt's storage access.
    async fn settle_store(&mut self) {
        if let Some((id, handle)) = self.storing.take() {
            if tokio::time::timeout(CLOSE_GRACE, handle).await.is_err() {
                warn!(checkpoint = %id, "a checkpoint store did not finish in time after the job ended");
            }
        }
    }

    fn start_next_store(&mut self) {
        if self.storing.is_some() {
            return;
        }
        if let Some(checkpoint) = self.store_queue.pop_front() {
            let storage = self.storage.clone();
            let id = checkpoint.checkpoint_id;
            debug!(checkpoint = %id, "storing checkpoint");
            self.storing = Some((
                id,
                tokio::spawn(async move { storage.store(checkpoint).await }),
            ));
        }
    }

    fn on_store_result(
        &mut self,
        id: CheckpointId,
        stored: Result<(), StorageError>,
    ) -> Result<(), JobError> {
        let now = self.now();
        match stored {
            Ok(()) => {
                let Some(tracker) = &mut self.tracker else {
                    return Ok(());
                };
                let in_flight_before = tracker.in_flight().len() as u64;
                // Stored, so complete: a crash here restores from it, and its
                // commits happen at the restore.
                failpoint!("after-checkpoint-stored");
                if let Some(completion) = tracker.on_stored(id, now) {
                    let duration = self
                        .triggered_at
                        .remove(&id)
                        .map(|at| now.saturating_sub(at))
                        .unwrap_or_default();
                    metrics::add(&self.metrics.checkpoints_completed, 1);
                    self.metrics
                        .checkpoints_failed_in_a_row
                        .store(0, std::sync::atomic::Ordering::Relaxed);
                    self.last_completed = self.last_completed.max(id);
                    self.metrics.last_checkpoint_duration_ms.store(
                        duration.as_millis() as u64,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    // Subsumed and, after the final checkpoint, abandoned ones.
                    let abandoned = in_flight_before - 1 - tracker.in_flight().len() as u64;
                    metrics::add(&self.metrics.checkpoints_aborted, abandoned);
                    for old in completion.subsumed.iter() {
                        self.triggered_at.remove(old);
                        self.collecting.remove(old);
                    }
                    info!(checkpoint = %id, is_final = completion.is_final, ?duration, "checkpoint completed");
                    self.notify_complete(id, completion.is_final);
                    if completion.is_final {
                        self.store_queue.clear();
                        self.collecting.clear();
                    }
                    self.store_queue.retain(|c| c.checkpoint_id > id);
                }
            }
            // A newer instance took the storage over (fenced), or the storage
            // refuses this instance for good (credentials, a missing bucket):
            // stop now, storing and committing nothing more, never restarted.
            Err(error) if error.is_permanent() => return Err(JobError::Storage(error)),
            Err(reason) => self.on_checkpoint_failed(id, format!("storing it failed: {reason}"))?,
        }
        self.start_next_store();
        Ok(())
    }

    fn on_checkpoint_failed(&mut self, id: CheckpointId, reason: String) -> Result<(), JobError> {
        let now = self.now();
        let Some(tracker) = &mut self.tracker else {
            return Ok(());
        };
        self.collecting.remove(&id);
        self.triggered_at.remove(&id);
        self.store_queue.retain(|c| c.checkpoint_id != id);
        let Some(verdict) = tracker.on_failed(id, now) else {
            return Ok(());
        };
        metrics::add(&self.metrics.checkpoints_failed, 1);
        let (FailureVerdict::Tolerated { consecutive }
        | FailureVerdict::Warn { consecutive }
        | FailureVerdict::FailJob { consecutive }) = &verdict;
        self.metrics.checkpoints_failed_in_a_row.store(
            u64::from(*consecutive),
            std::sync::atomic::Ordering::Relaxed,
        );
        match verdict {
            FailureVerdict::Tolerated { consecutive } => {
                info!(checkpoint = %id, %reason, consecutive, "checkpoint failed");
            }
            FailureVerdict::Warn { consecutive } => {
                warn!(checkpoint = %id, %reason, consecutive,
                    "checkpoints keep failing: nothing is committed until one completes");
            }
            FailureVerdict::FailJob { consecutive } => {
                return Err(JobError::CheckpointsFailing {
                    consecutive,
                    tolerated: consecutive - 1,
                    checkpoint_id: id,
                    reason,
                });
            }
        }
        Ok(())
    }

    fn on_tick(&mut self) -> Result<(), JobError> {
        let now = self.now();
        let expired = match &self.tracker {
            Some(tracker) => tracker.expired(now),
            None => return Ok(()),
        };
        for id in expired {
            if let Some((storing, handle)) = &self.storing {
                if *storing == id {
                    // Stop it, but start the next store only once this one
                    // has really ended: stores never overlap.
                    handle.abort();
                }
            }
            self.on_checkpoint_failed(id, "it timed out".into())?;
        }
        self.start_next_store();
        if let Some(id) = self.tracker.as_mut().and_then(|t| t.try_trigger(now)) {
            metrics::add(&self.metrics.checkpoints_triggered, 1);
            self.triggered_at.insert(id, now);
            debug!(checkpoint = %id, "checkpoint triggered");
            self.send_all(Control::Trigger(id));
        }
        Ok(())
    }
}
