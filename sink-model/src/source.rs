//! The bounded group source model: members of a consumer group, each in an
//! instance of its own, read the partitions the group deals them (dealt
//! twice, to no one, to nobody at all, moving at any time), commit their
//! positions with the data, are killed and rejoin; each decides that the
//! input ended by the Kafka source's own `end::unread`.
//!
//! ```text
//!  Deal(assignment) ─▶ each member takes its partitions over from the destination's positions
//!  Read(member, p)  ─▶ one record further
//!  Commit(member)   ─▶ every advance applied if each partition is still at its `from`, else
//!                      nothing (superseded: the member reads again from the destination)
//!  Kill(member)     ─▶ what it read and did not commit is gone; it rejoins dealt nothing
//!  Look(member)     ─▶ end::unread(ends, the destination's positions, {}, read here) empty:
//!                      the member's final commit, then its run returns Finished
//! ```
//!
//! The property: a run returns Finished only when the destination holds
//! every partition at its end, and every record once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sources_kafka::end::unread;
use stateright::{Model, Property};

use crate::world::PastBug;

/// One small world of the source model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceWorld {
    /// Members of the group (each an instance of the job with one subtask).
    pub members: usize,
    /// Partitions of the topic.
    pub partitions: usize,
    /// Records in each partition (its end offset).
    pub records: i64,
    /// Deals (rebalances) at most, the first included.
    pub deals: u8,
    /// Members killed at most.
    pub kills: u8,
    /// The past bugs put back (only `EndOnOwnPartitions` applies).
    pub bugs: BTreeSet<PastBug>,
}

impl SourceWorld {
    /// 2 members, 3 partitions of 1 record each, 3 deals, 1 kill.
    pub fn small() -> SourceWorld {
        SourceWorld {
            members: 2,
            partitions: 3,
            records: 1,
            deals: 3,
            kills: 1,
            bugs: BTreeSet::new(),
        }
    }

    /// The same world with `bug` put back.
    pub fn with_bug(mut self, bug: PastBug) -> SourceWorld {
        self.bugs.insert(bug);
        self
    }
}

impl fmt::Display for SourceWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a bounded group source: {} members, {} partitions × {} records, {} deals, {} kills",
            self.members, self.partitions, self.records, self.deals, self.kills
        )?;
        for bug in &self.bugs {
            write!(f, ", past bug {bug}")?;
        }
        Ok(())
    }
}

/// Where a member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Reading what it is dealt, or waiting for the end.
    Reading,
    /// Its look found nothing unread: its final commit, then it returns.
    Ending,
    /// Its run returned `Finished`.
    Finished,
}

/// One member.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    /// The partitions it reads: where it took each over (`from`, the
    /// destination's position then) and the next offset it reads.
    reading: BTreeMap<i32, (i64, i64)>,
    /// Partitions it read to their end in this start (`read_here`).
    read_to_end: BTreeSet<i32>,
    /// Where it stands.
    phase: Phase,
}

/// The group, the destination and the members.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceState {
    members: Vec<Member>,
    /// The destination: each partition's position and how many times each
    /// record is in it.
    positions: BTreeMap<i32, i64>,
    records: BTreeMap<(i32, i64), u8>,
    deals: u8,
    kills: u8,
    /// A member's run returned Finished while the destination lacked a
    /// partition's end.
    ended_short: bool,
}

/// One step of the source world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SourceAction {
    /// The group deals: each member's partitions, by member.
    Deal(Vec<Vec<i32>>),
    /// A member reads the next record of a partition.
    Read(usize, i32),
    /// A member commits what it read.
    Commit(usize),
    /// A member is killed and rejoins.
    Kill(usize),
    /// A member looks whether the input is read to its end.
    Look(usize),
}

impl fmt::Display for SourceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceAction::Deal(assignment) => {
                write!(f, "the group deals")?;
                for (member, partitions) in assignment.iter().enumerate() {
                    write!(f, " member {member}: {partitions:?}")?;
                }
                Ok(())
            }
            SourceAction::Read(m, p) => write!(f, "member {m} reads a record of partition {p}"),
            SourceAction::Commit(m) => write!(f, "member {m} commits what it read"),
            SourceAction::Kill(m) => write!(f, "member {m} is killed and rejoins"),
            SourceAction::Look(m) => write!(f, "member {m} looks whether the input ended"),
        }
    }
}

