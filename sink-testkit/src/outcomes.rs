//! Commits whose outcome the runtime never hears: the commit applies, then
//! the call fails (the answer was lost), and the job restarts and commits
//! the same committables again. The most reported exactly-once bug in the
//! field is a retry that applies such a commit twice; its twin is a retry
//! that takes a half-applied batch for a whole one and skips the rest.
//!
//! The kit wraps the sink's committer ([`Chaos`]) so that, once per
//! scenario, a call applies and then returns an error:
//!
//! | scenario | what is applied before the error |
//! |---|---|
//! | `first-call` | the whole first call with a request |
//! | `middle-of-batch` | the first half of the first call with two requests or more |
//! | `last-of-batch` | all but the last request of that call |
//! | `slow-commit` | nothing fails: the first call takes five checkpoint intervals |
//! | `global-commit` | the first checkpoint acted on by the sink's global committer (only for sinks that bring one) |
//!
//! The job restarts in the process (a restart strategy) from its last
//! checkpoint; the sink must recognise what it applied from the
//! destination, not from memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sink_api::{
    CheckpointId, CommitRequest, CommittableOf, Committer, GlobalCommitter, GlobalCommitterFactory,
    InitContext, InputOf, JobStart, Sink, SinkError, VersionedSerializer, WriterStateOf,
};
use sink_runtime::MemoryCheckpointStorage;

use crate::modes::describe;
use crate::runner::{exactly_once, join, start_with_sink, Shape};
use crate::Destination;
use crate::RecordMaker;

/// Where the outcome is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Injection {
    FirstCall,
    MiddleOfBatch,
    LastOfBatch,
    SlowCommit,
    GlobalCommit,
}

impl Injection {
    pub(crate) const ALL: [Injection; 5] = [
        Injection::FirstCall,
        Injection::MiddleOfBatch,
        Injection::LastOfBatch,
        Injection::SlowCommit,
        Injection::GlobalCommit,
    ];

    /// Whether the injection needs a commit call of two requests or more.
    pub(crate) fn needs_a_batch(self) -> bool {
        matches!(self, Injection::MiddleOfBatch | Injection::LastOfBatch)
    }

    /// Why the scenario checked nothing when the injection never fired.
    pub(crate) fn not_fired(self) -> &'static str {
        match self {
            Injection::FirstCall | Injection::SlowCommit => "no commit call was made",
            Injection::GlobalCommit => "the global committer acted on no checkpoint",
            Injection::MiddleOfBatch | Injection::LastOfBatch => {
                "no commit call held two requests or more in this run, with checkpoints 50 ms, \
                 200 ms and 1 s apart: the sink makes one committable per checkpoint and subtask \
                 (its calls cannot be half-applied), or too few records reached a checkpoint"
            }
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Injection::FirstCall => "first-call",
            Injection::MiddleOfBatch => "middle-of-batch",
            Injection::LastOfBatch => "last-of-batch",
            Injection::SlowCommit => "slow-commit",
            Injection::GlobalCommit => "global-commit",
        }
    }
}

/// One scenario's injection, fired at most once over every start.
struct Plan {
    injection: Injection,
    fired: AtomicBool,
    slow: Duration,
}

/// The sink under test, with a committer that loses one outcome.
pub(crate) struct Chaos<S> {
    inner: S,
    plan: Arc<Plan>,
}

/// The sink's global committer, losing the outcome of its first checkpoint
/// when so planned.
pub(crate) struct ChaosGlobal<C> {
    inner: Box<dyn GlobalCommitter<Committable = C>>,
    plan: Arc<Plan>,
}

/// The sink's committer, losing one outcome as planned.
pub(crate) struct ChaosCommitter<K> {
    inner: K,
    plan: Arc<Plan>,
}

fn lost(what: &str) -> SinkError {
    SinkError::msg(format!(
        "injected by sink-testkit: {what} was applied, then the call failed as if the answer was lost"
    ))
}

#[async_trait]
impl<S: Sink> Sink for Chaos<S> {
    type Writer = S::Writer;
    type Committer = ChaosCommitter<S::Committer>;

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
        Ok(ChaosCommitter {
            inner: self.inner.create_committer(context).await?,
            plan: self.plan.clone(),
        })
    }

    fn global_committer(&self) -> Option<GlobalCommitterFactory<CommittableOf<Self>>> {
        let factory = self.inner.global_committer()?;
        let plan = self.plan.clone();
        Some(Box::new(move |context: &InitContext| {
            Box::new(ChaosGlobal {
                inner: factory(context),
                plan: plan.clone(),
            })
        }))
    }

    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<CommittableOf<Self>>> {
        self.inner.committable_serializer()
    }

    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<WriterStateOf<Self>>> {
        self.inner.writer_state_serializer()
    }
}

