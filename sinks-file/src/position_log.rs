//! The position log: the files in the output directory that say which
//! position groups were committed, and so where the output's data of each
//! source split ends.
//!
//! ```text
//!  <out>/.positions/log/00000000000000000065        an entry: a group's id, advances and parts
//!  <out>/.positions/log/00000000000000000066           (pending name → visible name, size)
//!  <out>/.positions/snapshot/00000000000000000064   the positions and the committed groups of entries 1..=64
//!  <out>/.positions/tmp/<lineage>-<uuid>            a file being written, linked into place whole
//! ```
//!
//! Everything is under a hidden directory: readers of the output skip it.
//! An entry is written whole under a temporary name, fsynced, and
//! hard-linked to its number: a link fails if the number is taken, so of
//! two committers (of this instance or another sharing the directory) that
//! read the log up to entry `N` and both want `N + 1`, exactly one gets it,
//! and the other reads the log again. The entry is the commit point of its
//! group (the `position_commit` module renames its parts afterwards, and
//! rolls forward the parts of any entry whose renames a crash cut short).
//!
//! Every [`SNAPSHOT_EVERY`] entries a committer writes a snapshot covering
//! them (once their parts are renamed and durable), then removes them: the
//! log stays bounded. A snapshot keeps the positions and the committed
//! groups as a [`GroupSet`] (per job life and subtask, the ranges of group
//! numbers of its newest start), which grows with the splits and the
//! job's lives and subtasks, not with its starts or checkpoints.
//!
//! A reader takes the newest snapshot, the entries after it, and looks at
//! the snapshots again: if a newer one appeared meanwhile (entries may have
//! been removed under it), it reads again. An entry linked under a number
//! that a snapshot already covers (the number was taken, covered and its
//! entry removed while its writer was away) is void: its writer removes it
//! and tries again, and readers pass over it, as over every entry a
//! snapshot covers.
//!
//! Files are JSON, at most [`MAX_FILE_BYTES`] long, read with that cap: a
//! damaged file is a clear error naming it, never a panic or an allocation
//! the file cannot back. No file longer than the cap is ever linked: an
//! entry or a snapshot that would be is refused before anything changes
//! ([`LogError::TooLong`]), so the log stays readable.
//!
//! On an object store output the log is the same objects under
//! `<prefix>/.positions/`: an entry or a snapshot is created whole by a
//! conditional put (`PutMode::Create`, refused when the key exists) in
//! place of the link, and nothing needs a sync. Its calls are blocking
//! there too (each request waited for on the runtime's handle from the
//! blocking thread), so the log's logic is one for both.
//!
//! A read that found the log changed under it, and an append that found
//! its number taken, try again after a short pause ([`Backoff`]) that
//! grows with each attempt, so that committers sharing the output do not
//! spin against each other.

#[cfg(feature = "object-store")]
use object_store::ObjectStoreExt;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sink_api::{PositionAdvance, PositionConflict, PositionTable, SinkError, SplitKey};

use crate::blocking::assert_blocking;
use crate::group_set::GroupSet;
#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;
use crate::position_group::PositionGroupId;
use crate::state::Upload;

/// The hidden directory of the log, in the output directory.
pub(crate) const POSITIONS_DIR: &str = ".positions";
/// Entries, under [`POSITIONS_DIR`].
const LOG: &str = "log";
/// Snapshots, under [`POSITIONS_DIR`].
const SNAPSHOTS: &str = "snapshot";
/// Files being written, under [`POSITIONS_DIR`].
const TEMPORARY: &str = "tmp";
/// The format of entries and snapshots written and read.
const FORMAT: u32 = 1;
/// After this many entries past the last snapshot, a committer writes the
/// next one.
pub(crate) const SNAPSHOT_EVERY: usize = 64;
/// The longest entry or snapshot read.
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 20;
/// How often a read starts again because the log changed under it before
/// it gives up.
const MAX_READS: u32 = 100;
/// The longest pause of a [`Backoff`].
const MAX_PAUSE: Duration = Duration::from_millis(10);

/// The cap on the files of the log: [`MAX_FILE_BYTES`], or in this
/// crate's unit tests what the test thread set (`tests::with_cap`), so
/// that a test can reach it with small files.
fn cap() -> u64 {
    #[cfg(test)]
    if let Some(cap) = tests::CAP.with(std::cell::Cell::get) {
        return cap;
    }
    MAX_FILE_BYTES
}

/// Pauses between the attempts of a retry loop: 1 ms, 2 ms, 4 ms, … up to
/// [`MAX_PAUSE`], each a random length between half of that and all of it
/// (committers that collided once do not collide again in step). Blocking.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    attempts: u32,
}

impl Backoff {
    /// The pause before the next attempt.
    pub(crate) fn next_pause(&mut self) -> Duration {
        let full = Duration::from_millis(1)
            .saturating_mul(1 << self.attempts.min(16))
            .min(MAX_PAUSE);
        self.attempts = self.attempts.saturating_add(1);
        // A random fraction from the standard library's hasher keys, drawn
        // anew for every hasher: no dependency for a jitter.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let half = full / 2;
        half + Duration::from_nanos(random % (half.as_nanos() as u64).max(1))
    }

    /// Sleeps for [`next_pause`](Self::next_pause).
    pub(crate) fn pause(&mut self) {
        assert_blocking("a pause between position log attempts");
        std::thread::sleep(self.next_pause());
    }
}

