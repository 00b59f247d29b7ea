//! Committing a position group: its files and the source positions their
//! records advance, in one atomic step, through the output's position log
//! (the `position_log` module). Used by the file committer for committables
//! that carry a [`PositionMember`], and by the sink's start hook and
//! `committed_positions` to roll the log forward.
//!
//! ```text
//!  (a) read the log; roll forward: every logged part still pending is renamed into place
//!      (the log's directory synced first: an entry is seen before its writer synced it)
//!  (b) the group is in the log?                        ─▶ already committed (a replay)
//!  (c) every split at its advance's `from`?  no        ─▶ superseded: nothing applied, its pending parts removed
//!      the group whole, its parts there at their size? no ─▶ refused / superseded (see below)
//!  (d) entry N + 1 written exclusively (number taken ─▶ back to (a)) ◀── the commit point
//!  (e) its parts renamed into place, their directories synced ─▶ committed
//!      every SNAPSHOT_EVERY entries: a snapshot, once the entries' renames are durable
//! ```
//!
//! A crash after (d) leaves the group committed with parts still pending:
//! the next roll-forward (a replay of the same commit, another committer's
//! commit, another instance's start or `committed_positions`) renames them.
//! Renames never go over an existing file, and a part whose pending file is
//! gone was placed already (and maybe merged by compaction since): nothing
//! is ever renamed twice or brought back. A part found gone at its rename
//! is looked for where it may be now (its bucket and its segments, as a
//! replay looks): after the committer's own entry, a part found nowhere
//! fails the commit loudly (the positions moved; something else removed a
//! hidden file of the output), never a silent success. Until the renames of
//! a group are all done (a kill between two of them), readers of the output
//! see only some of its parts; the next roll-forward completes it.
//!
//! The snapshot written after an entry may fail (a full disk, or a
//! snapshot longer than the log reads back): the group is committed all
//! the same, so the commit warns and reports it committed; the next commit
//! writes the snapshot before its own entry, and fails (nothing of it
//! applied) while the snapshot cannot be written, so the log never grows
//! without bound.
//!
//! | found | outcome |
//! |---|---|
//! | the group in the log | already committed (each member then found where it is, as a replay of a plain committable) |
//! | a split not at its advance's `from` | superseded; the group's pending parts are removed (no one can commit them any more) |
//! | only some of the group's members in the commit call, or one of them twice | failed, unknown reason: a group commits whole, each member once |
//! | a part missing, or of another size than recorded | superseded: nothing applied, the positions did not move, so its records are read again from the destination |
//! | a part's target exists already | failed, unknown reason: nothing is overwritten |
//! | otherwise | committed |

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use sink_api::{Lineage, PositionAdvance, SinkError};
use tracing::{debug, warn};

use crate::blocking::assert_blocking;
use crate::compaction;
use crate::hidden_name::lineage_of;
use crate::identity;
use crate::io_error::io_error;
use crate::orphans::remove_orphans;
use crate::placement::{Placed, Placement, Touched};
use crate::position_group::{PositionGroupId, PositionMember};
use crate::position_log::{
    Appended, Backoff, Entry, LogState, LoggedPart, PositionLog, SNAPSHOT_EVERY,
};
use crate::segments::{self, size_of, Found};
use crate::state::FileCommittable;
use crate::stats::FileSinkStats;

/// How often one commit may find its entry's number taken before it gives
/// up (each time, another committer committed a group); it pauses up to
/// 10 ms before each new try (the position log's `Backoff`).
const MAX_APPENDS: u32 = 10_000;

/// The turn of one sink's committers at the position log: they commit one
/// group at a time, so that they do not race each other for numbers (other
/// instances sharing the output directory still may: the log is safe
/// either way), and the start hook's orphan sweep holds it too. Made by
/// the sink's builder.
#[derive(Debug, Default)]
pub(crate) struct LogTurn {
    turn: Mutex<()>,
    /// Whether this sink made the names of the log's directories durable
    /// ([`PositionLog::sync_parents`]).
    parents_synced: AtomicBool,
}

impl LogTurn {
    /// Waits for the turn.
    fn take(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A group, as one commit call holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupToCommit {
    pub id: PositionGroupId,
    pub advances: Vec<PositionAdvance>,
    /// The parts of the members in the call (members without a part carry
    /// only positions).
    pub parts: Vec<LoggedPart>,
    /// How many members the group has.
    pub members: u32,
    /// How many of them the call holds (each counted once).
    pub present: u32,
    /// How many committables of the call repeat a member already counted
    /// (the same pending part, or a second member without a part).
    pub repeated: u32,
}

impl GroupToCommit {
    /// Refused when the call does not hold each member exactly once: a
    /// group commits whole, or not at all.
    pub(crate) fn not_whole(&self) -> Option<GroupOutcome> {
        if self.repeated > 0 {
            return Some(GroupOutcome::Refused(format!(
                "the commit call holds a committable of {} more than once ({} times more): a \
                 group commits with each of its members exactly once",
                self.id, self.repeated
            )));
        }
        (self.present != self.members).then(|| {
            GroupOutcome::Refused(format!(
                "the commit call holds {} of the {} committables of {}: a group commits whole, \
                 with all of its members",
                self.present, self.members, self.id
            ))
        })
    }
}

/// Every committable's outcome, once each was decided.
pub(crate) fn all_decided<O>(outcomes: Vec<Option<O>>) -> Result<Vec<O>, SinkError> {
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.ok_or_else(|| {
                SinkError::msg(
                    "a committable was left without an outcome: a fault of the file sink",
                )
            })
        })
        .collect()
}

/// What became of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupOutcome {
    Committed,
    AlreadyCommitted,
    Superseded(String),
    /// Not committed, for a reason the sink does not understand.
    Refused(String),
}

/// The committables of one commit call, sorted out by [`sort_out`].
#[derive(Debug)]
pub(crate) struct SortedOut {
    /// The indexes of those of no group, in order.
    pub plain: Vec<usize>,
    /// Each group, with the indexes of its members.
    pub groups: Vec<(GroupToCommit, Vec<usize>)>,
}

