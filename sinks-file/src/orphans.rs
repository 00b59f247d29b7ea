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
//! they are abandoned. A fresh start has a new lineage, so it has nothing to
//! remove and does not look.
//!
//! On an object store output, the leftovers are multipart uploads, which
//! readers never see but the bucket keeps (and bills) until they are
//! aborted. Every upload has a marker,
//! `.uploads/<lineage>/<generation>/<writer id>-<n>`, naming its key and id;
//! a start aborts the uploads of its lineage's markers, of earlier
//! generations, that the restored checkpoint does not name, and removes
//! those markers (a newer instance started meanwhile keeps its own). An upload whose marker was never written (a crash right after
//! the upload was created) is left to the bucket's lifecycle rule (see
//! `docs/file-sink.md`).

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use sink_api::{Generation, Lineage, SinkError};
use tracing::{info, warn};

use crate::dir_sync::fsync_dir;
use crate::hidden_name::IN_PROGRESS_MARK;
use crate::io_error::io_error;
use crate::object_output::ObjectOutput;
use crate::output::files_in_visible_dirs;
use crate::upload::{marker_generation, markers_dir, Marker};

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

/// Aborts, under the object store output `object`, every upload that an
/// earlier generation than `generation` of lineage `lineage` started and
/// whose id is not in `kept`, and removes its marker; removes the markers of
/// uploads already completed or aborted. Uploads of `generation` or newer
/// are left alone: a newer instance that started meanwhile may be writing
/// them. Returns how many uploads were aborted.
pub(crate) async fn abort_orphaned_uploads(
    object: &ObjectOutput,
    lineage: &Lineage,
    generation: Generation,
    kept: &HashSet<String>,
) -> Result<u64, SinkError> {
    use futures::TryStreamExt;
    let dir = markers_dir(lineage);
    let markers: Vec<object_store::ObjectMeta> = object
        .store
        .list(Some(&object.path(&dir)))
        .try_collect()
        .await
        .map_err(|e| object.error("listing the upload markers under", &dir, e))?;
    let mut aborted = 0;
    for meta in markers {
        let relative = meta
            .location
            .prefix_match(&object.prefix)
            .map(|parts| {
                parts
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| meta.location.to_string());
        if marker_generation(&relative).is_none_or(|written| written >= generation.0) {
            continue;
        }
        let body = match object.store.get(&meta.location).await {
            Ok(found) => found.bytes().await,
            Err(e) => Err(e),
        };
        let body = match body {
            Ok(body) => body,
            Err(e) if ObjectOutput::is_absent(&e) => continue,
            Err(e) => return Err(object.error("reading the upload marker", &relative, e)),
        };
        let Ok(marker) = serde_json::from_slice::<Marker>(&body) else {
            warn!(marker = %object.url_of(&relative), "an upload marker that cannot be read is left alone");
            continue;
        };
        if kept.contains(&marker.upload_id) {
            continue;
        }
        match object
            .store
            .abort_multipart(&object.path(&marker.target), &marker.upload_id)
            .await
        {
            Ok(()) => {
                aborted += 1;
                info!(object = %object.url_of(&marker.target), upload = %marker.upload_id,
                    "aborted a multipart upload an earlier start left and no checkpoint refers to");
            }
            // Completed (its marker outlived the commit) or aborted before.
            Err(e) if ObjectOutput::is_absent(&e) => {}
            Err(e) => {
                return Err(object.error(
                    &format!("aborting the orphaned upload {} of", marker.upload_id),
                    &marker.target,
                    e,
                ))
            }
        }
        match object.store.delete(&meta.location).await {
            Ok(()) => {}
            Err(e) if ObjectOutput::is_absent(&e) => {}
            Err(e) => return Err(object.error("removing the upload marker", &relative, e)),
        }
    }
    Ok(aborted)
}

/// Starts an object store output over: aborts every upload that has a
/// marker under it (of any lineage), then removes every object under its
/// prefix but those under `keep` (a path relative to the prefix, such as a
/// checkpoint storage kept there). Called by programs that start a job
/// over (the file sink demo's `--fresh`) before the job is built, never
/// while one writes there.
pub async fn clear_object_output(
    object: &ObjectOutput,
    keep: Option<&str>,
) -> Result<(), SinkError> {
    use futures::TryStreamExt;
    let listed: Vec<object_store::ObjectMeta> = object
        .store
        .list(Some(&object.prefix))
        .try_collect()
        .await
        .map_err(|e| object.error("listing", "", e))?;
    let keep = keep.map(|keep| object.path(keep));
    for meta in listed {
        if keep
            .as_ref()
            .is_some_and(|keep| meta.location.prefix_matches(keep))
        {
            continue;
        }
        let relative = meta
            .location
            .prefix_match(&object.prefix)
            .map(|parts| {
                parts
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| meta.location.to_string());
        if relative.starts_with(".uploads/") {
            let body = match object.store.get(&meta.location).await {
                Ok(found) => found.bytes().await.ok(),
                Err(_) => None,
            };
            let marker = body.and_then(|b| serde_json::from_slice::<Marker>(&b).ok());
            if marker.is_none() {
                warn!(marker = %object.url_of(&relative),
                    "an upload marker that cannot be read: its upload, if any, is left to the bucket's lifecycle rule");
            }
            if let Some(marker) = marker {
                match object
                    .store
                    .abort_multipart(&object.path(&marker.target), &marker.upload_id)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if ObjectOutput::is_absent(&e) => {}
                    Err(e) => return Err(object.error("aborting an upload of", &marker.target, e)),
                }
            }
        }
        match object.store.delete(&meta.location).await {
            Ok(()) => {}
            Err(e) if ObjectOutput::is_absent(&e) => {}
            Err(e) => return Err(object.error("removing", &relative, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::on_this_thread;
    use crate::hidden_name::hidden_name;
    use crate::memory_store::MemoryObjectStore;
    use crate::upload::marker_path;
    use object_store::multipart::MultipartStore;
    use object_store::path::Path as ObjectPath;
    use object_store::ObjectStore;
    use std::sync::Arc;

    /// Starts an upload of `target` and writes its marker, as a writer of
    /// `generation` does; returns the upload's id.
    async fn upload(
        store: &Arc<MemoryObjectStore>,
        object: &ObjectOutput,
        lineage: &Lineage,
        generation: u64,
        target: &str,
    ) -> String {
        let id = store.create_multipart(&object.path(target)).await.unwrap();
        let marker = marker_path(lineage, Generation(generation), target, 0);
        let body = serde_json::to_vec(&Marker {
            target: target.into(),
            upload_id: id.clone(),
        })
        .unwrap();
        store.put(&object.path(&marker), body.into()).await.unwrap();
        id
    }

    #[tokio::test]
    async fn only_unnamed_uploads_of_earlier_generations_of_the_lineage_are_aborted() {
        let store = Arc::new(MemoryObjectStore::new());
        let object = ObjectOutput::new(store.clone(), ObjectPath::from("out"), "memory://out");
        let (ours, theirs) = (Lineage::new("0123abcd"), Lineage::new("9999ffff"));
        let orphan = upload(&store, &object, &ours, 1, "part-a").await;
        let named = upload(&store, &object, &ours, 1, "part-b").await;
        let newer = upload(&store, &object, &ours, 3, "part-c").await;
        let foreign = upload(&store, &object, &theirs, 1, "part-d").await;
        let kept = HashSet::from([named.clone()]);
        let aborted = abort_orphaned_uploads(&object, &ours, Generation(3), &kept)
            .await
            .unwrap();
        assert_eq!(aborted, 1);
        for (id, alive) in [
            (orphan, false),
            (named, true),
            (newer, true),
            (foreign, true),
        ] {
            let part = store
                .put_part(&ObjectPath::from("out/x"), &id, 0, b"x".to_vec().into())
                .await;
            assert_eq!(part.is_ok(), alive, "upload {id}");
        }
        assert_eq!(store.uploads_in_progress(), 3);
    }

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