/// Why the position log cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// A file operation failed.
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A file of the log does not decode.
    #[error(
        "{} is not a position log file this sink can read; restore the output directory \
         (its .positions directory included) from a backup",
        path.display()
    )]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A file of the log decodes but does not fit the others.
    #[error(
        "{} is damaged: {reason}; restore the output directory (its .positions directory \
         included) from a backup",
        path.display()
    )]
    Damaged { path: PathBuf, reason: String },
    /// A value could not be encoded.
    #[error("encoding {what}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// An entry or a snapshot would be longer than the log's files may be
    /// (nothing was written).
    #[error(
        "{what} for {} would be {bytes} bytes, longer than the {cap} bytes the position log \
         reads back; nothing was written (the log is unchanged and readable): {advice}",
        dir.display()
    )]
    TooLong {
        what: &'static str,
        dir: PathBuf,
        bytes: u64,
        cap: u64,
        advice: &'static str,
    },
    /// An object store's request failed.
    #[cfg(feature = "object-store")]
    #[error("{what} {}", path.display())]
    Store {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: object_store::Error,
    },
    /// Other committers changed the log under every read.
    #[error(
        "the position log {} changed under {attempts} reads in a row: too many committers \
         sharing the output directory",
        dir.display()
    )]
    Unsettled { dir: PathBuf, attempts: u32 },
}

impl From<LogError> for SinkError {
    /// A damaged log, and a file too long to write, are permanent
    /// (nothing is committed until someone repairs it, or the same file
    /// would be refused again); the rest is transient.
    fn from(error: LogError) -> SinkError {
        let permanent = matches!(
            error,
            LogError::Decode { .. } | LogError::Damaged { .. } | LogError::TooLong { .. }
        );
        let error = SinkError::other("the output's position log", error);
        match permanent {
            true => error.permanent(),
            false => error,
        }
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LogError + 'a {
    move |source| LogError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// One part of a logged group: its pending (hidden) name and its visible
/// name, relative to the output directory, and its size and records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LoggedPart {
    pub pending: PathBuf,
    pub target: PathBuf,
    pub size_bytes: u64,
    pub records: u64,
    /// On an object store output: the multipart upload that holds the
    /// part, completed by whoever rolls the entry forward (`pending` is
    /// then its marker, `target` the object's key under the prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Upload>,
}

/// An entry of the log: one committed group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// [`FORMAT`].
    pub format: u32,
    pub group: PositionGroupId,
    pub advances: Vec<PositionAdvance>,
    pub parts: Vec<LoggedPart>,
}

impl Entry {
    /// The entry of `group`, advancing `advances`, with `parts`.
    pub(crate) fn new(
        group: PositionGroupId,
        advances: Vec<PositionAdvance>,
        parts: Vec<LoggedPart>,
    ) -> Entry {
        Entry {
            format: FORMAT,
            group,
            advances,
            parts,
        }
    }
}

/// One split's position, as a snapshot keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredPosition {
    key: SplitKey,
    position: u64,
}

/// A snapshot: the log up to entry `covers`, folded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Snapshot {
    /// [`FORMAT`].
    format: u32,
    covers: u64,
    positions: Vec<StoredPosition>,
    committed: GroupSet,
}

/// The positions the log holds: a [`PositionTable`] for the checks, and
/// every split, to write them into a snapshot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Positions {
    table: PositionTable,
    all: BTreeMap<SplitKey, u64>,
}

impl Positions {
    /// Applies every advance if each split is at its `from`, none
    /// otherwise.
    fn apply(&mut self, advances: &[PositionAdvance]) -> Result<(), PositionConflict> {
        self.table.apply(advances)?;
        for advance in advances {
            self.all.insert(advance.key.clone(), advance.to);
        }
        Ok(())
    }

    /// Whether every advance finds its split at its `from`.
    pub(crate) fn check(&self, advances: &[PositionAdvance]) -> Result<(), PositionConflict> {
        self.table.check(advances)
    }

    /// The positions of `scope`'s splits.
    pub(crate) fn scope(&self, scope: &str) -> sink_api::CommittedPositions {
        self.table.scope(scope)
    }
}

/// The log as one read found it.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogState {
    /// The last entry the snapshot read covers; 0 without one.
    pub covers: u64,
    /// The positions after every entry.
    pub positions: Positions,
    /// The committed groups the snapshot holds.
    pub snapshot_groups: GroupSet,
    /// The entries after the snapshot, in order, with their numbers.
    pub entries: Vec<(u64, Entry)>,
}

impl LogState {
    /// The number of the last entry (covered by the snapshot or not).
    pub(crate) fn last(&self) -> u64 {
        self.entries.last().map_or(self.covers, |(seq, _)| *seq)
    }

    /// The number of the next entry, after [`last`](Self::last); a
    /// damaged log when the last is the largest number there is (a file
    /// named so by hand, never by this sink).
    pub(crate) fn next(&self, log: &PositionLog) -> Result<u64, LogError> {
        self.last().checked_add(1).ok_or_else(|| LogError::Damaged {
            path: log.dir.clone(),
            reason: format!(
                "its last entry is numbered {}, the largest number there is: no entry can follow",
                self.last()
            ),
        })
    }

