//! The life of one part on an object store: a multipart upload.
//!
//! ```text
//!  create      put its marker .uploads/<lineage>/<generation>/<writer id>-<n> (the key), create the
//!              upload, put the marker again with the upload's id
//!  write       append to the tail; each time the tail holds a part's worth, that part is
//!              uploaded in the background (at most `parts_in_flight` at once)
//!  checkpoint  wait for the parts in flight; the state records the upload id, every part's
//!              id and size, and the tail (below the part size) itself
//!  roll        wait for the parts in flight, upload the tail as the last part: the
//!              committable holds key, upload id, part ids and sizes
//!  commit      complete the upload (the `upload_commit` module): the object appears, whole
//!  restore     upload the state's tail as the next part (replacing whatever a crashed
//!              instance uploaded under that number) and commit with the next checkpoint
//! ```
//!
//! Nothing is visible to readers of the prefix until the upload completes:
//! an incomplete multipart upload is not an object. Memory held per part in
//! progress: the tail (below one part size) and the parts in flight, at most
//! `(parts_in_flight + 1) × part_size`, in buffers the writer fills again
//! from part to part (the `part_buffers` module). A checkpoint copies the
//! tail into the writer state, which the runtime encodes and stores: up to
//! three more parts' worth for a moment (the copy, its encoding, and the
//! checkpoint's frame around that).

use object_store::multipart::PartId;
use object_store::ObjectStoreExt;
use object_store::{MultipartId, PutPayload};
use serde::{Deserialize, Serialize};
use sink_api::{Generation, Lineage, SinkError};
use tokio::task::JoinSet;

use crate::identity::OutputIdentity;
use crate::object_output::ObjectOutput;
use crate::part_buffers::PartBuffers;
use crate::rolling::PartInfo;
use crate::state::{FileCommittable, InProgressState, Upload, UploadedPart};

/// What an upload's marker object holds.
///
/// Written before the upload is created, without its id, then again with
/// it: a crash in between leaves a marker without an id, and a later start
/// finds the upload by its key (`ListUploads`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Marker {
    /// The object's path relative to the prefix.
    pub target: String,
    /// The upload's id, once created.
    #[serde(default)]
    pub upload_id: Option<String>,
}

/// The marker's path (relative to the prefix) of the upload of the part
/// `<writer id>-<counter>`, written by generation `generation` of lineage
/// `lineage`: `.uploads/<lineage>/<generation>/<writer id>-<counter>`.
pub(crate) fn marker_path(
    lineage: &Lineage,
    generation: Generation,
    writer_id: &str,
    counter: u64,
) -> String {
    format!(
        "{}/{:020}/{writer_id}-{counter}",
        markers_dir(lineage),
        generation.0
    )
}

/// Where the markers of lineage `lineage` are, relative to the prefix.
pub(crate) fn markers_dir(lineage: &Lineage) -> String {
    format!(".uploads/{lineage}")
}

/// The generation a marker at `relative` (a path relative to the prefix,
/// as [`marker_path`] makes them) was written by.
pub(crate) fn marker_generation(relative: &str) -> Option<u64> {
    let mut parts = relative.rsplit('/');
    parts.next()?;
    parts.next()?.parse().ok()
}

/// Writes the marker `marker` of the upload into `target`, with its id
/// once known.
async fn put_marker(
    output: &ObjectOutput,
    marker: &str,
    target: &str,
    upload_id: Option<&str>,
) -> Result<(), SinkError> {
    let body = serde_json::to_vec(&Marker {
        target: target.to_string(),
        upload_id: upload_id.map(str::to_string),
    })
    .map_err(|e| SinkError::msg(format!("encoding an upload marker: {e}")))?;
    output
        .store
        .put(&output.path(marker), PutPayload::from(body))
        .await
        .map_err(|e| output.error("writing the upload marker", marker, e))?;
    Ok(())
}

/// A part being written into a multipart upload.
pub(crate) struct UploadPart {
    output: ObjectOutput,
    /// The object's path relative to the prefix (its visible name).
    target: String,
    /// The marker's path relative to the prefix.
    marker: String,
    upload_id: MultipartId,
    part_size: usize,
    parts_in_flight: usize,
    /// The writer's part buffers: the tail and every full part come from
    /// them and go back once uploaded.
    buffers: PartBuffers,
    /// Parts uploaded, by index; `None` while in flight.
    parts: Vec<Option<UploadedPart>>,
    in_flight: JoinSet<(usize, u64, Result<PartId, object_store::Error>)>,
    /// Bytes not yet in a part (less than a part).
    tail: Vec<u8>,
    /// Full parts cut from the tail, not yet started (at most one per
    /// record written since the last upload).
    full: Vec<Vec<u8>>,
    pub(crate) info: PartInfo,
    records: u64,
}

