//! What the kit needs to know about the system a sink writes to.

use async_trait::async_trait;
use sink_api::Sink;

/// A place a sink under test writes to, and a way to read back what was
/// committed there.
///
/// The kit makes a fresh destination for every scenario (through the
/// factory given to [`certify`](crate::certify)) and calls
/// [`sink`](Self::sink) once per job: several times in a scenario with
/// crashes and restarts, all writing to the same destination, as a
/// restarted process would (a restart inside the process keeps its sink). Every scenario runs under a job name of its own
/// (`sink-testkit-<n>`), so sinks with job-scoped locks and clean-ups (a
/// database's advisory lock, lingering transactions) see each scenario as a
/// job of its own. The methods are async: reading back may query a database
/// or an object store.
#[async_trait]
pub trait Destination: Send + Sync + 'static {
    /// The sink under test.
    type Sink: Sink;

    /// A sink that writes to this destination.
    async fn sink(&self) -> Self::Sink;

    /// The ids of every committed (visible) record, duplicates included, in
    /// any order. Each record the kit writes carries an id (see the record
    /// maker given to [`certify`](crate::certify)); read it back here. A
    /// destination that cannot be read is a broken test set-up: panic with
    /// the reason.
    async fn committed_ids(&self) -> Vec<u64>;

    /// How many transactions (or files, or whatever needs a commit) are open
    /// now: neither committed nor aborted. `None` when the sink cannot tell;
    /// then the property `contract/no-transaction-after-end-of-input` is not
    /// checked.
    async fn open_transactions(&self) -> Option<usize> {
        None
    }

    /// How the source of the hand-over scenarios (`handover/*`, run for a
    /// sink that commits source positions) names its positions in job
    /// `job`: a scope, and the prefix of its splits' names (split `i` of
    /// [`HAND_OVER_PARTITIONS`] is `<prefix><i>`). Called once per
    /// scenario.
    ///
    /// The default, `<job>/input` and `p`, suits a sink that keeps any
    /// source's positions. A sink that keeps only a kind of source's (the
    /// Kafka sink: a consumer group's offsets of a topic's partitions)
    /// answers names of that kind, and makes what they need (the topic).
    async fn hand_over_source(&self, job: &str) -> HandOverSource {
        HandOverSource {
            scope: format!("{job}/input"),
            split_prefix: "p".to_string(),
        }
    }
}

/// The partitions of the hand-over scenarios' source: more than any
/// parallelism the kit uses.
pub const HAND_OVER_PARTITIONS: u32 = 6;

/// The names of the hand-over scenarios' source positions; see
/// [`Destination::hand_over_source`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOverSource {
    /// The scope of every split.
    pub scope: String,
    /// Split `i` is named `<split_prefix><i>`.
    pub split_prefix: String,
}