    /// Whether the group `id` was committed.
    pub(crate) fn contains(&self, id: &PositionGroupId) -> bool {
        self.snapshot_groups.contains(id) || self.entries.iter().any(|(_, e)| &e.group == id)
    }

    /// Adds `entry`, just written under `seq`, checked against these
    /// positions.
    pub(crate) fn push(&mut self, seq: u64, entry: Entry) -> Result<(), PositionConflict> {
        self.positions.apply(&entry.advances)?;
        self.entries.push((seq, entry));
        Ok(())
    }
}

/// Whether [`PositionLog::append`] wrote the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Written and durable: the group is committed.
    Written,
    /// The number was taken: read the log again.
    Taken,
}

/// The position log of one output. Blocking, every method.
#[derive(Debug, Clone)]
pub(crate) struct PositionLog {
    /// `<out>/.positions` (on an object store: `<prefix>/.positions`).
    dir: PathBuf,
    files: Files,
}

/// Where the log's files are, and how they are made.
#[derive(Clone)]
enum Files {
    /// In a local directory: linked into place, directories synced.
    Local,
    /// Objects of a store: created by conditional puts.
    #[cfg(feature = "object-store")]
    Object {
        output: ObjectOutput,
        /// The runtime the requests are waited for on, from blocking
        /// threads.
        runtime: tokio::runtime::Handle,
    },
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Files::Local => f.write_str("Local"),
            #[cfg(feature = "object-store")]
            Files::Object { output, .. } => write!(f, "Object({})", output.location),
        }
    }
}

impl PositionLog {
    /// The log of the output directory `base`.
    pub(crate) fn of(base: &Path) -> PositionLog {
        PositionLog {
            dir: base.join(POSITIONS_DIR),
            files: Files::Local,
        }
    }

    /// The log of the object store output `output`, whose requests are
    /// waited for on the current runtime. Called from async code; the
    /// log's methods then run on blocking threads.
    #[cfg(feature = "object-store")]
    pub(crate) fn on_store(output: &ObjectOutput) -> PositionLog {
        PositionLog {
            dir: Path::new(output.prefix.as_ref()).join(POSITIONS_DIR),
            files: Files::Object {
                output: output.clone(),
                runtime: tokio::runtime::Handle::current(),
            },
        }
    }

    /// Whether anything was ever committed through the log.
    pub(crate) fn exists(&self) -> Result<bool, LogError> {
        assert_blocking("looking for the position log");
        match &self.files {
            Files::Local => Ok(self.dir.exists()),
            #[cfg(feature = "object-store")]
            Files::Object { .. } => Ok(!self.numbers(&self.log_dir())?.is_empty()
                || !self.numbers(&self.snapshot_dir())?.is_empty()),
        }
    }

