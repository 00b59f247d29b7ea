//! One subtask's chain: source reader, writer and committer in one tokio task.
//!
//! The loop reads a batch, writes it, and between batches serves the
//! coordinator's control messages. Because the source lives in the same task,
//! a barrier is aligned by construction: every record read before it is
//! written and prepared before the checkpoint is acknowledged.
//!
//! ```text
//! loop:
//!   serve every waiting control message:
//!     Trigger(n)     ─▶ [flush(false), prepare_commit(n), summary n]  snapshot_state(n), ack, barrier to global
//!     Complete(n)    ─▶ commit every ready checkpoint <= n (retries with backoff), forward to global
//!                       final? ─▶ end of stream to global, close, exit
//!     Cancel         ─▶ close, exit
//!   before end of input: read a batch ─▶ write_batch
//!     source finished ─▶ flush(true), prepare_commit(last barrier + 1), tagged with it;
//!                        the final checkpoint follows (in every bounded mode, with
//!                        checkpointing off too), and its Complete commits everything
//!   after end of input: wait for the next control message
//! ```
//!
//! The decisions are made by [`SubtaskLifecycle`], [`CommitLedger`] and
//! [`CommitRound`]; this file only carries them out.

use std::sync::Arc;
use std::time::Duration;

use sink_api::{
    serialize_versioned, BincodeSerializer, CheckpointId, Committer, Sink, SinkError, SinkWriter,
    SubtaskIndex, VersionedSerializer,
};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{Control, GlobalMessage, TaskEvent, TaskState};
use crate::core::checkpoints::TaskId;
use crate::core::commit_round::{CommitRound, RoundStep};
use crate::core::ledger::{CommitLedger, CommittableSummary, SubtaskPart};
use crate::core::lifecycle::{BarrierAction, SubtaskLifecycle};
use crate::core::retry::RetryPolicy;
use crate::error::JobError;
use crate::failpoints::failpoint;
use crate::metrics::{self, KnownCommitFailure, Metrics};
use crate::source::{CommitOutcome, ReadStatus, Source, SplitReader};
use crate::storage::{encode_pending, SubtaskSnapshot};

/// Longest a busy subtask runs before it lets other tasks run.
const YIELD_EVERY: Duration = Duration::from_millis(1);

/// Settings shared by every subtask of a job.
#[derive(Debug, Clone)]
pub(crate) struct SubtaskSettings {
    pub batch_size: usize,
    pub idle_poll: Duration,
    pub retry: RetryPolicy,
}

/// What to do after a control message or end of input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

/// The sink's serializers and the source's, for snapshots.
pub(crate) struct Serializers<S: Sink, Src: Source> {
    pub committable: Arc<dyn VersionedSerializer<S::Committable>>,
    pub writer_state: Arc<dyn VersionedSerializer<S::WriterState>>,
    pub splits: Arc<BincodeSerializer<Vec<Src::Split>>>,
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
pub(crate) struct SubtaskTask<S: Sink, Src: Source<Record = S::Input>> {
    pub index: SubtaskIndex,
    pub name: String,
    pub reader: Src::Reader,
    pub writer: S::Writer,
    pub committer: S::Committer,
    pub ledger: CommitLedger<S::Committable>,
    pub lifecycle: SubtaskLifecycle,
    pub control: mpsc::UnboundedReceiver<Control>,
    pub events: mpsc::UnboundedSender<TaskEvent>,
    pub global: Option<mpsc::Sender<GlobalMessage<S::Committable>>>,
    pub metrics: Arc<Metrics>,
    pub serializers: Serializers<S, Src>,
    pub settings: SubtaskSettings,
    /// Restored from a checkpoint: its pending committables are committed
    /// before any record is read.
    pub restored: Option<CheckpointId>,
    /// True while re-committing what the restored checkpoint held.
    pub recommitting: bool,
    /// Set by the coordinator when the job is cancelled or failed: no more
    /// commits, no more waiting.
    pub cancel: watch::Receiver<bool>,
    /// Whether the writer and committer were closed.
    pub closed: bool,
    pub records_since_barrier: u64,
}

impl<S: Sink, Src: Source<Record = S::Input>> SubtaskTask<S, Src> {
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
            self.recommitting = true;
            self.commit_ready().await?;
            self.recommitting = false;
        }
        let mut batch = Vec::with_capacity(self.settings.batch_size);
        let mut last_yield = tokio::time::Instant::now();
        loop {
            // Control messages first: a barrier waits for one batch at most.
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
            if !self.lifecycle.accepts_input() {
                let message = self.control.recv().await;
                if self.serve(message).await? == Flow::Exit {
                    return Ok(());
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
                let count = batch.len() as u64;
                let records =
                    std::mem::replace(&mut batch, Vec::with_capacity(self.settings.batch_size));
                self.writer
                    .write_batch(records)
                    .await
                    .map_err(self.sink_error("write_batch"))?;
                self.records_since_barrier += count;
                metrics::add(&self.metrics.records_written, count);
                failpoint!("after-write");
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
                        () = self.reader.wait_for_input() => Flow::Continue,
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
                self.commit_ready().await?;
                if is_final {
                    self.finish(checkpoint_id).await?;
                    return Ok(Flow::Exit);
                }
                Ok(Flow::Continue)
            }
            Control::Cancel => {
                self.close().await?;
                Ok(Flow::Exit)
            }
        }
    }

