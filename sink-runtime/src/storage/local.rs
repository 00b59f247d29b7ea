//! Durable checkpoints in a local state directory: the embedded default.
//!
//! ```text
//! STATE_DIR/
//!   LOCK                                   held (flock) while a job uses the directory
//!   GENERATION                             the last generation started here
//!   LINEAGE                                the lineage of starts while no checkpoint carries it
//!   checkpoint-00000000000000000007.ckpt   the newest K completed checkpoints
//!   checkpoint-00000000000000000008.ckpt
//!   FINISHED                               written once the job ended with everything committed
//! ```
//!
//! Every file but `LOCK` is written atomically (a temporary file, fsync,
//! rename, fsync of the directory) and framed with a checksum and a format
//! version (the `frame` module).
//!
//! A newest checkpoint that is truncated, fails its checksum or has an unknown
//! version is an error naming the file ([`StorageError::Corrupt`]); there is no
//! silent fallback to an older one. File I/O runs on tokio's blocking pool.
//!
//! [`LocalCheckpointStorage::start_over`] forgets a job's progress under the
//! lock (checkpoints, `FINISHED` and `LINEAGE` go, `GENERATION` stays), for
//! programs that start a job over in the same directory.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};
use sink_api::{CheckpointId, Generation, Lineage};

use super::frame::{self, Framed, Kind};
use super::shared::{stored_form, ChunkBook, Holder, StoredCheckpoint};
use super::{CheckpointStorage, CompletedCheckpoint, FinishedMarker, StorageError};

const LOCK_FILE: &str = "LOCK";
const GENERATION_FILE: &str = "GENERATION";
const FINISHED_FILE: &str = "FINISHED";
const LINEAGE_FILE: &str = "LINEAGE";
const CHECKPOINT_PREFIX: &str = "checkpoint-";
const CHECKPOINT_SUFFIX: &str = ".ckpt";

/// Durable checkpoint storage in a local directory, exclusively owned by one
/// running job (see the module docs for the layout).
///
/// Made by the user with [`open`](Self::open) and given to
/// `JobBuilder::checkpoint_storage`. Clones share the directory and its lock;
/// the lock is released when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct LocalCheckpointStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    retained: usize,
    /// Whether `LINEAGE` was removed (once a stored checkpoint carries the
    /// lineage).
    lineage_removed: std::sync::atomic::AtomicBool,
    /// Where the chunks of the checkpoints here are held.
    book: std::sync::Mutex<ChunkBook>,
    _lock: File,
}

impl Inner {
    fn book(&self) -> std::sync::MutexGuard<'_, ChunkBook> {
        // Every change of the book is made whole under the lock; a panic
        // elsewhere leaves it consistent.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One checkpoint file found in a state directory, for inspection tools.
#[derive(Debug)]
pub struct CheckpointFile {
    /// The checkpoint id its name carries.
    pub checkpoint_id: CheckpointId,
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its content, or why it cannot be read.
    pub content: Result<CompletedCheckpoint, StorageError>,
}

/// What a state directory holds, read without taking its lock.
#[derive(Debug)]
pub struct StateDirectory {
    /// The last generation started, if any.
    pub generation: Option<Generation>,
    /// The finished marker, if the job ended.
    pub finished: Option<FinishedMarker>,
    /// The checkpoint files, oldest first.
    pub checkpoints: Vec<CheckpointFile>,
    /// Whether a running instance holds the directory now.
    pub locked: bool,
}

impl LocalCheckpointStorage {
    /// Opens (creating it if needed) the state directory `dir`, keeping the
    /// newest 3 checkpoints, and takes its lock. Fails with
    /// [`StorageError::Locked`] when another live instance holds it.
    pub fn open(dir: impl AsRef<Path>) -> Result<LocalCheckpointStorage, StorageError> {
        LocalCheckpointStorage::open_retaining(dir, 3)
    }

