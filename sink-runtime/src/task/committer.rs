//! One subtask's committer, on a task of its own: commits, retries and
//! backoffs never stop the subtask from reading, writing and passing
//! barriers.
//!
//! ```text
//!  subtask ── CommitJob(n), oldest first ──▶ committer task: commit n through its retries
//!     ▲                                               │
//!     └──────────── CommitDone(n) ◀───────────────────┘
//!  subtask: forward n to the global committer, tell the source, drop n from its snapshots
//! ```
//!
//! The subtask hands over every checkpoint its ledger says is ready, in
//! order; the committer task commits them one at a time, oldest first, so
//! the ordering rules hold as before. Until the subtask hears that a
//! checkpoint is done, its committables stay in the subtask's snapshots
//! (committed again, as a replay, after a restore), and only the subtask
//! forwards them to the global committer, in the same order as its
//! barriers: the global committer's snapshot of checkpoint `m` holds
//! exactly what the subtask dropped from its own before barrier `m`.

use std::sync::Arc;

use sink_api::{CheckpointId, Committer, SubtaskIndex};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::calls::CommitCalls;
use crate::core::commit_round::{CommitFailure, CommitRound, RoundStep};
use crate::core::ledger::{CommittableSummary, SubtaskPart};
use crate::core::retry::RetryPolicy;
use crate::error::JobError;
use crate::failpoints::failpoint;
use crate::metrics::{self, KnownCommitFailure, Metrics};
use crate::source::CommitOutcome;

/// A ready checkpoint, handed from the subtask to its committer task.
pub(crate) struct CommitJob<C> {
    pub checkpoint_id: CheckpointId,
    /// One part per former subtask whose committables this subtask holds
    /// (one, unless it took over parts after a change of parallelism).
    pub parts: Vec<SubtaskPart<C>>,
    /// Part of the re-commit of a restored checkpoint: written and counted
    /// by an earlier run.
    pub recommit: bool,
}

/// A checkpoint committed, handed back to the subtask.
pub(crate) struct CommitDone<C> {
    pub checkpoint_id: CheckpointId,
    /// Per part, what was committed (or found already committed), for the
    /// global committer, under the part's original summary.
    pub committed: Vec<(CommittableSummary, Vec<C>)>,
    /// Whether a committable was dropped with a known reason.
    pub outcome: CommitOutcome,
}

/// The committer task of one subtask.
pub(crate) struct CommitterTask<K: Committer> {
    pub index: SubtaskIndex,
    pub name: String,
    /// The committer, away while a call of it runs in a task of its own
    /// (see [`CommitCalls`]); lost only to a call that panicked.
    pub committer: Option<K>,
    pub calls: CommitCalls,
    pub jobs: mpsc::UnboundedReceiver<CommitJob<K::Committable>>,
    /// Every job's report, in order; a failure is reported here too, before
    /// the committer is closed.
    pub done: mpsc::UnboundedSender<Result<CommitDone<K::Committable>, JobError>>,
    pub metrics: Arc<Metrics>,
    pub retry: RetryPolicy,
    /// Set when the job is cancelled or failed: no more commits.
    pub cancel: watch::Receiver<bool>,
    /// Set by the subtask when it fails: no more commits either.
    pub stop: watch::Receiver<bool>,
}

/// The committer task's handle, aborting the task when dropped: a subtask
/// stopped from outside (the coordinator's grace period ran out) takes its
/// committer task with it. A commit call under way is not stopped: it runs
/// in a task of its own, which the coordinator waits for (`CommitCalls`).
pub(crate) struct CommitterHandle(pub JoinHandle<Result<(), JobError>>);

impl Drop for CommitterHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<K: Committer> CommitterTask<K> {
    /// Starts the task.
    pub(crate) fn spawn(self) -> CommitterHandle
    where
        K::Committable: Send,
    {
        let span = tracing::info_span!("committer", subtask = self.index);
        CommitterHandle(tokio::spawn(tracing::Instrument::instrument(
            self.run(),
            span,
        )))
    }

