//! Reading the sink's output as its consumers must: finished files only.
//!
//! In-progress and pending part files are hidden (their names start with a
//! dot), and so is anything under a hidden directory (a state directory kept
//! beside the output, say). Everything else under the base path is finished:
//! committed, complete, and never changed again.

use std::io;
use std::path::{Path, PathBuf};

/// Every finished file under `dir`, recursively, sorted by path: every
/// regular file whose name, and every directory on the way to it, does not
/// start with a dot. A missing `dir` holds no finished files.
///
/// For readers of the output (and tests and demos that count what was
/// committed); call it after a commit to see what that commit made visible.
pub fn finished_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    match walk(dir, &mut found) {
        Err(error) if error.kind() == io::ErrorKind::NotFound && found.is_empty() => {}
        other => other?,
    }
    found.sort();
    Ok(found)
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&entry.path(), found)?;
        } else if kind.is_file() {
            found.push(entry.path());
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