/// The source model over one [`SourceWorld`].
#[derive(Debug, Clone)]
pub struct SourceModel {
    /// The world explored.
    pub world: SourceWorld,
}

/// The names of the source model's properties.
pub mod rules {
    /// The bounded end is a global fact.
    pub const ENDS_ONLY_AT_THE_END: &str = "a bounded source's run ends only when every split's \
                                            end is in the destination, and never ends short";
    /// Every record once in the destination, whatever the deals.
    pub const EVERY_RECORD_AT_MOST_ONCE: &str =
        "every record is in the destination at most once, whoever read it";
    /// Vacuity: every member can finish.
    pub const SOMETIMES_FINISHED: &str = "sometimes every member's run finishes";
}

impl SourceModel {
    /// A model of `world`.
    pub fn new(world: SourceWorld) -> SourceModel {
        SourceModel { world }
    }

    fn partitions(&self) -> impl Iterator<Item = i32> {
        0..self.world.partitions as i32
    }

    /// Every way to deal the partitions: each partition to any subset of
    /// the members (none, one, several).
    fn deals(&self) -> Vec<Vec<Vec<i32>>> {
        let members = self.world.members;
        let choices = 1usize << members;
        let mut deals = Vec::new();
        let total = choices.pow(self.world.partitions as u32);
        for code in 0..total {
            let mut assignment = vec![Vec::new(); members];
            let mut rest = code;
            for partition in self.partitions() {
                let holders = rest % choices;
                rest /= choices;
                for (member, partitions) in assignment.iter_mut().enumerate() {
                    if holders & (1 << member) != 0 {
                        partitions.push(partition);
                    }
                }
            }
            deals.push(assignment);
        }
        deals
    }

    fn ends(&self) -> BTreeMap<i32, i64> {
        self.partitions().map(|p| (p, self.world.records)).collect()
    }

    /// A member takes `partitions` over from the destination's positions.
    fn take_over(state: &mut SourceState, member: usize, partitions: &[i32]) {
        let positions = state.positions.clone();
        let m = &mut state.members[member];
        if m.phase != Phase::Reading {
            return;
        }
        m.reading = partitions
            .iter()
            .map(|&p| {
                let at = positions.get(&p).copied().unwrap_or(0);
                (p, (at, at))
            })
            .collect();
    }

    /// Commits a member's advances: all or nothing, only from where each
    /// partition is. Returns false when superseded.
    fn commit(state: &mut SourceState, member: usize) -> bool {
        let advances: Vec<(i32, i64, i64)> = state.members[member]
            .reading
            .iter()
            .filter(|(_, (from, next))| next > from)
            .map(|(&p, &(from, next))| (p, from, next))
            .collect();
        let fits = advances
            .iter()
            .all(|&(p, from, _)| state.positions.get(&p).copied().unwrap_or(0) == from);
        if !fits {
            // Superseded: nothing applied; the job restarts (a new start,
            // which has read nothing to its end yet) and reads its
            // partitions again from the destination.
            let partitions: Vec<i32> = state.members[member].reading.keys().copied().collect();
            state.members[member].read_to_end.clear();
            Self::take_over(state, member, &partitions);
            return false;
        }
        for (p, from, next) in advances {
            state.positions.insert(p, next);
            for offset in from..next {
                *state.records.entry((p, offset)).or_insert(0) += 1;
            }
            if let Some(entry) = state.members[member].reading.get_mut(&p) {
                entry.0 = next;
            }
        }
        true
    }

    fn all_at_the_end(&self, state: &SourceState) -> bool {
        self.partitions()
            .all(|p| state.positions.get(&p).copied().unwrap_or(0) >= self.world.records)
    }
}

impl Model for SourceModel {
    type State = SourceState;
    type Action = SourceAction;

    fn init_states(&self) -> Vec<SourceState> {
        let member = Member {
            reading: BTreeMap::new(),
            read_to_end: BTreeSet::new(),
            phase: Phase::Reading,
        };
        vec![SourceState {
            members: vec![member; self.world.members],
            positions: BTreeMap::new(),
            records: BTreeMap::new(),
            deals: 0,
            kills: 0,
            ended_short: false,
        }]
    }