    /// Commits every job until the subtask drops its sender, then closes
    /// the committer. A failure goes to the subtask at once, as the last
    /// report (so the job fails whatever closing takes), and the committer
    /// is closed after it; the task's own result is that of closing.
    async fn run(mut self) -> Result<(), JobError> {
        if let Err(error) = self.commit_all().await {
            // Unless the subtask is gone (the job is being torn down), it
            // fails the job with this error.
            if let Err(unsent) = self.done.send(Err(error)) {
                if let Err(error) = unsent.0 {
                    debug!(subtask = self.index, %error, "a commit failed while the job was torn down");
                }
            }
        }
        // A committer lost to a panicked call is not closed: the panic
        // failed the job already.
        let Some(committer) = self.committer.as_mut() else {
            return Ok(());
        };
        committer.close().await.map_err(|source| JobError::Sink {
            task: self.name.clone(),
            action: "close the committer",
            source,
        })
    }

    async fn commit_all(&mut self) -> Result<(), JobError> {
        while let Some(job) = self.jobs.recv().await {
            let mut committed = Vec::with_capacity(job.parts.len());
            let mut outcome = CommitOutcome::Committed;
            for part in job.parts {
                let (summary, committables, lost) = self
                    .commit_part(job.checkpoint_id, part, job.recommit)
                    .await?;
                if lost {
                    outcome = CommitOutcome::PartlyLost;
                }
                committed.push((summary, committables));
            }
            let done = CommitDone {
                checkpoint_id: job.checkpoint_id,
                committed,
                outcome,
            };
            if self.done.send(Ok(done)).is_err() {
                // The subtask is gone: the job is being torn down.
                return Ok(());
            }
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

    /// Fails with [`JobError::Cancelled`] once the job was cancelled or the
    /// subtask failed.
    fn check_cancelled(&self) -> Result<(), JobError> {
        match *self.cancel.borrow() || *self.stop.borrow() {
            true => Err(JobError::Cancelled),
            false => Ok(()),
        }
    }

    /// Commits one part through its retries. Returns its summary with what
    /// was committed, and whether a committable was dropped with a known
    /// reason.
    async fn commit_part(
        &mut self,
        checkpoint_id: CheckpointId,
        part: SubtaskPart<K::Committable>,
        recommit: bool,
    ) -> Result<(CommittableSummary, Vec<K::Committable>, bool), JobError> {
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
            let mut committer = self.committer.take().ok_or_else(|| {
                JobError::invariant(&self.name, "the committer was lost to a panicked call")
            })?;
            // A call of its own, run to its end even if this task is
            // stopped: see `CommitCalls`.
            let (committer, called, result) = self
                .calls
                .run(&self.name, async move {
                    let result = committer.commit(&mut requests).await;
                    (committer, requests, result)
                })
                .await?;
            self.committer = Some(committer);
            let requests = called;
            result.map_err(|source| JobError::Sink {
                task: self.name.clone(),
                action: "commit",
                source,
            })?;
            let step = round.settle(requests, &self.retry);
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
                    let delay = self.retry.backoff(retry, fastrand::f64());
                    warn!(subtask = self.index, checkpoint = %checkpoint_id, retry, ?delay, "commit asked to be retried");
                    let (mut cancel, mut stop) = (self.cancel.clone(), self.stop.clone());
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = cancel.wait_for(|&cancelled| cancelled) => return Err(JobError::Cancelled),
                        _ = stop.wait_for(|&stopped| stopped) => return Err(JobError::Cancelled),
                    }
                }
            }
        }
        let (committed, tally) = round.into_committed();
        if let Some(reason) = tally.superseded.first() {
            if !recommit {
                // Its source went on past records no one will commit: the
                // job restarts and reads from the destination's positions.
                return Err(JobError::Commit {
                    subtask: self.index,
                    source: CommitFailure::Superseded {
                        checkpoint_id,
                        reason: reason.clone(),
                    },
                });
            }
            warn!(subtask = self.index, checkpoint = %checkpoint_id, %reason, superseded = tally.superseded.len(),
                "restored committables superseded: another owner of their splits committed those records");
            metrics::add(
                &self.metrics.commits_superseded,
                tally.superseded.len() as u64,
            );
        }
        let failed = count
            .saturating_sub(committed.len() as u64)
            .saturating_sub(tally.superseded.len() as u64);
        metrics::sub(&self.metrics.committables_pending, count);
        if !recommit {
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
        // Two statements, not an if/else: without the failpoints feature
        // both expand to nothing.
        if recommit {
            failpoint!("during-recovery-recommit");
        }
        if !recommit {
            failpoint!("after-commit");
        }
        let summary = CommittableSummary {
            committable_count: committed.len() as u64,
            ..summary
        };
        Ok((summary, committed, failed > 0))
    }
}
