//! Property tests of the pure core over random event orders.
//!
//! The ledger is fed the summaries and committables of several subtasks and
//! checkpoints, interleaved at random (each subtask's own messages stay in
//! order, as a channel keeps them), with completion notices for random
//! checkpoints at random moments, some lost. After every event it is asked
//! what to commit. It must never commit an incomplete checkpoint, never
//! commit a committable twice, never commit before completion, always commit
//! oldest first, and commit everything once every checkpoint completed.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use sink_api::{CheckpointId, SubtaskIndex};
use sink_runtime::core::checkpoints::{
    AckStep, CheckpointConfig, CheckpointTracker, TaskId, TriggerMode,
};
use sink_runtime::core::ledger::{CommitLedger, CommittableSummary};
use std::time::Duration;

/// A committable names where it came from.
type Committable = (u64, SubtaskIndex, u64);

#[derive(Debug, Clone)]
enum Event {
    /// The next message of a subtask's stream.
    Deliver(SubtaskIndex),
    /// A completion notice for a checkpoint.
    Complete(u64),
    /// A duplicate summary for a checkpoint already announced by a subtask.
    DuplicateSummary(SubtaskIndex),
}

#[derive(Debug, Clone)]
enum Message {
    Summary(CommittableSummary),
    Committable(u64, SubtaskIndex, Committable),
}

/// Per subtask, per checkpoint 1..=checkpoints, 0 to 3 committables.
fn scenario() -> impl Strategy<Value = (usize, u64, Vec<Vec<u64>>, Vec<Event>)> {
    (1usize..4, 1u64..6).prop_flat_map(|(subtasks, checkpoints)| {
        let counts = prop::collection::vec(
            prop::collection::vec(0u64..4, checkpoints as usize),
            subtasks,
        );
        let events = prop::collection::vec(
            prop_oneof![
                6 => (0..subtasks).prop_map(Event::Deliver),
                2 => (1..=checkpoints).prop_map(Event::Complete),
                1 => (0..subtasks).prop_map(Event::DuplicateSummary),
            ],
            0..120,
        );
        (Just(subtasks), Just(checkpoints), counts, events)
    })
}

fn streams(counts: &[Vec<u64>]) -> Vec<Vec<Message>> {
    counts
        .iter()
        .enumerate()
        .map(|(subtask, per_checkpoint)| {
            let mut stream = Vec::new();
            for (index, &count) in per_checkpoint.iter().enumerate() {
                let checkpoint = index as u64 + 1;
                stream.push(Message::Summary(CommittableSummary {
                    checkpoint_id: CheckpointId(checkpoint),
                    subtask,
                    committable_count: count,
                    record_count: count,
                }));
                for k in 0..count {
                    stream.push(Message::Committable(
                        checkpoint,
                        subtask,
                        (checkpoint, subtask, k),
                    ));
                }
            }
            stream
        })
        .collect()
}

struct Checker {
    counts: Vec<Vec<u64>>,
    committed: BTreeSet<Committable>,
    last_committed: CheckpointId,
    completed: CheckpointId,
}

