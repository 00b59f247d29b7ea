//! What a source whose positions are committed with the data needs: where
//! the destination's data of each split ends ([`PositionLookup`]), and the
//! bookkeeping of what each barrier's records advance ([`PositionTracker`]).
//!
//! Such a source names a scope ([`Source::position_scope`](super::Source::position_scope)).
//! At every start the runtime commits the restored checkpoint's
//! committables again, then asks the sink where each split of the scope
//! ends and hands that to the reader
//! ([`SplitReader::seek_committed`](super::SplitReader::seek_committed)):
//! every split is read from there, whatever the checkpoint says, because
//! another owner may have committed more of it (or a committable of this
//! owner was superseded). At every barrier the runtime takes the reader's
//! advances ([`SplitReader::take_advances`](super::SplitReader::take_advances))
//! and hands them to the writer before `prepare_commit`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sink_api::{
    CommittedPositions, Lineage, PositionAdvance, Sink, SinkError, SinkMetrics, SplitKey,
    SubtaskIndex,
};

type Lookup = dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<CommittedPositions, SinkError>> + Send>>
    + Send
    + Sync;

/// Asks the job's sink where its destination's data of a scope ends
/// ([`Sink::committed_positions`]).
///
/// Made by the runtime at every start, handed to the reader with the
/// positions found then; a reader that is assigned splits while the job
/// runs (a consumer group's rebalance) asks again before reading them.
#[derive(Clone)]
pub struct PositionLookup(Arc<Lookup>);

impl std::fmt::Debug for PositionLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PositionLookup").finish_non_exhaustive()
    }
}

impl PositionLookup {
    /// The lookup of `sink`'s destination. Called by the runtime; by tests
    /// of readers too.
    pub fn of_sink<S: Sink>(sink: Arc<S>) -> PositionLookup {
        PositionLookup(Arc::new(move |scope: String| {
            let sink = Arc::clone(&sink);
            Box::pin(async move { sink.committed_positions(&scope).await })
        }))
    }

    /// A lookup that always answers `positions`: for tests of readers.
    pub fn fixed(positions: CommittedPositions) -> PositionLookup {
        PositionLookup(Arc::new(move |_| {
            let positions = positions.clone();
            Box::pin(async move { Ok(positions) })
        }))
    }

    /// The destination's positions of `scope`, read now.
    pub async fn committed(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        (self.0)(scope.to_string()).await
    }
}

/// What the reader of a source with a position scope is told at each
/// start, before its first read: where the destination's data of each
/// split ends, how to ask again, and who it is.
///
/// Made by the runtime, handed to
/// [`SplitReader::seek_committed`](super::SplitReader::seek_committed);
/// tests of readers make one with [`SourceStart::new`]. More facts may be
/// added (it is `#[non_exhaustive]`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SourceStart {
    /// The destination's positions of the source's scope, read once every
    /// subtask re-committed what the restored checkpoint holds.
    pub committed: CommittedPositions,
    /// Asks the destination again (splits assigned later).
    pub lookup: PositionLookup,
    /// The job's name.
    pub job_name: String,
    /// The job's lineage: the same in every start on one checkpoint
    /// storage, from the first, also before the first checkpoint; a name
    /// made of it and the subtask is stable across restarts of this
    /// instance and differs from every other instance's (a consumer
    /// group's static member id).
    pub lineage: Lineage,
    /// The reader's subtask.
    pub subtask: SubtaskIndex,
    /// The job's registry of connectors' own counters (shown in
    /// [`MetricsSnapshot::sink`](crate::MetricsSnapshot::sink)): where a
    /// source counts what only it knows, such as the time its readers
    /// waited on a consumer group. The same registry in every start and
    /// subtask of the job; a fresh one in [`SourceStart::new`].
    pub metrics: SinkMetrics,
}

impl SourceStart {
    /// A start of subtask `subtask` of job `job_name` in `lineage`, the
    /// destination holding `committed`.
    pub fn new(
        committed: CommittedPositions,
        lookup: PositionLookup,
        job_name: impl Into<String>,
        lineage: Lineage,
        subtask: SubtaskIndex,
    ) -> SourceStart {
        SourceStart {
            committed,
            lookup,
            job_name: job_name.into(),
            lineage,
            subtask,
            metrics: SinkMetrics::new(),
        }
    }

    /// The same start, counting in `metrics`, the job's registry. Called by
    /// the runtime.
    pub fn with_metrics(mut self, metrics: SinkMetrics) -> SourceStart {
        self.metrics = metrics;
        self
    }

