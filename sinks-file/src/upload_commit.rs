//! Committing a part on an object store: completing its multipart upload,
//! recognising from the store, never from memory, an upload completed
//! before (a replay after a restore, or a retry after an unknown outcome).
//!
//! | object at the key | completing the upload | outcome |
//! |---|---|---|
//! | absent | succeeds | committed |
//! | of the recorded size | (not tried) | already committed |
//! | of another size | (not tried) | failed, known reason, its records lost (counted) |
//! | absent | the upload is gone (S3 answers 404 `NoSuchUpload`), and the object is then present with the recorded size | already committed (completed by an earlier attempt whose answer was lost) |
//! | absent | the upload is gone, and still no object | retried later (three times: an earlier completion may still be assembling the object), then failed, known reason: the data is lost (the upload was aborted, by hand or by a lifecycle rule), its records counted; never a silent success |
//! | absent | `InvalidPart` for a restored upload | its last part (the checkpoint's tail, kept in the committable) was replaced by an older instance still running: uploaded again, then completed |
//! | absent | succeeds, but the object is not of the recorded size | failed, unknown reason: the job stops |
//! | absent | any other error (the server unreachable, a timeout) | retried later under the job's commit retry policy; the retry looks at the object first. A permanent error (credentials, a missing bucket) fails the job |
//!
//! Keys never repeat (they carry the writer's random id), so an object of
//! the recorded size at the key can only be this committable's. After a
//! commit the upload's marker is removed (best effort: a marker left behind
//! is removed at the next start).

use object_store::multipart::PartId;
use object_store::ObjectStoreExt;
use sink_api::SinkError;

use crate::object_output::ObjectOutput;
use crate::outcome::Outcome;
use crate::state::FileCommittable;
use crate::state::Upload;
use crate::stats::FileSinkStats;

/// How often a completion answered "no such upload" with no object at the
/// key is tried again before the data is declared lost: S3 may still be
/// assembling an earlier completion of the same upload (the client retries
/// a completion whose answer timed out), and the object appears only once
/// that is done.
const GONE_RETRIES: u32 = 3;

/// Commits `c`, a part of `output` uploaded as `upload`, on its
/// `retry_count`-th retry (see the module's table).
pub(crate) async fn commit_upload(
    output: &ObjectOutput,
    stats: &FileSinkStats,
    c: &FileCommittable,
    upload: &Upload,
    retry_count: u32,
) -> Result<Outcome, SinkError> {
    let target = c.target.to_string_lossy().into_owned();
    let path = output.path(&target);
    if let Some(outcome) = look_at_object(output, stats, c, &target, false).await? {
        return Ok(outcome);
    }
    let mut parts: Vec<PartId> = upload
        .parts
        .iter()
        .map(|part| PartId {
            content_id: part.content_id.clone(),
        })
        .collect();
    let mut completed = output
        .store
        .complete_multipart(&path, &upload.upload_id, parts.clone())
        .await;
    if let Err(error) = &completed {
        let replaced = error.to_string().contains("InvalidPart");
        if let (true, Some(last)) = (replaced && !upload.last_part.is_empty(), parts.last_mut()) {
            // The restored tail's part was replaced (an older instance
            // still running uploaded its next part under that number):
            // upload it again and complete with it.
            let index = upload.parts.len() - 1;
            let again = output
                .store
                .put_part(
                    &path,
                    &upload.upload_id,
                    index,
                    upload.last_part.clone().into(),
                )
                .await
                .map_err(|e| output.error("uploading again the last part of", &target, e))?;
            *last = again;
            completed = output
                .store
                .complete_multipart(&path, &upload.upload_id, parts)
                .await;
        }
    }
    match completed {
        Ok(_) => {
            // Completing names the parts; their sizes are checked here, so
            // that an object that is not the recorded one never passes as
            // committed.
            let size = output
                .store
                .head(&path)
                .await
                .map_err(|e| output.error("looking at the completed", &target, e))?
                .size;
            if size != c.size_bytes {
                return Ok(Outcome::Unknown(format!(
                    "{} was completed from the upload {} but holds {size} bytes instead of the {} \
                     recorded in the checkpoint: its parts are not the recorded ones",
                    output.url_of(&target),
                    upload.upload_id,
                    c.size_bytes
                )));
            }
            stats.committed(c);
            remove_marker(output, c).await;
            Ok(Outcome::Committed)
        }
        Err(e) if ObjectOutput::is_absent(&e) => {
            if let Some(outcome) = look_at_object(output, stats, c, &target, true).await? {
                return Ok(outcome);
            }
            if retry_count < GONE_RETRIES {
                return Ok(Outcome::RetryLater);
            }
            stats.failed();
            Ok(Outcome::RecordsLost(
                c.records,
                format!(
                    "neither the multipart upload {} nor the object {} exists: the upload was aborted \
                     (by hand, or by a lifecycle rule of the bucket shorter than the job's outage) and \
                     its {} records are lost",
                    upload.upload_id,
                    output.url_of(&target),
                    c.records
                ),
            ))
        }
        Err(error) => {
            let error = output.error(
                &format!("completing the multipart upload {} of", upload.upload_id),
                &target,
                error,
            );
            match error.is_permanent() {
                true => Err(error),
                // The server unreachable, a timeout: the commit is retried
                // (under the job's commit retry policy), and the retry
                // looks at the object first.
                false => {
                    tracing::warn!(%error, "a completion failed; it is retried");
                    Ok(Outcome::RetryLater)
                }
            }
        }
    }
}

/// What the object at `target` says about `c`: `None` when there is no
/// object; already committed when it has the recorded size; records lost
/// otherwise. `after_completion`: the upload was found gone.
async fn look_at_object(
    output: &ObjectOutput,
    stats: &FileSinkStats,
    c: &FileCommittable,
    target: &str,
    after_completion: bool,
) -> Result<Option<Outcome>, SinkError> {
    let meta = match output.store.head(&output.path(target)).await {
        Ok(meta) => meta,
        Err(e) if ObjectOutput::is_absent(&e) => return Ok(None),
        Err(error) => return Err(output.error("looking at", target, error)),
    };
    if meta.size == c.size_bytes {
        stats.replayed();
        remove_marker(output, c).await;
        return Ok(Some(Outcome::AlreadyCommitted));
    }
    stats.failed();
    let when = if after_completion {
        "appeared while its upload was completed"
    } else {
        "exists before its upload was completed"
    };
    Ok(Some(Outcome::RecordsLost(
        c.records,
        format!(
            "{} {when} but holds {} bytes instead of the {} recorded in the checkpoint: something else \
             than this sink wrote it, so the upload is not completed and its {} records are lost",
            output.url_of(target),
            meta.size,
            c.size_bytes,
            c.records
        ),
    )))
}

/// Removes the marker of `c`'s upload, now completed. Best effort.
async fn remove_marker(output: &ObjectOutput, c: &FileCommittable) {
    let marker = c.pending.to_string_lossy();
    if let Err(error) = output.store.delete(&output.path(&marker)).await {
        tracing::warn!(marker = %output.url_of(&marker), %error,
            "cannot remove the marker of a completed upload; it is removed at the next start");
    }
}
