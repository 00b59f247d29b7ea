//! Multipart uploads that earlier starts of this job's lineage left behind
//! on an object store output, aborted at each start (the object store's
//! counterpart of `orphans`), and an object store output started over.
//!
//! Readers never see uploads in progress, but the bucket keeps (and bills)
//! them until they are aborted. Every upload has a marker,
//! `.uploads/<lineage>/<generation>/<writer id>-<n>`, naming its key and id;
//! a start aborts the uploads of its lineage's markers, of earlier
//! generations, that the restored checkpoint does not name (all of them at a
//! start that restores none: the checkpoint storage keeps the lineage across
//! such starts), and removes those markers (a newer instance started
//! meanwhile keeps its own). An
//! upload is never made before its marker: a marker written without the
//! upload's id (a crash came before the id was recorded) stands for every
//! upload in progress into its key, as the store lists them
//! (`upload_listing`; on a store that cannot list them, they are left to
//! the bucket's lifecycle rule, with a warning).

use object_store::ObjectStoreExt;
use std::collections::HashSet;

use sink_api::{Generation, Lineage, SinkError};
use tracing::{info, warn};

use crate::object_output::ObjectOutput;
use crate::upload::{marker_generation, markers_dir, Marker};

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
        let relative = object.relative(&meta.location);
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
        // A checkpoint names it: the upload lives on, and so does its marker.
        if marker
            .upload_id
            .as_ref()
            .is_some_and(|id| kept.contains(id))
        {
            continue;
        }
        for upload_id in upload_ids(object, &marker).await? {
            if kept.contains(&upload_id) {
                continue;
            }
            match object
                .store
                .abort_multipart(&object.path(&marker.target), &upload_id)
                .await
            {
                Ok(()) => {
                    aborted += 1;
                    info!(object = %object.url_of(&marker.target), upload = %upload_id,
                        "aborted a multipart upload an earlier start left and no checkpoint refers to");
                }
                // Completed (its marker outlived the commit) or aborted before.
                Err(e) if ObjectOutput::is_absent(&e) => {}
                Err(e) => {
                    return Err(object.error(
                        &format!("aborting the orphaned upload {upload_id} of"),
                        &marker.target,
                        e,
                    ))
                }
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
        let relative = object.relative(&meta.location);
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
                for upload_id in upload_ids(object, &marker).await? {
                    match object
                        .store
                        .abort_multipart(&object.path(&marker.target), &upload_id)
                        .await
                    {
                        Ok(()) => {}
                        Err(e) if ObjectOutput::is_absent(&e) => {}
                        Err(e) => {
                            return Err(object.error("aborting an upload of", &marker.target, e))
                        }
                    }
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

/// The uploads `marker` stands for: its upload, or, for a marker written
/// before its upload was created (a crash may have come between the two),
/// every upload in progress into its key, as the store lists them. Without
/// a way to list them, none, with a warning.
async fn upload_ids(object: &ObjectOutput, marker: &Marker) -> Result<Vec<String>, SinkError> {
    if let Some(id) = &marker.upload_id {
        return Ok(vec![id.clone()]);
    }
    match &object.upload_listing {
        Some(listing) => listing.uploads_into(&object.path(&marker.target)).await,
        None => {
            warn!(object = %object.url_of(&marker.target),
                "a start crashed while creating an upload of this object, and the store cannot list \
                 uploads: an upload, if it was made, is left to the bucket's lifecycle rule");
            Ok(Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_store::MemoryObjectStore;
    use crate::upload::marker_path;
    use object_store::multipart::MultipartStore;
    use object_store::path::Path as ObjectPath;
    use object_store::ObjectStoreExt;
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
            upload_id: Some(id.clone()),
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

    /// An upload made by a start that died before writing its id down (its
    /// marker, written first, names only the key) is found by its key and
    /// aborted, and only it: not an upload into another key that starts
    /// with the same name. Without a way to list uploads, it is left, and
    /// the marker removed.
    #[tokio::test]
    async fn an_upload_whose_id_was_not_recorded_is_found_by_its_key() {
        for listing in [true, false] {
            let store = Arc::new(MemoryObjectStore::new());
            let mut object =
                ObjectOutput::new(store.clone(), ObjectPath::from("out"), "memory://out");
            if listing {
                object = object.with_upload_listing(store.clone());
            }
            let ours = Lineage::new("0123abcd");
            let unrecorded = store
                .create_multipart(&object.path("part-a"))
                .await
                .unwrap();
            let marker = marker_path(&ours, Generation(1), "w", 0);
            let body = serde_json::to_vec(&Marker {
                target: "part-a".into(),
                upload_id: None,
            })
            .unwrap();
            store.put(&object.path(&marker), body.into()).await.unwrap();
            let longer_name = upload(&store, &object, &ours, 2, "part-ab").await;
            let aborted = abort_orphaned_uploads(&object, &ours, Generation(2), &HashSet::new())
                .await
                .unwrap();
            assert_eq!(aborted, u64::from(listing), "listing: {listing}");
            assert_eq!(store.uploads_in_progress(), 2 - usize::from(listing));
            assert_eq!(
                store.upload_ids_into(&object.path("part-ab")),
                [longer_name]
            );
            assert_eq!(
                store.upload_ids_into(&object.path("part-a")).len(),
                usize::from(!listing),
                "{unrecorded}"
            );
            assert!(
                store.get(&object.path(&marker)).await.is_err(),
                "the marker is removed"
            );
        }
    }
}
