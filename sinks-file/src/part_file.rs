//! The life of one part file, on disk.
//!
//! ```text
//!  .part-<uuid>-<n>.inprogress.<lineage>   in progress: being written, hidden
//!        │ roll (flush, close; its fsync starts on a blocking thread)
//!        ▼
//!  .part-<uuid>-<n>.inprogress.<lineage>   pending: complete, still hidden; durable before
//!        │                               the checkpoint that refers to it is acknowledged
//!        │ commit: atomic rename
//!        ▼
//!  part-<uuid>-<n><suffix>               finished: visible to readers
//! ```
//!
//! At a checkpoint an in-progress file is *persisted*: flushed, its path and
//! length recorded in the writer's state, and fsynced before the checkpoint
//! is acknowledged. A restore truncates it
//! back to that length and turns it into a pending file, so that exactly the
//! records before the checkpoint are in it.
//!
//! Committables and writer states name files relative to the sink's base
//! directory, with the base directory's identity (see the `identity` module):
//! a stopped job's directory may be moved or copied before it resumes.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sink_api::{Lineage, SinkError};

use crate::blocking::assert_blocking;
use crate::dir_sync::DirSyncs;
use crate::hidden_name::hidden_name;
use crate::identity::{resolve, OutputIdentity};
use crate::io_error::io_error;
use crate::rolling::PartInfo;
use crate::state::{FileCommittable, InProgressState};

/// Size of each part file's write buffer.
const WRITE_BUFFER_BYTES: usize = 1024 * 1024;

/// Every this many bytes written to a part, its data so far is synced in
/// the background (write-behind, as RocksDB's `bytes_per_sync`): the disk
/// works while the writer writes, and the fsync a checkpoint waits for has
/// little left to do. A failure of one of these syncs is kept (see
/// [`PartSync`]) and fails the next checkpoint's.
const WRITE_BEHIND_BYTES: u64 = 16 * 1024 * 1024;

/// The syncs of one part file, shared by all of them: every handle on the
/// file (`File::try_clone`) shares one open file description, and Linux
/// reports a write-back error to the first fsync through any of them only.
/// So syncs of a part never overlap (the lock), and an error any of them saw
/// is kept and reported by every later one: a checkpoint never completes
/// over data a background sync failed to write.
#[derive(Debug, Default)]
pub(crate) struct PartSync {
    lock: Mutex<()>,
    failed: Mutex<Option<String>>,
    /// Set while a write-behind sync of the part is queued or runs.
    behind: AtomicBool,
}

impl PartSync {
    /// Syncs `file`'s data (the part at `path`), under the part's lock; the
    /// error of this sync, or of any earlier one.
    fn sync(&self, file: &File, path: &Path) -> Result<(), SinkError> {
        let _turn = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(feature = "failpoints")]
        fail::fail_point!("file-sync-fails", |_| {
            self.record("simulated failure at failpoint file-sync-fails".into());
            Err(SinkError::msg(format!(
                "syncing the part file {}: simulated failure at failpoint file-sync-fails",
                path.display()
            )))
        });
        if let Err(e) = file.sync_data() {
            self.record(e.to_string());
            return Err(io_error(
                format!("syncing the part file {}", path.display()),
                e,
            ));
        }
        match self.failed.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            None => Ok(()),
            Some(earlier) => Err(SinkError::msg(format!(
                "an earlier sync of the part file {} failed ({earlier}): what was written before it \
                 may not be on disk, so no checkpoint may refer to it; the job restarts from its last \
                 checkpoint",
                path.display()
            ))),
        }
    }

    fn record(&self, error: String) {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(error);
    }
}

/// Names of one part in the bucket directory `dir` (relative to the base
/// directory): the hidden in-progress file, ending with the job's lineage
/// (see the `orphans` module), and the visible target.
pub(crate) fn part_paths(
    dir: &Path,
    prefix: &str,
    writer_id: &str,
    counter: u64,
    suffix: &str,
    lineage: &Lineage,
) -> (PathBuf, PathBuf) {
    let visible = format!("{prefix}-{writer_id}-{counter}{suffix}");
    let hidden = hidden_name(&visible, lineage);
    (dir.join(hidden), dir.join(visible))
}

/// A part file being written.
pub(crate) struct InProgressPart {
    /// The hidden file, as opened (the base directory joined with `relative`).
    path: PathBuf,
    /// The hidden file, relative to the base directory.
    relative: PathBuf,
    /// The visible name, relative to the base directory.
    target: PathBuf,
    file: BufWriter<File>,
    pub(crate) info: PartInfo,
    records: u64,
    /// Directories to fsync before the file may be referred to by a
    /// checkpoint (emptied by the first persist).
    unsynced_dirs: Vec<PathBuf>,
    /// Taken right after the file and its directories were created.
    created_seq: u64,
    /// The sink's directory fsyncs.
    syncs: Arc<DirSyncs>,
    /// Bytes written since the last write-behind sync started.
    unsynced_bytes: u64,
    /// Its syncs, shared with the background ones and the checkpoints'.
    sync: Arc<PartSync>,
}

