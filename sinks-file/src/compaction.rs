//! Compaction: checkpoints many times a second without many tiny files for
//! readers. Committed files are merged, a segment at a time, and the merged
//! file replaces them for readers in one atomic step.
//!
//! Every commit still makes its file visible at once (an acknowledgement
//! waits for nothing more); the files go into the current epoch's segment
//! directories (the `segments` module). The compactor is the sink's global
//! committer: after each checkpoint it seals the epoch once it is
//! [`CompactionPolicy::max_segment_age`] old (or large enough), and merges
//! the sealed segments in the background, off the async workers:
//!
//! ```text
//!  B/S/part-1 part-2 … part-n            sealed segment S of bucket B: n small files, visible
//!  B/.S.compacting/part-S + .compacted   merged copy (their bytes, in name order; for a bulk format
//!                                        such as Parquet, their records rewritten as one file) and
//!                                        its manifest, fsynced
//!        │ renameat2(RENAME_EXCHANGE): B/S ⇄ B/.S.compacting, then fsync B
//!        ▼
//!  B/S/part-S + .compacted               what readers see now: one file
//!  B/.S.replaced-<ms>/part-1 … part-n    hidden; removed after CompactionPolicy::retention
//! ```
//!
//! A reader lists either the small files or the merged one, never both and
//! never neither: the exchange swaps the two directories in one step. A
//! reader that listed the small files and then opens one by its path finds
//! it gone: it lists again ([`read_finished`](crate::read_finished) does).
//! The replaced files stay for the retention, so that a reader that opened
//! the old directory just before the exchange still lists all of it.
//!
//! A crash at any step leaves a state the next compaction round of the
//! lineage repairs, before it merges anything:
//!
//! | found | meaning | done |
//! |---|---|---|
//! | `B/.S.compacting`, `B/S` without manifest | merge not finished | the copy is removed; `S` is merged again |
//! | `B/.S.compacting`, `B/S` with manifest | exchanged, not yet renamed | renamed to `B/.S.replaced-<ms>` |
//! | `B/.S.replaced-<ms>` older than the retention | done | removed |
//!
//! Compaction rounds hold an exclusive lock on `<base>/.file-sink-compaction.lock`,
//! so two compactors (a lingering one of an earlier start, another process)
//! never merge at once. Each round merges only the segments of its own
//! lineage: those its start sealed, and at a start's first round those of
//! earlier generations (which no commit reaches any more) that have no
//! manifest. A merge that fails leaves the small files as they are (visible,
//! nothing lost); it is logged, counted (`file_sink_compaction_failures`)
//! and tried again at the next round.
//!
//! Local outputs only: an object store cannot swap a set of objects for
//! another atomically (the Delta sink compacts tables instead). The
//! filesystem must support `RENAME_EXCHANGE` (ext4, XFS, Btrfs, tmpfs do);
//! the sink checks it at every start and refuses to start without it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sink_api::{CheckpointId, Clock, Generation, GlobalCommitter, Lineage, SinkError};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::blocking::{assert_blocking, blocking, spawn};
use crate::bulk::PartMerger;
use crate::dir_sync::fsync_dir;
use crate::io_error::io_error;
use crate::segments::{
    parse_segment, read_manifest, Manifest, SealLimits, Sealed, Segments, Source, MANIFEST,
    MANIFEST_FORMAT, SEGMENT_PREFIX,
};
use crate::state::FileCommittable;
use crate::stats::FileSinkStats;

/// When the file sink merges its committed files: given to
/// [`FileSinkBuilder::compaction`](crate::FileSinkBuilder::compaction).
///
/// Commits go into the current epoch's segment of each bucket; the epoch is
/// sealed when it reaches any of the limits below (and at end of input),
/// and each sealed segment becomes one file. Readers see at most one
/// epoch's small files per bucket at a time, and one file per bucket and
/// epoch afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionPolicy {
    /// Seal an epoch once it is this old. Default 10 s.
    pub max_segment_age: Duration,
    /// Seal an epoch once this many bytes were committed into it. Default
    /// 128 MiB.
    pub max_segment_bytes: u64,
    /// Seal an epoch once this many files were committed into it. Default
    /// 10 000.
    pub max_segment_files: u64,
    /// How long the small files of a merged segment stay, hidden, after the
    /// exchange, for readers in the middle of a listing. Default 60 s.
    pub retention: Duration,
}

impl Default for CompactionPolicy {
    fn default() -> CompactionPolicy {
        CompactionPolicy {
            max_segment_age: Duration::from_secs(10),
            max_segment_bytes: 128 * 1024 * 1024,
            max_segment_files: 10_000,
            retention: Duration::from_secs(60),
        }
    }
}

