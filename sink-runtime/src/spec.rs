//! What a job is, once built: its source, sink and settings, as the builder
//! checked them and the coordinator runs them.

use std::sync::Arc;
use std::time::Duration;

use sink_api::CommittableOf;
use sink_api::{CheckpointId, Clock, GlobalCommitterFactory, Sink, SubtaskIndex};

use crate::core::checkpoints::CheckpointConfig;
use crate::core::restart::RestartStrategy;
use crate::core::retry::RetryPolicy;
use crate::storage::CheckpointStorage;

/// How the job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RuntimeMode {
    /// Records flow continuously; commits follow completed checkpoints, or
    /// end of input when checkpointing is off. The default.
    #[default]
    Streaming,
    /// A bounded input processed as a whole: checkpointing is ignored and
    /// everything is committed once at end of input.
    Batch,
}

/// Everything the coordinator needs to run a job. Made by [`JobBuilder::build`].
pub(crate) struct JobSpec<Src, S: Sink> {
    pub name: String,
    pub source: Src,
    pub sink: Arc<S>,
    pub parallelism: usize,
    pub checkpointing: Option<CheckpointConfig>,
    pub global_committer: Option<GlobalCommitterFactory<CommittableOf<S>>>,
    pub restart: RestartStrategy,
    pub storage: Arc<dyn CheckpointStorage>,
    pub retry: RetryPolicy,
    pub batch_size: usize,
    pub idle_poll: Duration,
    pub defer_end_of_stream: bool,
    pub notification_faults: Option<NotificationFaults>,
    /// Whether a finished run marks the storage finished. A pipeline's input
    /// goes on in its next run, so its end is not marked: the next start
    /// restores its final checkpoint instead of doing nothing.
    pub mark_finished: bool,
    /// The clock sinks see ([`sink_api::InitContext::clock`]).
    pub clock: Arc<dyn Clock>,
    /// Whether the job promises that commits make their records visible
    /// ([`sink_api::InitContext::visible_commits`]).
    pub visible_commits: bool,
    /// The job counters registered with the builder.
    pub counters: Vec<crate::JobCounter>,
    /// What a record the source's parse step refuses does.
    pub bad_records: crate::BadRecordPolicy,
}

/// What happens to one completion notice, in a simulation (feature
/// `testing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub enum NoticeDelivery {
    /// Delivered at once.
    Deliver,
    /// Lost (never for the final checkpoint).
    Lose,
    /// Delivered after a delay, possibly after later messages.
    Delay(Duration),
}

/// Decides, per subtask and checkpoint, what happens to a completion notice.
pub(crate) type NotificationFaults =
    Arc<dyn Fn(SubtaskIndex, CheckpointId) -> NoticeDelivery + Send + Sync>;

impl<Src, S: Sink> std::fmt::Debug for JobSpec<Src, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSpec")
            .field("name", &self.name)
            .field("parallelism", &self.parallelism)
            .field("checkpointing", &self.checkpointing)
            .field("global_committer", &self.global_committer.is_some())
            .finish_non_exhaustive()
    }
}
