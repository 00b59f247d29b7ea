//! Where a bounded read ends: a global fact, never one member's view.
//!
//! ```text
//!  a member's own partitions read to their ends ─▶ Awaiting
//!  every look (LOOK_EVERY): the destination's positions, this start's readers,
//!                           each partition's first offset ─▶ unread(..)
//!     none unread                             ─▶ Finished
//!     what is unread moved                    ─▶ wait (the stall clock starts again)
//!     nothing moved for rebalance_after ×2^k  ─▶ ask the group for a rebalance, wait
//!     nothing moved for give_up_after         ─▶ fail, naming each partition unread
//! ```
//!
//! A bounded run ends only when every partition of its input has reached
//! the end taken at the job's first start in the destination's committed
//! positions, whichever member (of this instance or another) read it. A
//! member that read its own partitions, or was dealt none, or was dealt
//! partitions another subtask of this instance already reads (a group that
//! deals one partition twice), waits for the others. A partition no member
//! reads (a group that deals none of it) does not move: the member asks
//! the group to deal again, and past a bound fails loudly, naming it.
//!
//! Pure: the reader (`reader.rs`) gathers the facts and acts on the
//! verdict; the tests below drive each shape of assignment.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How often a waiting member looks at the destination.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);

/// A partition of a bounded input not yet read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unread {
    /// The partition.
    pub partition: i32,
    /// Where the destination's data of it ends (`None`: nothing of it).
    pub position: Option<i64>,
    /// Where the bounded read of it ends.
    pub end: i64,
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.position {
            Some(position) => write!(
                f,
                "partition {} (the destination holds it to offset {position} of {})",
                self.partition, self.end
            ),
            None => write!(
                f,
                "partition {} (the destination holds none of its {} offsets)",
                self.partition, self.end
            ),
        }
    }
}

/// The partitions of a bounded input (`ends`: each one's end) not read to
/// their end yet.
///
/// A partition is read when the destination's position of it (`committed`)
/// is at its end or past it, when a reader of this start read it to its
/// end (`read_here`: its commit is this job's own, made before the job
/// returns), or when it holds nothing to read: the destination has no
/// position of it and its first offset (`log_starts`, 0 where absent) is
/// at its end.
pub fn unread(
    ends: &BTreeMap<i32, i64>,
    committed: &BTreeMap<i32, i64>,
    log_starts: &BTreeMap<i32, i64>,
    read_here: &BTreeSet<i32>,
) -> Vec<Unread> {
    ends.iter()
        .filter(|(partition, _)| !read_here.contains(partition))
        .filter_map(|(&partition, &end)| {
            let position = committed.get(&partition).copied();
            let read = match position {
                Some(position) => position >= end,
                None => log_starts.get(&partition).copied().unwrap_or(0) >= end,
            };
            (!read).then_some(Unread {
                partition,
                position,
                end,
            })
        })
        .collect()
}

/// What a waiting member does after a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every partition is read: the member's input ended.
    Finished,
    /// Others are still reading, or may be: look again later.
    Wait,
    /// Nothing moved for a while: ask the group to deal the partitions
    /// again, then wait.
    Rebalance,
    /// Nothing moved for the whole bound: these partitions are read by no
    /// member.
    GiveUp(Vec<Unread>),
}

/// The stall clock of one waiting member: what was unread at the last
/// look, since when, and when to ask for a rebalance next.
#[derive(Debug, Clone)]
pub struct EndWatch {
    rebalance_after: Duration,
    give_up_after: Duration,
    last: Option<Vec<Unread>>,
    since: Instant,
    asks: u32,
    next_ask: Instant,
}

impl EndWatch {
    /// A watch that asks for the first rebalance after `rebalance_after`
    /// without a move (then after twice as long each time) and gives up
    /// after `give_up_after`.
    pub fn new(rebalance_after: Duration, give_up_after: Duration, now: Instant) -> Self {
        EndWatch {
            rebalance_after,
            give_up_after,
            last: None,
            since: now,
            asks: 0,
            next_ask: now + rebalance_after,
        }
    }

    /// The member was dealt partitions again: the group moved, so the next
    /// ask for a rebalance waits the first pause again. The stall clock
    /// runs on: an assignment is not progress (a group that deals this
    /// member nothing, or nothing unread, in every generation must still
    /// reach the bound); what the member then reads moves the unread
    /// partitions, which starts the clock over at the next look.
    pub fn dealt(&mut self, now: Instant) {
        self.asks = 0;
        self.next_ask = now + self.rebalance_after;
    }