impl UploadPart {
    /// Starts the upload of the object `target` (relative to the prefix),
    /// and records it in its marker `marker`. Its parts are filled in
    /// `buffers` (of the part size).
    pub(crate) async fn create(
        output: &ObjectOutput,
        target: String,
        marker: String,
        buffers: &PartBuffers,
        parts_in_flight: usize,
        now_ms: u64,
    ) -> Result<UploadPart, SinkError> {
        let path = output.path(&target);
        // The marker first: an upload is never made that no marker names.
        put_marker(output, &marker, &target, None).await?;
        let upload_id = output
            .store
            .create_multipart(&path)
            .await
            .map_err(|e| output.error("starting a multipart upload of", &target, e))?;
        // A crash with the upload made and its id not recorded (crash
        // tests only).
        #[cfg(feature = "failpoints")]
        fail::fail_point!("file-upload-created", |_| Err(SinkError::msg(
            "failpoint file-upload-created: the upload is made, its id not recorded"
        )));
        put_marker(output, &marker, &target, Some(&upload_id)).await?;
        Ok(UploadPart {
            output: output.clone(),
            target,
            marker,
            upload_id,
            part_size: buffers.part_size(),
            parts_in_flight: parts_in_flight.max(1),
            buffers: buffers.clone(),
            parts: Vec::new(),
            in_flight: JoinSet::new(),
            tail: buffers.take(),
            full: Vec::new(),
            info: PartInfo {
                size_bytes: 0,
                created_ms: now_ms,
                last_write_ms: now_ms,
            },
            records: 0,
        })
    }

    /// Appends `bytes` holding `records` more records (one encoded record
    /// of a row format, or a piece of what a bulk format handed out): to
    /// the tail, and each time the tail reaches the part size, it is cut
    /// there (a record may straddle two parts) and uploaded in the
    /// background.
    ///
    /// A record that completes a part first waits for room among the parts
    /// in flight, so the writer never holds more than its parts in flight
    /// and its tail: `(parts_in_flight + 1) × part_size`. Every part buffer
    /// holds exactly the part size and is filled to it, so it is handed to
    /// the store without a copy, and comes back to the writer's buffers once
    /// uploaded.
    ///
    /// Its state stays consistent if the call is dropped at an await:
    /// nothing is appended before the first wait, and a part cut stays
    /// queued until its upload starts. A call dropped at a later wait (a
    /// record that cut more parts than there is room for) has appended its
    /// record. The runtime awaits `write_batch` to its end; it never drops
    /// it midway.
    pub(crate) async fn write(
        &mut self,
        bytes: &[u8],
        records: u64,
        now_ms: u64,
    ) -> Result<(), SinkError> {
        if self.tail.len() + bytes.len() >= self.part_size {
            self.wait_for_room().await?;
        }
        let mut rest = bytes;
        while self.tail.len() + rest.len() >= self.part_size {
            let (head, after) = rest.split_at(self.part_size - self.tail.len());
            self.tail.extend_from_slice(head);
            let fresh = self.buffers.take();
            self.full.push(std::mem::replace(&mut self.tail, fresh));
            rest = after;
        }
        self.tail.extend_from_slice(rest);
        self.info.size_bytes += bytes.len() as u64;
        self.info.last_write_ms = now_ms;
        self.records += records;
        self.upload_full_parts().await
    }

    /// Uploads the queued full parts, in the background; waits only when
    /// `parts_in_flight` parts are already on their way (a record larger
    /// than a part cuts more than one).
    ///
    /// Cancellation-safe: a part leaves the queue only when its upload
    /// starts, and nothing is awaited between the two.
    async fn upload_full_parts(&mut self) -> Result<(), SinkError> {
        while !self.full.is_empty() {
            self.wait_for_room().await?;
            let part = self.full.remove(0);
            self.spawn_part(part);
        }
        Ok(())
    }