impl CompactionPolicy {
    /// Epochs sealed every `max_segment_age` (and at the default limits of
    /// size and files).
    pub fn every(max_segment_age: Duration) -> CompactionPolicy {
        CompactionPolicy {
            max_segment_age,
            ..CompactionPolicy::default()
        }
    }

    /// The same policy with this retention of replaced files.
    pub fn retention(self, retention: Duration) -> CompactionPolicy {
        CompactionPolicy { retention, ..self }
    }

    /// The same policy sealing at this many bytes.
    pub fn max_segment_bytes(self, bytes: u64) -> CompactionPolicy {
        CompactionPolicy {
            max_segment_bytes: bytes,
            ..self
        }
    }

    /// The same policy sealing at this many files.
    pub fn max_segment_files(self, files: u64) -> CompactionPolicy {
        CompactionPolicy {
            max_segment_files: files,
            ..self
        }
    }

    fn limits(&self) -> SealLimits {
        SealLimits {
            age_ms: millis(self.max_segment_age),
            bytes: self.max_segment_bytes,
            files: self.max_segment_files,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The lock file compaction rounds hold, in the base directory.
const LOCK_FILE: &str = ".file-sink-compaction.lock";
/// The end of a merge's hidden working directory: `.<segment>.compacting`.
const COMPACTING: &str = ".compacting";
/// Between a replaced segment's name and the time it was replaced.
const REPLACED: &str = ".replaced-";

/// What the sink's compactors share, across starts: made by the builder.
#[derive(Debug)]
pub(crate) struct Compaction {
    pub policy: CompactionPolicy,
    pub segments: Segments,
    /// Replaced segments waiting for their retention: path, replaced at.
    replaced: Mutex<Vec<(PathBuf, u64)>>,
}

impl Compaction {
    pub(crate) fn new(policy: CompactionPolicy) -> Compaction {
        Compaction {
            policy,
            segments: Segments::default(),
            replaced: Mutex::new(Vec::new()),
        }
    }
}

/// What a compaction round needs, owned, on a blocking thread.
#[derive(Clone)]
pub(crate) struct Round {
    pub compaction: Arc<Compaction>,
    pub base: PathBuf,
    pub prefix: String,
    pub suffix: String,
    /// A bulk format's merge (Parquet's row groups rewritten through
    /// arrow); `None`: a row format's files, concatenated.
    pub merger: Option<Arc<dyn PartMerger>>,
    pub lineage: Lineage,
    pub generation: Generation,
    pub stats: Arc<FileSinkStats>,
    /// The sink's clock: the times of replaced segments and their expiry.
    pub clock: Arc<dyn Clock>,
}

/// How often a segment's merge is tried in one start before it is left as
/// it is (its files visible, merged by a later start's repair).
const MAX_MERGE_ATTEMPTS: u32 = 3;

/// The file sink's global committer when it compacts: seals epochs after
/// checkpoints and merges the sealed segments on a blocking thread, one
/// round at a time. Made once per start by the sink's
/// [`global_committer`](sink_api::Sink::global_committer) factory.
pub(crate) struct Compactor {
    round: Round,
    /// Sealed segments not handed to a round yet, with the merges tried.
    queue: Vec<(Sealed, u32)>,
    /// Whether this start's repair (see the module's table) is done.
    repaired: bool,
    /// After a failure, no round before this time.
    retry_at_ms: u64,
    running: Option<JoinHandle<Outcome>>,
}

/// What a round left.
struct Outcome {
    /// The segments whose merge failed, with the merges tried.
    failed: Vec<(Sealed, u32)>,
    repaired: bool,
    /// Whether anything failed (a merge, the repair, the lock).
    trouble: bool,
}

impl Compactor {
    pub(crate) fn new(round: Round) -> Compactor {
        Compactor {
            round,
            queue: Vec::new(),
            repaired: false,
            retry_at_ms: 0,
            running: None,
        }
    }

    /// Seals this start's epoch if due (or `force`), off the async workers.
    async fn seal(&mut self, force: bool) -> Result<(), SinkError> {
        let compaction = self.round.compaction.clone();
        let (lineage, generation) = (self.round.lineage.clone(), self.round.generation);
        let now_ms = self.round.clock.now_ms();
        let sealed = blocking(move || {
            let limits = compaction.policy.limits();
            Ok(compaction
                .segments
                .seal(&lineage, generation, limits, now_ms, force))
        })
        .await?;
        self.queue
            .extend(sealed.into_iter().map(|segment| (segment, 0)));
        Ok(())
    }

    /// Takes back what a finished round left: failed merges are queued
    /// again (up to [`MAX_MERGE_ATTEMPTS`]) after a pause.
    fn settle(&mut self, finished: Result<Outcome, tokio::task::JoinError>) {
        let outcome = match finished {
            Ok(outcome) => outcome,
            Err(error) => {
                self.round.stats.compaction_failed();
                warn!(%error, "a compaction round ended abnormally; its segments are merged by a later start");
                return;
            }
        };
        self.repaired |= outcome.repaired;
        for (segment, attempts) in outcome.failed {
            if attempts < MAX_MERGE_ATTEMPTS {
                self.queue.push((segment, attempts));
            } else {
                warn!(
                    segment = %segment.bucket.join(&segment.name).display(),
                    attempts,
                    "giving up merging a segment in this start; its files stay visible"
                );
            }
        }
        if outcome.trouble {
            let pause = millis(self.round.compaction.policy.max_segment_age).max(1_000);
            self.retry_at_ms = self.round.clock.now_ms().saturating_add(pause);
        }
    }

    /// Starts a round with what is queued, unless one runs, there is
    /// nothing to do, or a failure asks for a pause.
    async fn start_round(&mut self) {
        if let Some(running) = self.running.take_if(|r| r.is_finished()) {
            let finished = running.await;
            self.settle(finished);
        }
        if self.running.is_some() || self.round.clock.now_ms() < self.retry_at_ms {
            return;
        }
        let expiring = !self
            .round
            .compaction
            .replaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if self.queue.is_empty() && self.repaired && !expiring {
            return;
        }
        let round = self.round.clone();
        let queue = std::mem::take(&mut self.queue);
        let repair = !self.repaired;
        self.running = Some(spawn(move || round.run(queue, repair, false)));
    }
}

#[async_trait]
impl GlobalCommitter for Compactor {
    type Committable = FileCommittable;

    /// Seals the epoch when it is due and starts a merge round if none runs;
    /// returns without waiting for it.
    async fn commit_checkpoint(
        &mut self,
        _checkpoint_id: CheckpointId,
        _committables: Vec<FileCommittable>,
    ) -> Result<(), SinkError> {
        self.seal(false).await?;
        self.start_round().await;
        Ok(())
    }

    /// Seals the last epoch and merges everything sealed, waiting for it,
    /// then removes every replaced segment (a finished job does not come
    /// back to do it): a bounded job ends with its output compacted. A
    /// failure is logged and counted; the small files stay visible.
    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        self.seal(true).await?;
        if let Some(running) = self.running.take() {
            let finished = running.await;
            self.settle(finished);
        }
        let round = self.round.clone();
        let queue = std::mem::take(&mut self.queue);
        let repair = !self.repaired;
        let outcome = blocking(move || Ok(round.run(queue, repair, true))).await;
        self.settle(Ok(outcome?));
        Ok(())
    }
}

impl Round {
    /// One round, under the lock: the repair (until one succeeded), the
    /// merges of `queue`, and the removal of replaced segments past their
    /// retention (of all of them when `last`). A failed merge is logged,
    /// counted and returned for another try; the others go on. Blocking.
    fn run(&self, queue: Vec<(Sealed, u32)>, repair: bool, last: bool) -> Outcome {
        let mut outcome = Outcome {
            failed: Vec::new(),
            repaired: !repair,
            trouble: false,
        };
        let fail = |what: &str, error: SinkError, outcome: &mut Outcome| {
            self.stats.compaction_failed();
            outcome.trouble = true;
            warn!(
                error = %error,
                "{what} failed; the small files stay visible, and it is tried again later"
            );
        };
        let _lock = match lock(&self.base) {
            Ok(lock) => lock,
            Err(error) => {
                fail("taking the compaction lock", error, &mut outcome);
                outcome.failed = queue;
                return outcome;
            }
        };
        let mut queue = queue;
        if repair {
            match self.repair() {
                Ok(unmerged) => {
                    queue.extend(unmerged.into_iter().map(|segment| (segment, 0)));
                    outcome.repaired = true;
                }
                Err(error) => fail("repairing earlier compactions", error, &mut outcome),
            }
        }
        queue.sort();
        queue.dedup_by(|a, b| a.0 == b.0);
        for (segment, attempts) in queue {
            if let Err(error) = self.merge(&segment) {
                let what = format!("merging {}", segment.bucket.join(&segment.name).display());
                fail(&what, error, &mut outcome);
                outcome.failed.push((segment, attempts + 1));
            }
        }
        if let Err(error) = self.expire(last) {
            fail("removing replaced segments", error, &mut outcome);
        }
        outcome
    }

    /// Finds what earlier rounds of the lineage left (see the module's
    /// table): repairs interrupted merges, notes replaced segments, and
    /// returns the segments of earlier generations that were never merged.
    /// Directories that vanish meanwhile are skipped.
    fn repair(&self) -> Result<Vec<Sealed>, SinkError> {
        let mut unmerged = Vec::new();
        let mut buckets = Vec::new();
        visible_dirs(&self.base, &self.lineage, &mut buckets)?;
        for bucket in buckets {
            let listing = |e| io_error(format!("listing {}", bucket.display()), e);
            let entries = match fs::read_dir(&bucket) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(listing(e)),
            };
            for entry in entries {
                let entry = entry.map_err(listing)?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if let Some((generation, _)) = parse_segment(&name, &self.lineage) {
                    let merged = entry.path().join(MANIFEST).exists();
                    if generation < self.generation.0 && !merged {
                        unmerged.push(Sealed {
                            bucket: bucket.clone(),
                            name,
                        });
                    }
                } else if let Some(segment) = compacting_of(&name, &self.lineage) {
                    let working = entry.path();
                    if bucket.join(segment).join(MANIFEST).exists() {
                        // Exchanged: these are the replaced small files.
                        fsync_dir(&bucket)?;
                        self.replace(&bucket, segment, &working)?;
                    } else {
                        remove_all(&working)?;
                        debug!(segment, "removed an interrupted merge");
                    }
                } else if let Some(at) = replaced_at(&name, &self.lineage) {
                    self.note_replaced(entry.path(), at);
                }
            }
        }
        Ok(unmerged)
    }

    /// Merges the sealed segment `segment`: its files into one, exchanged
    /// for them. Nothing to do for a segment merged already, gone, or of
    /// one file.
    fn merge(&self, segment: &Sealed) -> Result<(), SinkError> {
        let bucket = &segment.bucket;
        let dir = bucket.join(&segment.name);
        let working = bucket.join(format!(".{}{COMPACTING}", segment.name));
        if dir.join(MANIFEST).exists() {
            if working.exists() {
                // Exchanged by a round that failed right after.
                fsync_dir(bucket)?;
                self.replace(bucket, &segment.name, &working)?;
            }
            return Ok(());
        }
        if !dir.exists() {
            return Ok(());
        }
        if working.exists() {
            remove_all(&working)?;
        }
        let files = visible_files(&dir)?;
        if files.len() < 2 {
            return Ok(());
        }
        fs::create_dir(&working)
            .map_err(|e| io_error(format!("creating {}", working.display()), e))?;
        if let Err(error) = self.merge_into(segment, &dir, &working, &files) {
            // Nothing was exchanged: the copy is of no use.
            let _ = remove_all(&working);
            return Err(error);
        }
        exchange(&working, &dir).map_err(|e| {
            io_error(
                format!("exchanging {} and {}", working.display(), dir.display()),
                e,
            )
        })?;
        fsync_dir(bucket)?;
        #[cfg(feature = "failpoints")]
        fail::fail_point!("compaction-after-exchange", |_| Err(SinkError::msg(
            "simulated failure at failpoint compaction-after-exchange"
        )));
        self.replace(bucket, &segment.name, &working)?;
        self.stats.compacted(files.len() as u64);
        debug!(segment = %dir.display(), files = files.len(), "merged a segment");
        Ok(())
    }

    /// Writes the merged copy of `files` (of the segment directory `dir`)
    /// and its manifest into the working directory `working`, durably.
    fn merge_into(
        &self,
        segment: &Sealed,
        dir: &Path,
        working: &Path,
        files: &[(String, u64)],
    ) -> Result<(), SinkError> {
        let merged_name = format!("{}-{}{}", self.prefix, segment.name, self.suffix);
        let merged_path = working.join(&merged_name);
        let mut merged = File::create_new(&merged_path)
            .map_err(|e| io_error(format!("creating {}", merged_path.display()), e))?;
        let mut sources = Vec::with_capacity(files.len());
        if let Some(merger) = &self.merger {
            let paths: Vec<(PathBuf, u64)> = (files.iter())
                .map(|(name, bytes)| (dir.join(name), *bytes))
                .collect();
            merger.merge(&paths, &mut merged)?;
            sources.extend(files.iter().map(|(name, bytes)| Source {
                name: name.clone(),
                bytes: *bytes,
            }));
        }
        for (name, bytes) in files.iter().filter(|_| self.merger.is_none()) {
            let path = dir.join(name);
            let mut source = File::open(&path)
                .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
            let copied = io::copy(&mut source, &mut merged).map_err(|e| {
                io_error(
                    format!("copying {} into {}", path.display(), merged_path.display()),
                    e,
                )
            })?;
            if copied != *bytes {
                return Err(SinkError::msg(format!(
                    "{} changed while it was merged ({copied} bytes copied, {bytes} listed); the \
                     segment is left as it is",
                    path.display()
                )));
            }
            sources.push(Source {
                name: name.clone(),
                bytes: *bytes,
            });
        }
        merged
            .sync_all()
            .map_err(|e| io_error(format!("syncing {}", merged_path.display()), e))?;
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            merged: merged_name,
            sources,
        };
        let manifest_path = working.join(MANIFEST);
        let encoded = serde_json::to_vec(&manifest)
            .map_err(|e| SinkError::other("encoding a compaction manifest", e))?;
        File::create_new(&manifest_path)
            .and_then(|mut file| file.write_all(&encoded).and_then(|()| file.sync_all()))
            .map_err(|e| io_error(format!("writing {}", manifest_path.display()), e))?;
        fsync_dir(working)?;
        #[cfg(feature = "failpoints")]
        fail::fail_point!("compaction-before-exchange", |_| Err(SinkError::msg(
            "simulated failure at failpoint compaction-before-exchange"
        )));
        Ok(())
    }

