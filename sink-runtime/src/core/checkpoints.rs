//! The checkpoint coordinator's decisions: when to trigger, when a checkpoint
//! is acknowledged by everyone, what its completion means, how failures count,
//! and which checkpoint is the final one.
//!
//! ```text
//!  try_trigger(now) ─▶ in flight ─ on_ack × every task ─▶ AllAcknowledged ─▶ (store) ─▶ on_stored
//!                          │                                                    │
//!                          └─ expired(now) / store failed ─▶ on_failed          └─▶ Completion { final? }
//! ```
//!
//! Time is a [`Duration`] since the job started, passed in by the caller: the
//! tracker has no clock, so tests drive it with any timeline.
//!
//! **The final checkpoint** is any checkpoint triggered after every subtask
//! reached end of input. The first of them to complete ends the job (FLINK-23473:
//! do not wait for every checkpoint triggered after the finish); later ones are
//! abandoned.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use sink_api::{CheckpointId, SubtaskIndex};

/// Who acknowledges a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskId {
    /// The chain (source, writer, committer) of one subtask.
    Subtask(SubtaskIndex),
    /// The global committer.
    GlobalCommitter,
}

/// When and how checkpoints are taken. Given to
/// [`JobBuilder::checkpointing`](crate::JobBuilder::checkpointing); read by the
/// coordinator's `CheckpointTracker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Time between two checkpoint triggers.
    pub interval: Duration,
    /// A checkpoint not completed this long after its trigger fails.
    /// Default 10 minutes.
    pub timeout: Duration,
    /// Least time between the end of one checkpoint and the next trigger.
    /// Default zero.
    pub min_pause: Duration,
    /// Most checkpoints in flight at once. Default 1.
    pub max_concurrent: usize,
    /// Consecutive failed checkpoints tolerated; one more fails the job.
    /// Default 10.
    pub tolerable_failures: u32,
    /// From this many consecutive failures on, each failure is logged as a
    /// warning: checkpointing that never succeeds commits nothing. Default 3.
    pub warn_after_failures: u32,
}

impl CheckpointConfig {
    /// Checkpoints every `interval`, with the defaults for the rest.
    pub fn every(interval: Duration) -> CheckpointConfig {
        CheckpointConfig {
            interval,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 10,
            warn_after_failures: 3,
        }
    }

    /// Sets the timeout.
    pub fn timeout(self, timeout: Duration) -> CheckpointConfig {
        CheckpointConfig { timeout, ..self }
    }

    /// Sets the minimum pause between checkpoints.
    pub fn min_pause(self, min_pause: Duration) -> CheckpointConfig {
        CheckpointConfig { min_pause, ..self }
    }

    /// Sets the most checkpoints in flight at once.
    pub fn max_concurrent(self, max_concurrent: usize) -> CheckpointConfig {
        CheckpointConfig {
            max_concurrent,
            ..self
        }
    }

    /// Sets the consecutive failures tolerated.
    pub fn tolerable_failures(self, tolerable_failures: u32) -> CheckpointConfig {
        CheckpointConfig {
            tolerable_failures,
            ..self
        }
    }

    /// Sets the consecutive failures from which failures are warnings.
    pub fn warn_after_failures(self, warn_after_failures: u32) -> CheckpointConfig {
        CheckpointConfig {
            warn_after_failures,
            ..self
        }
    }
}

/// What an acknowledgement led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStep {
    /// Other tasks have not acknowledged yet.
    Waiting,
    /// Every task acknowledged: store the checkpoint now.
    AllAcknowledged,
    /// The checkpoint is no longer in flight (aborted or subsumed): ignore.
    Stale,
}

/// What a successfully stored checkpoint means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The completed checkpoint: notify every task of it.
    pub checkpoint_id: CheckpointId,
    /// True when this is the final checkpoint: tasks commit and exit.
    pub is_final: bool,
    /// Earlier checkpoints still in flight, now abandoned (subsumed).
    pub subsumed: Vec<CheckpointId>,
}