impl Checker {
    fn drain(&mut self, ledger: &mut CommitLedger<Committable>) -> Result<(), TestCaseError> {
        while let Some(ready) = ledger.take_ready() {
            let id = ready.checkpoint_id;
            prop_assert!(
                id <= self.completed,
                "committed {id} before its completion (completed through {})",
                self.completed
            );
            prop_assert!(
                id > self.last_committed,
                "committed {id} after {}",
                self.last_committed
            );
            self.last_committed = id;
            let subtasks: Vec<SubtaskIndex> =
                ready.parts.iter().map(|p| p.summary.subtask).collect();
            prop_assert_eq!(
                subtasks,
                (0..self.counts.len()).collect::<Vec<_>>(),
                "checkpoint {} incomplete",
                id
            );
            for part in ready.parts {
                let expected = self.counts[part.summary.subtask][id.0 as usize - 1];
                prop_assert_eq!(
                    part.committables.len() as u64,
                    expected,
                    "checkpoint {} subtask {} partial",
                    id,
                    part.summary.subtask
                );
                for committable in part.committables {
                    prop_assert_eq!(committable.0, id.0, "committable of another checkpoint");
                    prop_assert!(
                        self.committed.insert(committable),
                        "{:?} committed twice",
                        committable
                    );
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_ledger_commits_exactly_once_in_order_and_only_when_allowed(
        (subtasks, checkpoints, counts, events) in scenario()
    ) {
        let mut ledger = CommitLedger::<Committable>::new(0..subtasks);
        let streams = streams(&counts);
        let mut positions = vec![0usize; subtasks];
        let mut announced: BTreeMap<SubtaskIndex, CommittableSummary> = BTreeMap::new();
        let mut checker = Checker {
            counts: counts.clone(),
            committed: BTreeSet::new(),
            last_committed: CheckpointId::NONE,
            completed: CheckpointId::NONE,
        };
        let deliver = |ledger: &mut CommitLedger<Committable>, message: &Message| match message {
            Message::Summary(summary) => ledger.add_summary(*summary),
            Message::Committable(checkpoint, subtask, c) => {
                ledger.add_committable(CheckpointId(*checkpoint), *subtask, *c)
            }
        };
        for event in events {
            match event {
                Event::Deliver(subtask) => {
                    if let Some(message) = streams[subtask].get(positions[subtask]) {
                        positions[subtask] += 1;
                        deliver(&mut ledger, message).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        if let Message::Summary(summary) = message {
                            announced.insert(subtask, *summary);
                        }
                    }
                }
                Event::Complete(checkpoint) => {
                    ledger.notify_complete(CheckpointId(checkpoint));
                    checker.completed = checker.completed.max(CheckpointId(checkpoint));
                }
                Event::DuplicateSummary(subtask) => {
                    if let Some(summary) = announced.get(&subtask) {
                        let pending = ledger.pending_committables();
                        prop_assert!(ledger.add_summary(*summary).is_err(), "a duplicate summary was accepted");
                        prop_assert_eq!(ledger.pending_committables(), pending);
                    }
                }
            }
            checker.drain(&mut ledger)?;
        }
        // Deliver the rest, complete the last checkpoint: everything commits.
        for subtask in 0..subtasks {
            for message in &streams[subtask][positions[subtask]..] {
                deliver(&mut ledger, message).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
        }
        ledger.notify_complete(CheckpointId(checkpoints));
        checker.completed = CheckpointId(checkpoints);
        checker.drain(&mut ledger)?;
        let total: u64 = counts.iter().flatten().sum();
        prop_assert_eq!(checker.committed.len() as u64, total);
        prop_assert!(ledger.is_empty());
        prop_assert!(ledger.held().is_none());
    }

    /// The coordinator's tracker over random orders of triggers,
    /// acknowledgements, stores, failures and ends of input: completions come
    /// in increasing order, a final checkpoint is only one triggered after
    /// every subtask ended, there is at most one, and nothing is triggered or
    /// completed after it.
    #[test]
    fn the_tracker_ends_on_the_first_completion_after_everyone_finished(
        subtasks in 1usize..4,
        steps in prop::collection::vec((0u8..6, 0usize..4, 0u64..8), 0..200),
    ) {
        let policy = CheckpointConfig {
            trigger: TriggerMode::Periodic,
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(3600),
            min_pause: Duration::ZERO,
            max_concurrent: 3,
            tolerable_failures: u32::MAX,
            warn_after_failures: 3,
        };
        let mut tracker = CheckpointTracker::new(policy, true, subtasks, false, CheckpointId::NONE);
        let mut now = Duration::ZERO;
        let mut ended = BTreeSet::new();
        let mut triggered_after_all_ended = BTreeSet::new();
        let mut last_completion = CheckpointId::NONE;
        let mut final_seen: Option<CheckpointId> = None;
        for (kind, subtask, pick) in steps {
            now += Duration::from_millis(50);
            let in_flight = tracker.in_flight();
            let choose = |i: u64| in_flight.get(i as usize % in_flight.len().max(1)).copied();
            match kind {
                0 => {
                    if let Some(id) = tracker.try_trigger(now) {
                        prop_assert!(final_seen.is_none(), "triggered {id} after the final checkpoint");
                        if ended.len() == subtasks {
                            triggered_after_all_ended.insert(id);
                        }
                    }
                }
                1 | 2 => {
                    if let Some(id) = choose(pick) {
                        for task in 0..subtasks {
                            if tracker.on_ack(id, TaskId::Subtask(task)) == AckStep::AllAcknowledged {
                                if let Some(completion) = tracker.on_stored(id, now) {
                                    prop_assert!(final_seen.is_none(), "completed {id} after the final checkpoint");
                                    prop_assert!(completion.checkpoint_id > last_completion);
                                    last_completion = completion.checkpoint_id;
                                    prop_assert_eq!(completion.is_final, triggered_after_all_ended.contains(&id));
                                    if completion.is_final {
                                        final_seen = Some(id);
                                        prop_assert!(tracker.in_flight().is_empty());
                                    }
                                }
                            }
                        }
                    }
                }
                3 => {
                    if let Some(id) = choose(pick) {
                        tracker.on_failed(id, now);
                    }
                }
                _ => {
                    let subtask = subtask % subtasks;
                    tracker.on_end_of_input(subtask);
                    ended.insert(subtask);
                }
            }
        }
        prop_assert_eq!(tracker.final_completed(), final_seen);
        if final_seen.is_some() {
            prop_assert_eq!(tracker.next_trigger_at(), None);
        }
    }

    /// On demand, a checkpoint is triggered exactly when it may be: records
    /// written after the last trigger wait no longer than the minimum pause
    /// (when nothing is in flight), and without such records the only
    /// triggers are those of the maximum interval.
    #[test]
    fn on_demand_triggers_exactly_when_written_records_are_uncovered(
        steps in prop::collection::vec((0u8..5, 1u64..60, any::<bool>()), 0..300),
        min_pause_ms in 0u64..40,
    ) {
        let interval = Duration::from_millis(200);
        let min_pause = Duration::from_millis(min_pause_ms);
        let mut tracker = CheckpointTracker::new(
            CheckpointConfig::on_demand(min_pause, interval),
            true,
            2,
            false,
            CheckpointId::NONE,
        );
        let mut now = Duration::ZERO;
        let mut last_triggered = CheckpointId::NONE;
        let mut last_trigger_at = Duration::ZERO;
        let mut last_end_at: Option<Duration> = None;
        let mut uncovered = false;
        for (kind, advance_ms, stale) in steps {
            now += Duration::from_millis(advance_ms);
            match kind {
                0 | 1 => {
                    // A subtask wrote records after the barrier it last saw:
                    // the newest, or (stale) one before it, as when a trigger
                    // crosses the message.
                    let since = match stale {
                        true if last_triggered > CheckpointId::NONE => CheckpointId(last_triggered.0 - 1),
                        _ => last_triggered,
                    };
                    tracker.on_records_written(since);
                    uncovered |= since == last_triggered;
                }
                2 => {
                    if let Some(id) = tracker.in_flight().first().copied() {
                        for task in 0..2 {
                            tracker.on_ack(id, TaskId::Subtask(task));
                        }
                        tracker.on_stored(id, now);
                        last_end_at = Some(now);
                    }
                }
                3 => {
                    if let Some(id) = tracker.in_flight().first().copied() {
                        tracker.on_failed(id, now);
                        last_end_at = Some(now);
                    }
                }
                _ => {}
            }
            let paused = last_end_at.is_some_and(|end| now < end + min_pause);
            let idle_due = now >= last_trigger_at + interval;
            let free = tracker.in_flight().is_empty();
            match tracker.try_trigger(now) {
                Some(id) => {
                    prop_assert!(free, "triggered {id} with one in flight");
                    prop_assert!(!paused, "triggered {id} within the minimum pause");
                    prop_assert!(uncovered || idle_due, "triggered {id} with nothing to cover before the interval");
                    last_triggered = id;
                    last_trigger_at = now;
                    uncovered = false;
                }
                None => {
                    prop_assert!(!free || paused || (!uncovered && !idle_due),
                        "no trigger at {now:?} although one was due (uncovered {uncovered})");
                }
            }
        }
    }
}