    fn log_dir(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    fn snapshot_dir(&self) -> PathBuf {
        self.dir.join(SNAPSHOTS)
    }

    fn entry_path(&self, seq: u64) -> PathBuf {
        self.log_dir().join(number_name(seq))
    }

    fn snapshot_path(&self, covers: u64) -> PathBuf {
        self.snapshot_dir().join(number_name(covers))
    }

    /// Reads the log: the newest snapshot and the entries after it, folded.
    /// Reads again when a snapshot appears meanwhile. An empty state when
    /// there is no log.
    pub(crate) fn read(&self) -> Result<LogState, LogError> {
        assert_blocking("reading the position log");
        let mut backoff = Backoff::default();
        for attempt in 0..MAX_READS {
            if attempt > 0 {
                backoff.pause();
            }
            let snapshot = self.newest(&self.snapshot_dir())?;
            let mut state = LogState::default();
            if let Some(covers) = snapshot {
                let path = self.snapshot_path(covers);
                let Some(snapshot) = self.read_json::<Snapshot>(&path)? else {
                    continue;
                };
                state = from_snapshot(&path, covers, snapshot)?;
            }
            let numbers: Vec<u64> = self
                .numbers(&self.log_dir())?
                .into_iter()
                .filter(|seq| *seq > state.covers)
                .collect();
            let mut vanished = false;
            let mut entries = Vec::with_capacity(numbers.len());
            for seq in numbers {
                let path = self.entry_path(seq);
                match self.read_json::<Entry>(&path)? {
                    Some(entry) => entries.push((seq, entry, path)),
                    None => {
                        vanished = true;
                        break;
                    }
                }
            }
            if vanished || self.newest(&self.snapshot_dir())? != snapshot {
                continue;
            }
            for (seq, entry, path) in entries {
                // `seq` is above the last number: the sum does not overflow.
                if state.last().checked_add(1) != Some(seq) {
                    return Err(LogError::Damaged {
                        path: self.log_dir(),
                        reason: format!(
                            "entries {} to {} are missing",
                            state.last().saturating_add(1),
                            seq.saturating_sub(1)
                        ),
                    });
                }
                check_format(&path, entry.format)?;
                state
                    .push(seq, entry)
                    .map_err(|conflict| LogError::Damaged {
                        path,
                        reason: format!(
                            "its advances do not follow the entries before it: {conflict}"
                        ),
                    })?;
            }
            return Ok(state);
        }
        Err(LogError::Unsettled {
            dir: self.dir.clone(),
            attempts: MAX_READS,
        })
    }

    /// Writes `entry` as entry `seq`, exclusively: [`Appended::Taken`] when
    /// another committer has (or had) that number. Durable when written
    /// (its name in the log's directory; the directories above are
    /// [`sync_parents`](Self::sync_parents)'). `tag` (the committer's
    /// lineage) starts the temporary file's name. An entry longer than the
    /// log's files may be is refused, and nothing is written.
    pub(crate) fn append(&self, seq: u64, entry: &Entry, tag: &str) -> Result<Appended, LogError> {
        assert_blocking("appending to the position log");
        let bytes = serde_json::to_vec(entry).map_err(|source| LogError::Encode {
            what: "a position log entry",
            source,
        })?;
        self.within_cap(
            "the position log entry of a group",
            &bytes,
            "the group has too many parts or source splits; checkpoint more often, or roll \
             fewer parts per checkpoint",
        )?;
        self.create_dirs()?;
        let path = self.entry_path(seq);
        if !self.link_new(&bytes, &path, tag)? {
            return Ok(Appended::Taken);
        }
        // Taken, covered by a snapshot and removed while this committer was
        // away: void, whatever it holds.
        if self
            .newest(&self.snapshot_dir())?
            .is_some_and(|covers| covers >= seq)
        {
            self.remove_if_present(&path)?;
            return Ok(Appended::Taken);
        }
        self.sync_dir(&self.log_dir())?;
        Ok(Appended::Written)
    }

    /// Writes a snapshot of `state` covering all of its entries (unless one
    /// covers them already), then removes the entries and the snapshots it
    /// replaces. The parts of those entries must be renamed, durably.
    pub(crate) fn write_snapshot(&self, state: &LogState, tag: &str) -> Result<(), LogError> {
        assert_blocking("writing a position log snapshot");
        let covers = state.last();
        if covers == state.covers {
            return Ok(());
        }
        let mut committed = state.snapshot_groups.clone();
        for (_, entry) in &state.entries {
            committed.insert(&entry.group);
        }
        let snapshot = Snapshot {
            format: FORMAT,
            covers,
            positions: (state.positions.all.iter())
                .map(|(key, position)| StoredPosition {
                    key: key.clone(),
                    position: *position,
                })
                .collect(),
            committed,
        };
        let bytes = serde_json::to_vec(&snapshot).map_err(|source| LogError::Encode {
            what: "a position log snapshot",
            source,
        })?;
        // Before anything is removed: the entries stay, and the log stays
        // readable as it is.
        self.within_cap(
            "a position log snapshot",
            &bytes,
            "the output keeps the positions of too many source splits, or the groups of too \
             many jobs and subtasks; give the job another output directory",
        )?;
        self.create_dirs()?;
        // Taken: another committer wrote the same snapshot (the same
        // entries folded the same way).
        self.link_new(&bytes, &self.snapshot_path(covers), tag)?;
        self.sync_dir(&self.snapshot_dir())?;
        // Removals need no sync: an entry or a snapshot back after a power
        // cut is older than the snapshot, and passed over.
        for seq in self.numbers(&self.log_dir())? {
            if seq <= covers {
                self.remove_if_present(&self.entry_path(seq))?;
            }
        }
        for older in self.numbers(&self.snapshot_dir())? {
            if older < covers {
                self.remove_if_present(&self.snapshot_path(older))?;
            }
        }
        Ok(())
    }

    /// Refuses `bytes`, to be written as `what`, when they are longer than
    /// the log reads back.
    fn within_cap(
        &self,
        what: &'static str,
        bytes: &[u8],
        advice: &'static str,
    ) -> Result<(), LogError> {
        let (length, cap) = (bytes.len() as u64, cap());
        match length > cap {
            true => Err(LogError::TooLong {
                what,
                dir: self.dir.clone(),
                bytes: length,
                cap,
                advice,
            }),
            false => Ok(()),
        }
    }

    /// Makes the names of the log's directories durable, and every name
    /// above them up to the root, whoever created them (a committer killed
    /// before it synced them leaves them in the page cache only, and the
    /// whole log would go in a power cut): whether they exist (nothing to
    /// sync otherwise). Once per sink is enough, before it reports anything
    /// the log says.
    pub(crate) fn sync_parents(&self) -> Result<bool, LogError> {
        assert_blocking("syncing the position log's directories");
        if !matches!(self.files, Files::Local) {
            return Ok(true);
        }
        let log = self.log_dir();
        if !log.is_dir() {
            return Ok(false);
        }
        // The log's directory holds the entries and sits next to the
        // snapshots' and the temporaries': syncing `.positions` and up
        // covers every one of their names.
        sink_local_fs::sync_entries_of(&log).map_err(io("syncing the directories above", &log))?;
        Ok(true)
    }

    /// Makes every entry linked so far durable: another committer's entry
    /// is visible before its writer synced the log's directory, and what
    /// is renamed on its word must not outlive it in a power cut.
    pub(crate) fn sync_entries(&self) -> Result<(), LogError> {
        assert_blocking("syncing the position log");
        self.sync_dir(&self.log_dir())
    }

    /// Removes the temporary files tagged `tag` (of this lineage): left by
    /// a crash between writing one and linking it. Called at a start.
    pub(crate) fn remove_temporaries(&self, tag: &str) -> Result<(), LogError> {
        assert_blocking("removing temporary position log files");
        if !matches!(self.files, Files::Local) {
            return Ok(());
        }
        let dir = self.dir.join(TEMPORARY);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("listing", &dir)(e)),
        };
        let prefix = format!("{tag}-");
        for entry in entries {
            let entry = entry.map_err(io("listing", &dir))?;
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                self.remove_if_present(&entry.path())?;
            }
        }
        Ok(())
    }

    fn create_dirs(&self) -> Result<(), LogError> {
        if !matches!(self.files, Files::Local) {
            return Ok(());
        }
        for dir in [
            self.log_dir(),
            self.snapshot_dir(),
            self.dir.join(TEMPORARY),
        ] {
            if !dir.is_dir() {
                // Durable up to the root: the entries are linked into it.
                sink_local_fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
            }
        }
        Ok(())
    }

    /// Writes `bytes` under a temporary name, durably, and links it to
    /// `path`; `false` when `path` exists. On an object store: a put of
    /// `path` that only creates.
    fn link_new(&self, bytes: &[u8], path: &Path, tag: &str) -> Result<bool, LogError> {
        #[cfg(feature = "object-store")]
        if let Files::Object { output, runtime } = &self.files {
            use object_store::{PutMode, PutOptions};
            let location = key(path);
            let put = output.store.put_opts(
                &location,
                bytes.to_vec().into(),
                PutOptions::from(PutMode::Create),
            );
            return match runtime.block_on(put) {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(source) => Err(LogError::Store {
                    what: "creating",
                    path: path.to_path_buf(),
                    source,
                }),
            };
        }
        let temporary = self
            .dir
            .join(TEMPORARY)
            .join(format!("{tag}-{}", uuid::Uuid::new_v4().simple()));
        let written = File::create_new(&temporary)
            .and_then(|mut file| file.write_all(bytes).and_then(|()| file.sync_all()));
        if let Err(error) = written {
            let _ = fs::remove_file(&temporary);
            return Err(io("writing", &temporary)(error));
        }
        let linked = fs::hard_link(&temporary, path);
        let _ = fs::remove_file(&temporary);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io(
                "hard-linking a position log file (the output's file system must support \
                 hard links for source positions) to",
                path,
            )(e)),
        }
    }
}