    /// Adds the writer's committables to the ledger under `checkpoint_id`.
    fn add_to_ledger(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<S::Committable>,
    ) -> Result<(), JobError> {
        let summary = CommittableSummary {
            checkpoint_id,
            subtask: self.index,
            committable_count: committables.len() as u64,
            record_count: std::mem::take(&mut self.records_since_barrier),
        };
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
    ) -> Result<Vec<S::Committable>, JobError> {
        self.writer
            .flush(end_of_input)
            .await
            .map_err(self.sink_error("flush"))?;
        failpoint!("after-flush");
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
        self.events
            .send(TaskEvent::Ack {
                task: TaskId::Subtask(self.index),
                checkpoint_id,
                state: TaskState::Subtask(snapshot),
            })
            .map_err(|_| (self.invariant())(&"the coordinator is gone"))?;
        failpoint!("after-acknowledge");
        self.send_global(GlobalMessage::Barrier {
            checkpoint_id,
            subtask: self.index,
        })
        .await
    }

    fn snapshot(&self, states: Vec<S::WriterState>) -> Result<SubtaskSnapshot, JobError> {
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
        let pending = encode_pending(
            self.ledger.pending_parts(),
            self.serializers.committable.as_ref(),
        )
        .map_err(encode_error("encoding a committable"))?;
        let source_splits = serialize_versioned(
            self.serializers.splits.as_ref(),
            &self.reader.snapshot_splits(),
        )
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

    /// Commits every checkpoint the ledger says is ready, oldest first, each
    /// through its retries, and forwards what was committed.
    async fn commit_ready(&mut self) -> Result<(), JobError> {
        while let Some(ready) = self.ledger.take_ready() {
            // One part per checkpoint, unless this subtask took over the
            // parts of several former subtasks in a restore with another
            // parallelism.
            let mut outcome = CommitOutcome::Committed;
            for part in ready.parts {
                if self.commit_part(ready.checkpoint_id, part).await? == CommitOutcome::PartlyLost {
                    outcome = CommitOutcome::PartlyLost;
                }
            }
            self.reader.on_commit(ready.checkpoint_id, outcome);
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

    /// Logs, counts and keeps the known failures of `checkpoint_id` just
    /// settled; returns the records lost with them. A failure this process
    /// already reported (the same re-commit after an in-process restart) is
    /// logged again but counted once.
    fn report_known_failures(
        &self,
        checkpoint_id: CheckpointId,
        failures: Vec<(String, Option<u64>)>,
    ) -> u64 {
        let mut records_lost = 0u64;
        for (reason, lost) in failures {
            warn!(subtask = self.index, checkpoint = %checkpoint_id, %reason, records_lost = ?lost,
                "a committable failed with a known reason and was dropped: its output is lost");
            records_lost = records_lost.saturating_add(lost.unwrap_or(0));
            let first_report = self.metrics.record_failure(KnownCommitFailure {
                checkpoint_id,
                subtask: self.index,
                reason,
                records_lost: lost,
            });
            if first_report {
                metrics::add(&self.metrics.commits_failed, 1);
                metrics::add(&self.metrics.records_lost, lost.unwrap_or(0));
            }
        }
        records_lost
    }

    /// Commits one part through its retries and forwards what was committed
    /// to the global committer, under the part's original subtask. Says
    /// whether a committable was dropped with a known reason.
    async fn commit_part(
        &mut self,
        checkpoint_id: CheckpointId,
        part: SubtaskPart<S::Committable>,
    ) -> Result<CommitOutcome, JobError> {
        let summary = part.summary;
        let count = part.committables.len() as u64;
        let mut round = CommitRound::new(checkpoint_id, part.committables);
        let mut records_lost = 0u64;
        loop {
            let mut requests = round.take_requests();
            if requests.is_empty() {
                break;
            }
            // After a cancel nothing more is committed: what this round held
            // stays in the last checkpoint and is committed after a restore.
            self.check_cancelled()?;
            metrics::add(&self.metrics.commit_calls, 1);
            self.committer
                .commit(&mut requests)
                .await
                .map_err(self.sink_error("commit"))?;
            let step = round.settle(requests, &self.settings.retry);
            // Reported at once: a round cut short below hides no loss.
            records_lost = records_lost.saturating_add(
                self.report_known_failures(checkpoint_id, round.take_known_failures()),
            );
            let step = step.map_err(|source| JobError::Commit {
                subtask: self.index,
                source,
            })?;
            match step {
                RoundStep::Done => break,
                RoundStep::Retry { retry, requests } => {
                    metrics::add(&self.metrics.commits_retried, requests);
                    let delay = self.settings.retry.backoff(retry, fastrand::f64());
                    warn!(subtask = self.index, checkpoint = %checkpoint_id, retry, ?delay, "commit asked to be retried");
                    let mut cancel = self.cancel.clone();
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = cancel.wait_for(|&cancelled| cancelled) => return Err(JobError::Cancelled),
                    }
                }
            }
        }
        let (committed, tally) = round.into_committed();
        let failed = count.saturating_sub(committed.len() as u64);
        metrics::sub(&self.metrics.committables_pending, count);
        if !self.recommitting {
            // Restored records were written, and counted, by an earlier run;
            // lost ones were never committed; a part that was all replays
            // made nothing visible now.
            let records = summary.record_count.saturating_sub(records_lost);
            let all_replays = tally.committed == 0 && tally.already_committed > 0;
            match all_replays {
                true => metrics::add(&self.metrics.records_replayed, records),
                false => metrics::add(&self.metrics.records_committed, records),
            }
        }
        metrics::add(&self.metrics.commits_succeeded, tally.committed);
        metrics::add(
            &self.metrics.commits_already_committed,
            tally.already_committed,
        );

        // Once per subtask and checkpoint: debug; the coordinator logs each
        // completed checkpoint at info.
        debug!(subtask = self.index, checkpoint = %checkpoint_id, origin = summary.subtask,
            committed = tally.committed, already_committed = tally.already_committed,
            records = summary.record_count, "checkpoint committed");
        if self.recommitting {
            failpoint!("during-recovery-recommit");
        }
        if !self.recommitting {
            failpoint!("after-commit");
        }
        self.send_global(GlobalMessage::Committed {
            summary: CommittableSummary {
                committable_count: committed.len() as u64,
                ..summary
            },
            committables: committed,
        })
        .await?;
        Ok(match failed {
            0 => CommitOutcome::Committed,
            _ => CommitOutcome::PartlyLost,
        })
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
        info!(subtask = self.index, checkpoint = %final_checkpoint, "finished");
        self.close().await
    }

    /// Closes the writer and the committer, once: a second call does
    /// nothing.
    async fn close(&mut self) -> Result<(), JobError> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        let writer = self.writer.close().await.map_err(self.sink_error("close"));
        let committer = self
            .committer
            .close()
            .await
            .map_err(self.sink_error("close the committer"));
        writer.and(committer)
    }

    /// Fails with [`JobError::Cancelled`] once the job was cancelled.
    fn check_cancelled(&self) -> Result<(), JobError> {
        match *self.cancel.borrow() {
            true => Err(JobError::Cancelled),
            false => Ok(()),
        }
    }

    async fn send_global(
        &mut self,
        message: GlobalMessage<S::Committable>,
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
