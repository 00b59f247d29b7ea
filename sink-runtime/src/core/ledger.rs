//! The commit ledger: which committables wait for which checkpoint, and which
//! checkpoint may be committed next.
//!
//! Both a subtask (for its committer task) and the global committer keep
//! one. It is
//! fed two kinds of events and answers one question:
//!
//! ```text
//!   add(summary, committables)   ──▶ ┌──────────────┐
//!   notify_complete(n)           ──▶ │ CommitLedger │ ──▶ take_ready(): the oldest checkpoint
//!                                    └──────────────┘     that is completed and complete
//! ```
//!
//! *Completed* means a checkpoint `>= n` completed (subsumption: a completion
//! of `n` also commits every earlier checkpoint whose own notice was lost or
//! which was aborted). *Complete* means a summary arrived from every expected
//! subtask and each subtask delivered exactly the committables its summary
//! announced. A completed checkpoint that is not complete holds the commit of
//! itself and of every later checkpoint, so commits stay in checkpoint order.
//!
//! No I/O, no clock, no tokio: the runtime feeds it and carries out its
//! answers; the property tests drive it with random event orders.

use std::collections::{BTreeMap, BTreeSet};

use sink_api::{CheckpointId, SubtaskIndex};

/// What a subtask announces before its committables of one checkpoint:
/// how many there are, and how many records they hold (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CommittableSummary {
    /// The checkpoint the committables belong to.
    pub checkpoint_id: CheckpointId,
    /// The subtask that produced them.
    pub subtask: SubtaskIndex,
    /// How many committables follow.
    pub committable_count: u64,
    /// How many records they hold, as counted by the runtime.
    pub record_count: u64,
}

/// A broken promise between the parts of the runtime. Always a bug in the
/// runtime or a corrupt restore: the job fails with it rather than merge,
/// drop or double-count anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// A second summary for the same checkpoint and subtask.
    #[error("a second summary arrived for checkpoint {checkpoint_id} from subtask {subtask}; summaries are never merged")]
    DuplicateSummary {
        /// The checkpoint.
        checkpoint_id: CheckpointId,
        /// The subtask.
        subtask: SubtaskIndex,
    },
    /// A committable arrived without a summary announcing it.
    #[error("a committable of checkpoint {checkpoint_id} arrived from subtask {subtask} without a summary")]
    MissingSummary {
        /// The checkpoint.
        checkpoint_id: CheckpointId,
        /// The subtask.
        subtask: SubtaskIndex,
    },
    /// More committables arrived than the summary announced.
    #[error("subtask {subtask} sent more committables for checkpoint {checkpoint_id} than the {announced} its summary announced")]
    TooManyCommittables {
        /// The checkpoint.
        checkpoint_id: CheckpointId,
        /// The subtask.
        subtask: SubtaskIndex,
        /// The count in the summary.
        announced: u64,
    },
    /// A summary arrived for a checkpoint that was already committed.
    #[error("a summary for checkpoint {checkpoint_id} from subtask {subtask} arrived after that checkpoint was committed")]
    AlreadyCommitted {
        /// The checkpoint.
        checkpoint_id: CheckpointId,
        /// The subtask.
        subtask: SubtaskIndex,
    },
    /// A summary arrived from a subtask the ledger does not expect.
    #[error("a summary for checkpoint {checkpoint_id} arrived from subtask {subtask}, which is not among the expected subtasks")]
    UnexpectedSubtask {
        /// The checkpoint.
        checkpoint_id: CheckpointId,
        /// The subtask.
        subtask: SubtaskIndex,
    },
}

/// The committables one subtask delivered for one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubtaskPart<C> {
    /// The summary that announced them.
    pub summary: CommittableSummary,
    /// The committables received so far.
    pub committables: Vec<C>,
}

