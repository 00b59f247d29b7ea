//! Reading the sink's output as its consumers must: finished files only.
//!
//! In-progress and pending part files are hidden (their names start with a
//! dot), and so is anything under a hidden directory (a state directory kept
//! beside the output, say). Everything else under the base path is finished:
//! committed, complete, and never changed again.

#[cfg(feature = "object-store")]
use object_store::ObjectStoreExt;
use std::io;
use std::path::{Path, PathBuf};

#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;

/// Every finished file under `dir`, recursively, sorted by path: every
/// regular file whose name, and every directory on the way to it, does not
/// start with a dot. A missing `dir` holds no finished files.
///
/// For readers of the output (and tests and demos that count what was
/// committed); call it after a commit to see what that commit made visible.
pub fn finished_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = files_in_visible_dirs(dir)?
        .into_iter()
        .filter(|relative| !is_hidden(relative))
        .map(|relative| dir.join(relative))
        .collect();
    found.sort();
    Ok(found)
}

/// Every finished file under `dir` with its content, read as a reader of
/// an output with compaction must: a file listed and then gone was merged
/// (its segment directory was exchanged for the merged one while this
/// reader looked), so the whole listing is read again, up to 100 times.
/// Blocking; for readers, tests and demos of small outputs (it holds every
/// byte in memory).
pub fn read_finished(dir: &Path) -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut attempts = 0;
    'listing: loop {
        attempts += 1;
        let mut contents = Vec::new();
        for path in finished_files(dir)? {
            match std::fs::read(&path) {
                Ok(bytes) => contents.push((path, bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 100 => {
                    continue 'listing
                }
                Err(e) => return Err(e),
            }
        }
        return Ok(contents);
    }
}

#[cfg(feature = "object-store")]
/// Every finished object under the prefix of `output`, sorted by path
/// (relative to the prefix): every object none of whose path segments
/// starts with a dot. Incomplete uploads are not objects, so they are never
/// listed.
///
/// For readers of an object store output (and tests and demos that count
/// what was committed).
pub async fn finished_objects(output: &ObjectOutput) -> object_store::Result<Vec<String>> {
    use futures::TryStreamExt;
    let listed: Vec<object_store::ObjectMeta> = output
        .store
        .list(Some(&output.prefix))
        .try_collect()
        .await?;
    let mut found: Vec<String> = listed
        .into_iter()
        .filter_map(|meta| {
            let parts: Vec<String> = meta
                .location
                .prefix_match(&output.prefix)?
                .map(|part| part.as_ref().to_string())
                .collect();
            let visible = parts.iter().all(|part| !part.starts_with('.'));
            visible.then(|| parts.join("/"))
        })
        .collect();
    found.sort();
    Ok(found)
}

#[cfg(feature = "object-store")]
/// The content of the object `relative` (a path under the prefix of
/// `output`, as [`finished_objects`] lists them).
pub async fn read_object(
    output: &ObjectOutput,
    relative: &str,
) -> object_store::Result<bytes::Bytes> {
    output
        .store
        .get(&output.path(relative))
        .await?
        .bytes()
        .await
}

/// Every regular file under `dir` (hidden or not), relative to `dir`, in
/// every directory whose name does not start with a dot: where finished and
/// hidden part files live, without a state directory kept beside them. A
/// missing `dir` holds none. Blocking.
pub(crate) fn files_in_visible_dirs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    match walk(dir, Path::new(""), &mut found) {
        Err(error) if error.kind() == io::ErrorKind::NotFound && found.is_empty() => {}
        other => other?,
    }
    Ok(found)
}

/// Whether the file name of `path` starts with a dot.
fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with('.'))
}

fn walk(dir: &Path, relative: &Path, found: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let kind = entry.file_type()?;
        if kind.is_dir() && !name.to_string_lossy().starts_with('.') {
            walk(&entry.path(), &relative.join(&name), found)?;
        } else if kind.is_file() {
            found.push(relative.join(&name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_files_and_hidden_directories_are_not_output() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("2026-11-30/.state")).unwrap();
        for file in [
            "part-0-1",
            ".part-0-2.inprogress",
            "2026-11-30/part-1-1",
            "2026-11-30/.state/checkpoint-1.ckpt",
        ] {
            std::fs::write(root.join(file), "x").unwrap();
        }
        assert_eq!(
            finished_files(root).unwrap(),
            vec![root.join("2026-11-30/part-1-1"), root.join("part-0-1")]
        );
        assert!(finished_files(&root.join("missing")).unwrap().is_empty());
    }
}