impl InProgressPart {
    /// Creates the hidden file `base/relative`, to become `base/target` when
    /// committed (both relative to the base directory `base`).
    pub(crate) fn create(
        base: &Path,
        relative: PathBuf,
        target: PathBuf,
        now_ms: u64,
        syncs: &Arc<DirSyncs>,
    ) -> Result<InProgressPart, SinkError> {
        assert_blocking("creating a part file");
        let path = base.join(&relative);
        // Directories whose entries the file's name depends on: its own,
        // and, until this sink has synced them, the parent of every
        // directory between the base and it, whoever created them (another
        // subtask, which may not have synced yet; an earlier run, killed
        // before it did). They are synced at the first persist, before a
        // checkpoint can refer to the file.
        let mut unsynced_dirs = Vec::new();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| {
                io_error(
                    format!("creating the bucket directory {}", dir.display()),
                    e,
                )
            })?;
            if !syncs.is_durable(dir) {
                let mut below = dir;
                while let Some(parent) = below.parent().filter(|_| below != base) {
                    unsynced_dirs.push(parent.to_path_buf());
                    below = parent;
                }
            }
            unsynced_dirs.push(dir.to_path_buf());
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error(format!("creating the part file {}", path.display()), e))?;
        let created_seq = syncs.sequence();
        Ok(InProgressPart {
            path,
            relative,
            target,
            file: BufWriter::with_capacity(WRITE_BUFFER_BYTES, file),
            info: PartInfo {
                size_bytes: 0,
                created_ms: now_ms,
                last_write_ms: now_ms,
            },
            records: 0,
            unsynced_dirs,
            created_seq,
            syncs: syncs.clone(),
            unsynced_bytes: 0,
            sync: Arc::default(),
        })
    }

    /// Appends `bytes` holding `records` more records: one encoded record
    /// of a row format, or what a bulk format handed out.
    pub(crate) fn write(
        &mut self,
        bytes: &[u8],
        records: u64,
        now_ms: u64,
    ) -> Result<(), SinkError> {
        self.file
            .write_all(bytes)
            .map_err(|e| io_error(format!("writing the part file {}", self.path.display()), e))?;
        self.info.size_bytes += bytes.len() as u64;
        self.info.last_write_ms = now_ms;
        self.records += records;
        self.unsynced_bytes += bytes.len() as u64;
        if self.unsynced_bytes >= WRITE_BEHIND_BYTES {
            self.write_behind()?;
        }
        Ok(())
    }

    /// Starts a sync of what was written so far on a blocking thread,
    /// unless one is queued or runs (or no tokio runtime is there to run
    /// it). It is not waited for; its error is kept in [`PartSync`] and
    /// fails the next sync a checkpoint waits for.
    fn write_behind(&mut self) -> Result<(), SinkError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Ok(());
        };
        if self.sync.behind.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.unsynced_bytes = 0;
        self.flush()?;
        let sync = self.sync.clone();
        match self.file.get_ref().try_clone() {
            Ok(file) => {
                let path = self.path.clone();
                runtime.spawn_blocking(move || {
                    let _ = sync.sync(&file, &path);
                    sync.behind.store(false, Ordering::Release);
                });
            }
            Err(_) => sync.behind.store(false, Ordering::Release),
        }
        Ok(())
    }

    /// Hands buffered bytes to the operating system.
    pub(crate) fn flush(&mut self) -> Result<(), SinkError> {
        self.file
            .flush()
            .map_err(|e| io_error(format!("flushing the part file {}", self.path.display()), e))
    }

    /// Describes everything written so far for a checkpoint, with what is
    /// left to make it durable (see [`Unsynced`]); writing goes on
    /// afterwards. The buffered bytes are handed to the operating system
    /// here, so the fsync may run on another thread while this one writes.
    pub(crate) fn persist(&mut self) -> Result<(InProgressState, Unsynced), SinkError> {
        self.flush()?;
        let file = self.file.get_ref().try_clone().map_err(|e| {
            io_error(
                format!(
                    "opening the part file {} again to sync it",
                    self.path.display()
                ),
                e,
            )
        })?;
        let unsynced = Unsynced {
            path: self.path.clone(),
            file,
            dirs: std::mem::take(&mut self.unsynced_dirs),
            created_seq: self.created_seq,
            syncs: self.syncs.clone(),
            sync: self.sync.clone(),
        };
        Ok((self.state(), unsynced))
    }

    fn state(&self) -> InProgressState {
        InProgressState {
            path: self.relative.clone(),
            target: self.target.clone(),
            length: self.info.size_bytes,
            records: self.records,
            upload: None,
            tail: Vec::new(),
        }
    }

    /// Closes the part for good: complete, and ready to be committed in the
    /// output directory `output` once what is returned with it was synced.
    pub(crate) fn close_for_commit(
        mut self,
        output: &OutputIdentity,
    ) -> Result<(FileCommittable, Unsynced), SinkError> {
        self.flush()?;
        let state = self.state();
        let file = self.file.into_inner().map_err(|e| {
            io_error(
                format!("flushing the part file {}", self.path.display()),
                e.into_error(),
            )
        })?;
        let unsynced = Unsynced {
            path: self.path,
            file,
            dirs: self.unsynced_dirs,
            created_seq: self.created_seq,
            syncs: self.syncs,
            sync: self.sync,
        };
        let committable = FileCommittable {
            output_id: output.id.clone(),
            output_dir: output.dir.clone(),
            pending: state.path,
            target: state.target,
            size_bytes: state.length,
            records: state.records,
            upload: None,
            positions: None,
        };
        Ok((committable, unsynced))
    }
}

