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

/// What starts a checkpoint. Part of [`CheckpointConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TriggerMode {
    /// A checkpoint every [`interval`](CheckpointConfig::interval), whether
    /// records arrived or not. The default.
    #[default]
    Periodic,
    /// A checkpoint as soon as some subtask wrote records that no checkpoint
    /// covers yet, while fewer than
    /// [`max_concurrent`](CheckpointConfig::max_concurrent) are in flight and
    /// at least [`min_pause`](CheckpointConfig::min_pause) after the last one
    /// ended; and, idle or not, at the latest
    /// [`interval`](CheckpointConfig::interval) after the last trigger. Under
    /// light load a record is committed about one checkpoint's duration after
    /// it was written; under heavy load each checkpoint covers every record
    /// written while the one before was in flight (group commit).
    OnDemand,
}

/// When and how checkpoints are taken. Given to
/// [`JobBuilder::checkpointing`](crate::JobBuilder::checkpointing); read by the
/// coordinator's `CheckpointTracker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CheckpointConfig {
    /// What starts a checkpoint. Default [`TriggerMode::Periodic`].
    pub trigger: TriggerMode,
    /// Time between two checkpoint triggers; with [`TriggerMode::OnDemand`],
    /// the longest time between two.
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
            trigger: TriggerMode::Periodic,
            interval,
            timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 10,
            warn_after_failures: 3,
        }
    }

    /// Checkpoints on demand ([`TriggerMode::OnDemand`]): as soon as records
    /// wait for one, no sooner than `min_pause` after the last one ended, and
    /// at least every `max_interval`; the defaults for the rest.
    pub fn on_demand(min_pause: Duration, max_interval: Duration) -> CheckpointConfig {
        CheckpointConfig {
            trigger: TriggerMode::OnDemand,
            min_pause,
            ..CheckpointConfig::every(max_interval)
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InFlight {
    triggered_at: Duration,
    acks: BTreeSet<TaskId>,
    after_all_ended: bool,
}

/// The coordinator's bookkeeping of checkpoints. Owned by the coordinator
/// loop, which feeds it events and carries out its answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// The newest checkpoint triggered (or the restored one).
    last_triggered: CheckpointId,
    /// Some subtask wrote records that no triggered checkpoint covers.
    uncovered: bool,
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
            last_triggered: restored,
            uncovered: false,
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
            _ if self.uncovered && self.policy.trigger == TriggerMode::OnDemand => Duration::ZERO,
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
        self.last_triggered = id;
        self.uncovered = false;
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

    /// A subtask wrote records after its barrier of checkpoint `since` (or
    /// since its start, when `since` is the restored checkpoint). They are
    /// covered unless no checkpoint after `since` was triggered yet; then,
    /// on demand, the next checkpoint is due.
    pub fn on_records_written(&mut self, since: CheckpointId) {
        if since >= self.last_triggered {
            self.uncovered = true;
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
            trigger: TriggerMode::Periodic,
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

    fn on_demand(min_pause_ms: u64, max_interval: Duration) -> CheckpointTracker {
        CheckpointTracker::new(
            CheckpointConfig::on_demand(Duration::from_millis(min_pause_ms), max_interval),
            true,
            2,
            false,
            CheckpointId::NONE,
        )
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn on_demand_triggers_when_records_are_written_not_on_the_interval() {
        let mut tracker = on_demand(0, secs(10));
        assert_eq!(
            tracker.next_trigger_at(),
            Some(secs(10)),
            "idle: only the maximum interval"
        );
        assert_eq!(tracker.try_trigger(ms(5)), None);
        tracker.on_records_written(CheckpointId::NONE);
        assert_eq!(
            tracker.try_trigger(ms(5)),
            Some(CheckpointId(1)),
            "at once, not 10 s later"
        );
        // Written before the subtask saw barrier 1: covered by it.
        tracker.on_records_written(CheckpointId::NONE);
        ack_all(&mut tracker, CheckpointId(1), 2);
        tracker.on_stored(CheckpointId(1), ms(8)).unwrap();
        assert_eq!(tracker.try_trigger(ms(8)), None, "nothing uncovered");
        assert_eq!(tracker.next_trigger_at(), Some(ms(5) + secs(10)));
        // Written after barrier 1: due, but not while checkpoint 2 is in flight.
        tracker.on_records_written(CheckpointId(1));
        assert_eq!(tracker.try_trigger(ms(9)), Some(CheckpointId(2)));
        tracker.on_records_written(CheckpointId(2));
        assert_eq!(tracker.try_trigger(ms(10)), None, "one in flight already");
        ack_all(&mut tracker, CheckpointId(2), 2);
        tracker.on_stored(CheckpointId(2), ms(12)).unwrap();
        assert_eq!(
            tracker.try_trigger(ms(12)),
            Some(CheckpointId(3)),
            "group commit: right after"
        );
    }

    #[test]
    fn on_demand_waits_for_the_minimum_pause() {
        let mut tracker = on_demand(50, secs(10));
        tracker.on_records_written(CheckpointId::NONE);
        let id = tracker.try_trigger(ms(1)).unwrap();
        ack_all(&mut tracker, id, 2);
        tracker.on_stored(id, ms(3)).unwrap();
        tracker.on_records_written(id);
        assert_eq!(tracker.next_trigger_at(), Some(ms(53)));
        assert_eq!(tracker.try_trigger(ms(52)), None);
        assert_eq!(tracker.try_trigger(ms(53)), Some(id.next()));
    }

    #[test]
    fn on_demand_while_idle_triggers_only_on_the_maximum_interval() {
        let mut tracker = on_demand(0, secs(2));
        let mut triggered = Vec::new();
        let mut now = Duration::ZERO;
        while now <= secs(20) {
            if let Some(id) = tracker.try_trigger(now) {
                triggered.push(now);
                ack_all(&mut tracker, id, 2);
                tracker.on_stored(id, now).unwrap();
            }
            now += ms(1);
        }
        let expected: Vec<Duration> = (1..=10).map(|i| secs(2 * i)).collect();
        assert_eq!(triggered, expected);
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