impl<C> SubtaskPart<C> {
    fn is_complete(&self) -> bool {
        self.committables.len() as u64 == self.summary.committable_count
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PendingCheckpoint<C> {
    expected: BTreeSet<SubtaskIndex>,
    parts: BTreeMap<SubtaskIndex, SubtaskPart<C>>,
}

impl<C> PendingCheckpoint<C> {
    fn is_complete(&self) -> bool {
        self.parts.len() == self.expected.len()
            && self.expected.iter().all(|subtask| {
                self.parts
                    .get(subtask)
                    .is_some_and(SubtaskPart::is_complete)
            })
    }
}

/// A checkpoint ready to commit: completed, and complete.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReadyCheckpoint<C> {
    /// The checkpoint.
    pub checkpoint_id: CheckpointId,
    /// Every subtask's part, by subtask.
    pub parts: Vec<SubtaskPart<C>>,
}

impl<C> ReadyCheckpoint<C> {
    /// The records all parts hold, as counted by the runtime.
    pub fn record_count(&self) -> u64 {
        self.parts
            .iter()
            .map(|part| part.summary.record_count)
            .sum()
    }
}

/// Why the oldest completed checkpoint cannot be committed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The checkpoint that holds the commit.
    pub checkpoint_id: CheckpointId,
    /// Subtasks whose summary has not arrived.
    pub missing_summaries: Vec<SubtaskIndex>,
    /// Subtasks whose committables have not all arrived.
    pub missing_committables: Vec<SubtaskIndex>,
}

/// Pending committables per checkpoint, and the commit decisions on them.
///
/// Owned by one runtime task (a subtask, which hands what
/// [`take_ready`](Self::take_ready) returns to its committer task in that
/// order, or the global committer, which commits it), which feeds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommitLedger<C> {
    expected: BTreeSet<SubtaskIndex>,
    /// Checkpoints up to this one expect other subtasks: those of the
    /// parallelism the job was restored from.
    expected_until: Option<(CheckpointId, BTreeSet<SubtaskIndex>)>,
    pending: BTreeMap<CheckpointId, PendingCheckpoint<C>>,
    completed_through: CheckpointId,
    committed_through: CheckpointId,
    /// A past bug put back: a checkpoint is handed out once complete,
    /// whether it completed or not. Only the `testing` feature sets it.
    ready_before_completion: bool,
}

impl<C> CommitLedger<C> {
    /// A ledger that expects a summary from each of `expected` subtasks for
    /// every checkpoint.
    pub fn new(expected: impl IntoIterator<Item = SubtaskIndex>) -> CommitLedger<C> {
        CommitLedger {
            expected: expected.into_iter().collect(),
            expected_until: None,
            pending: BTreeMap::new(),
            completed_through: CheckpointId::NONE,
            committed_through: CheckpointId::NONE,
            ready_before_completion: false,
        }
    }

    /// The same ledger with a past bug put back: a checkpoint is ready as
    /// soon as every part arrived, before its checkpoint completed, so a
    /// crash can leave committed output that the restored checkpoint reads
    /// and writes again. For the model checker's tests, which must find it;
    /// never in a job.
    #[cfg(feature = "testing")]
    pub fn with_commit_before_completion(mut self) -> CommitLedger<C> {
        self.ready_before_completion = true;
        self
    }

    /// Checkpoints up to `checkpoint_id` expect summaries from `expected`
    /// instead: after a restore with another parallelism, the global
    /// committer still receives the restored checkpoints' parts under their
    /// original subtasks.
    pub fn expect_until(
        &mut self,
        checkpoint_id: CheckpointId,
        expected: impl IntoIterator<Item = SubtaskIndex>,
    ) {
        self.expected_until = Some((checkpoint_id, expected.into_iter().collect()));
    }

    fn expected_for(&self, checkpoint_id: CheckpointId) -> &BTreeSet<SubtaskIndex> {
        match &self.expected_until {
            Some((until, expected)) if checkpoint_id <= *until => expected,
            _ => &self.expected,
        }
    }