    /// Like [`open`](Self::open), keeping the newest `retained` (at least 1)
    /// checkpoints.
    pub fn open_retaining(
        dir: impl AsRef<Path>,
        retained: usize,
    ) -> Result<LocalCheckpointStorage, StorageError> {
        let dir = dir.as_ref().to_path_buf();
        // Its entry, and each above it, durable: a checkpoint reported
        // complete must not vanish with a directory that was never synced.
        sink_local_fs::create_dir_all(&dir).map_err(|e| {
            StorageError::io(format!("creating the state directory {}", dir.display()), e)
        })?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StorageError::io(format!("opening {}", lock_path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(StorageError::Locked { path: dir }),
            Err(fs::TryLockError::Error(e)) => {
                return Err(StorageError::io(
                    format!("locking {}", lock_path.display()),
                    e,
                ))
            }
        }
        Ok(LocalCheckpointStorage {
            inner: Arc::new(Inner {
                dir,
                retained: retained.max(1),
                lineage_removed: std::sync::atomic::AtomicBool::new(false),
                book: std::sync::Mutex::new(ChunkBook::default()),
                _lock: lock,
            }),
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Forgets the job's progress in this directory, so that the next job
    /// started on this storage starts from the beginning: removes every
    /// checkpoint and the `FINISHED` marker.
    ///
    /// Called by a program that offers to start a job over (the file sink
    /// demo's `--fresh`), after [`open`](Self::open) and before the job is
    /// built; never while a job runs on this storage. Because it needs an
    /// open storage, it runs under the directory's lock: a second instance
    /// cannot start over a directory in use, it gets
    /// [`StorageError::Locked`] from `open` first.
    ///
    /// # Guarantees
    ///
    /// - `GENERATION` is kept: the next start gets a generation larger than
    ///   any before, so names that sinks derive from generations never
    ///   repeat across runs of the directory. `LINEAGE` goes: the next start
    ///   begins a new lineage. `LOCK` is kept (and held).
    /// - `FINISHED` is removed first, then the checkpoints oldest first, and
    ///   the directory is synced: a crash part-way leaves the newest
    ///   checkpoints (a resume from them is still exact, or refused by a sink
    ///   whose output was cleared, or refused because a chunk they name was
    ///   in an older checkpoint, removed: start over again), never a state
    ///   that resumes from an older checkpoint than the newest, nor a
    ///   finished marker without its checkpoints.
    /// - Only the job's progress goes: what the job wrote elsewhere (a sink's
    ///   output) is the caller's to clear, and must be cleared while this
    ///   storage is open, so that no other instance is using it.
    ///
    /// Blocking file I/O, on the calling thread.
    pub fn start_over(&self) -> Result<(), StorageError> {
        let dir = &self.inner.dir;
        // The marker first: a crash after it leaves checkpoints a resume
        // refuses or completes, never a "finished" job with nothing behind it.
        remove_if_present(&dir.join(FINISHED_FILE))?;
        for (_, path) in list_checkpoints(dir)? {
            fs::remove_file(&path).map_err(|e| {
                StorageError::io(format!("removing the checkpoint {}", path.display()), e)
            })?;
        }
        self.inner.book().clear();
        // A new life: the next start draws a new lineage.
        remove_if_present(&dir.join(LINEAGE_FILE))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StorageError::io(format!("syncing the directory {}", dir.display()), e))
    }

    /// Sets `GENERATION` to `generation`, so that the next start gets
    /// `generation + 1`: the repair of a damaged generation file
    /// ([`StorageError::DamagedGeneration`]), called by `sink-inspect
    /// --set-generation` after [`open`](Self::open), under the lock, never
    /// while a job runs on this storage.
    ///
    /// Refused unless `generation` is above every generation the directory
    /// records (a readable `GENERATION`, the checkpoints, the finished
    /// marker): generations only grow. Written atomically. Blocking file
    /// I/O, on the calling thread.
    pub fn set_generation(&self, generation: Generation) -> Result<(), StorageError> {
        let dir = &self.inner.dir;
        let current = match read_generation(dir) {
            Ok(current) => current.unwrap_or(0),
            Err(StorageError::DamagedGeneration { .. }) => 0,
            Err(other) => return Err(other),
        };
        let highest = current.max(highest_recorded(dir));
        if generation.0 <= highest {
            return Err(StorageError::Message(format!(
                "generation {generation} is refused for {}: generations only grow, and the directory \
                 records generation {highest}; give a higher one",
                dir.display()
            )));
        }
        write_framed(dir, GENERATION_FILE, Kind::Generation, &generation.0)
    }

    /// Reads everything in the state directory `dir` without taking its
    /// lock (a running job may be writing it): for inspection tools.
    pub fn inspect(dir: impl AsRef<Path>) -> Result<StateDirectory, StorageError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(StorageError::Message(format!(
                "{} is not a state directory (it does not exist or is not a directory)",
                dir.display()
            )));
        }
        let locked = match File::open(dir.join(LOCK_FILE)) {
            Ok(file) => match file.try_lock_shared() {
                Ok(()) => false,
                Err(fs::TryLockError::WouldBlock) => true,
                Err(fs::TryLockError::Error(_)) => false,
            },
            Err(_) => false,
        };
        let checkpoints = list_checkpoints(dir)?
            .into_iter()
            .map(|(checkpoint_id, path)| {
                let size_bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                let content = load_checkpoint(dir, checkpoint_id, &path, None);
                CheckpointFile {
                    checkpoint_id,
                    path,
                    size_bytes,
                    content,
                }
            })
            .collect();
        Ok(StateDirectory {
            generation: read_generation(dir)?.map(Generation),
            finished: read_optional(&dir.join(FINISHED_FILE), Kind::Finished)?,
            checkpoints,
            locked,
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || work(&inner))
            .await
            .map_err(|e| {
                StorageError::Message(format!(
                    "a checkpoint storage operation ended abnormally: {e}"
                ))
            })?
    }
}

#[async_trait]
impl CheckpointStorage for LocalCheckpointStorage {
    async fn begin(&self) -> Result<Generation, StorageError> {
        self.blocking(|inner| {
            let path = inner.dir.join(GENERATION_FILE);
            let last = read_generation(&inner.dir)?.unwrap_or(0);
            let next = last.checked_add(1).ok_or_else(|| {
                StorageError::Message(format!(
                    "{} holds generation {last}, the largest there is: no start can get a new one. \
                     The file is damaged; use a new state directory (with a new output for sinks that \
                     keep theirs)",
                    path.display()
                ))
            })?;
            write_framed(&inner.dir, GENERATION_FILE, Kind::Generation, &next)?;
            Ok(Generation(next))
        })
        .await
    }

    /// Writes the checkpoint's file, with the chunks no kept checkpoint
    /// holds yet, then removes the files neither retained nor holding a
    /// chunk a retained checkpoint names.
    async fn store(&self, checkpoint: CompletedCheckpoint) -> Result<(), StorageError> {
        self.blocking(move |inner| {
            // Held through the whole store: a store abandoned by its caller
            // runs on, and the next must not interleave with it.
            let mut book = inner.book();
            let existing = list_checkpoints(&inner.dir)?;
            if let Some((newest, _)) = existing.last() {
                if *newest >= checkpoint.checkpoint_id {
                    return Err(StorageError::Message(format!(
                        "checkpoint {} is not newer than checkpoint {newest} already in {}; checkpoints are stored in order",
                        checkpoint.checkpoint_id,
                        inner.dir.display()
                    )));
                }
            }
            let name = checkpoint_file_name(checkpoint.checkpoint_id);
            let this = Holder {
                checkpoint: checkpoint.checkpoint_id,
                generation: checkpoint.generation,
            };
            let held = book.held(&checkpoint);
            let what = format!("checkpoint {}", checkpoint.checkpoint_id);
            let stored = stored_form(&checkpoint, this, &held);
            let references = stored.references(this);
            let bytes = frame::encode_written(Kind::Checkpoint, &stored, &what)?;
            write_atomically(&inner.dir, &name, &bytes)?;
            book.read(this, references);
            // Older checkpoints go only now that a newer one is durable.
            remove_unretained(inner, &mut book, &existing, this)?;
            // The lineage lives in the checkpoints from now on: a start that
            // finds none (they were removed) must draw a new one, or its
            // checkpoint ids would repeat in the lineage.
            if !inner.lineage_removed.load(std::sync::atomic::Ordering::Relaxed) {
                remove_if_present(&inner.dir.join(LINEAGE_FILE))?;
                inner
                    .lineage_removed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .await
    }

    /// The newest checkpoint file, with the chunks it names from the older
    /// files that hold them.
    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        self.blocking(|inner| match list_checkpoints(&inner.dir)?.pop() {
            Some((id, path)) => {
                let mut book = inner.book();
                load_checkpoint(&inner.dir, id, &path, Some(&mut book)).map(Some)
            }
            None => Ok(None),
        })
        .await
    }

    async fn mark_finished(&self, marker: FinishedMarker) -> Result<(), StorageError> {
        self.blocking(move |inner| write_framed(&inner.dir, FINISHED_FILE, Kind::Finished, &marker))
            .await
    }

    async fn finished(&self) -> Result<Option<FinishedMarker>, StorageError> {
        self.blocking(|inner| read_optional(&inner.dir.join(FINISHED_FILE), Kind::Finished))
            .await
    }

    /// `LINEAGE`, written atomically by the first start that restores no
    /// checkpoint (under the lock, so never by two at once); removed once a
    /// stored checkpoint carries the lineage, and by a start over.
    async fn lineage(&self, fresh: Lineage) -> Result<Lineage, StorageError> {
        self.blocking(move |inner| {
            let path = inner.dir.join(LINEAGE_FILE);
            // The next store removes it again.
            inner
                .lineage_removed
                .store(false, std::sync::atomic::Ordering::Relaxed);
            match read_optional::<Lineage>(&path, Kind::Lineage) {
                Ok(Some(kept)) => return Ok(kept),
                Ok(None) => {}
                Err(StorageError::Corrupt { problem, .. }) => {
                    return Err(StorageError::Message(format!(
                        "the lineage file {} is damaged: {problem}. It names the job's lineage, so \
                         that a start finds what earlier starts left behind; remove it to start a \
                         new lineage (what earlier starts left is then left alone)",
                        path.display()
                    )))
                }
                Err(other) => return Err(other),
            }
            write_framed(&inner.dir, LINEAGE_FILE, Kind::Lineage, &fresh)?;
            Ok(fresh)
        })
        .await
    }
}

fn checkpoint_file_name(id: CheckpointId) -> String {
    format!("{CHECKPOINT_PREFIX}{:020}{CHECKPOINT_SUFFIX}", id.0)
}

/// The checkpoint files of `dir`, oldest first. Other files (temporary ones
/// left by a crash among them) are ignored.
fn list_checkpoints(dir: &Path) -> Result<Vec<(CheckpointId, PathBuf)>, StorageError> {
    let entries = fs::read_dir(dir).map_err(|e| {
        StorageError::io(format!("listing the state directory {}", dir.display()), e)
    })?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| {
            StorageError::io(format!("listing the state directory {}", dir.display()), e)
        })?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CHECKPOINT_PREFIX))
            .and_then(|n| n.strip_suffix(CHECKPOINT_SUFFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        found.push((CheckpointId(id), entry.path()));
    }
    found.sort_by_key(|(id, _)| *id);
    Ok(found)
}

fn read_stored(path: &Path, id: CheckpointId) -> Result<StoredCheckpoint, StorageError> {
    let bytes = read_state_file(path, Kind::Checkpoint)?;
    frame::decode_checkpoint(&bytes, id, &path.display().to_string())
}

/// Checkpoint `id` of `dir`, at `path`, with the chunks it names read from
/// the files that hold them; what it names is recorded in `book`, if given.
fn load_checkpoint(
    dir: &Path,
    id: CheckpointId,
    path: &Path,
    book: Option<&mut ChunkBook>,
) -> Result<CompletedCheckpoint, StorageError> {
    let stored = read_stored(path, id)?;
    let this = Holder {
        checkpoint: id,
        generation: stored.generation(),
    };
    let mut held = std::collections::HashMap::new();
    for holder in stored.other_holders(this) {
        let holder_path = dir.join(checkpoint_file_name(holder.checkpoint));
        let chunks = match read_stored(&holder_path, holder.checkpoint) {
            Ok(other) if other.generation() == holder.generation => other.into_chunks(),
            // Gone or another checkpoint: named in the error below.
            Ok(_) => continue,
            Err(StorageError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue
            }
            Err(other) => return Err(other),
        };
        held.insert(holder, chunks);
    }
    let (checkpoint, references) = stored.resolve(this, &held, &path.display().to_string())?;
    if let Some(book) = book {
        book.read(this, references);
    }
    Ok(checkpoint)
}

/// Removes the checkpoint files of `existing` (the files before `newest`
/// was stored) that are neither among the retained ones (`newest` and the
/// ones before it) nor hold a chunk one of those names. A retained file
/// whose references cannot be read keeps every file: nothing it may name
/// is removed.
fn remove_unretained(
    inner: &Inner,
    book: &mut ChunkBook,
    existing: &[(CheckpointId, PathBuf)],
    newest: Holder,
) -> Result<(), StorageError> {
    let older_retained = &existing[existing.len() + 1 - inner.retained.min(existing.len() + 1)..];
    let mut retained = vec![newest];
    for (id, path) in older_retained {
        let known = book.known().find(|h| h.checkpoint == *id).copied();
        let holder = match known {
            Some(holder) => holder,
            None => match read_stored(path, *id) {
                Ok(stored) => {
                    let holder = Holder {
                        checkpoint: *id,
                        generation: stored.generation(),
                    };
                    book.read(holder, stored.references(holder));
                    holder
                }
                Err(error) => {
                    tracing::warn!(checkpoint = %path.display(), %error, "cannot read a retained checkpoint's references; no older checkpoint is removed");
                    return Ok(());
                }
            },
        };
        retained.push(holder);
    }
    let Some(keep) = book.keep(&retained) else {
        return Ok(());
    };
    let keep: Vec<CheckpointId> = keep.into_iter().map(|holder| holder.checkpoint).collect();
    for (id, path) in existing {
        if !keep.contains(id) {
            fs::remove_file(path).map_err(|e| {
                StorageError::io(format!("removing the old checkpoint {}", path.display()), e)
            })?;
        }
    }
    Ok(())
}

/// The bytes of the state file at `path`, its header checked before its
/// payload is read ([`frame::check_header`]): a file of the wrong size, a
/// device or a pipe in its place is refused after at most a header's read,
/// never read until memory runs out.
fn read_state_file(path: &Path, kind: Kind) -> Result<Vec<u8>, StorageError> {
    let location = path.display().to_string();
    let reading = |e| StorageError::io(format!("reading {location}"), e);
    // Following a symbolic link, as the open below does; a pipe would block
    // the open itself.
    let metadata = fs::metadata(path).map_err(reading)?;
    if !metadata.is_file() {
        return Err(StorageError::Corrupt {
            path: path.to_path_buf(),
            problem: format!(
                "it is not a regular file but a {}; a state file always is one",
                describe(&metadata.file_type())
            ),
        });
    }
    let file = File::open(path).map_err(reading)?;
    let size = file.metadata().map_err(reading)?.len();
    let mut bytes = Vec::new();
    let mut file = file.take(frame::HEADER_LEN as u64);
    file.read_to_end(&mut bytes).map_err(reading)?;
    frame::check_header(&bytes, size, kind, &location)?;
    let payload = size - frame::HEADER_LEN as u64;
    bytes.reserve_exact(usize::try_from(payload).unwrap_or(0));
    let mut file = file.into_inner().take(payload);
    file.read_to_end(&mut bytes).map_err(reading)?;
    Ok(bytes)
}

/// What a file that is not a regular one is, for messages.
fn describe(kind: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "named pipe"
    } else if kind.is_char_device() || kind.is_block_device() {
        "device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Removes the file at `path`, if there is one.
fn remove_if_present(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(format!("removing {}", path.display()), e)),
    }
}

/// The last generation started in `dir`, if any. A damaged file is
/// [`StorageError::DamagedGeneration`], with what the directory still
/// records: its own error and advice, not a checkpoint's.
fn read_generation(dir: &Path) -> Result<Option<u64>, StorageError> {
    let path = dir.join(GENERATION_FILE);
    read_optional::<u64>(&path, Kind::Generation).map_err(|error| match error {
        StorageError::Corrupt { problem, .. } => StorageError::DamagedGeneration {
            path,
            problem,
            highest_recorded: highest_recorded(dir),
        },
        other => other,
    })
}

/// The highest generation the readable checkpoints and finished marker of
/// `dir` record, 0 for none. Unreadable files are passed over: this is
/// advice for a repair, and [`LocalCheckpointStorage::set_generation`]'s
/// floor.
fn highest_recorded(dir: &Path) -> u64 {
    let checkpoints = list_checkpoints(dir).unwrap_or_default();
    let from_checkpoints = checkpoints
        .iter()
        .filter_map(|(id, path)| read_stored(path, *id).ok())
        .map(|checkpoint| checkpoint.generation().0);
    let finished = read_optional::<FinishedMarker>(&dir.join(FINISHED_FILE), Kind::Finished)
        .ok()
        .flatten()
        .map(|marker| marker.generation.0);
    from_checkpoints.chain(finished).max().unwrap_or(0)
}

fn read_optional<T: Framed>(path: &Path, kind: Kind) -> Result<Option<T>, StorageError> {
    match fs::metadata(path) {
        Ok(_) => read_framed(path, kind).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io(format!("reading {}", path.display()), e)),
    }
}

/// Encodes `value` into a frame and writes it atomically as `dir/name`.
fn write_framed<T: Serialize + DeserializeOwned>(
    dir: &Path,
    name: &str,
    kind: Kind,
    value: &T,
) -> Result<(), StorageError> {
    write_atomically(dir, name, &frame::encode(kind, value, name)?)
}

/// Writes `bytes` to `dir/name` so that a crash leaves either the old file or
/// the new one: a temporary file, fsync, rename, fsync of the directory.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
    let target = dir.join(name);
    let temporary = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut file = File::create(&temporary)
            .map_err(|e| StorageError::io(format!("creating {}", temporary.display()), e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| StorageError::io(format!("writing {}", temporary.display()), e))?;
        fs::rename(&temporary, &target).map_err(|e| {
            StorageError::io(
                format!("renaming {} to {}", temporary.display(), target.display()),
                e,
            )
        })?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StorageError::io(format!("syncing the directory {}", dir.display()), e))
    })();
    if result.is_err() {
        // Best effort: a leftover temporary file is ignored anyway.
        let _ = fs::remove_file(&temporary);
    }
    result
}