    /// Waits until fewer than `parts_in_flight` parts are on their way.
    async fn wait_for_room(&mut self) -> Result<(), SinkError> {
        while self.in_flight.len() >= self.parts_in_flight {
            self.finish_one().await?;
        }
        Ok(())
    }

    /// Starts uploading `data` as the next part, in the background.
    fn spawn_part(&mut self, data: Vec<u8>) {
        let index = self.parts.len();
        self.parts.push(None);
        let store = self.output.store.clone();
        let path = self.output.path(&self.target);
        let upload_id = self.upload_id.clone();
        let size = data.len() as u64;
        let payload = self.buffers.payload(data);
        self.in_flight.spawn(async move {
            let result = store.put_part(&path, &upload_id, index, payload).await;
            (index, size, result)
        });
    }

    /// Waits for one part in flight and records it.
    async fn finish_one(&mut self) -> Result<(), SinkError> {
        let Some(joined) = self.in_flight.join_next().await else {
            return Ok(());
        };
        let (index, size_bytes, result) = joined
            .map_err(|e| SinkError::msg(format!("a part upload task ended abnormally: {e}")))?;
        let part = result.map_err(|e| {
            self.output.error(
                &format!("uploading part {index} of {}", self.upload_id),
                &self.target,
                e,
            )
        })?;
        self.parts[index] = Some(UploadedPart {
            content_id: part.content_id,
            size_bytes,
        });
        Ok(())
    }

    /// Waits for every part in flight.
    async fn finish_all(&mut self) -> Result<(), SinkError> {
        while !self.in_flight.is_empty() {
            self.finish_one().await?;
        }
        Ok(())
    }

    /// The upload as far as it is done (call after
    /// [`finish_all`](Self::finish_all)): every part uploaded. A part that
    /// failed earlier leaves a hole, and the upload is unusable: completing
    /// it would name parts out of place.
    fn upload(&self) -> Result<Upload, SinkError> {
        let parts: Option<Vec<UploadedPart>> = self.parts.iter().cloned().collect();
        let parts = parts.ok_or_else(|| {
            SinkError::msg(format!(
                "the multipart upload {} of {} lost a part to an earlier error; the job restarts \
                 from its last checkpoint",
                self.upload_id,
                self.output.url_of(&self.target)
            ))
        })?;
        Ok(Upload {
            upload_id: self.upload_id.clone(),
            parts,
            last_part: Vec::new(),
        })
    }

    /// Waits for the parts in flight and describes the upload for a
    /// checkpoint, tail included; writing goes on afterwards.
    pub(crate) async fn persist(&mut self) -> Result<InProgressState, SinkError> {
        self.upload_full_parts().await?;
        self.finish_all().await?;
        Ok(InProgressState {
            path: self.marker.clone().into(),
            target: self.target.clone().into(),
            length: self.info.size_bytes,
            records: self.records,
            upload: Some(self.upload()?),
            tail: self.tail.clone(),
        })
    }

    /// Closes the part for good: the tail becomes the last part, and the
    /// committable names every part, ready to be completed in the output
    /// `output`.
    pub(crate) async fn close_for_commit(
        mut self,
        output: &OutputIdentity,
    ) -> Result<FileCommittable, SinkError> {
        self.upload_full_parts().await?;
        if !self.tail.is_empty() || self.parts.is_empty() {
            self.wait_for_room().await?;
            let tail = std::mem::take(&mut self.tail);
            self.spawn_part(tail);
        }
        self.finish_all().await?;
        Ok(FileCommittable {
            output_id: output.id.clone(),
            output_dir: output.dir.clone(),
            pending: self.marker.clone().into(),
            target: self.target.clone().into(),
            size_bytes: self.info.size_bytes,
            records: self.records,
            upload: Some(self.upload()?),
            positions: None,
        })
    }
}

impl Drop for UploadPart {
    /// The buffers it still holds (a tail that was not uploaded, parts cut
    /// and not started) go back to the writer's buffers; parts in flight
    /// are aborted with the tasks, and their buffers come back as well.
    fn drop(&mut self) {
        self.buffers.put_back(std::mem::take(&mut self.tail));
        for part in std::mem::take(&mut self.full) {
            self.buffers.put_back(part);
        }
    }
}

