//! The second phase of the two-phase commit: making prepared data visible.
//!
//! A [`Committer`] receives a batch of [`CommitRequest`]s and settles each one
//! with an outcome. Expected outcomes are values, not errors. A request the
//! committer leaves unsettled is not taken for a success: the job fails,
//! naming the omission.
//!
//! ```text
//!                    ┌─▶ Committed            (signal_committed: it is visible now)
//!                    ├─▶ AlreadyCommitted     (a replay after recovery)
//! CommitRequest ─────┼─▶ RetryLater           (transient; the runtime retries with backoff)
//!                    ├─▶ UpdatedAndRetryLater (partial progress; retry with the new committable)
//!                    ├─▶ Superseded           (its source positions moved: another owner committed them)
//!                    ├─▶ FailedWithKnownReason   (logged, counted, dropped; the job goes on)
//!                    └─▶ FailedWithUnknownReason (the job fails and restarts from the last checkpoint)
//! ```

use async_trait::async_trait;

use crate::{CheckpointId, SinkError};

/// How one [`CommitRequest`] ended. Set by the committer through the request's
/// `signal_*` and `retry_*` methods; read by the runtime afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitOutcome {
    /// Nothing was signalled yet: the state of a new request. A request still
    /// unsettled when [`Committer::commit`] returns is a bug of the committer
    /// (it would otherwise count as committed without being so): the runtime
    /// fails the job, naming it.
    Unsettled,
    /// The committable is now visible
    /// ([`CommitRequest::signal_committed`]).
    Committed,
    /// The committable had been committed before (a replay after recovery).
    AlreadyCommitted,
    /// A transient failure: the runtime retries the same committable later.
    RetryLater,
    /// Partial progress: the committable was replaced by an updated one, and
    /// the runtime retries with it later.
    UpdatedAndRetryLater,
    /// The committable carries source positions the destination no longer
    /// has (see the `positions` module): another owner of a split committed
    /// its records, and nothing of this committable was applied. Its
    /// records are not lost: they are in the destination through the other
    /// owner, or are read again from where the destination says. In the
    /// re-commit of a restored checkpoint the runtime drops it and counts
    /// it; otherwise the job restarts, so that its source reads every split
    /// again from the destination's positions.
    Superseded(String),
    /// The committable can never be committed, for a reason the sink
    /// understands (for example its data expired). The runtime logs it, counts
    /// it and drops it; the job goes on.
    FailedWithKnownReason(String),
    /// The commit failed for a reason the sink does not understand. The job
    /// fails and restarts from the last completed checkpoint.
    FailedWithUnknownReason(String),
}

/// One committable to commit, with where it came from and how often it was
/// tried. Created by the runtime, handed to [`Committer::commit`].
#[derive(Debug)]
pub struct CommitRequest<C> {
    committable: C,
    checkpoint_id: CheckpointId,
    retry_count: u32,
    outcome: CommitOutcome,
    records_lost: Option<u64>,
}

impl<C> CommitRequest<C> {
    /// A request for `committable` of checkpoint `checkpoint_id`, tried
    /// `retry_count` times before. Called by the runtime, and by sink authors
    /// who test their committer directly.
    pub fn new(committable: C, checkpoint_id: CheckpointId, retry_count: u32) -> CommitRequest<C> {
        CommitRequest {
            committable,
            checkpoint_id,
            retry_count,
            outcome: CommitOutcome::Unsettled,
            records_lost: None,
        }
    }

    /// The committable to commit.
    pub fn committable(&self) -> &C {
        &self.committable
    }

    /// The checkpoint the committable belongs to.
    pub fn checkpoint_id(&self) -> CheckpointId {
        self.checkpoint_id
    }

    /// How many times this committable was retried before this attempt
    /// (0 on the first attempt).
    pub fn retry_count(&self) -> u32 {
        self.retry_count
    }

    /// The outcome so far; [`CommitOutcome::Unsettled`] until signalled.
    pub fn outcome(&self) -> &CommitOutcome {
        &self.outcome
    }

    /// Consumes the request, returning its committable and outcome. Called by
    /// the runtime after [`Committer::commit`] returns.
    pub fn into_parts(self) -> (C, CommitOutcome) {
        (self.committable, self.outcome)
    }

    /// The committable is visible now: this commit made it so.
    pub fn signal_committed(&mut self) {
        self.outcome = CommitOutcome::Committed;
    }

    /// The committable was committed before: a replay after recovery.
    pub fn signal_already_committed(&mut self) {
        self.outcome = CommitOutcome::AlreadyCommitted;
    }

    /// Committed when `newly_visible`, already committed otherwise: for a
    /// destination whose write of the committable's key says whether the
    /// key was new (an insert into a map, `INSERT … ON CONFLICT DO NOTHING`
    /// and its row count), so a replay is told from a first commit.
    pub fn signal_committed_if_new(&mut self, newly_visible: bool) {
        match newly_visible {
            true => self.signal_committed(),
            false => self.signal_already_committed(),
        }
    }

    /// A transient failure: try the same committable again later.
    pub fn retry_later(&mut self) {
        self.outcome = CommitOutcome::RetryLater;
    }

    /// Partial progress: replace the committable and try again later.
    pub fn update_and_retry_later(&mut self, committable: C) {
        self.committable = committable;
        self.outcome = CommitOutcome::UpdatedAndRetryLater;
    }