    /// Moves an exchanged working directory (now the small files) out of
    /// the way, to `.<segment>.replaced-<now>`, for the retention; any file
    /// committed into it that the merge did not see is put back first.
    fn replace(&self, bucket: &Path, segment: &str, working: &Path) -> Result<(), SinkError> {
        rescue(working, &bucket.join(segment))?;
        let now_ms = self.clock.now_ms();
        let replaced = bucket.join(format!(".{segment}{REPLACED}{now_ms}"));
        fs::rename(working, &replaced).map_err(|e| {
            io_error(
                format!("renaming {} to {}", working.display(), replaced.display()),
                e,
            )
        })?;
        self.note_replaced(replaced, now_ms);
        Ok(())
    }

    fn note_replaced(&self, path: PathBuf, at_ms: u64) {
        self.compaction
            .replaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path, at_ms));
    }

    /// Removes the replaced segments whose retention passed (all of them
    /// when `all`), each after a last look for files the merge did not see.
    /// Those not removed stay listed.
    fn expire(&self, all: bool) -> Result<(), SinkError> {
        let retention = millis(self.compaction.policy.retention);
        let now_ms = self.clock.now_ms();
        let due: Vec<(PathBuf, u64)> = {
            let mut replaced = self
                .compaction
                .replaced
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let (due, kept) = std::mem::take(&mut *replaced)
                .into_iter()
                .partition(|(_, at)| all || now_ms.saturating_sub(*at) >= retention);
            *replaced = kept;
            due
        };
        let mut first_error = None;
        for (path, at) in due {
            let removed = segment_of_replaced(&path)
                .map_or(Ok(()), |segment| rescue(&path, &segment))
                .and_then(|()| remove_all(&path));
            if let Err(error) = removed {
                self.note_replaced(path, at);
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The visible regular files of the directory `dir`, by name, with their
/// sizes.
fn visible_files(dir: &Path) -> Result<Vec<(String, u64)>, SinkError> {
    let listing = |e| io_error(format!("listing {}", dir.display()), e);
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let meta = entry
            .metadata()
            .map_err(|e| io_error(format!("reading {}", entry.path().display()), e))?;
        if meta.is_file() && !name.starts_with('.') {
            files.push((name, meta.len()));
        }
    }
    files.sort();
    Ok(files)
}

/// Moves back into the merged segment `segment` every file of its replaced
/// directory `replaced` that its manifest does not list: a commit that
/// reached the old directory after the merge listed it (a committer of an
/// earlier start of the job still finishing, in another sink object). It
/// stays visible, not merged; deleting it would lose it.
fn rescue(replaced: &Path, segment: &Path) -> Result<(), SinkError> {
    let Some(manifest) = read_manifest(segment)
        .map_err(|e| io_error(format!("reading the manifest of {}", segment.display()), e))?
    else {
        return Ok(());
    };
    let merged: std::collections::HashSet<&str> =
        manifest.sources.iter().map(|s| s.name.as_str()).collect();
    let mut moved = 0;
    for (name, _) in visible_files(replaced)? {
        if merged.contains(name.as_str()) {
            continue;
        }
        let (from, to) = (replaced.join(&name), segment.join(&name));
        fs::rename(&from, &to).map_err(|e| {
            io_error(
                format!("moving {} back to {}", from.display(), to.display()),
                e,
            )
        })?;
        warn!(file = %to.display(), "a file committed after its segment was merged was put back, unmerged");
        moved += 1;
    }
    if moved > 0 {
        fsync_dir(segment)?;
        fsync_dir(replaced)?;
    }
    Ok(())
}

/// The segment whose small files the replaced directory `replaced`
/// (`<bucket>/.<segment>.replaced-<ms>`) holds.
fn segment_of_replaced(replaced: &Path) -> Option<PathBuf> {
    let name = replaced.file_name()?.to_str()?;
    let (segment, _) = name.strip_prefix('.')?.rsplit_once(REPLACED)?;
    Some(replaced.with_file_name(segment))
}

/// Takes the base directory `base`'s compaction lock (an exclusive lock on
/// `<base>/.file-sink-compaction.lock`), waiting for another compactor's
/// round to end. Held by merge rounds, and by a committer before it
/// declares a file lost. Blocking.
pub(crate) fn lock(base: &Path) -> Result<File, SinkError> {
    assert_blocking("taking the compaction lock");
    let path = base.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(format!("opening the compaction lock {}", path.display()), e))?;
    file.lock()
        .map_err(|e| io_error(format!("locking {}", path.display()), e))?;
    Ok(file)
}

/// The segment of `lineage` whose interrupted or exchanged merge the
/// hidden directory `name` (`.<segment>.compacting`) is; `None` for other
/// names.
fn compacting_of<'a>(name: &'a str, lineage: &Lineage) -> Option<&'a str> {
    let segment = name.strip_prefix('.')?.strip_suffix(COMPACTING)?;
    parse_segment(segment, lineage).map(|_| segment)
}