/// How a failed checkpoint is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureVerdict {
    /// Within tolerance; nothing to report beyond a log line.
    Tolerated {
        /// Consecutive failures so far.
        consecutive: u32,
    },
    /// Within tolerance, but checkpoints keep failing: warn the user, since
    /// no checkpoint means no commit.
    Warn {
        /// Consecutive failures so far.
        consecutive: u32,
    },
    /// Beyond tolerance: the job fails.
    FailJob {
        /// Consecutive failures so far.
        consecutive: u32,
    },
}

#[derive(Debug)]
struct InFlight {
    triggered_at: Duration,
    acks: BTreeSet<TaskId>,
    after_all_ended: bool,
}

/// The coordinator's bookkeeping of checkpoints. Owned by the coordinator
/// loop, which feeds it events and carries out its answers.
#[derive(Debug)]
pub struct CheckpointTracker {
    policy: CheckpointConfig,
    periodic: bool,
    tasks: BTreeSet<TaskId>,
    subtasks: usize,
    next_id: CheckpointId,
    in_flight: BTreeMap<CheckpointId, InFlight>,
    last_trigger_at: Option<Duration>,
    last_end_at: Option<Duration>,
    consecutive_failures: u32,
    ended_input: BTreeSet<SubtaskIndex>,
    final_completed: Option<CheckpointId>,
    last_completed: CheckpointId,
}

impl CheckpointTracker {
    /// A tracker for `subtasks` subtasks, plus the global committer when
    /// `with_global_committer`, continuing after checkpoint `restored`.
    /// Checkpoints are triggered every `policy.interval` when `periodic`;
    /// otherwise (checkpointing off, batch mode) only the final checkpoint is
    /// taken, so that the commit at end of input survives a crash.
    pub fn new(
        policy: CheckpointConfig,
        periodic: bool,
        subtasks: usize,
        with_global_committer: bool,
        restored: CheckpointId,
    ) -> CheckpointTracker {
        let mut tasks: BTreeSet<TaskId> = (0..subtasks).map(TaskId::Subtask).collect();
        if with_global_committer {
            tasks.insert(TaskId::GlobalCommitter);
        }
        CheckpointTracker {
            policy,
            periodic,
            tasks,
            subtasks,
            next_id: restored.next(),
            in_flight: BTreeMap::new(),
            last_trigger_at: None,
            last_end_at: None,
            consecutive_failures: 0,
            ended_input: BTreeSet::new(),
            final_completed: None,
            last_completed: restored,
        }
    }

    fn all_ended_input(&self) -> bool {
        self.ended_input.len() == self.subtasks
    }

    /// The earliest time at which [`try_trigger`](Self::try_trigger) may
    /// trigger, or `None` while it may not (too many in flight, or the final
    /// checkpoint completed).
    pub fn next_trigger_at(&self) -> Option<Duration> {
        if self.final_completed.is_some() || self.in_flight.len() >= self.policy.max_concurrent {
            return None;
        }
        let after_pause = self
            .last_end_at
            .map(|end| end.saturating_add(self.policy.min_pause));
        let after_interval = match self.last_trigger_at {
            // Once every subtask ended input, the final checkpoint is taken
            // at once rather than an interval later.
            _ if self.all_ended_input() && !self.in_flight.values().any(|c| c.after_all_ended) => {
                Duration::ZERO
            }
            _ if !self.periodic => return None,
            Some(last) => last.saturating_add(self.policy.interval),
            None => self.policy.interval,
        };
        Some(after_interval.max(after_pause.unwrap_or(Duration::ZERO)))
    }

    /// Triggers the next checkpoint if it is time.
    pub fn try_trigger(&mut self, now: Duration) -> Option<CheckpointId> {
        if self.next_trigger_at()? > now {
            return None;
        }
        let id = self.next_id;
        self.next_id = id.next();
        self.last_trigger_at = Some(now);
        let after_all_ended = self.all_ended_input();
        self.in_flight.insert(
            id,
            InFlight {
                triggered_at: now,
                acks: BTreeSet::new(),
                after_all_ended,
            },
        );
        Some(id)
    }