    /// Records a summary. Committables announced by it must follow through
    /// [`add_committable`](Self::add_committable).
    pub fn add_summary(&mut self, summary: CommittableSummary) -> Result<(), LedgerError> {
        let CommittableSummary {
            checkpoint_id,
            subtask,
            ..
        } = summary;
        if checkpoint_id <= self.committed_through {
            return Err(LedgerError::AlreadyCommitted {
                checkpoint_id,
                subtask,
            });
        }
        let expected = self.expected_for(checkpoint_id).clone();
        let checkpoint = self
            .pending
            .entry(checkpoint_id)
            .or_insert_with(|| PendingCheckpoint {
                expected,
                parts: BTreeMap::new(),
            });
        if !checkpoint.expected.contains(&subtask) {
            return Err(LedgerError::UnexpectedSubtask {
                checkpoint_id,
                subtask,
            });
        }
        if checkpoint.parts.contains_key(&subtask) {
            return Err(LedgerError::DuplicateSummary {
                checkpoint_id,
                subtask,
            });
        }
        checkpoint.parts.insert(
            subtask,
            SubtaskPart {
                summary,
                committables: Vec::new(),
            },
        );
        Ok(())
    }

    /// Records one committable announced by an earlier summary.
    pub fn add_committable(
        &mut self,
        checkpoint_id: CheckpointId,
        subtask: SubtaskIndex,
        committable: C,
    ) -> Result<(), LedgerError> {
        let part = self
            .pending
            .get_mut(&checkpoint_id)
            .and_then(|checkpoint| checkpoint.parts.get_mut(&subtask))
            .ok_or(LedgerError::MissingSummary {
                checkpoint_id,
                subtask,
            })?;
        if part.is_complete() {
            return Err(LedgerError::TooManyCommittables {
                checkpoint_id,
                subtask,
                announced: part.summary.committable_count,
            });
        }
        part.committables.push(committable);
        Ok(())
    }

    /// Records a summary together with all the committables it announces.
    pub fn add(
        &mut self,
        summary: CommittableSummary,
        committables: Vec<C>,
    ) -> Result<(), LedgerError> {
        self.add_summary(summary)?;
        for committable in committables {
            self.add_committable(summary.checkpoint_id, summary.subtask, committable)?;
        }
        Ok(())
    }

    /// Puts back a part restored from a checkpoint. The part is taken as
    /// complete as stored; its subtask is expected for its checkpoint even if
    /// the ledger does not expect it for new checkpoints (after rescaling).
    pub fn restore_part(&mut self, part: SubtaskPart<C>) -> Result<(), LedgerError> {
        let summary = part.summary;
        let checkpoint = self
            .pending
            .entry(summary.checkpoint_id)
            .or_insert_with(|| PendingCheckpoint {
                expected: BTreeSet::new(),
                parts: BTreeMap::new(),
            });
        if !checkpoint.expected.insert(summary.subtask) {
            return Err(LedgerError::DuplicateSummary {
                checkpoint_id: summary.checkpoint_id,
                subtask: summary.subtask,
            });
        }
        checkpoint.parts.insert(summary.subtask, part);
        Ok(())
    }

    /// Checkpoint `checkpoint_id` completed: it and every earlier checkpoint
    /// may now be committed. A notice older than one seen before changes
    /// nothing.
    pub fn notify_complete(&mut self, checkpoint_id: CheckpointId) {
        self.completed_through = self.completed_through.max(checkpoint_id);
    }

    /// Removes and returns the oldest checkpoint that is completed and
    /// complete, or `None` when there is none or when the oldest completed one
    /// is incomplete (see [`held`](Self::held)).
    pub fn take_ready(&mut self) -> Option<ReadyCheckpoint<C>> {
        let (&checkpoint_id, oldest) = self.pending.first_key_value()?;
        let completed = checkpoint_id <= self.completed_through || self.ready_before_completion;
        if !completed || !oldest.is_complete() {
            return None;
        }
        let checkpoint = self.pending.remove(&checkpoint_id)?;
        self.committed_through = checkpoint_id;
        Some(ReadyCheckpoint {
            checkpoint_id,
            parts: checkpoint.parts.into_values().collect(),
        })
    }