/// When the segment of `lineage` in the hidden directory `name`
/// (`.<segment>.replaced-<ms>`) was replaced; `None` for other names.
fn replaced_at(name: &str, lineage: &Lineage) -> Option<u64> {
    let (segment, at) = name.strip_prefix('.')?.rsplit_once(REPLACED)?;
    parse_segment(segment, lineage)?;
    at.parse().ok()
}

/// The base directory and every directory under it that may hold buckets:
/// not hidden, and not a segment of `lineage` (whose files are not
/// buckets).
fn visible_dirs(dir: &Path, lineage: &Lineage, found: &mut Vec<PathBuf>) -> Result<(), SinkError> {
    found.push(dir.to_path_buf());
    let listing = |e| io_error(format!("listing {}", dir.display()), e);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(listing(e)),
    };
    for entry in entries {
        let entry = entry.map_err(listing)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().map_err(listing)?.is_dir()
            && !name.starts_with('.')
            && !(name.starts_with(SEGMENT_PREFIX) && parse_segment(&name, lineage).is_some())
        {
            visible_dirs(&entry.path(), lineage, found)?;
        }
    }
    Ok(())
}

fn remove_all(path: &Path) -> Result<(), SinkError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(format!("removing {}", path.display()), e)),
    }
}

/// Swaps the directories `a` and `b` atomically (`renameat2` with
/// `RENAME_EXCHANGE`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    assert_blocking("exchanging two directories");
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "exchanging two directories atomically needs Linux's renameat2",
    ))
}

