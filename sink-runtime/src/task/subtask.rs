//! One subtask's chain: source reader and writer in one tokio task, its
//! committer on a task of its own (see the `committer` module).
//!
//! The loop reads a batch, writes it, and between batches serves the
//! coordinator's control messages and the committer task's reports. Because
//! the source lives in the same task, a barrier is aligned by construction:
//! every record read before it is written and prepared before the checkpoint
//! is acknowledged. Commits, their retries and backoffs run on the committer
//! task, so they never stop reading, writing or barriers.
//!
//! ```text
//! loop:
//!   serve every waiting control message and commit report:
//!     Trigger(n)     ─▶ [flush(false), prepare_commit(n), summary n]  snapshot_state(n), ack, barrier to global
//!     Complete(n)    ─▶ hand every ready checkpoint <= n to the committer task, oldest first
//!                       final? ─▶ wait for those commits, end of stream to global, close, exit
//!     CommitDone(m)  ─▶ forward m to global, tell the source, drop m from later snapshots
//!     Cancel         ─▶ close, exit
//!   before end of input (and while fewer than MAX_COMMIT_BACKLOG checkpoints wait
//!   for the committer): read a batch ─▶ write_batch
//!     source finished ─▶ flush(true), prepare_commit(last barrier + 1), tagged with it;
//!                        the final checkpoint follows (in every bounded mode, with
//!                        checkpointing off too), and its Complete commits everything
//!   after end of input: wait for the next control message
//! ```
//!
//! With a source whose positions are committed with the data (a position
//! scope), every subtask first waits until every subtask re-committed what
//! the restored checkpoint holds, then asks the destination where each
//! split's data ends and has its reader start there; at each barrier the
//! reader's advances go to the writer before `prepare_commit`.
//!
//! The decisions are made by [`SubtaskLifecycle`] and [`CommitLedger`]; this
//! file only carries them out.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use sink_api::{
    serialize_versioned, CheckpointId, Durability, Sink, SinkError, SinkWriter, SubtaskIndex,
    VersionedSerializer,
};
use sink_api::{CommittableOf, InputOf, WriterStateOf};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::committer::{CommitDone, CommitJob, CommitterHandle};
use super::{Control, GlobalMessage, TaskEvent, TaskState};
use crate::bad_records::Refusals;
use crate::core::checkpoints::TaskId;
use crate::core::ledger::{CommitLedger, CommittableSummary};
use crate::core::lifecycle::{BarrierAction, SubtaskLifecycle};
use crate::counters::SubtaskCounts;
use crate::error::JobError;
use crate::failpoints::failpoint;
use crate::metrics::{self, Metrics};
use crate::source::{
    CommitOutcome, PositionLookup, ReadStatus, Source, SourceStart, SplitCodec, SplitReader,
};
use crate::storage::{encode_pending, PendingCommittables, SubtaskSnapshot};

/// Longest a busy subtask runs before it lets other tasks run.
const YIELD_EVERY: Duration = Duration::from_millis(1);

/// How many completed checkpoints may wait for the committer task before the
/// subtask stops reading: a committer slower than the checkpoints for good
/// slows the writer down then, rather than let memory and every snapshot
/// grow without bound.
pub(crate) const MAX_COMMIT_BACKLOG: usize = 1024;

/// Settings shared by every subtask of a job.
#[derive(Debug, Clone)]
pub(crate) struct SubtaskSettings {
    pub batch_size: usize,
    pub idle_poll: Duration,
    /// Checkpoints are on demand: tell the coordinator when records were
    /// written after a barrier (once per barrier).
    pub report_writes: bool,
}

/// The positions of a source with a scope: where to read them, and the
/// gate every subtask passes once it re-committed its restored
/// committables (so that no subtask reads a position another subtask's
/// re-commit is about to move).
#[derive(Clone)]
pub(crate) struct SourcePositions {
    pub scope: String,
    pub job_name: String,
    pub lineage: sink_api::Lineage,
    pub lookup: PositionLookup,
    pub recommitted: Arc<RecommitGate>,
    /// The job's registry of connectors' own counters.
    pub metrics: sink_api::SinkMetrics,
}

/// Counts the subtasks that re-committed their restored committables.
pub(crate) struct RecommitGate {
    done: watch::Sender<usize>,
    subtasks: usize,
}

