//! A commit whose answer is lost and which the same committer is asked to
//! retry, without a restart: the commit applies, its answer never comes
//! back (a timeout), and the committer's caller takes that for a transient
//! failure, `retry_later`. The runtime then hands the same committables to
//! the same committer instance after a backoff. Nothing was restored: a
//! committer that recognises replays from what it loaded at its creation,
//! or that takes a request it was asked to retry for one it never applied,
//! applies the commit twice here, although every scenario with a restart
//! finds it correct.
//!
//! The kit wraps the sink's committer ([`InPlaceCommitter`]) so that, once
//! per scenario, one call is applied by the sink's committer and then every
//! request it settled as committed (or already committed) is turned into
//! `retry_later`, as a committer whose call timed out would signal:
//!
//! | position | the call whose answer is lost |
//! |---|---|
//! | first call | the first commit call of the job holding a request |
//! | later call | the first call of a committer that completed a call with requests before it (the middle of the job) |
//!
//! The job has no restart strategy: the retry must settle in place. A
//! global committer cannot be retried in place: its
//! [`commit_checkpoint`](sink_api::GlobalCommitter::commit_checkpoint) has
//! no "retry later", and an error fails the job (the `global-commit`
//! scenario of the `outcomes` module covers that).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, CommittableOf, Committer, GlobalCommitterFactory,
    InitContext, InputOf, JobStart, Sink, SinkError, SubtaskIndex, VersionedSerializer,
    WriterStateOf,
};
use sink_runtime::MemoryCheckpointStorage;

use crate::modes::describe;
use crate::runner::{exactly_once, join, start_with_sink, Shape};
use crate::Destination;
use crate::RecordMaker;

/// Which call loses its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// The first call of the job that holds a request.
    FirstCall,
    /// The first call of a committer that completed a call with requests
    /// before: what it applied then is in the destination, and in whatever
    /// the committer remembers of it.
    LaterCall,
}

impl Position {
    /// Every position, in the order the property tries them.
    pub(crate) const ALL: [Position; 2] = [Position::FirstCall, Position::LaterCall];

    /// The position in words, for a failure.
    fn describe(self) -> &'static str {
        match self {
            Position::FirstCall => "the first commit call of the job",
            Position::LaterCall => {
                "a commit call in the middle of the job (its committer had completed a call before)"
            }
        }
    }

    /// Why the scenario checked nothing when no call fitted it.
    pub(crate) fn not_fired(self) -> &'static str {
        match self {
            Position::FirstCall => "no commit call was made",
            Position::LaterCall => {
                "no committer made a second commit call with requests: every subtask committed \
                 once, at most"
            }
        }
    }
}

/// One scenario's plan: where the answer is lost, and what happened.
struct Plan {
    position: Position,
    /// Set by the call chosen to lose its answer.
    fired: AtomicBool,
    /// The call whose answer was lost, in words.
    lost: Mutex<Option<String>>,
    /// Set when the committer that lost the answer was called again with
    /// the lost call's requests.
    retried_in_place: AtomicBool,
}

