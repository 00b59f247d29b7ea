//! The identity of an output directory, and paths relative to it.
//!
//! Checkpoints outlive the place where their files were written: a stopped
//! job's directory may be moved or copied before it resumes. So committables
//! and writer states name their files relative to the sink's base directory,
//! resolved against the base directory of the sink that restores them.
//!
//! That alone would let a state be resolved against the wrong directory (a
//! state directory put beside another job's output, a mistyped path). So the
//! sink keeps an identity marker in its base directory:
//!
//! ```text
//! BASE/.file-sink-id     one line: a random id, made durably on first use
//! ```
//!
//! Committables and writer states carry the id of the directory they were
//! written in. A restored writer or a committer whose id is not the base
//! directory's is refused with an error naming both directories. A moved or
//! copied directory carries its marker, so it is accepted; an emptied one, or
//! another job's, is not. The marker is hidden (a leading dot), so readers of
//! the output skip it.
//!
//! An object store output keeps the same marker as an object
//! (`PREFIX/.file-sink-id`), created by a conditional put.

#[cfg(feature = "object-store")]
use object_store::ObjectStoreExt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use sink_api::SinkError;

use crate::dir_sync::fsync_dir;
use crate::io_error::io_error;
#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;

/// The marker's file name, in the base directory.
pub(crate) const MARKER_FILE: &str = ".file-sink-id";

/// The longest id accepted in a marker.
const MAX_ID_LEN: usize = 128;

/// An output directory as its writers and committers know it: where it is
/// now, and its identity.
#[derive(Debug, Clone)]
pub(crate) struct OutputIdentity {
    /// The id in the directory's marker.
    pub id: String,
    /// The directory, made absolute when possible: carried in committables
    /// and writer states for error messages only, never to find files.
    pub dir: PathBuf,
}

/// The base directory's identity, creating the marker durably if there is
/// none. Called by the sink when it creates a writer that restores nothing
/// (a fresh start, or a subtask given no state).
pub(crate) fn ensure(base: &Path) -> Result<OutputIdentity, SinkError> {
    if let Some(identity) = read(base)? {
        return Ok(identity);
    }
    let id = uuid::Uuid::new_v4().to_string();
    let marker = base.join(MARKER_FILE);
    // Written whole under a name of its own, then linked into place: the
    // marker never exists half-written, and of concurrent creators (the
    // subtasks of one job) exactly one wins; the others read its id.
    let temporary = base.join(format!(
        "{MARKER_FILE}.tmp-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(format!("{id}\n").as_bytes())?;
            file.sync_all()
        });
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(io_error(
            format!(
                "writing the output directory's identity file {}",
                temporary.display()
            ),
            error,
        ));
    }
    let linked = match fs::hard_link(&temporary, &marker) {
        // A file system without hard links: rename, which only a concurrent
        // creator in another process could race.
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
            fs::rename(&temporary, &marker)
        }
        other => other,
    };
    let _ = fs::remove_file(&temporary);
    match linked {
        Ok(()) => fsync_dir(base)?,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(io_error(
                format!(
                    "creating the output directory's identity file {}",
                    marker.display()
                ),
                error,
            ))
        }
    }
    read(base)?.ok_or_else(|| {
        SinkError::msg(format!(
            "the identity file {} vanished right after it was created; is something else removing files \
             from the output directory?",
            marker.display()
        ))
    })
}

/// The base directory's identity, or `None` when it has no marker (or does
/// not exist). A marker that cannot be read or holds no valid id is an error.
pub(crate) fn read(base: &Path) -> Result<Option<OutputIdentity>, SinkError> {
    let marker = base.join(MARKER_FILE);
    let text = match fs::read(&marker) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(io_error(
                format!(
                    "reading the output directory's identity file {}",
                    marker.display()
                ),
                error,
            ))
        }
    };
    Ok(Some(OutputIdentity {
        id: parse_id(&text, &marker.display().to_string())?,
        dir: fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf()),
    }))
}

/// The id in a marker's content `text`, read from `marker` (named in the
/// error when it holds no valid id).
fn parse_id(text: &[u8], marker: &str) -> Result<String, SinkError> {
    let id = std::str::from_utf8(text).unwrap_or("").trim();
    let valid = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !valid {
        return Err(SinkError::msg(format!(
            "the output's identity marker {marker} is damaged (it must hold one id of letters, digits and \
             '-'); restore it from a backup of the output, or, if nothing of this output is to be \
             resumed, remove it together with the job's checkpoint storage and start afresh"
        ))
        .permanent());
    }
    Ok(id.to_string())
}

#[cfg(feature = "object-store")]
/// The identity of an object store output (its `.file-sink-id` object), or
/// `None` when it has none. Reading it is also the sink's first request to
/// the store at a start: a missing bucket or wrong credentials fail here,
/// permanently, before any record is written.
pub(crate) async fn read_object(
    output: &ObjectOutput,
) -> Result<Option<OutputIdentity>, SinkError> {
    let text = match output.store.get(&output.path(MARKER_FILE)).await {
        Ok(found) => found
            .bytes()
            .await
            .map_err(|e| output.error("reading the output's identity marker", MARKER_FILE, e))?,
        Err(e) if ObjectOutput::is_absent(&e) => return Ok(None),
        Err(e) => return Err(output.error("reading the output's identity marker", MARKER_FILE, e)),
    };
    Ok(Some(OutputIdentity {
        id: parse_id(&text, &output.url_of(MARKER_FILE))?,
        dir: PathBuf::from(&output.location),
    }))
}