/// A number as a file name: 20 digits, so that names sort by number.
fn number_name(number: u64) -> String {
    format!("{number:020}")
}

impl PositionLog {
    /// The numbers named by the files of `dir`, in order; other names are
    /// passed over. None when `dir` does not exist.
    fn numbers(&self, dir: &Path) -> Result<Vec<u64>, LogError> {
        let names = match &self.files {
            Files::Local => local_names(dir)?,
            #[cfg(feature = "object-store")]
            Files::Object { output, runtime } => {
                let listed = runtime
                    .block_on(output.store.list_with_delimiter(Some(&key(dir))))
                    .map_err(|source| LogError::Store {
                        what: "listing",
                        path: dir.to_path_buf(),
                        source,
                    })?;
                (listed.objects.into_iter())
                    .filter_map(|meta| meta.location.filename().map(str::to_string))
                    .collect()
            }
        };
        let mut found: Vec<u64> = names
            .iter()
            .filter(|name| name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|name| name.parse().ok())
            .collect();
        found.sort_unstable();
        Ok(found)
    }

    /// The largest number in `dir`.
    fn newest(&self, dir: &Path) -> Result<Option<u64>, LogError> {
        Ok(self.numbers(dir)?.last().copied())
    }

    /// Reads and decodes `path`, at most [`MAX_FILE_BYTES`] of it (see
    /// [`cap`]); `None` when it does not exist (removed meanwhile).
    fn read_json<T: DeserializeOwned>(&self, path: &Path) -> Result<Option<T>, LogError> {
        let cap = cap();
        let too_long = || LogError::Damaged {
            path: path.to_path_buf(),
            reason: format!("it is longer than the {cap} bytes this sink reads"),
        };
        let bytes = match &self.files {
            Files::Local => {
                let file = match File::open(path) {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io("opening", path)(e)),
                };
                let mut bytes = Vec::new();
                file.take(cap.saturating_add(1))
                    .read_to_end(&mut bytes)
                    .map_err(io("reading", path))?;
                bytes
            }
            #[cfg(feature = "object-store")]
            Files::Object { output, runtime } => {
                let store_error = |source| LogError::Store {
                    what: "reading",
                    path: path.to_path_buf(),
                    source,
                };
                let got = match runtime.block_on(output.store.get(&key(path))) {
                    Ok(got) => got,
                    Err(e) if ObjectOutput::is_absent(&e) => return Ok(None),
                    Err(e) => return Err(store_error(e)),
                };
                if got.meta.size > cap {
                    return Err(too_long());
                }
                runtime.block_on(got.bytes()).map_err(store_error)?.to_vec()
            }
        };
        if bytes.len() as u64 > cap {
            return Err(too_long());
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| LogError::Decode {
                path: path.to_path_buf(),
                source,
            })
    }

    fn remove_if_present(&self, path: &Path) -> Result<(), LogError> {
        match &self.files {
            Files::Local => match fs::remove_file(path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io("removing", path)(e)),
            },
            #[cfg(feature = "object-store")]
            Files::Object { output, runtime } => {
                match runtime.block_on(output.store.delete(&key(path))) {
                    Ok(()) => Ok(()),
                    Err(e) if ObjectOutput::is_absent(&e) => Ok(()),
                    Err(source) => Err(LogError::Store {
                        what: "removing",
                        path: path.to_path_buf(),
                        source,
                    }),
                }
            }
        }
    }

    /// Syncs `dir` (nothing to do on an object store).
    fn sync_dir(&self, dir: &Path) -> Result<(), LogError> {
        match &self.files {
            Files::Local => sink_local_fs::sync_dir(dir).map_err(io("syncing", dir)),
            #[cfg(feature = "object-store")]
            Files::Object { .. } => Ok(()),
        }
    }
}

