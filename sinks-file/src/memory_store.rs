//! An in-memory object store whose multipart uploads behave as S3's do,
//! for tests of the file sink on object storage without a server.
//!
//! Objects are kept by `object_store`'s own [`InMemory`]; only multipart
//! uploads are handled here, because `InMemory`'s differ from S3's where the
//! sink's recovery depends on it (checked against object_store 0.12):
//!
//! | | S3 | `InMemory` | this store |
//! |---|---|---|---|
//! | completing with a list of parts | exactly the listed parts, in order | every part ever uploaded | the listed parts, each checked against its id |
//! | parts uploaded out of order | fine | panics | fine |
//! | completing or aborting an upload that is gone | 404 `NoSuchUpload` | not found | [`object_store::Error::NotFound`] |
//!
//! So a part uploaded by a crashed instance after its last checkpoint, and
//! not named when the restored instance completes the upload, is dropped
//! here as on S3, and a replayed completion is answered as S3 answers it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartId, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// An in-memory object store with S3's multipart semantics (see the module
/// docs). Give it to [`ObjectOutput::new`](crate::ObjectOutput::new) in
/// tests; clones are not shared, wrap it in an `Arc`.
#[derive(Debug, Default)]
pub struct MemoryObjectStore {
    objects: InMemory,
    uploads: Mutex<HashMap<String, PendingUpload>>,
}

#[derive(Debug)]
struct PendingUpload {
    path: Path,
    /// Uploaded parts by index: their id and content.
    parts: BTreeMap<usize, (String, Bytes)>,
}

impl MemoryObjectStore {
    /// An empty store.
    pub fn new() -> MemoryObjectStore {
        MemoryObjectStore::default()
    }

    /// How many multipart uploads are neither completed nor aborted.
    pub fn uploads_in_progress(&self) -> usize {
        self.uploads.lock().map(|u| u.len()).unwrap_or(0)
    }

    /// The ids of the uploads in progress into `key`.
    pub(crate) fn upload_ids_into(&self, key: &Path) -> Vec<MultipartId> {
        self.lock()
            .iter()
            .filter(|(_, upload)| &upload.path == key)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn not_found(id: &str) -> object_store::Error {
        object_store::Error::NotFound {
            path: id.to_string(),
            source: format!("NoSuchUpload: the multipart upload {id} does not exist").into(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PendingUpload>> {
        // A panic while holding the lock leaves the map consistent: every
        // change is one insert or remove.
        self.uploads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Display for MemoryObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryObjectStore")
    }
}

#[async_trait]
impl MultipartStore for MemoryObjectStore {
    async fn create_multipart(&self, path: &Path) -> Result<MultipartId> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        self.lock().insert(
            id.clone(),
            PendingUpload {
                path: path.clone(),
                parts: BTreeMap::new(),
            },
        );
        Ok(id)
    }

    async fn put_part(
        &self,
        _path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> Result<PartId> {
        let content_id = uuid::Uuid::new_v4().simple().to_string();
        // A copy, as a server keeps one: the caller's buffer comes back to
        // it once this returns, and the file sink fills it again with a
        // later part, as it does against a server.
        let mut bytes = Vec::with_capacity(data.content_length());
        for chunk in data.iter() {
            bytes.extend_from_slice(chunk);
        }
        let mut uploads = self.lock();
        let upload = uploads.get_mut(id).ok_or_else(|| Self::not_found(id))?;
        upload
            .parts
            .insert(part_idx, (content_id.clone(), Bytes::from(bytes)));
        Ok(PartId { content_id })
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> Result<PutResult> {
        let data = {
            let mut uploads = self.lock();
            let upload = uploads.get(id).ok_or_else(|| Self::not_found(id))?;
            let mut data = Vec::new();
            for (index, part) in parts.iter().enumerate() {
                match upload.parts.get(&index) {
                    Some((content_id, bytes)) if *content_id == part.content_id => {
                        data.extend_from_slice(bytes)
                    }
                    _ => {
                        return Err(object_store::Error::Generic {
                            store: "MemoryObjectStore",
                            source: format!(
                                "InvalidPart: part {index} of upload {id} is not the one named"
                            )
                            .into(),
                        })
                    }
                }
            }
            if upload.path != *path {
                return Err(Self::not_found(id));
            }
            uploads.remove(id);
            data
        };
        self.objects.put(path, PutPayload::from(data)).await
    }

    async fn abort_multipart(&self, _path: &Path, id: &MultipartId) -> Result<()> {
        match self.lock().remove(id) {
            Some(_) => Ok(()),
            None => Err(Self::not_found(id)),
        }
    }
}

#[async_trait]
impl ObjectStore for MemoryObjectStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.objects.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.objects.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.objects.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.objects.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.objects.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.objects.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.objects.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn completion_takes_the_named_parts_only_and_a_replay_is_not_found() {
        let store = MemoryObjectStore::new();
        let path = Path::from("a/b");
        let id = store.create_multipart(&path).await.unwrap();
        let second = store
            .put_part(&path, &id, 1, b"world".to_vec().into())
            .await
            .unwrap();
        let first = store
            .put_part(&path, &id, 0, b"hello ".to_vec().into())
            .await
            .unwrap();
        store
            .put_part(&path, &id, 2, b"!!!".to_vec().into())
            .await
            .unwrap();
        store
            .complete_multipart(&path, &id, vec![first.clone(), second.clone()])
            .await
            .unwrap();
        let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&bytes[..], b"hello world");
        assert_eq!(store.uploads_in_progress(), 0);
        assert!(matches!(
            store
                .complete_multipart(&path, &id, vec![first, second])
                .await,
            Err(object_store::Error::NotFound { .. })
        ));
        assert!(matches!(
            store.abort_multipart(&path, &id).await,
            Err(object_store::Error::NotFound { .. })
        ));
    }
}