    /// `task` acknowledged checkpoint `id` with its state.
    pub fn on_ack(&mut self, id: CheckpointId, task: TaskId) -> AckStep {
        let Some(checkpoint) = self.in_flight.get_mut(&id) else {
            return AckStep::Stale;
        };
        checkpoint.acks.insert(task);
        if checkpoint.acks == self.tasks {
            AckStep::AllAcknowledged
        } else {
            AckStep::Waiting
        }
    }

    /// Checkpoint `id` is durably stored: it completed. `None` when it was
    /// aborted or subsumed meanwhile (then it must not be announced).
    pub fn on_stored(&mut self, id: CheckpointId, now: Duration) -> Option<Completion> {
        let checkpoint = self.in_flight.remove(&id)?;
        let subsumed: Vec<CheckpointId> = self.in_flight.range(..id).map(|(&id, _)| id).collect();
        for old in &subsumed {
            self.in_flight.remove(old);
        }
        self.consecutive_failures = 0;
        self.last_end_at = Some(now);
        self.last_completed = self.last_completed.max(id);
        let is_final = checkpoint.after_all_ended;
        if is_final {
            self.final_completed = Some(id);
            // Later checkpoints are not waited for.
            self.in_flight.clear();
        }
        Some(Completion {
            checkpoint_id: id,
            is_final,
            subsumed,
        })
    }

    /// Checkpoint `id` failed (a timeout, a storage error). Returns `None`
    /// when it was not in flight.
    pub fn on_failed(&mut self, id: CheckpointId, now: Duration) -> Option<FailureVerdict> {
        self.in_flight.remove(&id)?;
        self.last_end_at = Some(now);
        self.consecutive_failures += 1;
        let consecutive = self.consecutive_failures;
        Some(if consecutive > self.policy.tolerable_failures {
            FailureVerdict::FailJob { consecutive }
        } else if consecutive >= self.policy.warn_after_failures {
            FailureVerdict::Warn { consecutive }
        } else {
            FailureVerdict::Tolerated { consecutive }
        })
    }

    /// Checkpoints in flight for longer than the timeout at `now`.
    pub fn expired(&self, now: Duration) -> Vec<CheckpointId> {
        self.in_flight
            .iter()
            .filter(|(_, c)| c.triggered_at.saturating_add(self.policy.timeout) <= now)
            .map(|(&id, _)| id)
            .collect()
    }