/// Turns an upload in progress recorded in a checkpoint into a committable:
/// uploads the recorded tail as the part after the recorded ones (replacing
/// any part a crashed instance uploaded under that number after the
/// checkpoint; completing names only the recorded parts and this one, so
/// later ones are dropped). An upload that no longer exists (aborted by
/// hand or by a bucket lifecycle rule) is a permanent error: its records
/// cannot be recovered.
pub(crate) async fn recover_for_commit(
    object: &ObjectOutput,
    output: &OutputIdentity,
    state: &InProgressState,
    upload: &Upload,
) -> Result<FileCommittable, SinkError> {
    let target = state.target.to_string_lossy().into_owned();
    let mut parts = upload.parts.clone();
    let recorded: u64 = parts.iter().map(|p| p.size_bytes).sum::<u64>() + state.tail.len() as u64;
    if recorded != state.length {
        return Err(SinkError::msg(format!(
            "the writer state of {} records {} bytes but its parts and tail hold {recorded}: the stored \
             state is corrupt",
            object.url_of(&target),
            state.length
        ))
        .permanent());
    }
    if !state.tail.is_empty() || parts.is_empty() {
        let index = parts.len();
        let uploaded = object
            .store
            .put_part(
                &object.path(&target),
                &upload.upload_id,
                index,
                PutPayload::from(state.tail.clone()),
            )
            .await
            .map_err(|e| match e {
                e if ObjectOutput::is_absent(&e) => SinkError::other(
                    format!(
                        "the multipart upload {} of {} recorded in the checkpoint no longer exists (aborted \
                         by hand, or by a lifecycle rule of the bucket?): its {} records cannot be recovered. \
                         Start the job afresh, or let the rule's delay exceed the job's longest outage",
                        upload.upload_id,
                        object.url_of(&target),
                        state.records
                    ),
                    e,
                )
                .permanent(),
                other => object.error("uploading the recorded tail of", &target, other),
            })?;
        parts.push(UploadedPart {
            content_id: uploaded.content_id,
            size_bytes: state.tail.len() as u64,
        });
    }
    let last_part = match state.tail.is_empty() && !upload.parts.is_empty() {
        true => Vec::new(),
        false => state.tail.clone(),
    };
    Ok(FileCommittable {
        output_id: output.id.clone(),
        output_dir: output.dir.clone(),
        pending: state.path.clone(),
        target: state.target.clone(),
        size_bytes: state.length,
        records: state.records,
        upload: Some(Upload {
            upload_id: upload.upload_id.clone(),
            parts,
            last_part,
        }),
        positions: None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::multipart::{MultipartStore, PartId};
    use object_store::path::Path as ObjectPath;
    use object_store::ObjectStoreExt;

    use super::*;
    use crate::memory_store::MemoryObjectStore;

    /// A writer's uploads fill the same few buffers again and again: for
    /// many parts, at most its parts in flight and its tail are ever
    /// allocated, and every byte arrives once, in order.
    #[tokio::test]
    async fn many_parts_go_through_parts_in_flight_plus_one_buffers() {
        let store = Arc::new(MemoryObjectStore::new());
        let object = ObjectOutput::new(store.clone(), ObjectPath::from("out"), "memory://out");
        let output = OutputIdentity {
            id: "out-id".into(),
            dir: "memory://out".into(),
        };
        let (part_size, in_flight) = (64, 2);
        let buffers = PartBuffers::new(part_size, in_flight + 1);
        let mut upload = UploadPart::create(
            &object,
            "part-0".into(),
            ".uploads/marker-0".into(),
            &buffers,
            in_flight,
            0,
        )
        .await
        .unwrap();
        let mut expected = Vec::new();
        for record in 0..200u32 {
            // Records of 3 to 29 bytes: many straddle two parts.
            let bytes: Vec<u8> = (0..3 + record % 27).map(|i| (record + i) as u8).collect();
            upload.write(&bytes, 1, 0).await.unwrap();
            expected.extend_from_slice(&bytes);
        }
        let committable = upload.close_for_commit(&output).await.unwrap();
        let done = committable.upload.unwrap();
        assert!(done.parts.len() > 40, "{} parts", done.parts.len());
        assert!(
            buffers.made() <= in_flight + 1,
            "{} buffers allocated for {} parts",
            buffers.made(),
            done.parts.len()
        );

        let ids = done
            .parts
            .iter()
            .map(|part| PartId {
                content_id: part.content_id.clone(),
            })
            .collect();
        let path = object.path("part-0");
        store
            .complete_multipart(&path, &done.upload_id, ids)
            .await
            .unwrap();
        let written = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(written.as_ref(), expected.as_slice());
    }
}