/// The start of the probe's directories, in the base directory.
const PROBE: &str = ".compaction-probe-";

/// Probes whose directories another start removed, before the probe fails.
const PROBE_ATTEMPTS: u32 = 5;

/// Checks that the filesystem of `base` exchanges directories atomically.
/// On a fresh start (`fresh`) a missing `base` is created (durably), as its
/// writers would; on a restored start a missing `base` is left to the
/// writers to refuse, and nothing is probed. Leftovers of a probe cut short
/// are removed. Called by the sink's start hook when it compacts; a refusal
/// is permanent and names the fix.
pub(crate) fn probe(base: &Path, fresh: bool) -> Result<(), SinkError> {
    assert_blocking("probing the filesystem for compaction");
    if !base.exists() {
        if !fresh {
            return Ok(());
        }
        // With every entry above it durable.
        sink_local_fs::create_dir_all(base).map_err(|e| {
            io_error(
                format!("creating the output directory {}", base.display()),
                e,
            )
        })?;
    }
    let listing = |e| io_error(format!("listing {}", base.display()), e);
    for entry in fs::read_dir(base).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        if entry.file_name().to_string_lossy().starts_with(PROBE) {
            remove_all(&entry.path())?;
        }
    }
    // Another start on the same output removes this probe's directories
    // as leftovers when it begins at the same moment (two instances of a
    // job reading the same splits): the exchange then finds them gone,
    // which says nothing of the filesystem, and is tried again.
    let mut attempt = 0;
    let result = loop {
        let id = uuid::Uuid::new_v4();
        let a = base.join(format!("{PROBE}{id}-a"));
        let b = base.join(format!("{PROBE}{id}-b"));
        let made = fs::create_dir(&a).and_then(|()| fs::create_dir(&b));
        let result = made.and_then(|()| exchange(&a, &b));
        let _ = fs::remove_dir(&a);
        let _ = fs::remove_dir(&b);
        match result {
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < PROBE_ATTEMPTS => {
                attempt += 1;
            }
            other => break other,
        }
    };
    result.map_err(|e| {
        SinkError::io(
            format!(
                "compaction needs a filesystem that exchanges directories atomically (renameat2 \
                 RENAME_EXCHANGE: ext4, XFS, Btrfs, tmpfs), and {} is not on one; put the output on \
                 such a filesystem or turn compaction off",
                base.display()
            ),
            e,
        )
        .permanent()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::on_this_thread;
    use crate::segments::{find_committed, segment_name, Found};
    use sink_api::ManualClock;

    fn lineage() -> Lineage {
        Lineage::new("0123abcd")
    }

    fn round(base: &Path, generation: u64, retention: Duration, clock: &ManualClock) -> Round {
        Round {
            compaction: Arc::new(Compaction::new(
                CompactionPolicy::default().retention(retention),
            )),
            base: base.to_path_buf(),
            prefix: "part".into(),
            suffix: ".txt".into(),
            merger: None,
            lineage: lineage(),
            generation: Generation(generation),
            stats: Arc::default(),
            clock: Arc::new(clock.clone()),
        }
    }

    fn segment(base: &Path, generation: u64, epoch: u64, files: &[(&str, &str)]) -> Sealed {
        let name = segment_name(&lineage(), Generation(generation), epoch);
        let dir = base.join(&name);
        fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            fs::write(dir.join(file), text).unwrap();
        }
        Sealed {
            bucket: base.to_path_buf(),
            name,
        }
    }

    /// Every number in the finished files, sorted.
    fn numbers(base: &Path) -> Vec<u32> {
        let mut numbers: Vec<u32> = crate::finished_files(base)
            .unwrap()
            .iter()
            .flat_map(|f| {
                fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .map(|l| l.parse().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        numbers.sort();
        numbers
    }

    fn run(round: &Round, queue: Vec<Sealed>, repair: bool, last: bool) -> Outcome {
        let queue = queue.into_iter().map(|segment| (segment, 0)).collect();
        on_this_thread(|| round.run(queue, repair, last))
    }

    #[test]
    fn a_segment_becomes_one_file_with_a_manifest_and_its_small_files_expire() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let sealed = segment(
            base,
            1,
            0,
            &[("part-b", "2\n"), ("part-a", "1\n"), ("part-c", "3\n")],
        );
        let clock = ManualClock::new(1_000);
        let round = round(base, 1, Duration::from_secs(60), &clock);
        let outcome = run(&round, vec![sealed.clone()], false, false);
        assert!(!outcome.trouble && outcome.failed.is_empty());
        let files = crate::finished_files(base).unwrap();
        let merged = base
            .join(&sealed.name)
            .join(format!("part-{}.txt", sealed.name));
        assert_eq!(files, vec![merged.clone()]);
        assert_eq!(fs::read_to_string(&merged).unwrap(), "1\n2\n3\n");
        assert_eq!(round.stats.snapshot().compacted_files, 3);
        assert_eq!(
            on_this_thread(|| find_committed(base, "part-b", Some(lineage().as_str()))).unwrap(),
            Found::Merged(base.join(&sealed.name), 2)
        );
        let replaced = base.join(format!(".{}.replaced-1000", sealed.name));
        assert!(replaced.join("part-a").exists(), "kept for the retention");
        clock.advance(59_999);
        run(&round, Vec::new(), false, false);
        assert!(replaced.exists());
        clock.advance(1);
        run(&round, Vec::new(), false, false);
        assert!(!replaced.exists(), "removed after it");
        // Merged already: left alone.
        run(&round, vec![sealed.clone()], false, false);
        assert_eq!(crate::finished_files(base).unwrap(), vec![merged]);
    }

    #[test]
    fn a_file_committed_into_a_merged_segment_is_put_back_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let sealed = segment(base, 1, 0, &[("part-a", "1\n"), ("part-b", "2\n")]);
        let clock = ManualClock::new(1_000);
        let round = round(base, 1, Duration::from_secs(60), &clock);
        run(&round, vec![sealed.clone()], false, false);
        // A late committer's rename reached the old directory after the merge.
        let replaced = base.join(format!(".{}.replaced-1000", sealed.name));
        fs::write(replaced.join("part-late"), "3\n").unwrap();
        clock.advance(60_000);
        run(&round, Vec::new(), false, false);
        assert!(!replaced.exists());
        assert_eq!(
            numbers(base),
            vec![1, 2, 3],
            "the late file is visible, once"
        );
        assert!(base.join(&sealed.name).join("part-late").exists());
    }

    #[test]
    fn a_segment_that_cannot_be_merged_does_not_hold_up_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let bad = segment(base, 1, 0, &[("part-a", "1\n"), ("part-b", "2\n")]);
        // A file where its working directory goes: its merge fails.
        fs::write(base.join(format!(".{}{COMPACTING}", bad.name)), "x").unwrap();
        let good = segment(base, 1, 1, &[("part-c", "3\n"), ("part-d", "4\n")]);
        let clock = ManualClock::new(1_000);
        let round = round(base, 1, Duration::ZERO, &clock);
        let outcome = run(&round, vec![bad.clone(), good.clone()], false, false);
        assert!(outcome.trouble);
        assert_eq!(outcome.failed, vec![(bad.clone(), 1)], "tried again later");
        assert!(
            base.join(&good.name).join(MANIFEST).exists(),
            "the other merged"
        );
        assert!(!base.join(&bad.name).join(MANIFEST).exists());
        assert_eq!(numbers(base), vec![1, 2, 3, 4], "nothing lost either way");
        assert_eq!(round.stats.snapshot().compaction_failures, 1);
    }

    #[test]
    fn a_start_repairs_interrupted_merges_and_merges_earlier_generations_only() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        // Generation 1: one segment whose merge was cut short, one never merged.
        let cut = segment(base, 1, 0, &[("part-a", "1\n"), ("part-b", "2\n")]);
        let working = base.join(format!(".{}{COMPACTING}", cut.name));
        fs::create_dir(&working).unwrap();
        fs::write(working.join("part-half"), "1\n").unwrap();
        let never = segment(base, 1, 1, &[("part-c", "3\n"), ("part-d", "4\n")]);
        // Generation 1's segment exchanged but not renamed.
        let exchanged = segment(base, 1, 2, &[("part-m", "5\n6\n")]);
        fs::write(
            base.join(&exchanged.name).join(MANIFEST),
            serde_json::to_vec(&Manifest {
                format: MANIFEST_FORMAT,
                merged: "part-m".into(),
                sources: vec![Source {
                    name: "part-e".into(),
                    bytes: 2,
                }],
            })
            .unwrap(),
        )
        .unwrap();
        let old = base.join(format!(".{}{COMPACTING}", exchanged.name));
        fs::create_dir(&old).unwrap();
        fs::write(old.join("part-e"), "5\n").unwrap();
        // This start's own segment, and another lineage's: not merged.
        let current = segment(base, 2, 0, &[("part-f", "7\n"), ("part-g", "8\n")]);
        let foreign = base.join("seg-ffff-0000000001-0000000000");
        fs::create_dir(&foreign).unwrap();
        fs::write(foreign.join("part-h"), "9\n").unwrap();
        fs::write(foreign.join("part-i"), "10\n").unwrap();

        let clock = ManualClock::new(5_000);
        let round = round(base, 2, Duration::ZERO, &clock);
        let outcome = run(&round, Vec::new(), true, false);
        assert!(outcome.repaired && !outcome.trouble);
        assert!(!working.exists() && !old.exists());
        for merged in [&cut, &never] {
            assert!(
                base.join(&merged.name).join(MANIFEST).exists(),
                "{merged:?}"
            );
        }
        assert!(!base.join(&current.name).join(MANIFEST).exists());
        assert!(foreign.join("part-h").exists());
        assert_eq!(numbers(base), (1..=10).collect::<Vec<_>>(), "each once");
        assert!(
            fs::read_dir(base)
                .unwrap()
                .flatten()
                .all(|e| !e.file_name().to_string_lossy().contains(REPLACED)),
            "no retention: replaced segments removed"
        );
    }

    #[test]
    fn the_last_round_removes_every_replaced_segment() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let sealed = segment(base, 1, 0, &[("part-a", "1\n"), ("part-b", "2\n")]);
        let clock = ManualClock::new(1_000);
        let round = round(base, 1, Duration::from_secs(3600), &clock);
        run(&round, vec![sealed], false, true);
        assert!(fs::read_dir(base)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains(REPLACED)));
        assert_eq!(numbers(base), vec![1, 2]);
    }

    #[test]
    fn the_probe_passes_here_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("out");
        on_this_thread(|| probe(&base, false)).unwrap();
        assert!(!base.exists(), "a restored start creates nothing");
        on_this_thread(|| probe(&base, true)).unwrap();
        assert_eq!(fs::read_dir(&base).unwrap().count(), 0);
        fs::create_dir(base.join(format!("{PROBE}cut-short-a"))).unwrap();
        on_this_thread(|| probe(&base, false)).unwrap();
        assert_eq!(fs::read_dir(&base).unwrap().count(), 0, "leftovers removed");
    }
}