    /// Nothing of the committable was applied, because a split it carries a
    /// position of is not where it expects (`reason`, typically a
    /// [`PositionConflict`](crate::PositionConflict)): another owner
    /// committed that split's records. Check for a replay first: a
    /// committable applied before has moved its splits itself, and is
    /// [already committed](Self::signal_already_committed).
    pub fn signal_superseded(&mut self, reason: impl std::fmt::Display) {
        self.outcome = CommitOutcome::Superseded(reason.to_string());
    }

    /// The committable can never be committed, for a reason the sink
    /// understands; it is logged, counted and dropped. When the sink knows
    /// how many records went with it, prefer
    /// [`signal_records_lost`](Self::signal_records_lost).
    pub fn signal_failed_with_known_reason(&mut self, reason: impl std::fmt::Display) {
        self.outcome = CommitOutcome::FailedWithKnownReason(reason.to_string());
        self.records_lost = None;
    }

    /// The committable can never be committed and `records` records are lost
    /// with it, for a reason the sink understands (its data was deleted or
    /// damaged). Like
    /// [`signal_failed_with_known_reason`](Self::signal_failed_with_known_reason),
    /// and the runtime adds `records` to the job's lost records (and takes
    /// them out of its committed records), so the loss is reported, never
    /// hidden in a log line.
    pub fn signal_records_lost(&mut self, records: u64, reason: impl std::fmt::Display) {
        self.outcome = CommitOutcome::FailedWithKnownReason(reason.to_string());
        self.records_lost = Some(records);
    }

    /// The records lost with this committable, as the committer said with
    /// [`signal_records_lost`](Self::signal_records_lost); `None` when it did
    /// not say (or the outcome is not a known failure). Read by the runtime.
    pub fn records_lost(&self) -> Option<u64> {
        match self.outcome {
            CommitOutcome::FailedWithKnownReason(_) => self.records_lost,
            _ => None,
        }
    }

    /// The commit failed for a reason the sink does not understand; the job
    /// fails.
    pub fn signal_failed_with_unknown_reason(&mut self, reason: impl std::fmt::Display) {
        self.outcome = CommitOutcome::FailedWithUnknownReason(reason.to_string());
    }

    /// Settles this request as `inner` was settled: its outcome and the
    /// records it lost, and, when `inner`'s committable was
    /// [updated](Self::update_and_retry_later), the update, turned into
    /// this request's type by `lift`.
    ///
    /// Called by a committer that wraps another (the runtime's dead-letter
    /// sink, which commits a main and a dead-letter destination): it makes
    /// `inner` from this request's committable, has the inner committer
    /// commit it, and settles this request from it.
    pub fn settle_as<D>(&mut self, inner: CommitRequest<D>, lift: impl FnOnce(D) -> C) {
        if inner.outcome == CommitOutcome::UpdatedAndRetryLater {
            self.committable = lift(inner.committable);
        }
        self.outcome = inner.outcome;
        self.records_lost = inner.records_lost;
    }
}

/// Makes prepared data visible: the second phase of the two-phase commit.
///
/// Created by [`Sink::create_committer`](crate::Sink::create_committer), one per
/// subtask and per start of the job. Driven by a runtime task of its own, not
/// the writer's: a slow commit, or its retries and backoff, never stop the
/// subtask from reading, writing and passing barriers. Its methods are never
/// called concurrently with each other (one call at a time, in order), but
/// may run while the subtask's writer works.
///
/// # When it is called
///
/// - When checkpoint `n` completes, with every pending committable of
///   checkpoints `<= n`, oldest checkpoint first, one checkpoint per call.
/// - Without checkpointing (bounded input, or batch mode), once at end of input
///   with everything.
/// - After a restore, with every committable the restored checkpoint still
///   held, before any new record is written.
/// - Again for the requests it asked to retry, after a backoff, up to the
///   job's retry limit.
///
/// # Guarantees the committer must give
///
/// - **Idempotence.** A committable may be committed again after a crash,
///   because the commit happened but the checkpoint that records it did not;
///   and by the same committer, without any restart, when a call applied
///   but its answer was lost (a timeout) and the request was set to
///   [`retry_later`](CommitRequest::retry_later). Committing it again must
///   not duplicate data: tell a replay from the destination at every call,
///   never from what the committer loaded when it was created or from
///   having asked for the retry; signal
///   [`CommitRequest::signal_already_committed`] when it can tell.
/// - A committable whose data cannot be found at all is a failure, never a
///   silent success: signal a known or unknown reason.
/// - Returning `Err` fails every request of the batch as with an unknown
///   reason: the job fails.
#[async_trait]
pub trait Committer: Send + 'static {
    /// What the writer's `prepare_commit` returned.
    type Committable: Send + 'static;

    /// Commits a batch of requests, all of one checkpoint, settling each with
    /// an outcome: [`signal_committed`](CommitRequest::signal_committed) or
    /// another. A request left [`Unsettled`](CommitOutcome::Unsettled) fails
    /// the job.
    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<Self::Committable>],
    ) -> Result<(), SinkError>;

    /// Releases resources. Called once when the job finishes, fails or is
    /// cancelled. The default does nothing.
    async fn close(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