    /// A start for tests of readers: the destination holds `committed`,
    /// and answers it again to every lookup.
    pub fn fixed(committed: CommittedPositions) -> SourceStart {
        SourceStart::new(
            committed.clone(),
            PositionLookup::fixed(committed),
            "test",
            Lineage::new("test"),
            0,
        )
    }
}

/// One split as its reader tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tracked {
    /// What the destination has (or what the last advance taken moves it
    /// to); `None`: nothing.
    committed: Option<u64>,
    /// Where the records not yet in an advance start.
    base: u64,
    /// The offset of the next record to read.
    next: u64,
    /// Released: dropped once its last advance is taken.
    released: bool,
}

/// The positions of the splits one reader owns, and what the records read
/// since the last barrier advance.
///
/// Used by readers of sources with a position scope: [`acquire`](Self::acquire)
/// a split with what the destination has for it, [`set_next`](Self::set_next)
/// as records are read, [`take_advances`](Self::take_advances) at each
/// barrier (the reader's `SplitReader::take_advances`).
#[derive(Debug, Clone)]
pub struct PositionTracker {
    scope: String,
    splits: BTreeMap<String, Tracked>,
}

impl PositionTracker {
    /// A tracker of no split, in `scope`.
    pub fn new(scope: impl Into<String>) -> PositionTracker {
        PositionTracker {
            scope: scope.into(),
            splits: BTreeMap::new(),
        }
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Takes `split` over: the destination has `committed` for it (`None`:
    /// nothing, so reading starts at `start`, the split's first offset).
    /// Returns the offset to read next. A split acquired again (released
    /// and assigned back) starts over from `committed`.
    pub fn acquire(&mut self, split: &str, committed: Option<u64>, start: u64) -> u64 {
        let next = committed.unwrap_or(start);
        self.splits.insert(
            split.to_string(),
            Tracked {
                committed,
                base: next,
                next,
                released: false,
            },
        );
        next
    }

    /// The records of `split` up to `next` (exclusive) were read.
    pub fn set_next(&mut self, split: &str, next: u64) {
        if let Some(tracked) = self.splits.get_mut(split) {
            tracked.next = next;
        }
    }

    /// The offset to read next of `split`, if it is owned.
    pub fn next(&self, split: &str) -> Option<u64> {
        self.splits
            .get(split)
            .filter(|t| !t.released)
            .map(|t| t.next)
    }

    /// `split` is no longer read by this reader; the advance of the records
    /// read from it is still taken at the next barrier.
    pub fn release(&mut self, split: &str) {
        if let Some(tracked) = self.splits.get_mut(split) {
            tracked.released = true;
        }
    }

    /// What the records read since the last call advance: one advance per
    /// split that moved, from where it was to where it is. Called at every
    /// barrier; the advances go to the writer, and the next ones start
    /// where these end.
    pub fn take_advances(&mut self) -> Vec<PositionAdvance> {
        let mut advances = Vec::new();
        for (split, tracked) in &mut self.splits {
            if tracked.next != tracked.base {
                advances.push(PositionAdvance {
                    key: SplitKey::new(self.scope.clone(), split.clone()),
                    from: tracked.committed,
                    to: tracked.next,
                });
                tracked.committed = Some(tracked.next);
                tracked.base = tracked.next;
            }
        }
        self.splits.retain(|_, tracked| !tracked.released);
        advances
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_run_from_the_destination_to_the_records_read_and_chain() {
        let mut tracker = PositionTracker::new("scope");
        assert_eq!(tracker.acquire("p0", None, 100), 100);
        assert_eq!(tracker.acquire("p1", Some(7), 0), 7);
        assert!(tracker.take_advances().is_empty(), "nothing read");
        tracker.set_next("p0", 103);
        let advances = tracker.take_advances();
        assert_eq!(
            advances,
            vec![PositionAdvance {
                key: SplitKey::new("scope", "p0"),
                from: None,
                to: 103
            }]
        );
        tracker.set_next("p0", 104);
        tracker.set_next("p1", 9);
        tracker.release("p1");
        assert_eq!(tracker.next("p1"), None);
        let advances = tracker.take_advances();
        assert_eq!(
            advances.iter().map(|a| (a.from, a.to)).collect::<Vec<_>>(),
            vec![(Some(103), 104), (Some(7), 9)],
            "each starts where the last ended; a released split's last records are carried"
        );
        assert!(tracker.take_advances().is_empty());
        assert_eq!(tracker.next("p0"), Some(104));
    }
}