    /// The earliest time something is due: a trigger or a timeout.
    pub fn next_deadline(&self) -> Option<Duration> {
        let timeout = self
            .in_flight
            .values()
            .map(|c| c.triggered_at.saturating_add(self.policy.timeout))
            .min();
        match (self.next_trigger_at(), timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Subtask `subtask` reached end of input.
    pub fn on_end_of_input(&mut self, subtask: SubtaskIndex) {
        self.ended_input.insert(subtask);
    }

    /// The final checkpoint, once it completed.
    pub fn final_completed(&self) -> Option<CheckpointId> {
        self.final_completed
    }

    /// The newest completed checkpoint.
    pub fn last_completed(&self) -> CheckpointId {
        self.last_completed
    }

    /// True when checkpoint `id` is in flight and was triggered after every
    /// subtask reached end of input: if it completes, it is final.
    pub fn is_final_candidate(&self, id: CheckpointId) -> bool {
        self.in_flight.get(&id).is_some_and(|c| c.after_all_ended)
    }

    /// Checkpoints in flight.
    pub fn in_flight(&self) -> Vec<CheckpointId> {
        self.in_flight.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> CheckpointConfig {
        CheckpointConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            min_pause: Duration::ZERO,
            max_concurrent: 3,
            tolerable_failures: 2,
            warn_after_failures: 2,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ack_all(tracker: &mut CheckpointTracker, id: CheckpointId, subtasks: usize) -> AckStep {
        let mut step = AckStep::Waiting;
        for i in 0..subtasks {
            step = tracker.on_ack(id, TaskId::Subtask(i));
        }
        step
    }

    #[test]
    fn triggers_on_the_interval_up_to_the_concurrency_limit() {
        let mut tracker = CheckpointTracker::new(
            CheckpointConfig {
                max_concurrent: 1,
                ..policy()
            },
            true,
            2,
            false,
            CheckpointId::NONE,
        );
        assert_eq!(tracker.try_trigger(Duration::from_millis(999)), None);
        assert_eq!(tracker.try_trigger(secs(1)), Some(CheckpointId(1)));
        assert_eq!(tracker.try_trigger(secs(5)), None, "one in flight already");
        assert_eq!(
            ack_all(&mut tracker, CheckpointId(1), 2),
            AckStep::AllAcknowledged
        );
        tracker.on_stored(CheckpointId(1), secs(5)).unwrap();
        assert_eq!(tracker.try_trigger(secs(5)), Some(CheckpointId(2)));
    }

    #[test]
    fn min_pause_delays_the_next_trigger() {
        let mut tracker = CheckpointTracker::new(
            CheckpointConfig {
                min_pause: secs(3),
                ..policy()
            },
            true,
            1,
            false,
            CheckpointId::NONE,
        );
        let id = tracker.try_trigger(secs(1)).unwrap();
        ack_all(&mut tracker, id, 1);
        tracker.on_stored(id, secs(2)).unwrap();
        assert_eq!(tracker.next_trigger_at(), Some(secs(5)));
    }

    #[test]
    fn every_task_including_the_global_committer_must_acknowledge() {
        let mut tracker = CheckpointTracker::new(policy(), true, 2, true, CheckpointId::NONE);
        let id = tracker.try_trigger(secs(1)).unwrap();
        assert_eq!(ack_all(&mut tracker, id, 2), AckStep::Waiting);
        assert_eq!(
            tracker.on_ack(id, TaskId::GlobalCommitter),
            AckStep::AllAcknowledged
        );
        assert_eq!(
            tracker.on_ack(CheckpointId(9), TaskId::Subtask(0)),
            AckStep::Stale
        );
    }

    #[test]
    fn a_completion_subsumes_older_checkpoints_in_flight() {
        let mut tracker = CheckpointTracker::new(policy(), true, 1, false, CheckpointId::NONE);
        let first = tracker.try_trigger(secs(1)).unwrap();
        let second = tracker.try_trigger(secs(2)).unwrap();
        ack_all(&mut tracker, second, 1);
        let completion = tracker.on_stored(second, secs(2)).unwrap();
        assert_eq!(completion.subsumed, vec![first]);
        assert_eq!(
            tracker.on_stored(first, secs(3)),
            None,
            "subsumed, not announced"
        );
    }

    #[test]
    fn failures_warn_then_fail_the_job_and_a_completion_resets_them() {
        let mut tracker = CheckpointTracker::new(policy(), true, 1, false, CheckpointId::NONE);
        let fail_next = |tracker: &mut CheckpointTracker, at| {
            let id = tracker.try_trigger(secs(at)).unwrap();
            tracker.on_failed(id, secs(at)).unwrap()
        };
        assert_eq!(
            fail_next(&mut tracker, 1),
            FailureVerdict::Tolerated { consecutive: 1 }
        );
        assert_eq!(
            fail_next(&mut tracker, 2),
            FailureVerdict::Warn { consecutive: 2 }
        );
        let id = tracker.try_trigger(secs(3)).unwrap();
        ack_all(&mut tracker, id, 1);
        tracker.on_stored(id, secs(3)).unwrap();
        assert_eq!(
            fail_next(&mut tracker, 4),
            FailureVerdict::Tolerated { consecutive: 1 }
        );
        fail_next(&mut tracker, 5);
        assert_eq!(
            fail_next(&mut tracker, 6),
            FailureVerdict::FailJob { consecutive: 3 }
        );
    }

    #[test]
    fn timeouts_expire_checkpoints() {
        let mut tracker = CheckpointTracker::new(policy(), true, 1, false, CheckpointId::NONE);
        let id = tracker.try_trigger(secs(1)).unwrap();
        assert!(tracker.expired(secs(10)).is_empty());
        assert_eq!(tracker.expired(secs(11)), vec![id]);
        assert_eq!(tracker.next_deadline(), Some(secs(2)));
    }

    /// FLINK-23473: finish, then checkpoints n+1, n+2, n+3 triggered; only
    /// n+2 completes. The job ends on n+2 and does not wait for n+3.
    #[test]
    fn the_first_completion_after_every_subtask_finished_is_final() {
        let mut tracker = CheckpointTracker::new(policy(), true, 2, false, CheckpointId(41));
        let before = tracker.try_trigger(secs(1)).unwrap();
        assert_eq!(before, CheckpointId(42));
        tracker.on_end_of_input(0);
        tracker.on_end_of_input(1);
        assert_eq!(
            tracker.next_trigger_at(),
            Some(Duration::ZERO),
            "final checkpoint at once"
        );
        let n1 = tracker.try_trigger(secs(1)).unwrap();
        let n2 = tracker.try_trigger(secs(2)).unwrap();
        assert_eq!(tracker.try_trigger(secs(3)), None, "concurrency limit of 3");
        tracker.on_failed(before, secs(3)).unwrap();
        let n3 = tracker.try_trigger(secs(3)).unwrap();
        assert_eq!(
            (n1, n2, n3),
            (CheckpointId(43), CheckpointId(44), CheckpointId(45))
        );
        tracker.on_failed(n1, secs(3)).unwrap();
        ack_all(&mut tracker, n2, 2);
        let completion = tracker.on_stored(n2, secs(4)).unwrap();
        assert!(completion.is_final);
        assert_eq!(tracker.final_completed(), Some(n2));
        assert!(tracker.in_flight().is_empty(), "n+3 is not waited for");
        assert_eq!(
            tracker.next_trigger_at(),
            None,
            "nothing is triggered after the final checkpoint"
        );
        assert_eq!(tracker.on_ack(n3, TaskId::Subtask(0)), AckStep::Stale);
    }

    #[test]
    fn without_periodic_checkpoints_only_the_final_one_is_taken() {
        let mut tracker = CheckpointTracker::new(policy(), false, 2, false, CheckpointId::NONE);
        assert_eq!(tracker.next_trigger_at(), None);
        assert_eq!(tracker.try_trigger(secs(3600)), None);
        tracker.on_end_of_input(0);
        assert_eq!(tracker.next_trigger_at(), None, "one subtask still reads");
        tracker.on_end_of_input(1);
        let id = tracker.try_trigger(secs(3601)).unwrap();
        assert!(tracker.is_final_candidate(id));
        assert_eq!(
            tracker.next_trigger_at(),
            None,
            "one final checkpoint in flight is enough"
        );
        ack_all(&mut tracker, id, 2);
        assert!(tracker.on_stored(id, secs(3602)).unwrap().is_final);
    }

    #[test]
    fn a_checkpoint_triggered_before_the_last_subtask_ended_is_not_final() {
        let mut tracker = CheckpointTracker::new(policy(), true, 2, false, CheckpointId::NONE);
        tracker.on_end_of_input(0);
        let id = tracker.try_trigger(secs(1)).unwrap();
        tracker.on_end_of_input(1);
        ack_all(&mut tracker, id, 2);
        assert!(!tracker.on_stored(id, secs(1)).unwrap().is_final);
        assert_eq!(
            tracker.next_trigger_at(),
            Some(secs(1)),
            "the final checkpoint is triggered at once, not an interval later"
        );
    }
}