#[async_trait]
impl<K: Committer> Committer for ChaosCommitter<K> {
    type Committable = K::Committable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<K::Committable>],
    ) -> Result<(), SinkError> {
        let n = requests.len();
        let due = match self.plan.injection {
            Injection::FirstCall | Injection::SlowCommit => n >= 1,
            Injection::MiddleOfBatch | Injection::LastOfBatch => n >= 2,
            Injection::GlobalCommit => false,
        };
        if !due || self.plan.fired.swap(true, Ordering::SeqCst) {
            return self.inner.commit(requests).await;
        }
        match self.plan.injection {
            Injection::SlowCommit => {
                tokio::time::sleep(self.plan.slow).await;
                self.inner.commit(requests).await
            }
            Injection::FirstCall => {
                self.inner.commit(requests).await?;
                Err(lost(&format!("a commit call of {n} request(s)")))
            }
            Injection::MiddleOfBatch => {
                self.inner.commit(&mut requests[..n / 2]).await?;
                Err(lost(&format!(
                    "the first {} of {n} requests of a commit call",
                    n / 2
                )))
            }
            Injection::LastOfBatch => {
                self.inner.commit(&mut requests[..n - 1]).await?;
                Err(lost(&format!(
                    "all but the last of {n} requests of a commit call"
                )))
            }
            Injection::GlobalCommit => self.inner.commit(requests).await,
        }
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.inner.close().await
    }
}

#[async_trait]
impl<C: Send + 'static> GlobalCommitter for ChaosGlobal<C> {
    type Committable = C;

    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<C>,
    ) -> Result<(), SinkError> {
        let due = self.plan.injection == Injection::GlobalCommit && !committables.is_empty();
        if !due || self.plan.fired.swap(true, Ordering::SeqCst) {
            return self
                .inner
                .commit_checkpoint(checkpoint_id, committables)
                .await;
        }
        self.inner
            .commit_checkpoint(checkpoint_id, committables)
            .await?;
        Err(lost(&format!(
            "the global commit of checkpoint {checkpoint_id}"
        )))
    }

    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        self.inner.end_of_input().await
    }
}

/// The checkpoint intervals a scenario is tried with, one after the other,
/// until its injection fires: five times as far apart as in the other
/// scenarios, then twenty and a hundred times. Each holds more records than
/// the one before, so a sink that makes several committables per checkpoint
/// (parts rolled by size) commits calls of two requests or more even where
/// writing is slow (an object store under load), when the first interval
/// caught only one committable per call. A sink that makes one committable
/// per checkpoint and subtask meets none at any interval.
pub(crate) const INTERVALS: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(1000),
];

/// Runs a bounded job with checkpoints every `interval` whose committer
/// loses one outcome as `injection` says; the job restarts in the process.
/// `Ok(false)`: the injection never fired (no call fitted it).
pub(crate) async fn lose_one_outcome<D: Destination>(
    destination: &D,
    record: &RecordMaker<InputOf<D::Sink>>,
    records: u64,
    parallelism: usize,
    injection: Injection,
    interval: Duration,
) -> Result<bool, String> {
    let shape = Shape {
        restarts: true,
        checkpoint_interval: Some(interval),
        ..Shape::streaming(records, parallelism)
    };
    let interval = shape
        .checkpoint_interval
        .unwrap_or(Duration::from_millis(10));
    let plan = Arc::new(Plan {
        injection,
        fired: AtomicBool::new(false),
        slow: interval * 5,
    });
    let sink = Chaos {
        inner: destination.sink().await,
        plan: plan.clone(),
    };
    let storage = MemoryCheckpointStorage::default();
    let handle = start_with_sink(sink, record, &shape, &storage).map_err(describe)?;
    let report = join(handle).await.map_err(describe)?;
    let fired = plan.fired.load(Ordering::SeqCst);
    exactly_once(destination.committed_ids().await, records).map_err(|e| {
        let restarts = report.metrics.restarts;
        match (injection, fired) {
            (Injection::SlowCommit, _) | (_, false) => format!(
                "{e} ({}; the injection {}, {restarts} restart(s))",
                injection.name(),
                if fired { "fired" } else { "never fired" }
            ),
            _ => format!(
                "after a commit whose outcome was lost ({}; {restarts} restart(s)): {e}; a commit \
                 retried after an unknown outcome must recognise, from the destination, what it \
                 already applied",
                injection.name()
            ),
        }
    })?;
    Ok(fired)
}
