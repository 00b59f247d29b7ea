//! Creating directories and making their entries durable.

use std::fs::File;
use std::io;
use std::path::Path;

/// Creates `dir` and its missing parents, and makes every directory entry on
/// its path durable: the parent of `dir`, and of each of its ancestors up to
/// the file system's root, is fsynced ([`sync_entries_of`]).
///
/// Called where a program creates a directory that what it reports will
/// depend on (an output directory, a state directory, a data directory),
/// once, before reporting anything. Directories that existed are synced as
/// well: an earlier run, killed before it synced them, may have created them.
///
/// # Guarantees
///
/// On `Ok`, `dir` is a directory and a power cut cannot remove it. A failed
/// creation is std's error, which the caller wraps with the directory's
/// role; a failed sync names the directory. Another
/// process creating the same directory at the same time is not an error.
/// Blocking file I/O.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    sync_entries_of(dir)
}

/// Makes every directory entry on the path of `path` (an existing file or
/// directory) durable: fsyncs its parent, its parent's parent, and so on up
/// to the file system's root, on the path with symbolic links resolved.
///
/// A directory that may not be opened (permission denied) is skipped: a
/// program that cannot read it did not create it, and it is the system's.
/// Called by [`create_dir_all`], and by a program on a path it did not
/// create through it. Blocking file I/O.
pub fn sync_entries_of(path: &Path) -> io::Result<()> {
    let resolved = path
        .canonicalize()
        .map_err(|e| io::Error::new(e.kind(), format!("resolving {}: {e}", path.display())))?;
    for dir in resolved.ancestors().skip(1) {
        match File::open(dir) {
            Ok(handle) => handle.sync_all().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("syncing the directory {}: {e}", dir.display()),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("opening the directory {} to sync it: {e}", dir.display()),
                ))
            }
        }
    }
    Ok(())
}

/// Fsyncs the directory `dir`: the creations, renames and removals of its
/// entries made so far become durable. Blocking file I/O.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("syncing the directory {}: {e}", dir.display()),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_created_with_its_parents_and_an_existing_one_is_fine() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all(&deep).unwrap();
        sync_dir(&deep).unwrap();
    }

    #[test]
    fn errors_name_the_path() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        // The caller names the directory it was creating.
        assert!(create_dir_all(&file.join("below")).is_err());
        let missing = root.path().join("missing");
        let error = sync_entries_of(&missing).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(error.to_string().contains("missing"), "{error}");
        let error = sync_dir(&missing).unwrap_err();
        assert!(error.to_string().contains("missing"), "{error}");
    }
}
