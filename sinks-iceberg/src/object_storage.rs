//! Tables on object storage: iceberg-rust's `Storage` over an
//! `object_store` client, so that a table on S3 (or an S3-compatible
//! server) is reached with the client the rest of the project uses (its
//! endpoint, credentials and retries: `sink-object-store`).
//!
//! ```text
//! s3://bucket/key  ─▶ the client of `bucket` ─▶ object `key`
//! write            ─▶ one PUT (small) or a multipart upload, completed at close
//! ```
//!
//! An object store holds what it acknowledged: a write reported done is
//! durable, so nothing is synced here. A location in another bucket, or of
//! another scheme, is an error naming both.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

/// Builds [`ObjectStorage`] for a catalog whose tables are in one bucket.
///
/// Given to the SQL catalog by [`SqliteCatalog::open`](crate::SqliteCatalog)
/// for an `s3://` warehouse. Its serde form (which iceberg-rust's storage
/// registry requires) holds the bucket only: a factory read back from it
/// has no client, and every call through it fails saying so.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ObjectStorageFactory {
    #[serde(skip)]
    store: Option<Arc<dyn ObjectStore>>,
    bucket: String,
}

impl ObjectStorageFactory {
    /// Objects of `bucket`, reached through `store` (a client whose root is
    /// the bucket's).
    pub(crate) fn new(store: Arc<dyn ObjectStore>, bucket: String) -> ObjectStorageFactory {
        ObjectStorageFactory {
            store: Some(store),
            bucket,
        }
    }
}

#[typetag::serde]
impl StorageFactory for ObjectStorageFactory {
    fn build(&self, _: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage {
            store: self.store.clone(),
            bucket: self.bucket.clone(),
        }))
    }
}

/// A table's objects in one bucket.
///
/// Made by [`ObjectStorageFactory`]; called by iceberg-rust's `FileIO` for
/// every file of a table on object storage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ObjectStorage {
    #[serde(skip)]
    store: Option<Arc<dyn ObjectStore>>,
    bucket: String,
}

/// An `object_store` error as iceberg-rust's, naming what was done. A
/// missing object is `DataInvalid`, as iceberg-rust's storages report it
/// (transient); refused credentials or permissions are
/// `PreconditionFailed`, which the sink classes permanent.
fn store_error(doing: String, error: object_store::Error) -> Error {
    let kind = match error {
        object_store::Error::NotFound { .. } => ErrorKind::DataInvalid,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => ErrorKind::PreconditionFailed,
        _ => ErrorKind::Unexpected,
    };
    Error::new(kind, format!("{doing}: {error}")).with_source(error)
}

impl ObjectStorage {
    fn store(&self) -> Result<&Arc<dyn ObjectStore>> {
        self.store.as_ref().ok_or_else(|| {
            Error::new(
                ErrorKind::PreconditionFailed,
                format!(
                    "the storage of s3://{} was read back without its client",
                    self.bucket
                ),
            )
        })
    }

    /// The object `location` names: `s3://<bucket>/<key>` (or `s3a://`).
    fn path(&self, location: &str) -> Result<Path> {
        let key = ["s3://", "s3a://"]
            .iter()
            .find_map(|scheme| location.strip_prefix(scheme))
            .and_then(|rest| rest.strip_prefix(self.bucket.as_str()))
            .and_then(|rest| rest.strip_prefix('/'))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::PreconditionFailed,
                    format!(
                        "{location} is not in the bucket s3://{} the catalog's warehouse is in",
                        self.bucket
                    ),
                )
            })?;
        Path::parse(key).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("{location} is not an object name: {e}"),
            )
        })
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectStorage {
    async fn exists(&self, location: &str) -> Result<bool> {
        match self.store()?.head(&self.path(location)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(format!("looking for {location}"), e)),
        }
    }

    async fn metadata(&self, location: &str) -> Result<FileMetadata> {
        let meta = self
            .store()?
            .head(&self.path(location)?)
            .await
            .map_err(|e| store_error(format!("reading the size of {location}"), e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, location: &str) -> Result<Bytes> {
        let reading = || format!("reading {location}");
        self.store()?
            .get(&self.path(location)?)
            .await
            .map_err(|e| store_error(reading(), e))?
            .bytes()
            .await
            .map_err(|e| store_error(reading(), e))
    }

    async fn reader(&self, location: &str) -> Result<Box<dyn FileRead>> {
        Ok(Box::new(ObjectRead {
            store: self.store()?.clone(),
            path: self.path(location)?,
            location: location.to_string(),
        }))
    }

    async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
        self.store()?
            .put(&self.path(location)?, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| store_error(format!("writing {location}"), e))
    }

    async fn writer(&self, location: &str) -> Result<Box<dyn FileWrite>> {
        Ok(Box::new(ObjectWrite {
            writer: Some(BufWriter::new(self.store()?.clone(), self.path(location)?)),
            location: location.to_string(),
        }))
    }

    async fn delete(&self, location: &str) -> Result<()> {
        match self.store()?.delete(&self.path(location)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(format!("removing {location}"), e)),
        }
    }

    async fn delete_prefix(&self, location: &str) -> Result<()> {
        let store = self.store()?.clone();
        let prefix = self.path(location)?;
        let listed = store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .boxed();
        store
            .delete_stream(listed)
            .try_collect::<Vec<_>>()
            .await
            .map(|_| ())
            .map_err(|e| store_error(format!("removing everything under {location}"), e))
    }

    async fn delete_stream(&self, mut locations: BoxStream<'static, String>) -> Result<()> {
        while let Some(location) = locations.next().await {
            self.delete(&location).await?;
        }
        Ok(())
    }

    fn new_input(&self, location: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), location.to_string()))
    }

    fn new_output(&self, location: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(
            Arc::new(self.clone()),
            location.to_string(),
        ))
    }
}

/// Reads ranges of one object.
struct ObjectRead {
    store: Arc<dyn ObjectStore>,
    path: Path,
    location: String,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&self.path, range.clone())
            .await
            .map_err(|e| store_error(format!("reading bytes {range:?} of {}", self.location), e))
    }
}

/// One object being written: buffered, then one PUT or a multipart upload,
/// completed when closed.
struct ObjectWrite {
    /// `None` once closed.
    writer: Option<BufWriter>,
    location: String,
}

impl ObjectWrite {
    /// Aborts the upload (best effort: an upload whose abort fails is left
    /// to the bucket's lifecycle rules) and closes the writer.
    async fn abort(&mut self) {
        if let Some(mut writer) = self.writer.take() {
            if let Err(error) = writer.abort().await {
                tracing::warn!(location = %self.location, %error, "an upload could not be aborted");
            }
        }
    }

    fn writer(&mut self) -> Result<&mut BufWriter> {
        self.writer.as_mut().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!("{} was closed already", self.location),
            )
        })
    }
}

#[async_trait]
impl FileWrite for ObjectWrite {
    /// A failed write aborts the upload: the object is not made, and no
    /// part is left behind.
    async fn write(&mut self, bytes: Bytes) -> Result<()> {
        let location = self.location.clone();
        let written = self.writer()?.put(bytes).await;
        if let Err(error) = written {
            self.abort().await;
            return Err(store_error(format!("writing {location}"), error));
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        let location = self.location.clone();
        let completed = self.writer()?.shutdown().await;
        if let Err(error) = completed {
            self.abort().await;
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("completing {location}: {error}"),
            )
            .with_source(error));
        }
        self.writer = None;
        Ok(())
    }
}
