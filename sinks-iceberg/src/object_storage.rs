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

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

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

/// Builds [`ObjectStorage`] for a catalog's tables.
///
/// Given to the SQL catalog by [`SqliteCatalog::open`](crate::SqliteCatalog)
/// for an `s3://` warehouse (one bucket, one client), and to a REST catalog
/// by `RestCatalog::open` (a client per bucket, made from the file IO
/// properties the catalog hands each table). Its serde form (which
/// iceberg-rust's storage registry requires) holds nothing: a factory read
/// back from it has no client, and every call through it fails saying so.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ObjectStorageFactory {
    #[serde(skip)]
    clients: Option<Clients>,
}

/// Where a storage finds the client of a location's bucket.
#[derive(Debug, Clone)]
enum Clients {
    /// The one bucket of an SQL catalog's warehouse, and its client.
    One {
        store: Arc<dyn ObjectStore>,
        bucket: String,
    },
    /// A client per bucket, made from the file IO properties (as
    /// `object_store` options) when first needed, and kept for every table
    /// with the same properties.
    #[cfg_attr(not(feature = "rest"), allow(dead_code))]
    PerBucket {
        options: Vec<(String, String)>,
        made: Arc<Mutex<ClientCache>>,
    },
}

/// Clients made from properties, by bucket and options.
type ClientCache = HashMap<(String, Vec<(String, String)>), Arc<dyn ObjectStore>>;

impl ObjectStorageFactory {
    /// Objects of `bucket`, reached through `store` (a client whose root is
    /// the bucket's).
    pub(crate) fn new(store: Arc<dyn ObjectStore>, bucket: String) -> ObjectStorageFactory {
        ObjectStorageFactory {
            clients: Some(Clients::One { store, bucket }),
        }
    }

    /// Objects of any bucket, each reached with a client configured from
    /// the `s3.*` file IO properties of the table's `FileIO` (see
    /// [`object_store_options`]), over the `AWS_*` variables.
    #[cfg(feature = "rest")]
    pub(crate) fn from_properties() -> ObjectStorageFactory {
        ObjectStorageFactory {
            clients: Some(Clients::PerBucket {
                options: Vec::new(),
                made: Arc::default(),
            }),
        }
    }
}

#[typetag::serde]
impl StorageFactory for ObjectStorageFactory {
    fn build(&self, config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        let clients = match &self.clients {
            Some(Clients::PerBucket { made, .. }) => Some(Clients::PerBucket {
                options: object_store_options(config.props())?,
                made: made.clone(),
            }),
            other => other.clone(),
        };
        Ok(Arc::new(ObjectStorage { clients }))
    }
}

/// The `object_store` options the file IO properties `props` name, by the
/// names PyIceberg and iceberg-rust use: `s3.endpoint` (plain HTTP allowed
/// for an `http://` one), `s3.access-key-id`, `s3.secret-access-key`,
/// `s3.session-token`, `s3.region` (or `client.region`) and
/// `s3.path-style-access`. Other properties are not the storage's. Remote
/// signing (`s3.remote-signing-enabled`) is refused: this storage signs its
/// own requests.
fn object_store_options(props: &HashMap<String, String>) -> Result<Vec<(String, String)>> {
    let truthy = |value: &str| value.eq_ignore_ascii_case("true");
    if props
        .get("s3.remote-signing-enabled")
        .is_some_and(|value| truthy(value))
    {
        return Err(Error::new(
            ErrorKind::FeatureUnsupported,
            "the catalog asks for remote signing of S3 requests (s3.remote-signing-enabled), \
             which this sink does not do: give it S3 credentials (s3.access-key-id, \
             s3.secret-access-key) instead",
        ));
    }
    let mut options = Vec::new();
    for (key, value) in props {
        match key.as_str() {
            "s3.endpoint" => {
                options.push(("endpoint".to_string(), value.clone()));
                if value.starts_with("http://") {
                    options.push(("allow_http".to_string(), "true".to_string()));
                }
            }
            "s3.access-key-id" => options.push(("access_key_id".to_string(), value.clone())),
            "s3.secret-access-key" => {
                options.push(("secret_access_key".to_string(), value.clone()))
            }
            "s3.session-token" => options.push(("token".to_string(), value.clone())),
            "s3.region" | "client.region" => options.push(("region".to_string(), value.clone())),
            "s3.path-style-access" => options.push((
                "virtual_hosted_style_request".to_string(),
                (!truthy(value)).to_string(),
            )),
            _ => {}
        }
    }
    options.sort();
    options.dedup_by(|a, b| a.0 == b.0);
    Ok(options)
}