#[cfg(feature = "object-store")]
/// The identity of an object store output, creating its marker if there is
/// none: by a conditional put (`If-None-Match`), so that of concurrent
/// creators exactly one wins and the others read its id.
pub(crate) async fn ensure_object(output: &ObjectOutput) -> Result<OutputIdentity, SinkError> {
    if let Some(identity) = read_object(output).await? {
        return Ok(identity);
    }
    let id = uuid::Uuid::new_v4().to_string();
    let create = object_store::PutOptions {
        mode: object_store::PutMode::Create,
        ..object_store::PutOptions::default()
    };
    let body = object_store::PutPayload::from(format!("{id}\n").into_bytes());
    match output
        .store
        .put_opts(&output.path(MARKER_FILE), body, create)
        .await
    {
        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
        Err(e) => {
            return Err(output.error("creating the output's identity marker", MARKER_FILE, e))
        }
    }
    read_object(output).await?.ok_or_else(|| {
        SinkError::msg(format!(
            "the identity marker {} vanished right after it was created; is something else removing \
             objects under the output's prefix?",
            output.url_of(MARKER_FILE)
        ))
    })
}

/// Checks that something restored (`what`: "a writer state", "a
/// committable") that was written in the output directory `written_in` with
/// identity `id` belongs to the base directory `base`, whose identity is
/// `found`. The error names both directories and says what to do.
pub(crate) fn check(
    base: &Path,
    found: Option<&OutputIdentity>,
    what: &str,
    id: &str,
    written_in: &Path,
) -> Result<(), SinkError> {
    match found {
        Some(identity) if identity.id == id => Ok(()),
        _ => Err(mismatch(base, found, what, id, written_in)),
    }
}

/// The error of [`check`]: `what`, written in `written_in` with identity
/// `id`, does not belong to `base`, whose identity is `found`.
pub(crate) fn mismatch(
    base: &Path,
    found: Option<&OutputIdentity>,
    what: &str,
    id: &str,
    written_in: &Path,
) -> SinkError {
    let base = fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    let here = match found {
        Some(identity) => format!(
            "the output directory {} is another one (its {MARKER_FILE} holds {})",
            base.display(),
            identity.id
        ),
        None => format!(
            "the output directory {} has no {MARKER_FILE} (it is empty, was emptied, or is not the job's)",
            base.display()
        ),
    };
    SinkError::msg(format!(
        "the checkpoint being restored holds {what} of the output directory {} (identity {id} in its \
         {MARKER_FILE}), but {here}. A state directory belongs to one output directory: resume with the \
         output directory it was written with (moved or copied there as a whole, {MARKER_FILE} included), \
         or start this output directory afresh with an empty state directory",
        written_in.display()
    ))
        .permanent()
}

/// `relative` resolved against `base`, when it is a relative path of plain
/// names (as the sink writes them); anything else (an absolute path, `..`)
/// cannot come from this sink and is refused.
pub(crate) fn resolve(base: &Path, relative: &Path) -> Result<PathBuf, SinkError> {
    let plain = relative.components().next().is_some()
        && relative
            .components()
            .all(|component| matches!(component, Component::Normal(_)));
    if !plain {
        return Err(SinkError::msg(format!(
            "the checkpoint names the file {}, which is not a path relative to the output directory {}; \
             the stored state is corrupt or was not written by this sink",
            relative.display(),
            base.display()
        ))
        .permanent());
    }
    Ok(base.join(relative))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::on_this_thread;

    #[test]
    fn the_marker_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_none());
        let made = on_this_thread(|| ensure(dir.path())).unwrap();
        assert_eq!(
            on_this_thread(|| ensure(dir.path())).unwrap().id,
            made.id,
            "made once"
        );
        assert_eq!(read(dir.path()).unwrap().unwrap().id, made.id);
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from(MARKER_FILE)]);
    }

    #[test]
    fn concurrent_creators_agree_on_one_id() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| on_this_thread(|| ensure(dir.path())).map(|i| i.id)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    }

    #[test]
    fn a_damaged_marker_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(MARKER_FILE), b"\xff\x00 not an id").unwrap();
        let error = read(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("is damaged") && error.contains(MARKER_FILE),
            "{error}"
        );
    }

    #[test]
    fn a_mismatch_is_permanent_no_restart_can_fix_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = check(dir.path(), None, "a writer state", "some-id", dir.path()).unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(resolve(dir.path(), Path::new("../x"))
            .unwrap_err()
            .is_permanent());
    }

    #[test]
    fn only_plain_relative_paths_resolve() {
        let base = Path::new("/out");
        assert_eq!(
            resolve(base, Path::new("b/.part-1")).unwrap(),
            PathBuf::from("/out/b/.part-1")
        );
        for bad in ["/etc/passwd", "../x", "a/../../x", ""] {
            assert!(resolve(base, Path::new(bad)).is_err(), "{bad}");
        }
    }
}
