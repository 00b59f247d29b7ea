//! The global committer's task: parallelism 1, after every committer.
//!
//! It receives, in order from each subtask, what that subtask committed per
//! checkpoint (with a summary), the barriers the subtask passed, and finally
//! its end of stream. It acts on a checkpoint once every subtask delivered
//! it completely, snapshots checkpoint `n` once every subtask's barrier `n`
//! arrived (aligned by `BarrierAligner`, so its state holds exactly what was
//! committed before the barriers), and ends when every subtask ended its
//! stream.
//!
//! A global committer that asks for a [`CommitSchedule`] other than every
//! checkpoint has the checkpoints that completed held back here until the
//! schedule is due: they stay in this task's state (its snapshots hold
//! them, so a restart delivers them again), and the subtasks' readers hear
//! of their commit only when it happens. Checkpoints up to the restored
//! one, and every one at end of input, are committed at once.
//!
//! Each subtask sends its end of stream only after forwarding its final
//! committables (see `SubtaskLifecycle`), so nothing can arrive after the
//! global committer was told the input ended. Should it happen anyway, the
//! delivery is passed on and reported as an error rather than dropped.

use std::collections::BTreeSet;
use std::sync::Arc;

use sink_api::{CheckpointId, CommitSchedule, GlobalCommitter, SubtaskIndex, VersionedSerializer};
use tokio::sync::{mpsc, watch};
use tracing::{error, info};

use super::calls::CommitCalls;
use super::{GlobalMessage, TaskEvent, TaskState};
use crate::core::alignment::{Aligned, AlignerInput, BarrierAligner};
use crate::core::checkpoints::TaskId;
use crate::core::ledger::{CommitLedger, ReadyCheckpoint};
use crate::error::JobError;
use crate::failpoints::failpoint;
use crate::metrics::{self, Metrics};
use crate::storage::{encode_pending, GlobalCommitterSnapshot};

const TASK: &str = "global committer";

/// The global committer's task.
pub(crate) struct GlobalTask<C: Send + 'static> {
    /// The global committer, away while a call of it runs in a task of its
    /// own (see [`CommitCalls`]); lost only to a call that panicked.
    pub committer: Option<Box<dyn GlobalCommitter<Committable = C>>>,
    pub calls: CommitCalls,
    pub parallelism: usize,
    pub ledger: CommitLedger<C>,
    pub input: mpsc::Receiver<GlobalMessage<C>>,
    pub events: mpsc::UnboundedSender<TaskEvent>,
    pub serializer: Arc<dyn VersionedSerializer<C>>,
    pub metrics: Arc<Metrics>,
    /// Subtasks whose end of stream arrived.
    pub ended: BTreeSet<SubtaskIndex>,
    /// Whether `GlobalCommitter::end_of_input` was called.
    pub end_of_input_called: bool,
    /// The newest checkpoint committed (or found empty), for the subtasks:
    /// their readers hear of a commit only after it.
    pub progress: watch::Sender<CheckpointId>,
    /// The checkpoint this start restored, if any.
    pub restored: Option<CheckpointId>,
    /// Subtasks that forwarded what they re-committed of it (sent only by
    /// the subtasks of a source with a position scope).
    pub recommitted: BTreeSet<SubtaskIndex>,
    /// The committer's schedule, read when it was made.
    pub schedule: CommitSchedule,
    /// Completed checkpoints the schedule holds back, oldest first.
    pub deferred: Vec<ReadyCheckpoint<C>>,
    /// When the last commit was made (or the task started).
    pub last_commit: tokio::time::Instant,
}