impl RecommitGate {
    pub(crate) fn new(subtasks: usize) -> RecommitGate {
        RecommitGate {
            done: watch::channel(0).0,
            subtasks,
        }
    }

    fn pass(&self) {
        self.done.send_modify(|done| *done += 1);
    }

    /// Waits until every subtask passed. Cancellation-safe.
    async fn all_passed(&self) {
        let mut done = self.done.subscribe();
        // The sender lives in `self`: the wait ends only when all passed.
        let _ = done.wait_for(|done| *done >= self.subtasks).await;
    }
}

/// What to do after a control message or end of input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

/// The sink's serializers and the source's, for snapshots.
pub(crate) struct Serializers<S: Sink, Src: Source> {
    pub committable: Arc<dyn VersionedSerializer<CommittableOf<S>>>,
    pub writer_state: Arc<dyn VersionedSerializer<WriterStateOf<S>>>,
    pub splits: Arc<dyn SplitCodec<Src::Split>>,
}

impl<S: Sink, Src: Source> Clone for Serializers<S, Src> {
    fn clone(&self) -> Self {
        Serializers {
            committable: self.committable.clone(),
            writer_state: self.writer_state.clone(),
            splits: self.splits.clone(),
        }
    }
}

/// The chain of one subtask.
pub(crate) struct SubtaskTask<S: Sink, Src: Source<Record = InputOf<S>>> {
    pub index: SubtaskIndex,
    pub name: String,
    pub reader: Src::Reader,
    pub writer: S::Writer,
    pub ledger: CommitLedger<CommittableOf<S>>,
    /// Hands ready checkpoints to the committer task, oldest first; `None`
    /// once closed.
    pub commits: Option<mpsc::UnboundedSender<CommitJob<CommittableOf<S>>>>,
    /// The committer task's reports, in the order the jobs were handed over;
    /// a failure of the committer comes as its last report.
    pub committed: mpsc::UnboundedReceiver<Result<CommitDone<CommittableOf<S>>, JobError>>,
    /// Raised when this subtask fails: its committer starts no more commits.
    pub stop: watch::Sender<bool>,
    /// The committer task; `None` once joined.
    pub committer_task: Option<CommitterHandle>,
    /// Checkpoints handed to the committer task and not reported done,
    /// oldest first, with their parts encoded: snapshots hold them until the
    /// report, so a crash meanwhile commits them again after the restore.
    pub in_flight: VecDeque<(CheckpointId, Vec<PendingCommittables>)>,
    pub lifecycle: SubtaskLifecycle,
    pub control: mpsc::UnboundedReceiver<Control>,
    pub events: mpsc::UnboundedSender<TaskEvent>,
    pub global: Option<mpsc::Sender<GlobalMessage<CommittableOf<S>>>>,
    pub metrics: Arc<Metrics>,
    pub serializers: Serializers<S, Src>,
    pub settings: SubtaskSettings,
    /// Restored from a checkpoint: its pending committables are committed
    /// before any record is read.
    pub restored: Option<CheckpointId>,
    /// Whether the writer and committer were closed.
    pub closed: bool,
    pub records_since_barrier: u64,
    /// The last barrier passed (or the restored checkpoint).
    pub last_barrier: CheckpointId,
    /// Checkpoints passed whose acknowledgement waits for the writer's
    /// durability work ([`SinkWriter::durability`]), oldest first: sent in
    /// this order once their work is done.
    pub awaiting: VecDeque<AwaitingAck>,
    /// With a global committer: the newest checkpoint it committed. The
    /// reader hears of a commit only once the global committer committed it
    /// too, since only then is the data visible (a Delta table's files).
    pub global_progress: Option<watch::Receiver<CheckpointId>>,
    /// Commits of this subtask the reader has not heard of yet, because the
    /// global committer has not committed them; oldest first.
    pub notices: VecDeque<(CheckpointId, CommitOutcome)>,
    /// With a source whose positions are committed with the data.
    pub positions: Option<SourcePositions>,
    /// This subtask's job counters' counts in this attempt: its task runs
    /// in them, and each barrier hands them to the coordinator.
    pub counts: Arc<SubtaskCounts>,
    /// The records this subtask's transforms refused, under the job's
    /// policy: its task runs in them; dead letters held there go to the
    /// writer after each read.
    pub refusals: Arc<Refusals>,
}