/// The committables of one commit call sorted out: those of no group, and
/// each group with its members. A group's members must agree on its size
/// and advances. A member is known by its pending part (a group has at
/// most one member without a part: the writer makes one only for a group
/// of no part), so one held twice is counted once, and noted.
pub(crate) fn sort_out(committables: &[FileCommittable]) -> Result<SortedOut, SinkError> {
    let mut plain = Vec::new();
    let mut groups: BTreeMap<PositionGroupId, (GroupToCommit, Vec<usize>)> = BTreeMap::new();
    let mut seen: BTreeMap<&PositionGroupId, BTreeSet<&Path>> = BTreeMap::new();
    for (index, committable) in committables.iter().enumerate() {
        let Some(member) = &committable.positions else {
            plain.push(index);
            continue;
        };
        let PositionMember {
            group,
            members,
            advances,
        } = member;
        let (found, indexes) = groups.entry(group.clone()).or_insert_with(|| {
            let found = GroupToCommit {
                id: group.clone(),
                advances: advances.clone(),
                parts: Vec::new(),
                members: *members,
                present: 0,
                repeated: 0,
            };
            (found, Vec::new())
        });
        if found.members != *members || &found.advances != advances {
            return Err(SinkError::msg(format!(
                "the committables of {group} disagree on the group's size or its advances: the \
                 stored state is corrupt"
            ))
            .permanent());
        }
        indexes.push(index);
        if !seen
            .entry(group)
            .or_default()
            .insert(committable.pending.as_path())
        {
            found.repeated += 1;
            continue;
        }
        found.present += 1;
        if !committable.pending.as_os_str().is_empty() {
            found.parts.push(LoggedPart {
                pending: committable.pending.clone(),
                target: committable.target.clone(),
                size_bytes: committable.size_bytes,
                records: committable.records,
                upload: committable.upload.clone(),
            });
        }
    }
    Ok(SortedOut {
        plain,
        groups: groups.into_values().collect(),
    })
}

/// Commits groups and rolls the position log forward in the output
/// directory `base`. Blocking, every method.
pub(crate) struct LogWork<'a> {
    pub base: &'a Path,
    pub placement: &'a Placement,
    pub turn: &'a LogTurn,
    /// The committer's lineage: the start of its temporary files' names.
    pub tag: &'a str,
    pub stats: &'a FileSinkStats,
}