impl<C: Send + 'static> GlobalTask<C> {
    /// Runs until every subtask ended its stream and the channel closed, or
    /// until the job is torn down.
    pub(crate) async fn run(mut self) -> Result<(), JobError> {
        let mut aligner = BarrierAligner::new(self.parallelism);
        while let Some(message) = self.input.recv().await {
            let (subtask, input) = match message {
                GlobalMessage::Recommitted { subtask } => {
                    self.on_recommitted(subtask).await?;
                    continue;
                }
                GlobalMessage::Barrier {
                    checkpoint_id,
                    subtask,
                } => (subtask, AlignerInput::Barrier(checkpoint_id)),
                GlobalMessage::Committed { ref summary, .. } => {
                    (summary.subtask, AlignerInput::Message(message))
                }
                GlobalMessage::EndOfStream { subtask } => (subtask, AlignerInput::Message(message)),
            };
            let aligned = aligner
                .push(subtask, input)
                .map_err(|e| JobError::invariant(TASK, e))?;
            for step in aligned {
                match step {
                    Aligned::Snapshot(checkpoint_id) => self.acknowledge(checkpoint_id)?,
                    Aligned::Message(message) => self.process(message).await?,
                }
            }
        }
        Ok(())
    }

    async fn process(&mut self, message: GlobalMessage<C>) -> Result<(), JobError> {
        match message {
            GlobalMessage::Committed {
                summary,
                committables,
            } => {
                if self.end_of_input_called {
                    error!(checkpoint = %summary.checkpoint_id, subtask = summary.subtask,
                        "committables reached the global committer after its end of input; \
                         end of stream was not deferred until the final commit");
                }
                self.ledger
                    .add(summary, committables)
                    .map_err(|e| JobError::invariant(TASK, e))?;
                // The committers forward only what they committed, so arrival
                // means completion; the ledger still waits until every
                // subtask delivered the checkpoint.
                self.ledger.notify_complete(summary.checkpoint_id);
                self.act_on_ready().await
            }
            GlobalMessage::EndOfStream { subtask } => {
                self.ended.insert(subtask);
                if self.ended.len() < self.parallelism || self.end_of_input_called {
                    return Ok(());
                }
                if let Some(held) = self.ledger.held() {
                    return Err(JobError::invariant(
                        TASK,
                        format_args!(
                            "every subtask ended its stream, but checkpoint {} is incomplete: {held:?}",
                            held.checkpoint_id
                        ),
                    ));
                }
                // Whatever the schedule: everything is committed before the
                // end of input.
                self.commit_deferred().await?;
                info!("end of input");
                self.end_of_input_called = true;
                let mut committer = self.take_committer()?;
                let (committer, result) = self
                    .calls
                    .run(TASK, async move {
                        let result = committer.end_of_input().await;
                        (committer, result)
                    })
                    .await?;
                self.committer = Some(committer);
                result.map_err(|source| JobError::Sink {
                    task: TASK.into(),
                    action: "end_of_input",
                    source,
                })
            }
            GlobalMessage::Barrier { .. } | GlobalMessage::Recommitted { .. } => {
                Err(JobError::invariant(
                    TASK,
                    "a barrier or a recommit notice passed the aligner as a message",
                ))
            }
        }
    }

    /// Takes the checkpoints that are ready (completed and complete) and
    /// commits them with those held back, once the schedule is due, or at
    /// once for those up to the restored checkpoint.
    async fn act_on_ready(&mut self) -> Result<(), JobError> {
        while let Some(ready) = self.ledger.take_ready() {
            self.deferred.push(ready);
        }
        let Some(oldest) = self.deferred.first().map(|ready| ready.checkpoint_id) else {
            return Ok(());
        };
        // Up to the restored checkpoint, the subtasks wait for the commit
        // before they read: no schedule holds it back.
        let recovering = self.restored.is_some_and(|restored| oldest <= restored);
        let due = self
            .schedule
            .is_due(self.deferred.len(), self.last_commit.elapsed());
        if recovering || due {
            self.commit_deferred().await?;
        }
        Ok(())
    }

    /// Commits every checkpoint held back, in one call: `commit_checkpoint`
    /// for one, `commit_checkpoints` for several. Checkpoints with nothing
    /// to commit are not handed over; the subtasks hear of all of them.
    async fn commit_deferred(&mut self) -> Result<(), JobError> {
        let Some(newest) = self.deferred.last().map(|ready| ready.checkpoint_id) else {
            return Ok(());
        };
        let mut checkpoints: Vec<(CheckpointId, Vec<C>)> = std::mem::take(&mut self.deferred)
            .into_iter()
            .map(|ready| {
                let committables = ready
                    .parts
                    .into_iter()
                    .flat_map(|part| part.committables)
                    .collect::<Vec<C>>();
                (ready.checkpoint_id, committables)
            })
            .filter(|(_, committables)| !committables.is_empty())
            .collect();
        self.last_commit = tokio::time::Instant::now();
        let Some(id) = checkpoints.last().map(|(id, _)| *id) else {
            self.progress.send_replace(newest);
            return Ok(());
        };
        // A call of its own, run to its end even if this task is
        // stopped: see `CommitCalls`.
        let mut committer = self.take_committer()?;
        let (action, call) = match checkpoints.len() {
            1 => ("commit_checkpoint", checkpoints.pop()),
            _ => ("commit_checkpoints", None),
        };
        let (committer, result) = self
            .calls
            .run(TASK, async move {
                let result = match call {
                    Some((id, committables)) => committer.commit_checkpoint(id, committables).await,
                    None => committer.commit_checkpoints(checkpoints).await,
                };
                (committer, result)
            })
            .await?;
        self.committer = Some(committer);
        match result {
            Ok(()) => {}
            Err(source) if source.is_superseded() => {
                metrics::add(&self.metrics.commits_superseded, 1);
                if self.restored.is_none_or(|restored| id > restored) {
                    return Err(JobError::Sink {
                        task: TASK.into(),
                        action,
                        source,
                    });
                }
                // A recovery: what the restored checkpoint's subtasks
                // read was committed by another owner, and they read
                // from the destination's positions next.
                info!(checkpoint = %id, reason = %source,
                    "a restored checkpoint's commit was superseded in part; going on");
            }
            Err(source) => {
                return Err(JobError::Sink {
                    task: TASK.into(),
                    action,
                    source,
                })
            }
        }
        metrics::add(&self.metrics.global_commits, 1);
        self.progress.send_replace(newest);
        failpoint!("after-global-commit");
        Ok(())
    }

    /// A subtask forwarded all it re-committed of the restored checkpoint
    /// (it sends no barrier before every subtask did, so nothing of it is
    /// held by the aligner). Once every subtask did, every checkpoint up to
    /// the restored one is complete here: they are committed, and the
    /// subtasks waiting to read from the destination's positions hear of
    /// it through `progress`.
    async fn on_recommitted(&mut self, subtask: SubtaskIndex) -> Result<(), JobError> {
        self.recommitted.insert(subtask);
        let Some(restored) = self.restored else {
            return Ok(());
        };
        if self.recommitted.len() < self.parallelism {
            return Ok(());
        }
        self.ledger.notify_complete(restored);
        self.act_on_ready().await?;
        if let Some(held) = self.ledger.held().filter(|h| h.checkpoint_id <= restored) {
            return Err(JobError::invariant(
                TASK,
                format_args!(
                    "every subtask re-committed the restored checkpoint {restored}, but \
                     checkpoint {} is incomplete: {held:?}",
                    held.checkpoint_id
                ),
            ));
        }
        self.progress.send_if_modified(|done| {
            let behind = *done < restored;
            if behind {
                *done = restored;
            }
            behind
        });
        Ok(())
    }

    /// The global committer, for a call that hands it back.
    fn take_committer(&mut self) -> Result<Box<dyn GlobalCommitter<Committable = C>>, JobError> {
        self.committer.take().ok_or_else(|| {
            JobError::invariant(TASK, "the global committer was lost to a panicked call")
        })
    }

    fn acknowledge(&self, checkpoint_id: CheckpointId) -> Result<(), JobError> {
        // The checkpoints held back first: they are older than any the
        // ledger still waits for.
        let held_back = self.deferred.iter().flat_map(|ready| ready.parts.iter());
        let pending = encode_pending(
            held_back.chain(self.ledger.pending_parts()),
            self.serializer.as_ref(),
        )
        .map_err(|source| JobError::Serialization {
            task: TASK.into(),
            what: "encoding a committable",
            source,
        })?;
        self.events
            .send(TaskEvent::Ack {
                task: TaskId::GlobalCommitter,
                checkpoint_id,
                state: TaskState::GlobalCommitter(GlobalCommitterSnapshot { pending }),
            })
            .map_err(|_| JobError::invariant(TASK, "the coordinator is gone"))
    }
}