    /// The oldest completed checkpoint that cannot be committed because it is
    /// incomplete, and what it lacks.
    pub fn held(&self) -> Option<Held> {
        let (&checkpoint_id, oldest) = self.pending.first_key_value()?;
        if checkpoint_id > self.completed_through || oldest.is_complete() {
            return None;
        }
        Some(Held {
            checkpoint_id,
            missing_summaries: oldest
                .expected
                .iter()
                .filter(|subtask| !oldest.parts.contains_key(subtask))
                .copied()
                .collect(),
            missing_committables: oldest
                .parts
                .values()
                .filter(|part| !part.is_complete())
                .map(|part| part.summary.subtask)
                .collect(),
        })
    }

    /// Every part not yet committed, oldest checkpoint first: what a snapshot
    /// of this ledger must hold.
    pub fn pending_parts(&self) -> impl Iterator<Item = &SubtaskPart<C>> {
        self.pending
            .values()
            .flat_map(|checkpoint| checkpoint.parts.values())
    }

    /// How many committables wait for a commit.
    pub fn pending_committables(&self) -> usize {
        self.pending_parts()
            .map(|part| part.committables.len())
            .sum()
    }

    /// True when nothing waits for a commit.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The newest checkpoint handed out by [`take_ready`](Self::take_ready).
    pub fn committed_through(&self) -> CheckpointId {
        self.committed_through
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(checkpoint: u64, subtask: SubtaskIndex, count: u64) -> CommittableSummary {
        CommittableSummary {
            checkpoint_id: CheckpointId(checkpoint),
            subtask,
            committable_count: count,
            record_count: count * 10,
        }
    }

    #[test]
    fn nothing_is_ready_before_completion() {
        let mut ledger = CommitLedger::new([0]);
        ledger.add(summary(1, 0, 2), vec!["a", "b"]).unwrap();
        assert_eq!(ledger.take_ready(), None);
        ledger.notify_complete(CheckpointId(1));
        let ready = ledger.take_ready().unwrap();
        assert_eq!(ready.checkpoint_id, CheckpointId(1));
        assert_eq!(ready.parts[0].committables, vec!["a", "b"]);
        assert_eq!(ready.record_count(), 20);
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_completion_commits_earlier_checkpoints_oldest_first() {
        let mut ledger = CommitLedger::new([0]);
        for checkpoint in 1..=3 {
            ledger
                .add(summary(checkpoint, 0, 1), vec![checkpoint])
                .unwrap();
        }
        ledger.notify_complete(CheckpointId(2));
        assert_eq!(ledger.take_ready().unwrap().checkpoint_id, CheckpointId(1));
        assert_eq!(ledger.take_ready().unwrap().checkpoint_id, CheckpointId(2));
        assert_eq!(ledger.take_ready(), None, "3 did not complete");
        ledger.notify_complete(CheckpointId(1));
        assert_eq!(ledger.take_ready(), None, "an old notice changes nothing");
        assert_eq!(ledger.pending_committables(), 1);
    }

    #[test]
    fn a_missing_summary_holds_the_commit_and_every_later_one() {
        let mut ledger = CommitLedger::new([0, 1]);
        ledger.add(summary(1, 0, 1), vec!["a"]).unwrap();
        ledger.add(summary(2, 0, 1), vec!["b"]).unwrap();
        ledger.add(summary(2, 1, 1), vec!["c"]).unwrap();
        ledger.notify_complete(CheckpointId(2));
        assert_eq!(ledger.take_ready(), None);
        let held = ledger.held().unwrap();
        assert_eq!(held.checkpoint_id, CheckpointId(1));
        assert_eq!(held.missing_summaries, vec![1]);
        ledger.add(summary(1, 1, 0), vec![]).unwrap();
        assert_eq!(ledger.take_ready().unwrap().checkpoint_id, CheckpointId(1));
        assert_eq!(ledger.take_ready().unwrap().checkpoint_id, CheckpointId(2));
    }

    #[test]
    fn missing_committables_hold_the_commit() {
        let mut ledger = CommitLedger::new([0]);
        ledger.add_summary(summary(1, 0, 2)).unwrap();
        ledger.add_committable(CheckpointId(1), 0, "a").unwrap();
        ledger.notify_complete(CheckpointId(1));
        assert_eq!(ledger.take_ready(), None);
        assert_eq!(ledger.held().unwrap().missing_committables, vec![0]);
        ledger.add_committable(CheckpointId(1), 0, "b").unwrap();
        assert!(ledger.take_ready().is_some());
    }

    #[test]
    fn a_duplicate_summary_is_an_error_never_merged() {
        let mut ledger = CommitLedger::new([0]);
        ledger.add(summary(1, 0, 1), vec!["a"]).unwrap();
        assert_eq!(
            ledger.add(summary(1, 0, 1), vec!["a"]),
            Err(LedgerError::DuplicateSummary {
                checkpoint_id: CheckpointId(1),
                subtask: 0
            })
        );
        assert_eq!(ledger.pending_committables(), 1);
    }

    #[test]
    fn committables_beyond_the_summary_or_without_one_are_errors() {
        let mut ledger = CommitLedger::new([0]);
        assert!(matches!(
            ledger.add_committable(CheckpointId(1), 0, "a"),
            Err(LedgerError::MissingSummary { .. })
        ));
        ledger.add(summary(1, 0, 1), vec!["a"]).unwrap();
        assert!(matches!(
            ledger.add_committable(CheckpointId(1), 0, "b"),
            Err(LedgerError::TooManyCommittables { announced: 1, .. })
        ));
        assert!(matches!(
            ledger.add_summary(summary(1, 7, 0)),
            Err(LedgerError::UnexpectedSubtask { subtask: 7, .. })
        ));
    }

    #[test]
    fn a_committed_checkpoint_is_never_handed_out_again() {
        let mut ledger = CommitLedger::new([0]);
        ledger.add(summary(1, 0, 1), vec!["a"]).unwrap();
        ledger.notify_complete(CheckpointId(1));
        ledger.take_ready().unwrap();
        assert!(matches!(
            ledger.add(summary(1, 0, 1), vec!["a"]),
            Err(LedgerError::AlreadyCommitted { .. })
        ));
        assert_eq!(ledger.take_ready(), None);
    }

    #[test]
    fn restored_checkpoints_can_expect_the_former_subtasks() {
        let mut ledger = CommitLedger::new([0]);
        ledger.expect_until(CheckpointId(4), [0, 1, 2]);
        ledger.add(summary(4, 2, 1), vec![42]).unwrap();
        ledger.add(summary(4, 0, 0), vec![]).unwrap();
        ledger.notify_complete(CheckpointId(5));
        assert_eq!(
            ledger.take_ready(),
            None,
            "subtask 1 of the old parallelism is missing"
        );
        ledger.add(summary(4, 1, 0), vec![]).unwrap();
        assert_eq!(ledger.take_ready().unwrap().parts.len(), 3);
        assert!(matches!(
            ledger.add(summary(5, 1, 0), vec![]),
            Err(LedgerError::UnexpectedSubtask { .. })
        ));
    }

    #[test]
    fn restored_parts_are_complete_as_stored() {
        let mut ledger = CommitLedger::new([0]);
        for subtask in [0, 1, 2] {
            ledger
                .restore_part(SubtaskPart {
                    summary: summary(4, subtask, 1),
                    committables: vec![subtask],
                })
                .unwrap();
        }
        ledger.notify_complete(CheckpointId(4));
        assert_eq!(ledger.take_ready().unwrap().parts.len(), 3);
    }
}