/// Reads and checks a frame, then decodes its payload.
fn read_framed<T: Framed>(path: &Path, kind: Kind) -> Result<T, StorageError> {
    let bytes = read_state_file(path, kind)?;
    frame::decode(&bytes, kind, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::tests::sample_checkpoint as checkpoint;

    /// A chunk is written once, in the first checkpoint that holds it;
    /// later ones name it there, so that file is kept while a retained
    /// checkpoint names it and goes when none does. Another start reads it
    /// back under its id, and does not store it again.
    #[tokio::test]
    async fn chunks_are_stored_once_and_their_holder_kept_while_named() {
        use crate::storage::tests::{checkpoint_with_chunks as with, chunk_ids};
        use crate::storage::Chunk;
        let dir = tempfile::tempdir().unwrap();
        let ids = || -> Vec<u64> {
            (list_checkpoints(dir.path()).unwrap().iter())
                .map(|(id, _)| id.0)
                .collect()
        };
        let size = |id: u64| {
            fs::metadata(dir.path().join(checkpoint_file_name(CheckpointId(id))))
                .unwrap()
                .len()
        };
        let big = Chunk::seal(vec![5; 100_000]);
        let storage = LocalCheckpointStorage::open_retaining(dir.path(), 2).unwrap();
        for id in 1..=4 {
            let small = Chunk::seal(vec![id as u8; 10]);
            storage
                .store(with(id, &[big.clone(), small]))
                .await
                .unwrap();
        }
        assert_eq!(ids(), [1, 3, 4], "1 holds the chunk 3 and 4 name");
        assert!(
            size(1) > 100_000 && size(4) < 1_000,
            "{} {}",
            size(1),
            size(4)
        );
        let latest = storage.latest().await.unwrap().unwrap();
        assert_eq!(latest.subtasks[0].source_splits.len(), 3 + 100_000 + 10);
        assert_eq!(chunk_ids(&latest)[0], big.id());
        drop(storage);

        // Another start: the chunk read back keeps its id, and is named.
        let storage = LocalCheckpointStorage::open_retaining(dir.path(), 2).unwrap();
        let restored = storage.latest().await.unwrap().unwrap();
        let big_again = restored.subtasks[0]
            .source_splits
            .chunks()
            .next()
            .unwrap()
            .clone();
        assert_eq!(big_again.id(), big.id());
        storage.store(with(5, &[big_again])).await.unwrap();
        assert!(size(5) < 1_000);
        assert_eq!(ids(), [1, 4, 5]);
        // Once no retained checkpoint names it, its holder goes.
        storage.store(with(6, &[])).await.unwrap();
        storage.store(with(7, &[])).await.unwrap();
        assert_eq!(ids(), [6, 7]);

        // A holder gone: the checkpoint that names it is corrupt, naming
        // the chunk; never read without it.
        let lost = Chunk::seal(vec![9; 10]);
        storage
            .store(with(8, std::slice::from_ref(&lost)))
            .await
            .unwrap();
        storage
            .store(with(9, std::slice::from_ref(&lost)))
            .await
            .unwrap();
        fs::remove_file(dir.path().join(checkpoint_file_name(CheckpointId(8)))).unwrap();
        let error = storage.latest().await.unwrap_err();
        assert!(matches!(error, StorageError::Corrupt { .. }), "{error}");
        assert!(
            error.to_string().contains("chunk 0 of checkpoint 8"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn stores_reads_and_retains_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalCheckpointStorage::open_retaining(dir.path(), 2).unwrap();
        assert_eq!(storage.latest().await.unwrap(), None);
        for id in 1..=4 {
            storage.store(checkpoint(id)).await.unwrap();
        }
        assert_eq!(storage.latest().await.unwrap(), Some(checkpoint(4)));
        let ids: Vec<u64> = list_checkpoints(dir.path())
            .unwrap()
            .iter()
            .map(|(id, _)| id.0)
            .collect();
        assert_eq!(ids, vec![3, 4]);
        assert!(storage.store(checkpoint(4)).await.is_err(), "not newer");
    }

    #[tokio::test]
    async fn generations_grow_across_opens_and_finished_is_remembered() {
        let dir = tempfile::tempdir().unwrap();
        {
            let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
            assert_eq!(storage.begin().await.unwrap(), Generation(1));
            assert_eq!(storage.begin().await.unwrap(), Generation(2));
            assert_eq!(storage.finished().await.unwrap(), None);
            let marker = FinishedMarker {
                generation: Generation(2),
                last_checkpoint: Some(CheckpointId(9)),
                lost: Default::default(),
            };
            storage.mark_finished(marker).await.unwrap();
        }
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        assert_eq!(storage.begin().await.unwrap(), Generation(3));
        assert_eq!(
            storage.finished().await.unwrap().unwrap().last_checkpoint,
            Some(CheckpointId(9))
        );
    }

    #[tokio::test]
    async fn starting_over_forgets_progress_but_not_generations_or_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        assert_eq!(storage.begin().await.unwrap(), Generation(1));
        assert_eq!(storage.begin().await.unwrap(), Generation(2));
        for id in 1..=4 {
            storage.store(checkpoint(id)).await.unwrap();
        }
        let marker = FinishedMarker {
            generation: Generation(2),
            last_checkpoint: Some(CheckpointId(4)),
            lost: Default::default(),
        };
        storage.mark_finished(marker).await.unwrap();

        storage.start_over().unwrap();
        assert_eq!(storage.latest().await.unwrap(), None, "no checkpoint left");
        assert_eq!(storage.finished().await.unwrap(), None, "not finished");
        assert!(
            list_checkpoints(dir.path()).unwrap().is_empty(),
            "the files are gone"
        );
        assert!(matches!(
            LocalCheckpointStorage::open(dir.path()),
            Err(StorageError::Locked { .. })
        ));
        assert_eq!(
            storage.begin().await.unwrap(),
            Generation(3),
            "generations never repeat"
        );
        storage.start_over().unwrap();
        storage.store(checkpoint(1)).await.unwrap();
        assert_eq!(storage.latest().await.unwrap(), Some(checkpoint(1)));
        drop(storage);
        let reopened = LocalCheckpointStorage::open(dir.path()).unwrap();
        assert_eq!(reopened.begin().await.unwrap(), Generation(4));
    }

    #[test]
    fn a_second_live_instance_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = LocalCheckpointStorage::open(dir.path()).unwrap();
        let error = LocalCheckpointStorage::open(dir.path()).unwrap_err();
        assert!(matches!(error, StorageError::Locked { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .contains("in use by another running instance"),
            "{error}"
        );
        drop(_first);
        LocalCheckpointStorage::open(dir.path()).expect("free again once the first is gone");
    }

    async fn corrupt_newest(mangle: impl FnOnce(&mut Vec<u8>)) -> StorageError {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        storage.store(checkpoint(1)).await.unwrap();
        storage.store(checkpoint(2)).await.unwrap();
        let path = dir.path().join(checkpoint_file_name(CheckpointId(2)));
        let mut bytes = fs::read(&path).unwrap();
        mangle(&mut bytes);
        fs::write(&path, bytes).unwrap();
        let error = storage.latest().await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains(&path.display().to_string()),
            "names the file: {message}"
        );
        assert!(
            message.contains("move the file out"),
            "says what to do: {message}"
        );
        error
    }

    #[tokio::test]
    async fn a_corrupt_newest_checkpoint_is_refused_never_skipped() {
        let truncated = corrupt_newest(|b| b.truncate(b.len() - 3)).await;
        assert!(truncated.to_string().contains("truncated"), "{truncated}");
        let header_only = corrupt_newest(|b| b.truncate(10)).await;
        assert!(
            header_only.to_string().contains("truncated"),
            "{header_only}"
        );
        let flipped = corrupt_newest(|b| *b.last_mut().unwrap() ^= 0xff).await;
        assert!(flipped.to_string().contains("checksum"), "{flipped}");
        let version = corrupt_newest(|b| b[8] = 9).await;
        assert!(
            version.to_string().contains("format version 9"),
            "{version}"
        );
        let foreign = corrupt_newest(|b| b[0] = b'X').await;
        assert!(foreign.to_string().contains("marker"), "{foreign}");
    }

    #[tokio::test]
    async fn a_full_disk_is_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        // The temporary file of checkpoint 1 leads to /dev/full: every write
        // to it fails with "no space left on device".
        let name = checkpoint_file_name(CheckpointId(1));
        std::os::unix::fs::symlink("/dev/full", dir.path().join(format!(".{name}.tmp"))).unwrap();
        let error = storage.store(checkpoint(1)).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains("the disk is full"), "{message}");
        assert!(message.contains(&name), "names the file: {message}");
        assert_eq!(
            storage.latest().await.unwrap(),
            None,
            "nothing half-written is visible"
        );
    }

    #[test]
    fn an_uncreatable_state_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        fs::write(&file, b"x").unwrap();
        let error = LocalCheckpointStorage::open(file.join("state")).unwrap_err();
        assert!(
            error.to_string().contains("creating the state directory"),
            "{error}"
        );
    }

    /// A damaged `GENERATION` is its own error: no checkpoint wording, no
    /// advice to move a file away (which would reuse generation 1), but the
    /// generations the directory records and a repair that only goes up.
    #[tokio::test]
    async fn a_damaged_generation_is_its_own_error_and_is_repaired_only_upward() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        storage.begin().await.unwrap();
        assert_eq!(storage.begin().await.unwrap(), Generation(2));
        let mut stored = checkpoint(1);
        stored.generation = Generation(2);
        storage.store(stored).await.unwrap();
        fs::write(dir.path().join(GENERATION_FILE), "junk\n").unwrap();

        let error = storage.begin().await.unwrap_err();
        assert!(
            matches!(
                error,
                StorageError::DamagedGeneration {
                    highest_recorded: 2,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.is_permanent());
        let message = error.to_string();
        assert!(message.contains("generation file"), "{message}");
        assert!(message.contains("--set-generation 1000002"), "{message}");
        assert!(!message.contains("checkpoint file"), "{message}");
        assert!(!message.contains("previous checkpoint"), "{message}");
        assert!(matches!(
            LocalCheckpointStorage::inspect(dir.path()),
            Err(StorageError::DamagedGeneration { .. })
        ));

        for refused in [1, 2] {
            let error = storage.set_generation(Generation(refused)).unwrap_err();
            assert!(error.to_string().contains("only grow"), "{error}");
        }
        storage.set_generation(Generation(1_000_002)).unwrap();
        assert_eq!(storage.begin().await.unwrap(), Generation(1_000_003));
        assert!(
            storage.set_generation(Generation(5)).is_err(),
            "never below the file's own generation"
        );
    }

    /// A state file is refused after at most its header is read: one
    /// larger than its header announces (a sparse terabyte), a device in
    /// its place, a pipe that would block the open. None is read whole.
    #[tokio::test]
    async fn a_state_file_is_refused_by_its_header_before_its_payload_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        storage.store(checkpoint(1)).await.unwrap();
        let path = dir.path().join(checkpoint_file_name(CheckpointId(1)));
        let size = fs::metadata(&path).unwrap().len();
        // Sparse: a terabyte that takes no disk, and more memory than the
        // machine has if it were read; then 100 MiB.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(1 << 40).unwrap();
        let error = storage.latest().await.unwrap_err().to_string();
        assert!(
            error.contains("it is 1099511627776 bytes, more than the"),
            "{error}"
        );
        file.set_len(100 << 20).unwrap();
        let error = storage.latest().await.unwrap_err().to_string();
        assert!(
            error.contains(&format!(
                "the header announces {} bytes of payload, the file holds {}",
                size - frame::HEADER_LEN as u64,
                (100 << 20) - frame::HEADER_LEN as u64
            )),
            "{error}"
        );
        drop(file);

        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/null", &path).unwrap();
        let error = storage.latest().await.unwrap_err().to_string();
        assert!(error.contains("not a regular file but a device"), "{error}");

        fs::remove_file(&path).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success());
        let error = storage.latest().await.unwrap_err().to_string();
        assert!(error.contains("named pipe"), "{error}");

        // The same for the generation file.
        std::os::unix::fs::symlink("/dev/null", dir.path().join(GENERATION_FILE)).unwrap();
        let error = storage.begin().await.unwrap_err().to_string();
        assert!(error.contains("not a regular file"), "{error}");
    }

    /// The lineage of starts without a checkpoint is drawn once and kept
    /// across opens of the directory until a checkpoint carries it (a start
    /// that then finds no checkpoint draws a new one, or its checkpoint ids
    /// would repeat in the lineage); a start over forgets it.
    #[tokio::test]
    async fn the_lineage_is_kept_until_a_checkpoint_carries_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = Lineage::new("first");
        {
            let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
            assert_eq!(storage.lineage(first.clone()).await.unwrap(), first);
            assert_eq!(
                storage.lineage(Lineage::new("second")).await.unwrap(),
                first
            );
        }
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        assert_eq!(storage.lineage(Lineage::new("third")).await.unwrap(), first);
        storage.store(checkpoint(1)).await.unwrap();
        assert!(!dir.path().join(LINEAGE_FILE).exists());
        storage.start_over().unwrap();
        let fourth = Lineage::new("fourth");
        assert_eq!(storage.lineage(fourth.clone()).await.unwrap(), fourth);
        storage.start_over().unwrap();
        assert!(
            !dir.path().join(LINEAGE_FILE).exists(),
            "a start over forgets it"
        );
        fs::write(dir.path().join(LINEAGE_FILE), "junk").unwrap();
        let error = storage.lineage(Lineage::new("x")).await.unwrap_err();
        assert!(error.to_string().contains("the lineage file"), "{error}");
    }
}