impl LogWork<'_> {
    /// Commits `group` (see the module's table). Every rename it made is
    /// durable when it returns.
    pub(crate) fn commit(&self, group: &GroupToCommit) -> Result<GroupOutcome, SinkError> {
        assert_blocking("a position group's commit");
        let _turn = self.turn.take();
        let log = PositionLog::of(self.base);
        let mut touched = Touched::default();
        let mut backoff = Backoff::default();
        for _ in 0..MAX_APPENDS {
            let mut state = log.read()?;
            self.parents_durable(&log)?;
            self.roll_forward(&state, &mut touched)?;
            let decided = self.decide(&state, group)?;
            if let Some(outcome) = decided {
                if !state.entries.is_empty() {
                    // The entries it was decided on outlive a power cut.
                    log.sync_entries()?;
                }
                touched.sync(&self.placement.syncs)?;
                return Ok(outcome);
            }
            if state.entries.len() >= SNAPSHOT_EVERY {
                // The snapshot after an earlier commit failed: written
                // before anything more is appended (the log stays
                // bounded), or this commit fails with nothing of it
                // applied. Then the log is read again.
                self.snapshot(&log, &state)?;
                continue;
            }
            let entry = Entry::new(
                group.id.clone(),
                group.advances.clone(),
                group.parts.clone(),
            );
            let seq = state.next(&log)?;
            if log.append(seq, &entry, self.tag)? == Appended::Taken {
                backoff.pause();
                continue;
            }
            // The log's directories may be new: their names durable before
            // the outcome is reported.
            self.parents_durable(&log)?;
            // A crash with the group committed and its parts still pending
            // (crash tests only): the next roll-forward renames them.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("file-positions-after-entry", |_| Err(SinkError::msg(
                "simulated crash at failpoint file-positions-after-entry"
            )));
            // Between the entry and its renames (tests only).
            #[cfg(feature = "failpoints")]
            fail::fail_point!("file-positions-before-renames");
            for part in &entry.parts {
                if self.place(seq, &entry, part, &mut touched, true)? {
                    self.stats.committed_file(part.records, part.size_bytes);
                }
            }
            touched.sync(&self.placement.syncs)?;
            state.push(seq, entry).map_err(|conflict| {
                SinkError::msg(format!(
                    "the group just committed does not follow the log it was checked against \
                     ({conflict}): a fault of the file sink"
                ))
            })?;
            if state.entries.len() >= SNAPSHOT_EVERY {
                // The group is committed, whatever becomes of the snapshot.
                if let Err(error) = self.snapshot(&log, &state) {
                    warn!(group = %group.id, %error, "a position group is committed, but the position log's snapshot could not be written: the next commit writes it before its own entry");
                }
            }
            return Ok(GroupOutcome::Committed);
        }
        Err(SinkError::msg(format!(
            "committing {} found the position log's next number taken {MAX_APPENDS} times in a \
             row: too many committers share the output directory {}",
            group.id,
            self.base.display()
        )))
    }

    /// Makes the names of the log's directories durable, once per sink
    /// (whoever created them), before anything the log says is reported.
    /// Called with the turn held.
    fn parents_durable(&self, log: &PositionLog) -> Result<(), SinkError> {
        if self.turn.parents_synced.load(Ordering::Acquire) {
            return Ok(());
        }
        if log.sync_parents()? {
            self.turn.parents_synced.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Steps (b) and (c) of the module's table against `state`: the
    /// outcome, or `None` when the group is to be appended.
    fn decide(
        &self,
        state: &LogState,
        group: &GroupToCommit,
    ) -> Result<Option<GroupOutcome>, SinkError> {
        if state.contains(&group.id) {
            return Ok(Some(GroupOutcome::AlreadyCommitted));
        }
        if let Err(conflict) = state.positions.check(&group.advances) {
            // Positions only move forward: the group can never be
            // committed, by anyone. Its pending parts would stay for good.
            for part in &group.parts {
                let pending = identity::resolve(self.base, &part.pending)?;
                if let Err(error) = std::fs::remove_file(&pending) {
                    if error.kind() != std::io::ErrorKind::NotFound {
                        warn!(file = %pending.display(), %error, "cannot remove a superseded part");
                    }
                }
            }
            return Ok(Some(GroupOutcome::Superseded(format!(
                "{}: {conflict}",
                group.id
            ))));
        }
        if let Some(refused) = group.not_whole() {
            return Ok(Some(refused));
        }
        for part in &group.parts {
            let pending = identity::resolve(self.base, &part.pending)?;
            let target = identity::resolve(self.base, &part.target)?;
            let looked = |path: &Path| {
                size_of(path).map_err(|e| io_error(format!("looking at {}", path.display()), e))
            };
            if looked(&target)?.is_some() {
                return Ok(Some(GroupOutcome::Refused(format!(
                    "the target {} of a pending part of {} exists already; refusing to overwrite it",
                    target.display(),
                    group.id
                ))));
            }
            let found = looked(&pending)?;
            if found != Some(part.size_bytes) {
                let what = match found {
                    None => "is gone".to_string(),
                    Some(size) => format!("holds {size} bytes, not {}", part.size_bytes),
                };
                warn!(group = %group.id, file = %pending.display(), "a part of a position group {what}: nothing of it is committed");
                return Ok(Some(GroupOutcome::Superseded(format!(
                    "the pending part {} of {} {what}: nothing of the group is committed and its \
                     source positions do not move, so its records are read again from the \
                     destination",
                    pending.display(),
                    group.id
                ))));
            }
        }
        Ok(None)
    }

    /// Renames `part` of `entry` (number `seq`) into place if it is still
    /// pending; whether this call renamed it. A pending file gone by the
    /// time of the rename was placed by another committer's roll-forward,
    /// or removed by something else: the part is looked for where it may
    /// be now, and its place synced with the rest. Found nowhere (or of
    /// another size) after the committer's `own` entry, it fails the
    /// commit: the group's positions moved without it. In another's
    /// roll-forward it is warned about: that commit's outcome was decided
    /// by its own committer.
    fn place(
        &self,
        seq: u64,
        entry: &Entry,
        part: &LoggedPart,
        touched: &mut Touched,
        own: bool,
    ) -> Result<bool, SinkError> {
        let pending = identity::resolve(self.base, &part.pending)?;
        let target = identity::resolve(self.base, &part.target)?;
        let refused = |reason: String| {
            SinkError::msg(format!(
                "entry {seq} of the position log of {} ({}) is committed, but its part {} cannot \
                 be put in place: {reason}",
                self.base.display(),
                entry.group,
                part.pending.display()
            ))
        };
        match self
            .placement
            .place(&pending, &target, part.size_bytes, touched)?
        {
            Placed::Moved => return Ok(true),
            Placed::Refused(reason) => return Err(refused(reason)),
            Placed::Gone => {}
        }
        let (Some(bucket), Some(name)) = (target.parent(), target.file_name()) else {
            return Err(refused(format!(
                "the target {} names no file in a directory",
                target.display()
            )));
        };
        let name = name.to_string_lossy();
        let lineage = lineage_of(&pending);
        let look = || {
            segments::find_committed(bucket, &name, lineage.as_deref())
                .map_err(|e| io_error(format!("looking for {name} in {}", bucket.display()), e))
        };
        let mut found = look()?;
        if matches!(found, Found::Nowhere) && self.placement.compaction.is_some() {
            // A merge under way may hold it between two places.
            let _lock = compaction::lock(self.base)?;
            found = look()?;
        }
        let problem = match found {
            Found::File(path, size) if size == part.size_bytes => {
                touched.placed_at(bucket, &path);
                return Ok(false);
            }
            Found::Merged(segment, size) if size == part.size_bytes => {
                touched.placed_at(bucket, &segment.join(&*name));
                return Ok(false);
            }
            Found::File(path, size) | Found::Merged(path, size) => format!(
                "it vanished while it was renamed, and {} holds {size} bytes, not the {} recorded",
                path.display(),
                part.size_bytes
            ),
            Found::Nowhere => format!(
                "it vanished while it was renamed, and {name} is nowhere in {} (nor in a \
                 segment of it)",
                bucket.display()
            ),
        };
        if !own {
            warn!(entry = seq, group = %entry.group, file = %pending.display(), "a part of a committed position group is gone from the output: {problem}");
            return Ok(false);
        }
        Err(SinkError::msg(format!(
            "entry {seq} of the position log of {} ({}) is committed and its source positions \
             moved, but its part {} is lost: {problem}; its {} records are lost (something other \
             than this sink removed or renamed a hidden file of the output directory)",
            self.base.display(),
            entry.group,
            part.pending.display(),
            part.records
        )))
    }

    /// Step (a): renames every part of `state`'s entries whose pending file
    /// is still there, once the entries are durable (their writer may not
    /// have synced them yet). A part already placed is never touched again.
    fn roll_forward(&self, state: &LogState, touched: &mut Touched) -> Result<(), SinkError> {
        let mut synced = false;
        for (seq, entry) in &state.entries {
            for part in &entry.parts {
                let pending = identity::resolve(self.base, &part.pending)?;
                let present = size_of(&pending)
                    .map_err(|e| io_error(format!("looking at {}", pending.display()), e))?;
                if present.is_none() {
                    continue;
                }
                if !synced {
                    PositionLog::of(self.base).sync_entries()?;
                    synced = true;
                }
                if self.place(*seq, entry, part, touched, false)? {
                    debug!(entry = seq, group = %entry.group, file = %part.target.display(), "rolled a committed part forward");
                }
            }
        }
        Ok(())
    }

    /// Reads the log and rolls it forward, durably: what the output holds
    /// is then what the log says. The log as read.
    pub(crate) fn settle(&self) -> Result<LogState, SinkError> {
        assert_blocking("rolling the position log forward");
        let _turn = self.turn.take();
        self.settle_in_turn()
    }

    /// [`settle`](Self::settle), with the turn held by the caller.
    fn settle_in_turn(&self) -> Result<LogState, SinkError> {
        let log = PositionLog::of(self.base);
        if !log.exists()? {
            return Ok(LogState::default());
        }
        let state = log.read()?;
        self.parents_durable(&log)?;
        if !state.entries.is_empty() {
            // What is answered must survive a power cut.
            log.sync_entries()?;
        }
        let mut touched = Touched::default();
        self.roll_forward(&state, &mut touched)?;
        touched.sync(&self.placement.syncs)?;
        Ok(state)
    }

    /// A start's clean-up, with the turn held throughout so that none of
    /// this sink's committers logs a group in between: rolls the log
    /// forward, removes this committer's temporary log files, and when
    /// `sweep`, removes the hidden parts of `lineage` that neither `kept`
    /// (what the restored checkpoint names) nor any entry of the log names
    /// (the `orphans` module). How many parts it removed.
    pub(crate) fn settle_and_sweep(
        &self,
        lineage: &Lineage,
        kept: &HashSet<PathBuf>,
        sweep: bool,
    ) -> Result<u64, SinkError> {
        assert_blocking("a start's clean-up of the output");
        let _turn = self.turn.take();
        let log = PositionLog::of(self.base);
        let mut kept = kept.clone();
        if log.exists()? {
            let state = self.settle_in_turn()?;
            log.remove_temporaries(self.tag)?;
            // Rolled forward just now, so none should be pending; but a
            // part a log entry names is never an orphan, whatever happened
            // since.
            kept.extend(
                (state.entries.iter())
                    .flat_map(|(_, entry)| entry.parts.iter().map(|part| part.pending.clone())),
            );
        }
        if !sweep {
            return Ok(0);
        }
        // Between the roll-forward and the sweep (tests only).
        #[cfg(feature = "failpoints")]
        fail::fail_point!("file-start-before-sweep");
        Ok(remove_orphans(self.base, lineage, &kept)?.len() as u64)
    }

    /// Writes a snapshot of `state`, whose entries' parts were all rolled
    /// forward, once each part's place is durable (another committer may
    /// have renamed it and died before its sync). A part found nowhere was
    /// removed from the output after its commit: warned about, nothing
    /// else (the snapshot only says the group was committed).
    fn snapshot(&self, log: &PositionLog, state: &LogState) -> Result<(), SinkError> {
        let mut touched = Touched::default();
        for (_, entry) in &state.entries {
            for part in &entry.parts {
                let pending = identity::resolve(self.base, &part.pending)?;
                let target = identity::resolve(self.base, &part.target)?;
                let (Some(bucket), Some(name)) = (target.parent(), target.file_name()) else {
                    continue;
                };
                let name = name.to_string_lossy();
                let lineage = lineage_of(&pending);
                let found =
                    segments::find_committed(bucket, &name, lineage.as_deref()).map_err(|e| {
                        io_error(format!("looking for {name} in {}", bucket.display()), e)
                    })?;
                match found {
                    Found::File(path, _) => touched.placed_at(bucket, &path),
                    Found::Merged(segment, _) => touched.placed_at(bucket, &segment.join(&*name)),
                    Found::Nowhere => {
                        warn!(group = %entry.group, file = %target.display(), "a committed part is gone from the output")
                    }
                }
            }
        }
        touched.sync(&self.placement.syncs)?;
        log.write_snapshot(state, self.tag)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;
    use std::sync::Arc;

    use sink_api::{Generation, Lineage, ManualClock, SplitKey};

    use super::*;
    use crate::blocking::on_this_thread;
    use crate::compaction::{Compaction, CompactionPolicy};
    use crate::hidden_name::hidden_name;
    use crate::segments::{Manifest, Source, MANIFEST, MANIFEST_FORMAT};

    /// One instance of the sink, as far as the log is concerned: its
    /// placement, its turn at the log, its counters.
    struct Instance {
        placement: Placement,
        turn: LogTurn,
        stats: FileSinkStats,
        lineage: &'static str,
    }

    impl Instance {
        fn new(lineage: &'static str) -> Instance {
            Instance {
                placement: Placement {
                    syncs: Arc::default(),
                    compaction: None,
                    clock: Arc::new(ManualClock::new(1_000)),
                },
                turn: LogTurn::default(),
                stats: FileSinkStats::default(),
                lineage,
            }
        }

        /// An instance whose commits go into segments, as with compaction.
        fn compacting(lineage: &'static str) -> Instance {
            let compaction = Arc::new(Compaction::new(CompactionPolicy::default()));
            on_this_thread(|| {
                compaction
                    .segments
                    .begin(&Lineage::new(lineage), Generation(1))
            });
            let mut instance = Instance::new(lineage);
            instance.placement.compaction = Some(compaction);
            instance
        }

        fn work<'a>(&'a self, base: &'a Path) -> LogWork<'a> {
            LogWork {
                base,
                placement: &self.placement,
                turn: &self.turn,
                tag: self.lineage,
                stats: &self.stats,
            }
        }

        fn commit(&self, base: &Path, group: &GroupToCommit) -> GroupOutcome {
            on_this_thread(|| self.work(base).commit(group)).unwrap()
        }
    }

    fn advance(split: &str, from: Option<u64>, to: u64) -> PositionAdvance {
        PositionAdvance {
            key: SplitKey::new("scope", split),
            from,
            to,
        }
    }

    /// A pending part `name` of lineage `lineage` holding `text`, written
    /// under `base`.
    fn part(base: &Path, lineage: &str, name: &str, text: &str) -> LoggedPart {
        let pending = PathBuf::from(hidden_name(name, &Lineage::new(lineage)));
        fs::write(base.join(&pending), text).unwrap();
        LoggedPart {
            pending,
            target: name.into(),
            size_bytes: text.len() as u64,
            records: text.lines().count() as u64,
            upload: None,
        }
    }

    fn group(
        writer: &str,
        number: u64,
        advances: Vec<PositionAdvance>,
        parts: Vec<LoggedPart>,
    ) -> GroupToCommit {
        let members = parts.len().max(1) as u32;
        GroupToCommit {
            id: PositionGroupId {
                writer: writer.into(),
                number,
                checkpoint: number + 1,
            },
            advances,
            parts,
            members,
            present: members,
            repeated: 0,
        }
    }

    fn visible(base: &Path) -> Vec<String> {
        let mut lines: Vec<String> = crate::read_finished(base)
            .unwrap()
            .into_iter()
            .flat_map(|(_, bytes)| {
                String::from_utf8(bytes)
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn two_instances_racing_for_a_number_one_wins_the_other_reads_again() {
        for round in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let base = dir.path();
            let (a, b) = (Instance::new("la"), Instance::new("lb"));
            // Both start split s0 from nothing: one of them is superseded.
            // Split s1 (a's) and s2 (b's) are theirs alone: both committed.
            let a_same = group(
                "a",
                0,
                vec![advance("s0", None, 3)],
                vec![part(base, "la", "a0", "a0\n")],
            );
            let b_same = group(
                "b",
                0,
                vec![advance("s0", None, 5)],
                vec![part(base, "lb", "b0", "b0\n")],
            );
            let a_own = group(
                "a",
                1,
                vec![advance("s1", None, 1)],
                vec![part(base, "la", "a1", "a1\n")],
            );
            let b_own = group(
                "b",
                1,
                vec![advance("s2", None, 1)],
                vec![part(base, "lb", "b1", "b1\n")],
            );
            let barrier = std::sync::Barrier::new(2);
            let run = |instance: &Instance, groups: [&GroupToCommit; 2]| {
                barrier.wait();
                groups.map(|g| instance.commit(base, g))
            };
            let (a_outcomes, b_outcomes) = std::thread::scope(|scope| {
                let a_run = scope.spawn(|| run(&a, [&a_same, &a_own]));
                let b_run = scope.spawn(|| run(&b, [&b_same, &b_own]));
                (a_run.join().unwrap(), b_run.join().unwrap())
            });
            let same = [&a_outcomes[0], &b_outcomes[0]];
            let winners = same
                .iter()
                .filter(|o| ***o == GroupOutcome::Committed)
                .count();
            let superseded = same
                .iter()
                .filter(|o| matches!(o, GroupOutcome::Superseded(_)))
                .count();
            assert_eq!((winners, superseded), (1, 1), "round {round}: {same:?}");
            assert_eq!(a_outcomes[1], GroupOutcome::Committed);
            assert_eq!(b_outcomes[1], GroupOutcome::Committed);
            let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
            assert_eq!(state.last(), 3, "three groups, numbers 1 to 3");
            let winner = if a_outcomes[0] == GroupOutcome::Committed {
                "a0"
            } else {
                "b0"
            };
            let mut expected = vec![winner, "a1", "b1"];
            expected.sort_unstable();
            assert_eq!(visible(base), expected);
            // The loser's pending part is gone: no one can ever commit it.
            let loser = if winner == "a0" { &b_same } else { &a_same };
            assert!(!base.join(&loser.parts[0].pending).exists());
        }
    }

    #[test]
    fn a_group_logged_but_not_renamed_is_rolled_forward_by_another_committer() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let (a, b) = (Instance::new("la"), Instance::new("lb"));
        // Instance A wrote its entry and died before its renames.
        let cut = group(
            "a",
            0,
            vec![advance("s0", None, 2)],
            vec![part(base, "la", "a0", "1\n2\n")],
        );
        let entry = Entry::new(cut.id.clone(), cut.advances.clone(), cut.parts.clone());
        on_this_thread(|| PositionLog::of(base).append(1, &entry, "la")).unwrap();
        assert!(visible(base).is_empty(), "committed, not yet visible");
        // B commits a group of its own: A's part is put in place first.
        let own = group(
            "b",
            0,
            vec![advance("s1", None, 1)],
            vec![part(base, "lb", "b0", "3\n")],
        );
        assert_eq!(b.commit(base, &own), GroupOutcome::Committed);
        assert_eq!(visible(base), ["1", "2", "3"]);
        assert!(!base.join(&cut.parts[0].pending).exists());
        // A, back, replays its commit: a replay, nothing twice.
        assert_eq!(a.commit(base, &cut), GroupOutcome::AlreadyCommitted);
        assert_eq!(visible(base), ["1", "2", "3"]);
        // A start (or committed_positions) completes a cut commit too.
        let later = group(
            "a",
            1,
            vec![advance("s0", Some(2), 3)],
            vec![part(base, "la", "a1", "4\n")],
        );
        let entry = Entry::new(
            later.id.clone(),
            later.advances.clone(),
            later.parts.clone(),
        );
        on_this_thread(|| PositionLog::of(base).append(3, &entry, "la")).unwrap();
        let state = on_this_thread(|| b.work(base).settle()).unwrap();
        assert_eq!(visible(base), ["1", "2", "3", "4"]);
        assert_eq!(state.positions.scope("scope").get("s0"), Some(&3));
    }

    #[test]
    fn after_a_snapshot_a_replay_is_recognised_and_a_superseded_group_stays_superseded() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        let mut groups = Vec::new();
        let mut position = None;
        for number in 0..70u64 {
            let text = format!("{number}\n");
            let parts = vec![part(base, "l", &format!("p{number}"), &text)];
            let to = number + 1;
            // Group 3 finds its split moved (another owner): superseded,
            // while the writer's later groups commit.
            let from = if number == 3 { Some(999) } else { position };
            let g = group("w", number, vec![advance("s", from, to)], parts);
            let outcome = instance.commit(base, &g);
            if number == 3 {
                assert!(
                    matches!(outcome, GroupOutcome::Superseded(_)),
                    "{outcome:?}"
                );
            } else {
                assert_eq!(outcome, GroupOutcome::Committed, "group {number}");
                position = Some(to);
            }
            groups.push(g);
        }
        let log = base.join(crate::position_log::POSITIONS_DIR);
        let snapshots: Vec<_> = fs::read_dir(log.join("snapshot")).unwrap().collect();
        assert_eq!(snapshots.len(), 1, "one snapshot");
        let entries = fs::read_dir(log.join("log")).unwrap().count();
        assert!(entries < SNAPSHOT_EVERY, "entries replaced: {entries} left");
        let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
        assert_eq!(state.covers, SNAPSHOT_EVERY as u64);
        assert_eq!(state.positions.scope("scope").get("s"), Some(&70));
        // Replays of groups covered by the snapshot and after it.
        for number in [0, 1, 2, 4, 40, 66, 69] {
            assert_eq!(
                instance.commit(base, &groups[number]),
                GroupOutcome::AlreadyCommitted,
                "group {number}"
            );
        }
        // The hole stays a hole: not taken for a replay.
        assert!(matches!(
            instance.commit(base, &groups[3]),
            GroupOutcome::Superseded(_)
        ));
        let lines = visible(base);
        assert_eq!(lines.len(), 69, "every committed group once, group 3 never");
        assert!(!lines.contains(&"3".to_string()));
        // And the log goes on from the snapshot.
        let next = group(
            "w",
            70,
            vec![advance("s", Some(70), 71)],
            vec![part(base, "l", "p70", "70\n")],
        );
        assert_eq!(instance.commit(base, &next), GroupOutcome::Committed);
    }

    #[test]
    fn a_part_merged_away_is_not_brought_back_and_its_group_is_a_replay() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::compacting("l");
        let first = group(
            "w",
            0,
            vec![advance("s", None, 2)],
            vec![part(base, "l", "p0", "0\n"), part(base, "l", "p1", "1\n")],
        );
        assert_eq!(instance.commit(base, &first), GroupOutcome::Committed);
        let segment = base.join(crate::segments::segment_name(
            &Lineage::new("l"),
            Generation(1),
            0,
        ));
        assert!(segment.join("p0").exists() && segment.join("p1").exists());
        // A merge, as the compactor makes it: the small files replaced by
        // one, with a manifest naming them.
        fs::remove_file(segment.join("p0")).unwrap();
        fs::remove_file(segment.join("p1")).unwrap();
        fs::write(segment.join("part-merged"), "0\n1\n").unwrap();
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            merged: "part-merged".into(),
            sources: vec![
                Source {
                    name: "p0".into(),
                    bytes: 2,
                },
                Source {
                    name: "p1".into(),
                    bytes: 2,
                },
            ],
        };
        fs::write(
            segment.join(MANIFEST),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        // Rolling forward brings nothing back; the replay is recognised.
        on_this_thread(|| instance.work(base).settle()).unwrap();
        assert_eq!(
            instance.commit(base, &first),
            GroupOutcome::AlreadyCommitted
        );
        assert_eq!(visible(base), ["0", "1"]);
        // A snapshot over merged parts: their places are found.
        let mut from = Some(2);
        for number in 1..(SNAPSHOT_EVERY as u64 + 1) {
            let g = group(
                "w",
                number,
                vec![advance("s", from, number + 2)],
                vec![part(
                    base,
                    "l",
                    &format!("q{number}"),
                    &format!("{}\n", number + 1),
                )],
            );
            assert_eq!(instance.commit(base, &g), GroupOutcome::Committed);
            from = Some(number + 2);
        }
        let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
        assert_eq!(state.covers, SNAPSHOT_EVERY as u64);
        assert_eq!(visible(base).len(), SNAPSHOT_EVERY + 2);
        assert_eq!(
            instance.commit(base, &first),
            GroupOutcome::AlreadyCommitted
        );
    }

    #[test]
    fn a_group_whose_part_is_missing_or_changed_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        let g = group(
            "w",
            0,
            vec![advance("s", None, 2)],
            vec![part(base, "l", "p0", "0\n"), part(base, "l", "p1", "1\n")],
        );
        fs::write(base.join(&g.parts[1].pending), "1\n1\n").unwrap();
        let outcome = instance.commit(base, &g);
        match &outcome {
            GroupOutcome::Superseded(why) => assert!(why.contains("holds 4 bytes, not 2"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(visible(base).is_empty(), "nothing of the group");
        let state = on_this_thread(|| instance.work(base).settle()).unwrap();
        assert!(
            state.positions.scope("scope").is_empty(),
            "no position moved"
        );
        assert!(base.join(&g.parts[0].pending).exists(), "left as it is");
        fs::remove_file(base.join(&g.parts[1].pending)).unwrap();
        match instance.commit(base, &g) {
            GroupOutcome::Superseded(why) => assert!(why.contains("is gone"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Half a group is refused, whatever its parts.
        let mut half = g.clone();
        half.present = 1;
        assert!(matches!(
            instance.commit(base, &half),
            GroupOutcome::Refused(_)
        ));
    }

    #[test]
    fn members_of_one_group_are_gathered_and_must_agree() {
        let member = |number, members, to| {
            Some(PositionMember {
                group: PositionGroupId {
                    writer: "w".into(),
                    number,
                    checkpoint: 1,
                },
                members,
                advances: vec![advance("s", None, to)],
            })
        };
        let committable = |pending: &str, positions| FileCommittable {
            output_id: "id".into(),
            output_dir: "/out".into(),
            pending: pending.into(),
            target: pending.trim_start_matches('.').into(),
            size_bytes: 1,
            records: 1,
            upload: None,
            positions,
        };
        let committables = vec![
            committable(".a", member(0, 2, 5)),
            committable(".plain", None),
            committable(".b", member(0, 2, 5)),
            // Only positions.
            committable("", member(1, 1, 9)),
        ];
        let SortedOut { plain, groups } = sort_out(&committables).unwrap();
        assert_eq!(plain, vec![1]);
        assert_eq!(groups.len(), 2);
        assert_eq!((groups[0].0.present, groups[0].0.parts.len()), (2, 2));
        assert_eq!(groups[0].1, vec![0, 2]);
        assert_eq!((groups[1].0.present, groups[1].0.parts.len()), (1, 0));
        let disagreeing = vec![
            committable(".a", member(0, 2, 5)),
            committable(".b", member(0, 2, 6)),
        ];
        let error = sort_out(&disagreeing).unwrap_err();
        assert!(
            error.is_permanent() && error.to_string().contains("disagree"),
            "{error}"
        );
        // One member twice and the other not at all: counted once, noted.
        let twice = vec![
            committable(".a", member(0, 2, 5)),
            committable(".a", member(0, 2, 5)),
        ];
        let SortedOut { groups, .. } = sort_out(&twice).unwrap();
        let (group, indexes) = &groups[0];
        assert_eq!(
            (group.present, group.repeated, group.parts.len()),
            (1, 1, 1)
        );
        assert_eq!(indexes, &vec![0, 1], "both get the group's outcome");
    }

    #[test]
    fn a_call_holding_one_member_twice_and_another_not_at_all_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        let whole = group(
            "w",
            0,
            vec![advance("s", None, 2)],
            vec![part(base, "l", "p0", "0\n"), part(base, "l", "p1", "1\n")],
        );
        // As sort_out makes it of a call holding p0 twice and p1 not.
        let mut twice = whole.clone();
        twice.parts = vec![whole.parts[0].clone()];
        (twice.present, twice.repeated) = (1, 1);
        match instance.commit(base, &twice) {
            GroupOutcome::Refused(why) => assert!(why.contains("more than once"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(visible(base).is_empty());
        let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
        assert!(state.positions.scope("scope").is_empty(), "nothing applied");
        assert_eq!(instance.commit(base, &whole), GroupOutcome::Committed);
        assert_eq!(visible(base), ["0", "1"]);
    }

    /// The snapshot JSON the log's newest snapshot holds.
    fn newest_snapshot(base: &Path) -> serde_json::Value {
        let dir = base
            .join(crate::position_log::POSITIONS_DIR)
            .join("snapshot");
        let newest = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .expect("a snapshot");
        serde_json::from_slice(&fs::read(newest).unwrap()).unwrap()
    }

    #[test]
    fn the_committed_groups_of_many_starts_of_a_job_stay_one_family_per_subtask() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        let starts = 3 * SNAPSHOT_EVERY as u64 + 10;
        let mut position = None;
        let mut last = None;
        for generation in 1..=starts {
            // Each start of the job commits one group of subtask 0, its
            // group 0, and its group 1 is superseded on the last start.
            let writer = format!("job-l-g{generation}-s0");
            let to = generation * 10;
            let g = group(
                &writer,
                0,
                vec![advance("s", position, to)],
                vec![part(base, "l", &format!("p{generation}"), "x\n")],
            );
            assert_eq!(instance.commit(base, &g), GroupOutcome::Committed);
            position = Some(to);
            last = Some(g);
        }
        let last = last.unwrap();
        let snapshot = newest_snapshot(base);
        let committed = snapshot["committed"].as_object().unwrap();
        assert_eq!(
            committed.len(),
            1,
            "one family for {starts} starts: {committed:?}"
        );
        // Past the snapshots: the newest start's replay is recognised.
        let log = base.join(crate::position_log::POSITIONS_DIR).join("log");
        assert!(fs::read_dir(log).unwrap().count() < SNAPSHOT_EVERY);
        assert_eq!(instance.commit(base, &last), GroupOutcome::AlreadyCommitted);
        // Its next group, superseded, stays superseded once snapshotted.
        let superseded = group(
            &last.id.writer,
            1,
            vec![advance("s", Some(1), 2)],
            vec![part(base, "l", "late", "y\n")],
        );
        assert!(matches!(
            instance.commit(base, &superseded),
            GroupOutcome::Superseded(_)
        ));
        let mut from = position;
        for number in 2..(SNAPSHOT_EVERY as u64 + 2) {
            let to = from.unwrap() + 1;
            let g = group(
                &last.id.writer,
                number,
                vec![advance("s", from, to)],
                vec![part(base, "l", &format!("q{number}"), "z\n")],
            );
            assert_eq!(instance.commit(base, &g), GroupOutcome::Committed);
            from = Some(to);
        }
        let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
        assert!(state.covers > starts, "snapshotted since");
        assert!(matches!(
            instance.commit(base, &superseded),
            GroupOutcome::Superseded(_)
        ));
        assert_eq!(instance.commit(base, &last), GroupOutcome::AlreadyCommitted);
    }

    #[test]
    fn a_snapshot_that_cannot_be_written_leaves_the_group_committed_and_stops_the_next() {
        use crate::position_log::tests::with_cap;
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        // Entries well under the cap; the positions of their 64 splits
        // together over it.
        let cap = 8 << 10;
        let commit = |number: u64| {
            let split = format!("{number:0>200}");
            let g = group(
                "w",
                number,
                vec![advance(&split, None, 1)],
                vec![part(
                    base,
                    "l",
                    &format!("p{number}"),
                    &format!("{number}\n"),
                )],
            );
            let outcome = on_this_thread(|| with_cap(cap, || instance.work(base).commit(&g)));
            (g, outcome)
        };
        for number in 0..SNAPSHOT_EVERY as u64 {
            let (_, outcome) = commit(number);
            assert_eq!(outcome.unwrap(), GroupOutcome::Committed, "group {number}");
        }
        // The 64th entry's snapshot was refused: its group is committed all
        // the same, and the log is whole and readable.
        let log = base.join(crate::position_log::POSITIONS_DIR);
        assert!(
            !log.join("snapshot").exists()
                || fs::read_dir(log.join("snapshot")).unwrap().count() == 0
        );
        assert_eq!(visible(base).len(), SNAPSHOT_EVERY);
        let state = on_this_thread(|| with_cap(cap, || PositionLog::of(base).read())).unwrap();
        assert_eq!(state.entries.len(), SNAPSHOT_EVERY);
        // The next commit writes the snapshot first, and fails while it
        // cannot: nothing of it applied.
        let (next, outcome) = commit(SNAPSHOT_EVERY as u64);
        let error = outcome.unwrap_err();
        assert!(
            error.is_permanent() && error.to_string().contains("snapshot"),
            "{error}"
        );
        assert!(base.join(&next.parts[0].pending).exists());
        assert_eq!(visible(base).len(), SNAPSHOT_EVERY);
        // Once it can (here: a larger cap), the snapshot goes first, then
        // the group.
        let outcome = on_this_thread(|| with_cap(1 << 20, || instance.work(base).commit(&next)));
        assert_eq!(outcome.unwrap(), GroupOutcome::Committed);
        let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
        assert_eq!(
            (state.covers, state.entries.len()),
            (SNAPSHOT_EVERY as u64, 1)
        );
        assert_eq!(visible(base).len(), SNAPSHOT_EVERY + 1);
    }

    #[test]
    fn a_log_at_the_largest_number_is_a_clear_error_not_an_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let snapshots = base
            .join(crate::position_log::POSITIONS_DIR)
            .join("snapshot");
        fs::create_dir_all(&snapshots).unwrap();
        fs::write(
            snapshots.join(format!("{:020}", u64::MAX)),
            format!(
                r#"{{"format":1,"covers":{},"positions":[],"committed":{{}}}}"#,
                u64::MAX
            ),
        )
        .unwrap();
        let instance = Instance::new("l");
        let g = group(
            "w",
            0,
            vec![advance("s", None, 1)],
            vec![part(base, "l", "p0", "0\n")],
        );
        let error = on_this_thread(|| instance.work(base).commit(&g)).unwrap_err();
        assert!(
            error.is_permanent() && error.to_string().contains("no entry can follow"),
            "{error}"
        );
        assert!(base.join(&g.parts[0].pending).exists(), "nothing applied");
    }

    /// Runs the failpoint tests one at a time: they configure the same
    /// points, which are process-wide.
    #[cfg(feature = "failpoints")]
    static FAILPOINTS: Mutex<()> = Mutex::new(());

    /// Whether this thread is named `name`.
    #[cfg(feature = "failpoints")]
    fn on_thread(name: &str) -> bool {
        std::thread::current().name() == Some(name)
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_part_gone_between_its_entry_and_its_rename_is_found_or_fails_the_commit() {
        let _serial = FAILPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        let moved = group(
            "w",
            0,
            vec![advance("s", None, 1)],
            vec![part(base, "l", "p0", "0\n")],
        );
        let removed = group(
            "w",
            1,
            vec![advance("s", Some(1), 2)],
            vec![part(base, "l", "p1", "1\n")],
        );
        let (pending, target) = (
            base.join(&moved.parts[0].pending),
            base.join(&moved.parts[0].target),
        );
        let lost = base.join(&removed.parts[0].pending);
        fail::cfg_callback("file-positions-before-renames", move || {
            // Another instance's roll-forward placed it meanwhile.
            if on_thread("gone-placed") {
                fs::rename(&pending, &target).unwrap();
            }
            // Something else removed it.
            if on_thread("gone-removed") {
                fs::remove_file(&lost).unwrap();
            }
        })
        .unwrap();
        let run = |name: &str, g: &GroupToCommit| {
            std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(scope, || on_this_thread(|| instance.work(base).commit(g)))
                    .unwrap()
                    .join()
                    .unwrap()
            })
        };
        let placed = run("gone-placed", &moved);
        let gone = run("gone-removed", &removed);
        fail::remove("file-positions-before-renames");
        assert_eq!(placed.unwrap(), GroupOutcome::Committed);
        let error = gone.expect_err("a part found nowhere after the entry fails the commit");
        assert!(
            error.to_string().contains("is lost") && error.to_string().contains("p1"),
            "{error}"
        );
        assert_eq!(visible(base), ["0"]);
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn the_start_sweep_removes_no_part_a_committer_of_the_sink_logs_meanwhile() {
        use std::sync::mpsc;
        use std::time::Duration;
        let _serial = FAILPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let instance = Instance::new("l");
        let g = group(
            "w",
            0,
            vec![advance("s", None, 1)],
            vec![part(base, "l", "p0", "0\n")],
        );
        let wait = Duration::from_secs(10);
        let (paused, sweep_paused) = mpsc::channel();
        let (resume_sweep, sweep_resumed) = mpsc::channel::<()>();
        let sweep_resumed = Mutex::new(sweep_resumed);
        fail::cfg_callback("file-start-before-sweep", move || {
            if on_thread("race-start") {
                paused.send(()).unwrap();
                let _ = sweep_resumed.lock().unwrap().recv_timeout(wait);
            }
        })
        .unwrap();
        let (logged, committer_logged) = mpsc::channel();
        let (resume_renames, renames_resumed) = mpsc::channel::<()>();
        let renames_resumed = Mutex::new(renames_resumed);
        fail::cfg_callback("file-positions-before-renames", move || {
            if on_thread("race-committer") {
                logged.send(()).unwrap();
                let _ = renames_resumed.lock().unwrap().recv_timeout(wait);
            }
        })
        .unwrap();
        let (swept, outcome) = std::thread::scope(|scope| {
            let start = std::thread::Builder::new()
                .name("race-start".into())
                .spawn_scoped(scope, || {
                    on_this_thread(|| {
                        instance.work(base).settle_and_sweep(
                            &Lineage::new("l"),
                            &Default::default(),
                            true,
                        )
                    })
                })
                .unwrap();
            sweep_paused.recv_timeout(wait).expect("the sweep pauses");
            let committer = std::thread::Builder::new()
                .name("race-committer".into())
                .spawn_scoped(scope, || on_this_thread(|| instance.work(base).commit(&g)))
                .unwrap();
            // The committer logs its group now, if the sweep lets it.
            let logged = committer_logged
                .recv_timeout(Duration::from_millis(500))
                .is_ok();
            resume_sweep.send(()).unwrap();
            let swept = start.join().unwrap();
            if logged {
                resume_renames.send(()).unwrap();
            }
            (swept, committer.join().unwrap())
        });
        fail::remove("file-start-before-sweep");
        fail::remove("file-positions-before-renames");
        swept.unwrap();
        let state = on_this_thread(|| PositionLog::of(base).read()).unwrap();
        match outcome {
            // Logged before the sweep: its part is not an orphan.
            Ok(GroupOutcome::Committed) => assert_eq!(visible(base), ["0"]),
            // Swept first: its part is gone, and nothing of it applied.
            Ok(GroupOutcome::Superseded(_)) => {
                assert!(state.positions.scope("scope").is_empty());
                assert!(visible(base).is_empty());
            }
            other => panic!("the sweep removed the part of a logged group: {other:?}"),
        }
    }
}