/// The names of the files of the local directory `dir`; none when it does
/// not exist.
fn local_names(dir: &Path) -> Result<Vec<String>, LogError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("listing", dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io("listing", dir))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// The object key of a log path: the output's prefix as it is (already
/// a key, never encoded twice), then the log's plain names.
#[cfg(feature = "object-store")]
fn key(path: &Path) -> object_store::path::Path {
    let text = path.to_string_lossy();
    object_store::path::Path::parse(text.as_ref())
        .unwrap_or_else(|_| object_store::path::Path::from(text.as_ref()))
}

fn check_format(path: &Path, format: u32) -> Result<(), LogError> {
    match format {
        FORMAT => Ok(()),
        other => Err(LogError::Damaged {
            path: path.to_path_buf(),
            reason: format!(
                "it has format {other}; this version of the sink reads format {FORMAT}"
            ),
        }),
    }
}

/// The state a snapshot (read from `path`, named `covers`) holds.
fn from_snapshot(path: &Path, covers: u64, snapshot: Snapshot) -> Result<LogState, LogError> {
    check_format(path, snapshot.format)?;
    let damaged = |reason: String| LogError::Damaged {
        path: path.to_path_buf(),
        reason,
    };
    if snapshot.covers != covers {
        return Err(damaged(format!(
            "it says it covers entry {}, its name says {covers}",
            snapshot.covers
        )));
    }
    let mut positions = Positions::default();
    for stored in snapshot.positions {
        let advance = PositionAdvance {
            key: stored.key,
            from: None,
            to: stored.position,
        };
        positions
            .apply(std::slice::from_ref(&advance))
            .map_err(|_| damaged(format!("it holds {} twice", advance.key)))?;
    }
    Ok(LogState {
        covers,
        positions,
        snapshot_groups: snapshot.committed,
        entries: Vec::new(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::blocking::on_this_thread;

    thread_local! {
        /// The cap [`cap`] answers on this thread, when set.
        pub(crate) static CAP: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    }

    /// Runs `f` with the log's files capped at `cap` bytes on this thread.
    pub(crate) fn with_cap<R>(cap: u64, f: impl FnOnce() -> R) -> R {
        CAP.with(|c| c.set(Some(cap)));
        let result = f();
        CAP.with(|c| c.set(None));
        result
    }

    fn advance(split: &str, from: Option<u64>, to: u64) -> PositionAdvance {
        PositionAdvance {
            key: SplitKey::new("scope", split),
            from,
            to,
        }
    }

    fn entry(number: u64, advances: Vec<PositionAdvance>) -> Entry {
        Entry::new(
            PositionGroupId {
                writer: "job-l-g1-s0".into(),
                number,
                checkpoint: number + 1,
            },
            advances,
            vec![LoggedPart {
                pending: format!(".part-{number}.inprogress.l").into(),
                target: format!("part-{number}").into(),
                size_bytes: 3,
                records: 1,
                upload: None,
            }],
        )
    }

    #[test]
    fn of_two_appenders_of_one_number_exactly_one_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        on_this_thread(|| {
            assert!(!log.exists().unwrap());
            assert_eq!(log.read().unwrap().last(), 0, "no log: nothing committed");
            let first = entry(0, vec![advance("a", None, 5)]);
            let second = entry(1, vec![advance("a", None, 7)]);
            assert_eq!(log.append(1, &first, "l").unwrap(), Appended::Written);
            assert_eq!(log.append(1, &second, "l").unwrap(), Appended::Taken);
            let state = log.read().unwrap();
            assert_eq!(state.entries, vec![(1, first.clone())]);
            assert!(state.contains(&first.group) && !state.contains(&second.group));
            // The loser, reading again, finds its split moved.
            assert!(state.positions.check(&second.advances).is_err());
        });
        // Many at once: every number taken once, none lost.
        let written: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u64)
                .map(|i| {
                    let log = log.clone();
                    scope.spawn(move || {
                        on_this_thread(|| loop {
                            let state = log.read().unwrap();
                            let mine = entry(10 + i, vec![advance(&format!("s{i}"), None, i)]);
                            let seq = state.last() + 1;
                            if log.append(seq, &mine, "l").unwrap() == Appended::Written {
                                return seq;
                            }
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = written.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (2..=9).collect::<Vec<_>>());
        let state = on_this_thread(|| log.read()).unwrap();
        assert_eq!(state.entries.len(), 9);
        for i in 0..8u64 {
            assert_eq!(
                state.positions.scope("scope").get(&format!("s{i}")),
                Some(&i)
            );
        }
        let leftovers = fs::read_dir(dir.path().join(POSITIONS_DIR).join(TEMPORARY))
            .unwrap()
            .count();
        assert_eq!(leftovers, 0, "temporary files are removed once linked");
    }

    #[test]
    fn a_snapshot_replaces_its_entries_and_a_number_it_covers_is_void() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        on_this_thread(|| {
            let mut from = None;
            for number in 0..3 {
                let to = (number + 1) * 10;
                let e = entry(number, vec![advance("a", from, to)]);
                assert_eq!(log.append(number + 1, &e, "l").unwrap(), Appended::Written);
                from = Some(to);
            }
            let state = log.read().unwrap();
            log.write_snapshot(&state, "l").unwrap();
            assert_eq!(log.numbers(&log.log_dir()).unwrap(), Vec::<u64>::new());
            assert_eq!(log.numbers(&log.snapshot_dir()).unwrap(), vec![3]);
            let read = log.read().unwrap();
            assert_eq!((read.covers, read.last(), read.entries.len()), (3, 3, 0));
            assert_eq!(read.positions.scope("scope").get("a"), Some(&30));
            for number in 0..3 {
                assert!(read.contains(&entry(number, Vec::new()).group));
            }
            assert!(!read.contains(&entry(3, Vec::new()).group));
            // An appender that read the log before the snapshot, back now:
            // number 2 is free on disk but covered, so its entry is void.
            let late = entry(7, vec![advance("b", None, 1)]);
            assert_eq!(log.append(2, &late, "l").unwrap(), Appended::Taken);
            assert!(!log.entry_path(2).exists(), "the void entry is removed");
            assert!(!log.read().unwrap().contains(&late.group));
            assert_eq!(log.append(4, &late, "l").unwrap(), Appended::Written);
            let read = log.read().unwrap();
            assert!(read.contains(&late.group));
            // A second snapshot replaces the first.
            log.write_snapshot(&read, "l").unwrap();
            assert_eq!(log.numbers(&log.snapshot_dir()).unwrap(), vec![4]);
            let read = log.read().unwrap();
            assert_eq!(read.positions.scope("scope").len(), 2);
            assert!(
                read.contains(&entry(0, Vec::new()).group),
                "kept across snapshots"
            );
        });
    }

    /// The error of reading a log whose entry 1 holds `bytes`.
    fn read_with_entry(bytes: &[u8]) -> Result<LogState, LogError> {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        fs::create_dir_all(log.log_dir()).unwrap();
        fs::write(log.entry_path(1), bytes).unwrap();
        on_this_thread(|| log.read())
    }

    #[test]
    fn a_damaged_file_is_a_clear_permanent_error() {
        let good = serde_json::to_vec(&entry(0, vec![advance("a", None, 5)])).unwrap();
        assert!(read_with_entry(&good).is_ok());
        let truncated = read_with_entry(&good[..good.len() / 2]).unwrap_err();
        assert!(matches!(truncated, LogError::Decode { .. }), "{truncated}");
        let message = SinkError::from(truncated);
        assert!(message.is_permanent());
        assert!(
            message.to_string().contains("00000000000000000001")
                && message.to_string().contains("from a backup"),
            "{message}"
        );
        let text = String::from_utf8(good.clone()).unwrap();
        let newer = text.replace("\"format\":1", "\"format\":2");
        let error = read_with_entry(newer.as_bytes()).unwrap_err();
        assert!(error.to_string().contains("format 2"), "{error}");
        // Advances that do not follow: the log was changed by hand.
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        on_this_thread(|| {
            log.append(1, &entry(0, vec![advance("a", None, 5)]), "l")
                .unwrap();
            log.append(2, &entry(1, vec![advance("a", Some(4), 9)]), "l")
                .unwrap();
            let error = log.read().unwrap_err();
            assert!(error.to_string().contains("do not follow"), "{error}");
            // A gap.
            fs::remove_file(log.entry_path(2)).unwrap();
            log.append(3, &entry(2, vec![advance("a", Some(5), 9)]), "l")
                .unwrap();
            let error = log.read().unwrap_err();
            assert!(
                error.to_string().contains("entries 2 to 2 are missing"),
                "{error}"
            );
        });
    }

    #[test]
    fn a_file_too_long_is_refused_before_it_is_decoded() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        fs::create_dir_all(log.log_dir()).unwrap();
        // Sparse: nothing is allocated for it on disk.
        File::create(log.entry_path(1))
            .unwrap()
            .set_len(MAX_FILE_BYTES + 10)
            .unwrap();
        let error = on_this_thread(|| log.read()).unwrap_err();
        assert!(error.to_string().contains("longer than"), "{error}");
    }

    #[test]
    fn an_entry_longer_than_the_cap_is_refused_and_the_log_stays_readable() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        on_this_thread(|| {
            let first = entry(0, vec![advance("a", None, 5)]);
            assert_eq!(log.append(1, &first, "l").unwrap(), Appended::Written);
            // One split named with more bytes than the log reads back.
            let long = "x".repeat(MAX_FILE_BYTES as usize + 1);
            let huge = entry(1, vec![advance(&long, None, 1)]);
            let error = log.append(2, &huge, "l").unwrap_err();
            assert!(
                matches!(error, LogError::TooLong { .. })
                    && error.to_string().contains("longer than"),
                "{error}"
            );
            assert!(SinkError::from(error).is_permanent());
            assert!(!log.entry_path(2).exists(), "nothing linked");
            let state = log.read().expect("the log stays readable");
            assert_eq!(state.entries, vec![(1, first)]);
            let leftovers = fs::read_dir(dir.path().join(POSITIONS_DIR).join(TEMPORARY))
                .unwrap()
                .count();
            assert_eq!(leftovers, 0);
        });
    }

    #[test]
    fn a_snapshot_longer_than_the_cap_is_refused_before_any_entry_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        on_this_thread(|| {
            with_cap(4096, || {
                // Entries of 300 bytes, well under the cap; their splits'
                // positions together are not.
                for number in 0..20u64 {
                    let split = format!("{number:0>200}");
                    let e = entry(number, vec![advance(&split, None, number)]);
                    assert_eq!(log.append(number + 1, &e, "l").unwrap(), Appended::Written);
                }
                let state = log.read().unwrap();
                let error = log.write_snapshot(&state, "l").unwrap_err();
                assert!(matches!(error, LogError::TooLong { .. }), "{error}");
                assert!(
                    error.to_string().contains("a position log snapshot"),
                    "{error}"
                );
                assert_eq!(log.numbers(&log.snapshot_dir()).unwrap(), Vec::<u64>::new());
                assert_eq!(
                    log.numbers(&log.log_dir()).unwrap(),
                    (1..=20).collect::<Vec<_>>()
                );
                let read = log.read().expect("the log stays readable");
                assert_eq!(read.entries.len(), 20);
            });
        });
    }

    #[test]
    fn a_read_that_never_settles_pauses_between_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        fs::create_dir_all(log.snapshot_dir()).unwrap();
        // A snapshot listed but gone whenever it is opened: every read
        // starts again.
        std::os::unix::fs::symlink(dir.path().join("nowhere"), log.snapshot_path(5)).unwrap();
        let started = std::time::Instant::now();
        let error = on_this_thread(|| log.read()).unwrap_err();
        assert!(matches!(error, LogError::Unsettled { .. }), "{error}");
        let waited = started.elapsed();
        // At least half of 1 + 2 + 4 + 8 + 10 × 95 ms.
        assert!(
            waited >= Duration::from_millis(400),
            "{MAX_READS} reads in {waited:?}: no pause between them"
        );
        let mut backoff = Backoff::default();
        let pauses: Vec<Duration> = (0..8).map(|_| backoff.next_pause()).collect();
        assert!(pauses[0] >= Duration::from_micros(500) && pauses[0] <= Duration::from_millis(1));
        assert!(pauses.iter().all(|p| *p <= MAX_PAUSE), "{pauses:?}");
        assert!(pauses[7] >= MAX_PAUSE / 2, "{pauses:?}");
    }

    #[test]
    fn after_the_largest_number_no_entry_can_follow() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        fs::create_dir_all(log.snapshot_dir()).unwrap();
        let snapshot = Snapshot {
            format: FORMAT,
            covers: u64::MAX,
            positions: Vec::new(),
            committed: GroupSet::default(),
        };
        fs::write(
            log.snapshot_path(u64::MAX),
            serde_json::to_vec(&snapshot).unwrap(),
        )
        .unwrap();
        let state = on_this_thread(|| log.read()).unwrap();
        assert_eq!(state.last(), u64::MAX);
        let error = state.next(&log).unwrap_err();
        assert!(error.to_string().contains("no entry can follow"), "{error}");
    }

    #[test]
    fn a_snapshot_that_does_not_fit_its_name_or_repeats_a_split_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        fs::create_dir_all(log.snapshot_dir()).unwrap();
        let snapshot = |covers: u64, positions: &[(&str, u64)]| Snapshot {
            format: FORMAT,
            covers,
            positions: positions
                .iter()
                .map(|(split, position)| StoredPosition {
                    key: SplitKey::new("scope", *split),
                    position: *position,
                })
                .collect(),
            committed: GroupSet::default(),
        };
        let write = |snapshot: &Snapshot| {
            fs::write(log.snapshot_path(5), serde_json::to_vec(snapshot).unwrap()).unwrap()
        };
        write(&snapshot(5, &[("a", 1), ("b", 2)]));
        assert_eq!(on_this_thread(|| log.read()).unwrap().covers, 5);
        write(&snapshot(4, &[("a", 1)]));
        let error = on_this_thread(|| log.read()).unwrap_err();
        assert!(error.to_string().contains("covers entry 4"), "{error}");
        write(&snapshot(5, &[("a", 1), ("a", 2)]));
        let error = on_this_thread(|| log.read()).unwrap_err();
        assert!(error.to_string().contains("twice"), "{error}");
    }

    #[test]
    fn mutated_entries_decode_or_fail_never_panic() {
        let good = serde_json::to_vec(&entry(3, vec![advance("a", None, 5)])).unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..300 {
            let mut bytes = good.clone();
            for _ in 0..(next() % 4 + 1) {
                let at = (next() % bytes.len() as u64) as usize;
                match next() % 3 {
                    0 => bytes[at] = next() as u8,
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at, b"{}[]\"9,:"[(next() % 8) as usize]),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            // Either a value or an error: reaching the end is the test.
            let _ = read_with_entry(&bytes);
        }
    }

    #[test]
    fn temporaries_of_a_lineage_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let log = PositionLog::of(dir.path());
        let tmp = dir.path().join(POSITIONS_DIR).join(TEMPORARY);
        fs::create_dir_all(&tmp).unwrap();
        fs::write(tmp.join("mine-1234"), "x").unwrap();
        fs::write(tmp.join("theirs-1234"), "x").unwrap();
        on_this_thread(|| log.remove_temporaries("mine")).unwrap();
        assert!(!tmp.join("mine-1234").exists());
        assert!(tmp.join("theirs-1234").exists());
    }
}