impl Plan {
    fn lost_call(&self) -> Option<String> {
        match self.lost.lock() {
            Ok(lost) => lost.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn note_lost(&self, what: String) {
        match self.lost.lock() {
            Ok(mut lost) => *lost = Some(what),
            Err(poisoned) => *poisoned.into_inner() = Some(what),
        }
    }
}

/// The sink under test, with a committer that loses one answer and is
/// asked to retry it in place.
pub(crate) struct InPlace<S> {
    inner: S,
    plan: Arc<Plan>,
}

/// The sink's committer, made by [`InPlace`]: forwards every call to it,
/// and turns the answer of the planned call into `retry_later` after the
/// sink's committer applied it.
pub(crate) struct InPlaceCommitter<K> {
    inner: K,
    plan: Arc<Plan>,
    subtask: SubtaskIndex,
    /// Calls with requests this committer completed.
    calls: u64,
    /// The checkpoint of the call whose answer this committer lost, until
    /// its requests come back to it.
    awaiting_retry: Option<CheckpointId>,
}

#[async_trait]
impl<S: Sink> Sink for InPlace<S> {
    type Writer = S::Writer;
    type Committer = InPlaceCommitter<S::Committer>;

    async fn on_start(
        &self,
        start: &JobStart<'_, CommittableOf<Self>, WriterStateOf<Self>>,
    ) -> Result<(), SinkError> {
        self.inner.on_start(start).await
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<WriterStateOf<Self>>,
    ) -> Result<S::Writer, SinkError> {
        self.inner.create_writer(context, restored).await
    }

    async fn create_committer(&self, context: &InitContext) -> Result<Self::Committer, SinkError> {
        Ok(InPlaceCommitter {
            inner: self.inner.create_committer(context).await?,
            plan: self.plan.clone(),
            subtask: context.subtask_index,
            calls: 0,
            awaiting_retry: None,
        })
    }

    /// The sink's own: a global committer has no retry in place.
    fn global_committer(&self) -> Option<GlobalCommitterFactory<CommittableOf<Self>>> {
        self.inner.global_committer()
    }

    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<CommittableOf<Self>>> {
        self.inner.committable_serializer()
    }

    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<WriterStateOf<Self>>> {
        self.inner.writer_state_serializer()
    }
}

#[async_trait]
impl<K: Committer> Committer for InPlaceCommitter<K> {
    type Committable = K::Committable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<K::Committable>],
    ) -> Result<(), SinkError> {
        if requests.is_empty() {
            return self.inner.commit(requests).await;
        }
        if let Some(checkpoint) = self.awaiting_retry {
            let retried = requests
                .iter()
                .any(|r| r.checkpoint_id() == checkpoint && r.retry_count() > 0);
            if retried {
                self.plan.retried_in_place.store(true, Ordering::SeqCst);
                self.awaiting_retry = None;
            }
        }
        let due = match self.plan.position {
            Position::FirstCall => true,
            Position::LaterCall => self.calls >= 1,
        };
        self.calls += 1;
        if !due || self.plan.fired.swap(true, Ordering::SeqCst) {
            return self.inner.commit(requests).await;
        }
        self.inner.commit(requests).await?;
        // The answer is lost: whatever the call applied is reported as a
        // transient failure, to be tried again by this committer.
        let mut lost = 0;
        for request in requests.iter_mut() {
            if matches!(
                request.outcome(),
                CommitOutcome::Committed | CommitOutcome::AlreadyCommitted
            ) {
                request.retry_later();
                lost += 1;
            }
        }
        if lost == 0 {
            // The call applied nothing (the sink asked for retries itself):
            // no answer to lose here; a later call takes the plan.
            self.plan.fired.store(false, Ordering::SeqCst);
            return Ok(());
        }
        let checkpoint = requests[0].checkpoint_id();
        self.awaiting_retry = Some(checkpoint);
        self.plan.note_lost(format!(
            "{} (subtask {}, checkpoint {checkpoint}, {lost} of {} request(s) applied)",
            self.plan.position.describe(),
            self.subtask,
            requests.len()
        ));
        Ok(())
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.inner.close().await
    }
}

/// Runs a bounded job with checkpoints every 10 ms and no restart
/// strategy, whose committer loses the answer of the call at `position` and
/// is asked to retry it. Every record must be committed once, and the lost
/// call's requests must have come back to the same committer. `Ok(false)`:
/// no call fitted `position`.
pub(crate) async fn retry_in_place<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
    position: Position,
) -> Result<bool, String> {
    let shape = Shape::streaming(records, parallelism);
    let plan = Arc::new(Plan {
        position,
        fired: AtomicBool::new(false),
        lost: Mutex::new(None),
        retried_in_place: AtomicBool::new(false),
    });
    let sink = InPlace {
        inner: destination.sink().await,
        plan: plan.clone(),
    };
    let storage = MemoryCheckpointStorage::default();
    let handle = start_with_sink(sink, record, &shape, &storage).map_err(describe)?;
    let ended = join(handle).await;
    let lost = plan.lost_call();
    if let Err(error) = ended {
        return Err(match &lost {
            Some(call) => format!(
                "after the answer of {call} was lost and the same committer was asked to retry \
                 it (no restart): {}",
                describe(error)
            ),
            None => describe(error),
        });
    }
    let Some(call) = lost else {
        return exactly_once(destination.committed_ids().await, records)
            .map(|()| false)
            .map_err(|e| format!("{e} (before any answer was lost)"));
    };
    exactly_once(destination.committed_ids().await, records).map_err(|e| {
        format!(
            "after the answer of {call} was lost and the same committer retried it in place (no \
             restart): {e}; a committer must resolve an unknown outcome from the destination at \
             every call, not from what it loaded when it was created, nor from having been asked \
             to retry"
        )
    })?;
    if !plan.retried_in_place.load(Ordering::SeqCst) {
        return Err(format!(
            "the answer of {call} was lost, but its requests never came back to the same \
             committer: the scenario checked nothing (a fault of the kit or the runtime, not of \
             the sink)"
        ));
    }
    Ok(true)
}