/// A part file whose bytes (and maybe name) are not durable yet: what a
/// checkpoint that refers to it waits for. Synced by the writer's
/// durability work ([`sink_api::SinkWriter::durability`]), on a blocking
/// thread, while the writer goes on.
pub(crate) struct Unsynced {
    path: PathBuf,
    /// The part's file (or a second handle on it, for a part still
    /// written).
    file: File,
    /// Directories whose entries for the file are not durable yet.
    dirs: Vec<PathBuf>,
    created_seq: u64,
    syncs: Arc<DirSyncs>,
    /// The part's syncs (see [`PartSync`]).
    sync: Arc<PartSync>,
}

impl Unsynced {
    /// Makes the file's bytes, as far as they were handed to the operating
    /// system, and its name durable. Blocking.
    pub(crate) fn sync(self) -> Result<(), SinkError> {
        assert_blocking("fsync of a part file");
        self.sync.sync(&self.file, &self.path)?;
        // The file's name must survive a power loss too, not only its data.
        for dir in &self.dirs {
            self.syncs.sync_dir_since(dir, self.created_seq)?;
        }
        // The file's own directory comes last: it and every name above it
        // (up to the base) are durable now.
        if let Some(dir) = self.dirs.last() {
            self.syncs.durable_dir(dir);
        }
        Ok(())
    }
}

/// Turns an in-progress part recorded in a checkpoint into a pending file of
/// the base directory `base` (whose identity is `output`, already checked
/// against the state's): truncates it back to its recorded length (dropping
/// what was written after the checkpoint, which the source replays) and
/// makes that durable.
pub(crate) fn recover_for_commit(
    base: &Path,
    output: &OutputIdentity,
    state: &InProgressState,
) -> Result<FileCommittable, SinkError> {
    assert_blocking("truncating and syncing a restored part file");
    resolve(base, &state.target)?;
    let path = &resolve(base, &state.path)?;
    let file = OpenOptions::new().write(true).open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            SinkError::msg(format!(
                "the in-progress part file {} recorded in the checkpoint has vanished; its {} records \
                 cannot be recovered. Was the hidden file deleted from the output directory? Restore it, \
                 or start the job afresh",
                path.display(),
                state.records
            ))
        .permanent()
        } else {
            io_error(format!("opening the in-progress part file {} to recover it", path.display()), e)
        }
    })?;
    let length = file
        .metadata()
        .map_err(|e| io_error(format!("reading the size of {}", path.display()), e))?
        .len();
    if length < state.length {
        return Err(SinkError::msg(format!(
            "the in-progress part file {} holds {length} bytes, fewer than the {} recorded in the checkpoint; \
             it was truncated by something else than this sink",
            path.display(),
            state.length
        ))
        .permanent());
    }
    file.set_len(state.length)
        .and_then(|()| file.sync_all())
        .map_err(|e| {
            io_error(
                format!("truncating {} to its checkpointed length", path.display()),
                e,
            )
        })?;
    Ok(FileCommittable {
        output_id: output.id.clone(),
        output_dir: output.dir.clone(),
        pending: state.path.clone(),
        target: state.target.clone(),
        size_bytes: state.length,
        records: state.records,
        upload: None,
        positions: None,
    })
}
