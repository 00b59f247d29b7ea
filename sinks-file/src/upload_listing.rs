//! How an object store output finds the multipart uploads in progress into
//! one key: what a start needs to abort an upload that a crashed start
//! created but whose id it never wrote down (see `upload_orphans`).
//! `object_store` has no such call; S3 has `ListMultipartUploads`
//! (`sink_object_store::S3Uploads`, given to outputs made by
//! [`ObjectOutput::s3`](crate::ObjectOutput::s3)), and the in-memory test
//! store knows its own.

use async_trait::async_trait;
use object_store::path::Path;
use object_store::MultipartId;
use sink_api::SinkError;

/// Lists the multipart uploads in progress into one key.
///
/// Given to an output with
/// [`ObjectOutput::with_upload_listing`](crate::ObjectOutput::with_upload_listing);
/// called at a start, for each upload marker an earlier start wrote before
/// it could record the upload's id. Must answer from the store, never from
/// memory of the process: the upload was made by another one.
#[async_trait]
pub trait ListUploads: Send + Sync + 'static {
    /// The ids of the uploads in progress whose key is exactly `key`.
    async fn uploads_into(&self, key: &Path) -> Result<Vec<MultipartId>, SinkError>;
}

#[cfg(feature = "s3")]
#[async_trait]
impl ListUploads for sink_object_store::S3Uploads {
    async fn uploads_into(&self, key: &Path) -> Result<Vec<MultipartId>, SinkError> {
        match self.list(key).await {
            Ok(uploads) => Ok(uploads
                .into_iter()
                .filter(|u| u.key == key.as_ref())
                .map(|u| u.upload_id)
                .collect()),
            Err(e) => {
                let transient = e.is_transient();
                let error =
                    SinkError::other(format!("listing the multipart uploads into {key}"), e);
                Err(if transient { error } else { error.permanent() })
            }
        }
    }
}

#[async_trait]
impl ListUploads for crate::MemoryObjectStore {
    async fn uploads_into(&self, key: &Path) -> Result<Vec<MultipartId>, SinkError> {
        Ok(self.upload_ids_into(key))
    }
}