/// A table's objects.
///
/// Made by [`ObjectStorageFactory`]; called by iceberg-rust's `FileIO` for
/// every file of a table on object storage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ObjectStorage {
    #[serde(skip)]
    clients: Option<Clients>,
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
    /// The client of `location`'s bucket, and the object's key in it.
    /// `location` is `s3://<bucket>/<key>` (or `s3a://`).
    fn resolve(&self, location: &str) -> Result<(Arc<dyn ObjectStore>, Path)> {
        let refused = |why: String| Error::new(ErrorKind::PreconditionFailed, why);
        let (bucket, key) = ["s3://", "s3a://"]
            .iter()
            .find_map(|scheme| location.strip_prefix(scheme))
            .and_then(|rest| rest.split_once('/'))
            .ok_or_else(|| {
                refused(format!(
                    "{location} is not an s3:// location: this sink reaches a catalog's \
                     tables on S3 and local ones of an SQL catalog"
                ))
            })?;
        let store = match &self.clients {
            None => {
                return Err(refused(format!(
                    "the storage of {location} was read back without its client"
                )))
            }
            Some(Clients::One {
                store,
                bucket: ours,
            }) => {
                if bucket != ours {
                    return Err(refused(format!(
                        "{location} is not in the bucket s3://{ours} the catalog's warehouse \
                         is in"
                    )));
                }
                store.clone()
            }
            Some(Clients::PerBucket { options, made }) => {
                let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
                let cached = (bucket.to_string(), options.clone());
                match made.get(&cached) {
                    Some(store) => store.clone(),
                    None => {
                        let s3 = sink_object_store::s3(&format!("s3://{bucket}"), options)
                            .map_err(|e| {
                                refused(format!(
                                    "the catalog's file IO properties make no client of \
                                     s3://{bucket}: {e}"
                                ))
                            })?;
                        let store: Arc<dyn ObjectStore> = Arc::new(s3.store);
                        made.insert(cached, store.clone());
                        store
                    }
                }
            }
        };
        let path = Path::parse(key).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("{location} is not an object name: {e}"),
            )
        })?;
        Ok((store, path))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectStorage {
    async fn exists(&self, location: &str) -> Result<bool> {
        let (store, path) = self.resolve(location)?;
        match store.head(&path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(format!("looking for {location}"), e)),
        }
    }

    async fn metadata(&self, location: &str) -> Result<FileMetadata> {
        let (store, path) = self.resolve(location)?;
        let meta = store
            .head(&path)
            .await
            .map_err(|e| store_error(format!("reading the size of {location}"), e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, location: &str) -> Result<Bytes> {
        let reading = || format!("reading {location}");
        let (store, path) = self.resolve(location)?;
        store
            .get(&path)
            .await
            .map_err(|e| store_error(reading(), e))?
            .bytes()
            .await
            .map_err(|e| store_error(reading(), e))
    }

    async fn reader(&self, location: &str) -> Result<Box<dyn FileRead>> {
        let (store, path) = self.resolve(location)?;
        Ok(Box::new(ObjectRead {
            store,
            path,
            location: location.to_string(),
        }))
    }

    async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
        let (store, path) = self.resolve(location)?;
        store
            .put(&path, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| store_error(format!("writing {location}"), e))
    }

    async fn writer(&self, location: &str) -> Result<Box<dyn FileWrite>> {
        Ok(Box::new(ObjectWrite {
            writer: Some({
                let (store, path) = self.resolve(location)?;
                BufWriter::new(store, path)
            }),
            location: location.to_string(),
        }))
    }

    async fn delete(&self, location: &str) -> Result<()> {
        let (store, path) = self.resolve(location)?;
        match store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(format!("removing {location}"), e)),
        }
    }

    async fn delete_prefix(&self, location: &str) -> Result<()> {
        let (store, prefix) = self.resolve(location)?;
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
