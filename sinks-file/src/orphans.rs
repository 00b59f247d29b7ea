//! Hidden files that earlier starts of this job's lineage left behind and
//! that nothing will ever commit: removed at each start, in the sink's
//! start hook.
//!
//! A crash leaves hidden part files in the output directory: parts in
//! progress, and pending parts whose checkpoint never completed. Those the
//! restored checkpoint refers to are resumed or committed again; the others
//! hold records that the source replays into new parts, and would stay on
//! disk for good. A hidden part's name ends with the lineage of the job that
//! wrote it:
//!
//! ```text
//! .part-<writer id>-<n><suffix>.inprogress.<lineage>
//! ```
//!
//! so a start removes exactly the hidden parts of its own lineage that the
//! restored checkpoint does not name (as a pending committable or as an
//! in-progress part of a writer state). Parts of other lineages (an earlier
//! life of the job, another job sharing the directory, files of earlier
//! versions of this sink) are left alone: this start cannot know whether
//! they are abandoned. A start that restores no checkpoint looks too: its
//! lineage is the one its checkpoint storage keeps
//! (`CheckpointStorage::lineage`), so the parts of an earlier start killed
//! before its first checkpoint are its own, and none is named.
//!
//! On an object store output the leftovers are multipart uploads:
//! `upload_orphans`.

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use sink_api::{Lineage, SinkError};
use tracing::info;

use crate::dir_sync::fsync_dir;
use crate::hidden_name::IN_PROGRESS_MARK;
use crate::io_error::io_error;
use crate::output::files_in_visible_dirs;

/// Whether `name` is a hidden part of lineage `lineage`.
fn is_hidden_part_of(name: &OsStr, lineage: &Lineage) -> bool {
    name.to_str().is_some_and(|name| {
        name.starts_with('.')
            && name
                .strip_suffix(lineage.as_str())
                .is_some_and(|rest| rest.ends_with(IN_PROGRESS_MARK))
    })
}

/// Removes, under the base directory `base`, every hidden part of lineage
/// `lineage` whose path relative to `base` is not in `kept`, and makes the
/// removals durable. Looks only in directories whose names do not start with
/// a dot (no bucket does; a state directory may). Returns the paths
/// removed, relative to `base`. Blocking: call it off the async workers.
pub(crate) fn remove_orphans(
    base: &Path,
    lineage: &Lineage,
    kept: &HashSet<PathBuf>,
) -> Result<Vec<PathBuf>, SinkError> {
    let files = files_in_visible_dirs(base)
        .map_err(|e| io_error(format!("listing {}", base.display()), e))?;
    let orphans: Vec<PathBuf> = files
        .into_iter()
        .filter(|relative| {
            relative
                .file_name()
                .is_some_and(|n| is_hidden_part_of(n, lineage))
        })
        .filter(|relative| !kept.contains(relative))
        .collect();
    let mut dirs = BTreeSet::new();
    for relative in &orphans {
        let path = base.join(relative);
        std::fs::remove_file(&path)
            .map_err(|e| io_error(format!("removing the orphaned part {}", path.display()), e))?;
        info!(file = %relative.display(), "removed a hidden part an earlier start left and no checkpoint refers to");
        dirs.extend(path.parent().map(Path::to_path_buf));
    }
    for dir in dirs {
        fsync_dir(&dir)?;
    }
    Ok(orphans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::on_this_thread;
    use crate::hidden_name::hidden_name;

    #[test]
    fn only_unreferenced_hidden_parts_of_the_lineage_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let ours = Lineage::new("0123abcd");
        let theirs = Lineage::new("9999ffff");
        std::fs::create_dir_all(base.join("2026-12-01")).unwrap();
        std::fs::create_dir_all(base.join(".state")).unwrap();
        let files = [
            hidden_name("part-w-0", &ours), // orphan: removed
            format!("2026-12-01/{}", hidden_name("part-w-1.csv", &ours)), // orphan in a bucket
            hidden_name("part-w-2", &ours), // kept: a checkpoint refers to it
            hidden_name("part-v-0", &theirs), // another lineage
            ".part-old-0.inprogress.5f0e6d".into(), // an earlier version's name
            "part-w-3".into(),              // finished
            format!(".state/{}", hidden_name("x", &ours)), // not a bucket
            format!("part-w-4{IN_PROGRESS_MARK}{ours}"), // not hidden
        ];
        for file in &files {
            std::fs::write(base.join(file), "data").unwrap();
        }
        let kept = HashSet::from([PathBuf::from(&files[2])]);
        let mut removed = on_this_thread(|| remove_orphans(base, &ours, &kept)).unwrap();
        removed.sort();
        assert_eq!(
            removed,
            vec![PathBuf::from(&files[0]), PathBuf::from(&files[1])]
        );
        for (i, file) in files.iter().enumerate() {
            assert_eq!(base.join(file).exists(), i > 1, "{file}");
        }
        let missing = remove_orphans(&base.join("never-written"), &ours, &kept).unwrap();
        assert!(missing.is_empty());
    }
}