/// Waits until the global committer's progress changes, while `waiting`
/// (forever otherwise, and once the global committer is gone).
/// Cancellation-safe.
async fn global_progress_changed(
    progress: &mut Option<watch::Receiver<CheckpointId>>,
    waiting: bool,
) {
    match progress {
        Some(progress) if waiting => {
            if progress.changed().await.is_err() {
                std::future::pending::<()>().await
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

/// A checkpoint's acknowledgement waiting for the writer's durability work.
pub(crate) struct AwaitingAck {
    checkpoint_id: CheckpointId,
    ack: TaskEvent,
    /// The work; `None` once it is done.
    durability: Option<Durability>,
}

/// Waits until the oldest awaiting acknowledgement's work is done (forever
/// when there is none); its result. Cancellation-safe: the work stays in
/// the queue and is polled again by the next call.
async fn settle_oldest(awaiting: &mut VecDeque<AwaitingAck>) -> Result<(), SinkError> {
    match awaiting.front_mut() {
        Some(oldest) => match oldest.durability.as_mut() {
            Some(work) => {
                let result = work.as_mut().await;
                oldest.durability = None;
                result
            }
            None => Ok(()),
        },
        None => std::future::pending().await,
    }
}

impl<S: Sink, Src: Source<Record = InputOf<S>>> SubtaskTask<S, Src> {
    fn sink_error(&self, action: &'static str) -> impl FnOnce(SinkError) -> JobError + '_ {
        move |source| JobError::Sink {
            task: self.name.clone(),
            action,
            source,
        }
    }

    fn invariant(&self) -> impl FnOnce(&dyn std::fmt::Display) -> JobError + '_ {
        move |error| JobError::invariant(self.name.clone(), error)
    }

    /// Runs the chain until the job finishes, is cancelled, or fails.
    pub(crate) async fn run(mut self) -> Result<(), JobError> {
        let result = self.run_loop().await;
        if result.is_err() && !self.closed {
            // The committer starts nothing more: what it was handed stays in
            // the last checkpoint. It finishes a commit under way and closes.
            self.stop.send_replace(true);
            // Abort whatever the writer holds; the error that stopped the job
            // matters more than one from closing.
            if let Err(error) = self.close().await {
                warn!(subtask = self.index, %error, "closing after a failure failed too");
            }
        }
        result
    }

    async fn run_loop(&mut self) -> Result<(), JobError> {
        if let Some(restored) = self.restored {
            // Everything <= the restored checkpoint is committed again, at
            // once, before new data flows: the commit may or may not have
            // happened before the crash, so it must be idempotent.
            info!(subtask = self.index, checkpoint = %restored, "re-committing what the restored checkpoint holds");
            self.ledger.notify_complete(restored);
            self.hand_over_ready(true).await?;
            self.wait_for_commits().await?;
        }
        if let Some(positions) = self.positions.clone() {
            if self.seek_committed(positions).await? == Flow::Exit {
                return Ok(());
            }
        }
        let mut batch = Vec::with_capacity(self.settings.batch_size);
        let mut last_yield = tokio::time::Instant::now();
        loop {
            // Commit reports first, then control messages: a barrier waits
            // for one batch at most. Acknowledgements whose durability work
            // is done go out before either.
            self.send_ready_acks()?;
            self.take_commit_reports().await?;
            if self
                .global_progress
                .as_ref()
                .is_some_and(|progress| progress.has_changed().unwrap_or(false))
            {
                self.release_notices();
            }
            let waiting = match self.control.try_recv() {
                Ok(message) => Some(Some(message)),
                Err(mpsc::error::TryRecvError::Empty) => None,
                Err(mpsc::error::TryRecvError::Disconnected) => Some(None),
            };
            if let Some(message) = waiting {
                if self.serve(message).await? == Flow::Exit {
                    return Ok(());
                }
                continue;
            }
            if !self.lifecycle.accepts_input() || self.in_flight.len() >= MAX_COMMIT_BACKLOG {
                tokio::select! {
                    message = self.control.recv() => {
                        if self.serve(message).await? == Flow::Exit {
                            return Ok(());
                        }
                    }
                    done = self.committed.recv() => self.on_commit_report(done).await?,
                    settled = settle_oldest(&mut self.awaiting) => {
                        settled.map_err(self.sink_error("durability"))?;
                    }
                    () = global_progress_changed(&mut self.global_progress, !self.notices.is_empty()) => {
                        self.release_notices();
                    }
                }
                continue;
            }
            let status = self
                .reader
                .read_batch(self.settings.batch_size, &mut batch)
                .await
                .map_err(|source| JobError::Source {
                    subtask: self.index,
                    source,
                })?;
            if !batch.is_empty() {
                let mut count = batch.len() as u64;
                let records = std::mem::take(&mut batch);
                if self.refusals.tolerates() {
                    let refused = self
                        .writer
                        .write_batch_refusing(records)
                        .await
                        .map_err(self.sink_error("write_batch_refusing"))?;
                    count -= refused.len() as u64;
                    self.refusals
                        .refused_by_sink(refused)
                        .map_err(|source| JobError::Source {
                            subtask: self.index,
                            source,
                        })?;
                } else {
                    self.writer
                        .write_batch(records)
                        .await
                        .map_err(self.sink_error("write_batch"))?;
                }
                // The next batch's buffer is taken only now: a writer that
                // is done with its batch has freed it, and the allocator
                // hands the same memory back, still in the cache.
                batch.reserve_exact(self.settings.batch_size);
                if self.records_since_barrier == 0 && self.settings.report_writes {
                    // The coordinator may be gone while the job is torn down;
                    // the barrier's acknowledgement would say so.
                    let _ = self.events.send(TaskEvent::RecordsWritten {
                        since: self.last_barrier,
                    });
                }
                self.records_since_barrier += count;
                metrics::add(&self.metrics.records_written, count);
                failpoint!("after-write");
            }
            let refused = self.refusals.take_held();
            if !refused.is_empty() {
                // Before the next barrier: committed with the records read
                // around them.
                self.writer
                    .write_bad_records(refused)
                    .await
                    .map_err(self.sink_error("write_bad_records"))?;
            }
            let flow = match status {
                // Other tasks (the coordinator, other subtasks) get their turn
                // when this task's cooperative budget runs out, and at least
                // every millisecond, so a trigger or a notice waits little
                // while yielding costs little.
                ReadStatus::More => {
                    tokio::task::consume_budget().await;
                    if last_yield.elapsed() >= YIELD_EVERY {
                        tokio::task::yield_now().await;
                        last_yield = tokio::time::Instant::now();
                    }
                    Flow::Continue
                }
                ReadStatus::Idle => {
                    // Nothing to read: serve the coordinator, or read again
                    // as soon as the reader has input, or after the poll.
                    tokio::select! {
                        message = self.control.recv() => self.serve(message).await?,
                        done = self.committed.recv() => {
                            self.on_commit_report(done).await?;
                            Flow::Continue
                        }
                        () = self.reader.wait_for_input() => Flow::Continue,
                        settled = settle_oldest(&mut self.awaiting) => {
                            settled.map_err(self.sink_error("durability"))?;
                            Flow::Continue
                        }
                        () = global_progress_changed(&mut self.global_progress, !self.notices.is_empty()) => {
                            self.release_notices();
                            Flow::Continue
                        }
                        () = tokio::time::sleep(self.settings.idle_poll) => Flow::Continue,
                    }
                }
                ReadStatus::Finished => self.on_end_of_input().await?,
            };
            if flow == Flow::Exit {
                return Ok(());
            }
        }
    }

    /// Once every subtask re-committed its restored committables (and the
    /// global committer, if any, committed them), starts the reader at the
    /// destination's positions. Serves a cancel (or the
    /// coordinator's end) meanwhile; a trigger waits in the channel.
    async fn seek_committed(&mut self, positions: SourcePositions) -> Result<Flow, JobError> {
        positions.recommitted.pass();
        // With a global committer, the data (and positions) of the restored
        // checkpoint are in the destination only once it committed them:
        // read before, the positions would be behind, and every commit
        // of this start superseded.
        let global_recovered = match (self.global_progress.clone(), self.restored) {
            (Some(progress), Some(restored)) => {
                self.send_global(GlobalMessage::Recommitted {
                    subtask: self.index,
                })
                .await?;
                Some((progress, restored))
            }
            _ => None,
        };
        let recovered = async {
            positions.recommitted.all_passed().await;
            if let Some((mut progress, restored)) = global_recovered {
                if progress.wait_for(|done| *done >= restored).await.is_err() {
                    // The global committer is gone: the job is failing, and
                    // the coordinator cancels this subtask.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::pin!(recovered);
        // Barriers and completions that come meanwhile wait for the
        // reader's start, in order.
        let mut held = Vec::new();
        loop {
            tokio::select! {
                () = &mut recovered => break,
                message = self.control.recv() => match message {
                    Some(Control::Cancel) | None => {
                        self.close().await?;
                        return Ok(Flow::Exit);
                    }
                    Some(other) => held.push(other),
                },
            }
        }
        self.start_reader(&positions).await?;
        for message in held {
            if self.on_control(message).await? == Flow::Exit {
                return Ok(Flow::Exit);
            }
        }
        Ok(Flow::Continue)
    }

    /// Starts the reader where the destination's data of each split ends.
    async fn start_reader(&mut self, positions: &SourcePositions) -> Result<(), JobError> {
        let committed = positions.lookup.committed(&positions.scope).await;
        let committed = committed.map_err(self.sink_error("committed_positions"))?;
        info!(subtask = self.index, scope = %positions.scope, splits = committed.len(),
            "reading from the destination's positions");
        self.reader
            .seek_committed(
                SourceStart::new(
                    committed,
                    positions.lookup.clone(),
                    positions.job_name.clone(),
                    positions.lineage.clone(),
                    self.index,
                )
                .with_metrics(positions.metrics.clone()),
            )
            .await
            .map_err(|source| JobError::Source {
                subtask: self.index,
                source,
            })
    }

    /// Serves one control message; `None` means the coordinator is gone and
    /// the job is being torn down.
    async fn serve(&mut self, message: Option<Control>) -> Result<Flow, JobError> {
        match message {
            Some(message) => self.on_control(message).await,
            None => {
                self.close().await?;
                Ok(Flow::Exit)
            }
        }
    }

    async fn on_control(&mut self, message: Control) -> Result<Flow, JobError> {
        match message {
            Control::Trigger(checkpoint_id) => {
                self.on_barrier(checkpoint_id).await?;
                Ok(Flow::Continue)
            }
            Control::Complete {
                checkpoint_id,
                is_final,
            } => {
                self.ledger.notify_complete(checkpoint_id);
                self.hand_over_ready(false).await?;
                if is_final {
                    self.wait_for_commits().await?;
                    self.finish(checkpoint_id).await?;
                    return Ok(Flow::Exit);
                }
                Ok(Flow::Continue)
            }
            Control::Cancel => {
                self.close().await?;
                Ok(Flow::Exit)
            }
            Control::EndInput if self.lifecycle.accepts_input() => {
                info!(subtask = self.index, "stopping: the input ends here");
                self.on_end_of_input().await
            }
            Control::EndInput => Ok(Flow::Continue),
        }
    }

    /// Adds the writer's committables to the ledger under `checkpoint_id`.
    fn add_to_ledger(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<CommittableOf<S>>,
    ) -> Result<(), JobError> {
        let summary = CommittableSummary {
            checkpoint_id,
            subtask: self.index,
            committable_count: committables.len() as u64,
            record_count: std::mem::take(&mut self.records_since_barrier),
        };
        self.last_barrier = checkpoint_id;
        metrics::add(
            &self.metrics.committables_pending,
            committables.len() as u64,
        );
        self.ledger
            .add(summary, committables)
            .map_err(|e| (self.invariant())(&e))
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
        end_of_input: bool,
    ) -> Result<Vec<CommittableOf<S>>, JobError> {
        self.writer
            .flush(end_of_input)
            .await
            .map_err(self.sink_error("flush"))?;
        failpoint!("after-flush");
        if self.positions.is_some() {
            // Every record read so far was written: the advances are
            // exactly the records of the committables prepared now.
            let advances = self.reader.take_advances();
            self.writer
                .carry_positions(advances)
                .map_err(self.sink_error("carry_positions"))?;
        }
        let committables = self
            .writer
            .prepare_commit(checkpoint_id)
            .await
            .map_err(self.sink_error("prepare_commit"))?;
        metrics::add(&self.metrics.prepare_commit_calls, 1);
        failpoint!("after-prepare-commit");
        Ok(committables)
    }

    async fn on_barrier(&mut self, checkpoint_id: CheckpointId) -> Result<(), JobError> {
        let action = self
            .lifecycle
            .on_barrier(checkpoint_id)
            .map_err(|e| (self.invariant())(&e))?;
        match action {
            BarrierAction::PrepareAndSnapshot => {
                let committables = self.prepare_commit(checkpoint_id, false).await?;
                self.add_to_ledger(checkpoint_id, committables)?;
                self.reader.on_checkpoint(checkpoint_id);
            }
            BarrierAction::SnapshotWithEmptySummary => {
                failpoint!("during-final-checkpoint");
                self.add_to_ledger(checkpoint_id, Vec::new())?;
            }
            BarrierAction::SnapshotOnly => failpoint!("during-final-checkpoint"),
        }
        let states = self
            .writer
            .snapshot_state(checkpoint_id)
            .await
            .map_err(self.sink_error("snapshot_state"))?;
        failpoint!("after-snapshot");
        let snapshot = self.snapshot(states)?;
        debug!(subtask = self.index, checkpoint = %checkpoint_id, ?action, "barrier passed");
        let ack = TaskEvent::Ack {
            task: TaskId::Subtask(self.index),
            checkpoint_id,
            state: TaskState::Subtask(snapshot, self.counts.snapshot()),
        };
        let durability = self.writer.durability(checkpoint_id);
        if durability.is_none() && self.awaiting.is_empty() {
            self.send_ack(ack)?;
            return self
                .send_global(GlobalMessage::Barrier {
                    checkpoint_id,
                    subtask: self.index,
                })
                .await;
        }
        // The acknowledgement waits for the work (and for those of earlier
        // checkpoints); the global committer hears of the barrier now, in
        // order with the commit reports that come after it.
        self.awaiting.push_back(AwaitingAck {
            checkpoint_id,
            ack,
            durability,
        });
        self.send_global(GlobalMessage::Barrier {
            checkpoint_id,
            subtask: self.index,
        })
        .await?;
        self.send_ready_acks()
    }

    fn send_ack(&mut self, ack: TaskEvent) -> Result<(), JobError> {
        self.events
            .send(ack)
            .map_err(|_| (self.invariant())(&"the coordinator is gone"))?;
        failpoint!("after-acknowledge");
        Ok(())
    }

    /// Sends, oldest first, the acknowledgements whose durability work is
    /// done, polling the oldest work without waiting; fails with the work's
    /// error.
    fn send_ready_acks(&mut self) -> Result<(), JobError> {
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        while let Some(oldest) = self.awaiting.front_mut() {
            if let Some(work) = oldest.durability.as_mut() {
                match work.as_mut().poll(&mut context) {
                    std::task::Poll::Pending => return Ok(()),
                    std::task::Poll::Ready(result) => {
                        oldest.durability = None;
                        result.map_err(self.sink_error("durability"))?;
                    }
                }
            }
            let Some(ready) = self.awaiting.pop_front() else {
                break;
            };
            debug!(subtask = self.index, checkpoint = %ready.checkpoint_id, "durable: acknowledged");
            self.send_ack(ready.ack)?;
        }
        Ok(())
    }

    fn snapshot(&self, states: Vec<WriterStateOf<S>>) -> Result<SubtaskSnapshot, JobError> {
        let encode_error = |what| {
            move |source| JobError::Serialization {
                task: self.name.clone(),
                what,
                source,
            }
        };
        let writer_states = states
            .iter()
            .map(|state| serialize_versioned(self.serializers.writer_state.as_ref(), state))
            .collect::<Result<_, _>>()
            .map_err(encode_error("encoding a writer state"))?;
        let waiting = encode_pending(
            self.ledger.pending_parts(),
            self.serializers.committable.as_ref(),
        )
        .map_err(encode_error("encoding a committable"))?;
        let in_flight = self
            .in_flight
            .iter()
            .flat_map(|(_, parts)| parts.iter().cloned());
        let pending = in_flight.chain(waiting).collect();
        let source_splits = (self.serializers.splits)
            .encode(&self.reader.snapshot_splits())
            .map_err(encode_error("encoding the source position"))?;
        Ok(SubtaskSnapshot {
            subtask: self.index,
            source_splits,
            writer_states,
            pending,
            end_of_input: !self.lifecycle.accepts_input(),
        })
    }

    async fn on_end_of_input(&mut self) -> Result<Flow, JobError> {
        let tag = self
            .lifecycle
            .on_end_of_input()
            .map_err(|e| (self.invariant())(&e))?;
        failpoint!("during-end-of-input");
        let committables = self.prepare_commit(tag, true).await?;
        info!(subtask = self.index, tag = %tag, committables = committables.len(), "end of input");
        self.add_to_ledger(tag, committables)?;
        self.reader.on_checkpoint(tag);
        self.events
            .send(TaskEvent::EndOfInput {
                subtask: self.index,
            })
            .map_err(|_| (self.invariant())(&"the coordinator is gone"))?;
        if self.lifecycle.take_end_of_stream(false) {
            // Only reached when the deferral is switched off (a test of the
            // FLINK-38614 race): end of stream before the final commit.
            self.send_global(GlobalMessage::EndOfStream {
                subtask: self.index,
            })
            .await?;
        }
        Ok(Flow::Continue)
    }

    /// Hands every checkpoint the ledger says is ready to the committer
    /// task, oldest first, keeping their parts (encoded) for snapshots until
    /// the task reports them done.
    async fn hand_over_ready(&mut self, recommit: bool) -> Result<(), JobError> {
        while let Some(ready) = self.ledger.take_ready() {
            let encoded = encode_pending(ready.parts.iter(), self.serializers.committable.as_ref())
                .map_err(|source| JobError::Serialization {
                    task: self.name.clone(),
                    what: "encoding a committable",
                    source,
                })?;
            self.in_flight.push_back((ready.checkpoint_id, encoded));
            let job = CommitJob {
                checkpoint_id: ready.checkpoint_id,
                parts: ready.parts,
                recommit,
            };
            let handed = self
                .commits
                .as_ref()
                .is_some_and(|commits| commits.send(job).is_ok());
            if !handed {
                return Err(self.committer_gone().await);
            }
        }
        if let Some(held) = self.ledger.held() {
            warn!(
                subtask = self.index,
                ?held,
                "a completed checkpoint is incomplete and holds the commit"
            );
        }
        Ok(())
    }

    /// Serves the commit reports that arrived, without waiting.
    async fn take_commit_reports(&mut self) -> Result<(), JobError> {
        loop {
            let done = match self.committed.try_recv() {
                Ok(done) => Some(done),
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            };
            self.on_commit_report(done).await?;
        }
    }

    /// Waits until the committer task reported every checkpoint handed to
    /// it.
    async fn wait_for_commits(&mut self) -> Result<(), JobError> {
        while !self.in_flight.is_empty() {
            let done = self.committed.recv().await;
            self.on_commit_report(done).await?;
        }
        Ok(())
    }

    /// A checkpoint committed (`None`: the committer task ended, which it
    /// does only on a failure while this subtask runs): forwards what was
    /// committed to the global committer, in order with this subtask's
    /// barriers, tells the source, and drops the checkpoint from snapshots.
    async fn on_commit_report(
        &mut self,
        done: Option<Result<CommitDone<CommittableOf<S>>, JobError>>,
    ) -> Result<(), JobError> {
        let done = match done {
            Some(Ok(done)) => done,
            Some(Err(error)) => return Err(error),
            None => return Err(self.committer_gone().await),
        };
        match self.in_flight.pop_front() {
            Some((checkpoint_id, _)) if checkpoint_id == done.checkpoint_id => {}
            other => {
                return Err((self.invariant())(&format_args!(
                "the committer task reported checkpoint {} while {:?} was the oldest handed to it",
                done.checkpoint_id,
                other.map(|(id, _)| id)
            )))
            }
        }
        for (summary, committables) in done.committed {
            self.send_global(GlobalMessage::Committed {
                summary,
                committables,
            })
            .await?;
        }
        self.notify_reader(done.checkpoint_id, done.outcome);
        Ok(())
    }

    /// Tells the reader that this subtask's share of `checkpoint_id` was
    /// committed with `outcome`: at once without a global committer; with
    /// one, once it committed the checkpoint too, in checkpoint order.
    fn notify_reader(&mut self, checkpoint_id: CheckpointId, outcome: CommitOutcome) {
        match self.global_progress {
            Some(_) => {
                self.notices.push_back((checkpoint_id, outcome));
                self.release_notices();
            }
            None => self.reader.on_commit(checkpoint_id, outcome),
        }
    }

    /// Passes on to the reader the commits the global committer caught up
    /// with.
    fn release_notices(&mut self) {
        let Some(progress) = &mut self.global_progress else {
            return;
        };
        let committed = *progress.borrow_and_update();
        while self
            .notices
            .front()
            .is_some_and(|(checkpoint_id, _)| *checkpoint_id <= committed)
        {
            if let Some((checkpoint_id, outcome)) = self.notices.pop_front() {
                self.reader.on_commit(checkpoint_id, outcome);
            }
        }
    }

    /// After the end of stream: waits until the global committer committed
    /// what the reader has not heard of yet (or is gone: the job failed,
    /// and those commits are not known to be visible).
    async fn wait_for_global_commits(&mut self) {
        while !self.notices.is_empty() {
            let Some(progress) = &mut self.global_progress else {
                return;
            };
            if progress.changed().await.is_err() {
                return;
            }
            self.release_notices();
        }
    }

    /// Why the committer task ended: its last report when it is a failure
    /// (the job's cancellation among them, which a commit handed over at
    /// the same moment races with); else an error closing it, a panic, or
    /// a broken promise.
    async fn committer_gone(&mut self) -> JobError {
        while let Ok(report) = self.committed.try_recv() {
            match report {
                Err(error) => return error,
                Ok(done) => self.on_late_commit(done),
            }
        }
        let Some(mut handle) = self.committer_task.take() else {
            return (self.invariant())(&"the committer task is gone");
        };
        match (&mut handle.0).await {
            Ok(Err(error)) => error,
            Ok(Ok(())) => {
                (self.invariant())(&"the committer task ended while commits were handed to it")
            }
            Err(join_error) => JobError::Panicked {
                task: format!("{} committer", self.name),
                message: join_error.to_string(),
            },
        }
    }

    /// After the final commit (or the commit at end of input): drops what
    /// was opened after the final checkpoint, tells the global committer the
    /// stream ended, and closes.
    async fn finish(&mut self, final_checkpoint: CheckpointId) -> Result<(), JobError> {
        if !self.ledger.is_empty() {
            let leftover = self.ledger.pending_committables();
            if leftover > 0 {
                // Only checkpoints after the final one can be left, and after
                // end of input no committable is ever produced.
                return Err((self.invariant())(&format_args!(
                    "{leftover} committables are still pending after the final checkpoint {final_checkpoint}"
                )));
            }
        }
        if self.lifecycle.take_end_of_stream(true) {
            self.send_global(GlobalMessage::EndOfStream {
                subtask: self.index,
            })
            .await?;
        }
        self.wait_for_global_commits().await;
        info!(subtask = self.index, checkpoint = %final_checkpoint, "finished");
        self.close().await
    }

    /// Closes the writer, then lets the committer task finish what it was
    /// handed (nothing, unless cancelled: then it stops before its next
    /// commit) and close the committer; once: a second call does nothing.
    async fn close(&mut self) -> Result<(), JobError> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        let writer = self.writer.close().await.map_err(self.sink_error("close"));
        // The reader lets go of what it holds outside the process (a
        // consumer group's membership) before the process may end.
        self.reader.close().await;
        self.commits = None;
        let committer = match self.committer_task.take() {
            Some(mut handle) => match (&mut handle.0).await {
                Ok(result) => result,
                Err(join_error) => Err(JobError::Panicked {
                    task: format!("{} committer", self.name),
                    message: join_error.to_string(),
                }),
            },
            None => Ok(()),
        };
        // Commits the task finished after a cancel or a failure: their
        // records are committed, so without a global committer the source
        // hears it (a pipeline's tickets resolve). The global committer
        // does not: it is stopping, and these checkpoints are in the last
        // snapshot, so a restore delivers them again as replays; with one,
        // the notices stay held (the data is not known to be visible).
        while let Ok(Ok(done)) = self.committed.try_recv() {
            self.on_late_commit(done);
        }
        writer.and(committer)
    }

    /// A commit the committer task finished while the job stops: its
    /// records are committed, so the source hears it (a pipeline's tickets
    /// resolve) unless a global committer must commit it too; the global
    /// committer does not (see [`close`](Self::close)).
    fn on_late_commit(&mut self, done: CommitDone<CommittableOf<S>>) {
        if self
            .in_flight
            .front()
            .is_some_and(|(id, _)| *id == done.checkpoint_id)
        {
            self.in_flight.pop_front();
            self.notify_reader(done.checkpoint_id, done.outcome);
        }
    }

    async fn send_global(
        &mut self,
        message: GlobalMessage<CommittableOf<S>>,
    ) -> Result<(), JobError> {
        let Some(global) = &self.global else {
            return Ok(());
        };
        global
            .send(message)
            .await
            .map_err(|_| (self.invariant())(&"the global committer is gone"))
    }
}