    fn actions(&self, state: &SourceState, actions: &mut Vec<SourceAction>) {
        if state.deals < self.world.deals {
            actions.extend(self.deals().into_iter().map(SourceAction::Deal));
        }
        for (i, member) in state.members.iter().enumerate() {
            if member.phase == Phase::Finished {
                continue;
            }
            if state.kills < self.world.kills {
                actions.push(SourceAction::Kill(i));
            }
            if member.phase == Phase::Ending {
                actions.push(SourceAction::Commit(i));
                continue;
            }
            for (&p, &(_, next)) in &member.reading {
                if next < self.world.records {
                    actions.push(SourceAction::Read(i, p));
                }
            }
            if member.reading.values().any(|(from, next)| next > from) {
                actions.push(SourceAction::Commit(i));
            }
            let own_read = member
                .reading
                .values()
                .all(|&(_, next)| next >= self.world.records);
            if own_read {
                actions.push(SourceAction::Look(i));
            }
        }
    }

    fn next_state(&self, last: &SourceState, action: SourceAction) -> Option<SourceState> {
        let mut state = last.clone();
        match action {
            SourceAction::Deal(assignment) => {
                state.deals += 1;
                for (member, partitions) in assignment.iter().enumerate() {
                    // A member gives its partitions up only once what it
                    // read is committed (it rejoins then): a commit first.
                    if state.members[member].phase == Phase::Reading {
                        Self::commit(&mut state, member);
                    }
                    Self::take_over(&mut state, member, partitions);
                }
            }
            SourceAction::Read(member, p) => {
                let records = self.world.records;
                let m = &mut state.members[member];
                let entry = m.reading.get_mut(&p)?;
                entry.1 += 1;
                if entry.1 >= records {
                    m.read_to_end.insert(p);
                }
            }
            SourceAction::Commit(member) => {
                let committed = Self::commit(&mut state, member);
                let m = &mut state.members[member];
                if m.phase == Phase::Ending {
                    if committed {
                        m.phase = Phase::Finished;
                        if !self.all_at_the_end(&state) {
                            state.ended_short = true;
                        }
                    } else {
                        // Superseded: the run restarts and reads again.
                        m.phase = Phase::Reading;
                    }
                }
            }
            SourceAction::Kill(member) => {
                state.kills += 1;
                state.members[member] = Member {
                    reading: BTreeMap::new(),
                    read_to_end: BTreeSet::new(),
                    phase: Phase::Reading,
                };
            }
            SourceAction::Look(member) => {
                let m = &state.members[member];
                let ends = match self.world.bugs.contains(&PastBug::EndOnOwnPartitions) {
                    // What the reader gathered before: its own partitions' ends.
                    true => m.reading.keys().map(|&p| (p, self.world.records)).collect(),
                    false => self.ends(),
                };
                // This start's own reads count: its final commit is made
                // before the run returns.
                let read_here = m.read_to_end.clone();
                if unread(&ends, &state.positions, &BTreeMap::new(), &read_here).is_empty() {
                    state.members[member].phase = Phase::Ending;
                }
            }
        }
        Some(state)
    }

    fn format_action(&self, action: &SourceAction) -> String {
        action.to_string()
    }

    fn properties(&self) -> Vec<Property<Self>> {
        use rules::*;
        vec![
            Property::always(ENDS_ONLY_AT_THE_END, |_, s: &SourceState| !s.ended_short),
            Property::always(EVERY_RECORD_AT_MOST_ONCE, |_, s: &SourceState| {
                s.records.values().all(|&count| count <= 1)
            }),
            Property::sometimes(SOMETIMES_FINISHED, |_, s: &SourceState| {
                s.members.iter().all(|m| m.phase == Phase::Finished)
            }),
        ]
    }
}

impl crate::check::Explained for SourceModel {
    fn describe(&self, _before: &SourceState, action: &SourceAction) -> String {
        action.to_string()
    }

    fn explain(&self, state: &SourceState) -> String {
        let finished: Vec<usize> = (0..state.members.len())
            .filter(|&m| state.members[m].phase == Phase::Finished)
            .collect();
        let short: Vec<String> = self
            .partitions()
            .filter_map(|p| {
                let at = state.positions.get(&p).copied().unwrap_or(0);
                (at < self.world.records)
                    .then(|| format!("partition {p} at {at} of {}", self.world.records))
            })
            .collect();
        format!(
            "members finished: {finished:?}; the destination lacks: {}",
            if short.is_empty() {
                "nothing".to_string()
            } else {
                short.join(", ")
            }
        )
    }
}