    /// How long nothing has moved.
    pub fn stalled(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }

    /// The verdict on a look at `now` that found `unread`.
    pub fn observe(&mut self, now: Instant, unread: Vec<Unread>) -> Verdict {
        if unread.is_empty() {
            return Verdict::Finished;
        }
        if self.last.as_ref() != Some(&unread) {
            let first = self.last.is_none();
            self.last = Some(unread);
            if !first {
                // Something moved: whoever reads it is alive.
                self.restart_clock(now);
            }
            return Verdict::Wait;
        }
        if self.stalled(now) >= self.give_up_after {
            return Verdict::GiveUp(unread);
        }
        if now >= self.next_ask {
            self.asks = self.asks.saturating_add(1);
            let pause = self
                .rebalance_after
                .saturating_mul(1 << self.asks.min(16))
                .min(self.give_up_after);
            self.next_ask = now + pause;
            return Verdict::Rebalance;
        }
        Verdict::Wait
    }

    fn restart_clock(&mut self, now: Instant) {
        self.since = now;
        self.asks = 0;
        self.next_ask = now + self.rebalance_after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(i32, i64)]) -> BTreeMap<i32, i64> {
        pairs.iter().copied().collect()
    }

    const ENDS: [(i32, i64); 4] = [(0, 2000), (1, 2000), (2, 1000), (3, 1000)];

    #[test]
    fn a_member_dealt_nothing_waits_until_the_destination_holds_every_end() {
        let ends = map(&ENDS);
        let none = BTreeSet::new();
        // Dealt nothing, the others have read nothing yet.
        let all = unread(&ends, &BTreeMap::new(), &BTreeMap::new(), &none);
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].position, None);
        // Partly committed by others.
        let some = map(&[(0, 2000), (1, 1500), (2, 1000), (3, 999)]);
        let left: Vec<i32> = unread(&ends, &some, &BTreeMap::new(), &none)
            .iter()
            .map(|u| u.partition)
            .collect();
        assert_eq!(left, vec![1, 3]);
        // Every end in the destination (one past it: read further by an
        // unbounded run): done.
        let all_there = map(&[(0, 2000), (1, 2100), (2, 1000), (3, 1000)]);
        assert!(unread(&ends, &all_there, &BTreeMap::new(), &none).is_empty());
    }

    #[test]
    fn partitions_read_here_count_before_their_commit_and_empty_ones_count_at_once() {
        let ends = map(&[(0, 10), (1, 0), (2, 5), (3, 7)]);
        let here: BTreeSet<i32> = [0].into();
        // 1 never held a record; 2's records were all deleted before
        // anything was read (its first offset is its end); 3 was not read.
        let starts = map(&[(2, 5), (3, 3)]);
        let left = unread(&ends, &BTreeMap::new(), &starts, &here);
        assert_eq!(
            left,
            vec![Unread {
                partition: 3,
                position: None,
                end: 7
            }]
        );
        // A position before the end is unread even where the partition
        // now starts past it: those records are the owner's to refuse.
        let behind = map(&[(2, 1)]);
        assert_eq!(unread(&ends, &behind, &starts, &here).len(), 2);
    }

    #[test]
    fn a_partition_dealt_twice_is_waited_for_until_its_reader_commits_it() {
        // Subtask 0 and 1 of one instance were both dealt [2, 3]; 0 reads
        // them, 1 waits (the reader skips partitions another subtask of its
        // start holds). Meanwhile another instance reads 0 and 1.
        let ends = map(&ENDS);
        let t0 = Instant::now();
        let mut watch = EndWatch::new(Duration::from_secs(5), Duration::from_secs(60), t0);
        let here = BTreeSet::new();
        let mut committed = map(&[(0, 100), (1, 100)]);
        let look = |c: &BTreeMap<i32, i64>| unread(&ends, c, &BTreeMap::new(), &here);
        assert_eq!(watch.observe(t0, look(&committed)), Verdict::Wait);
        for second in 1..30u64 {
            committed.insert(0, 100 + second as i64 * 50);
            let now = t0 + Duration::from_secs(second);
            assert_eq!(watch.observe(now, look(&committed)), Verdict::Wait);
        }
        let done = map(&[(0, 2000), (1, 2000), (2, 1000), (3, 1000)]);
        let now = t0 + Duration::from_secs(31);
        assert_eq!(watch.observe(now, look(&done)), Verdict::Finished);
    }

    #[test]
    fn partitions_no_member_reads_ask_for_rebalances_then_fail_naming_them() {
        let ends = map(&ENDS);
        let t0 = Instant::now();
        let mut watch = EndWatch::new(Duration::from_secs(5), Duration::from_secs(60), t0);
        // 2 and 3 are read (here); 0 and 1 were dealt to nobody.
        let here: BTreeSet<i32> = [2, 3].into();
        let committed = map(&[(0, 40)]);
        let look = || unread(&ends, &committed, &BTreeMap::new(), &here);
        let mut asks = Vec::new();
        let mut verdict = Verdict::Wait;
        for tenth in 0..=700u64 {
            let now = t0 + Duration::from_millis(tenth * 100);
            verdict = watch.observe(now, look());
            match &verdict {
                Verdict::Rebalance => asks.push(tenth / 10),
                Verdict::GiveUp(_) => break,
                Verdict::Wait => {}
                Verdict::Finished => panic!("finished with partitions unread"),
            }
        }
        // Asked at 5 s, then 10 s later, then 20 s later: the pauses double.
        assert_eq!(asks, vec![5, 15, 35]);
        let Verdict::GiveUp(unread) = verdict else {
            panic!("never gave up: {verdict:?}");
        };
        assert_eq!(watch.stalled(t0 + Duration::from_secs(60)).as_secs(), 60);
        let named: Vec<String> = unread.iter().map(|u| u.to_string()).collect();
        assert_eq!(
            named,
            vec![
                "partition 0 (the destination holds it to offset 40 of 2000)",
                "partition 1 (the destination holds none of its 2000 offsets)"
            ]
        );
    }

    #[test]
    fn partitions_moving_between_members_keep_the_clock_from_running_out() {
        let ends = map(&ENDS);
        let t0 = Instant::now();
        let mut watch = EndWatch::new(Duration::from_secs(5), Duration::from_secs(20), t0);
        let here = BTreeSet::new();
        let mut committed = BTreeMap::new();
        // Each partition sits still for 15 s (a member dropped, its
        // partitions dealt to another after the session timeout), then
        // moves: never 20 s without a move, so never given up.
        let mut rebalances = 0;
        for second in 0..=120u64 {
            if second % 15 == 0 {
                let partition = (second / 15 % 4) as i32;
                let end = ends[&partition];
                let at = committed.get(&partition).copied().unwrap_or(0);
                committed.insert(partition, (at + end / 4).min(end));
            }
            let now = t0 + Duration::from_secs(second);
            match watch.observe(now, unread(&ends, &committed, &BTreeMap::new(), &here)) {
                Verdict::GiveUp(unread) => panic!("gave up at {second} s: {unread:?}"),
                Verdict::Rebalance => rebalances += 1,
                Verdict::Wait | Verdict::Finished => {}
            }
        }
        // Each still stretch asks once (at 5 s) and the next ask, 10 s
        // later, comes after the move.
        assert_eq!(rebalances, 8);
    }

    #[test]
    fn assignments_that_move_nothing_do_not_hold_off_the_bound() {
        let ends = map(&ENDS);
        let t0 = Instant::now();
        let mut watch = EndWatch::new(Duration::from_secs(5), Duration::from_secs(20), t0);
        let none = BTreeSet::new();
        let still = || unread(&ends, &BTreeMap::new(), &BTreeMap::new(), &none);
        // A group that deals this member nothing every 2 s: each deal
        // puts the next ask off, none the bound.
        let mut verdicts = Vec::new();
        for second in 0..=21u64 {
            let now = t0 + Duration::from_secs(second);
            if second % 2 == 1 {
                watch.dealt(now);
            }
            verdicts.push(watch.observe(now, still()));
        }
        assert!(!verdicts.contains(&Verdict::Rebalance), "{verdicts:?}");
        assert!(
            matches!(verdicts[20], Verdict::GiveUp(ref left) if left.len() == 4),
            "{verdicts:?}"
        );
    }
}
