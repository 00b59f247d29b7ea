//! A local table's store: `object_store`'s `LocalFileSystem`, with every
//! write on disk before it is visible under its name.
//!
//! `LocalFileSystem` writes an object to a staging file and renames (or, for
//! a conditional create, hard-links) it into place, and fsyncs nothing: after
//! a power cut, a log entry, a log checkpoint or `_last_checkpoint` can be
//! there by name and empty, and the table cannot be read again (found by
//! the power-loss harness on the Delta demo). This store writes the staging
//! file, fsyncs it, then moves it into place the same way and fsyncs the
//! directory, so that a name is never durable before its bytes. Reads,
//! listings and removals go to `LocalFileSystem` unchanged; copies, renames
//! and multipart uploads are done by it and synced after.
//!
//! Staging files are named as `LocalFileSystem` names its own
//! (`<name>#<digits>`), which its listings skip.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
    Result, UploadPart,
};

/// Where the errors of this store say they come from.
const STORE: &str = "DurableLocalStore";

/// `LocalFileSystem` whose writes are durable before they are visible.
/// Made by `TableLocation::local` for local tables.
#[derive(Debug, Default)]
pub(crate) struct DurableLocalStore {
    inner: LocalFileSystem,
}

impl fmt::Display for DurableLocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DurableLocalStore({})", self.inner)
    }
}

fn io_error(what: String, source: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: format!("{what}: {source}").into(),
    }
}

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| object_store::Error::Generic {
            store: STORE,
            source: Box::new(e),
        })?
}

/// Writes `payload` to `path` durably: a staging file beside it, fsynced,
/// then renamed over it (`Overwrite`) or hard-linked to it, failing if it
/// exists (`Create`), and the directory fsynced. A missing directory is
/// created with every entry above it synced.
fn durable_put(path: &FsPath, payload: &PutPayload, mode: &PutMode) -> Result<()> {
    let dir = path.parent().ok_or_else(|| {
        io_error(
            format!("{} has no directory", path.display()),
            std::io::ErrorKind::InvalidInput.into(),
        )
    })?;
    if !dir.is_dir() {
        sink_local_fs::create_dir_all(dir)
            .map_err(|e| io_error(format!("creating {}", dir.display()), e))?;
    }
    let (mut file, staging) = staging_file(path)?;
    let written = payload
        .iter()
        .try_for_each(|chunk| file.write_all(chunk))
        .and_then(|()| file.sync_all());
    drop(file);
    let placed = written
        .map_err(|e| io_error(format!("writing {}", staging.display()), e))
        .and_then(|()| match mode {
            PutMode::Create => match std::fs::hard_link(&staging, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    Err(object_store::Error::AlreadyExists {
                        path: path.display().to_string(),
                        source: Box::new(e),
                    })
                }
                Err(e) => Err(io_error(format!("linking {}", path.display()), e)),
            },
            _ => std::fs::rename(&staging, path)
                .map_err(|e| io_error(format!("renaming into {}", path.display()), e)),
        });
    // The staging name is gone after a rename; after a link, or a failure,
    // it goes now (best effort: listings skip it).
    let _ = std::fs::remove_file(&staging);
    placed?;
    sink_local_fs::sync_dir(dir).map_err(|e| io_error(format!("syncing {}", dir.display()), e))
}

/// A new staging file for `path`, named as `LocalFileSystem` names its own.
fn staging_file(path: &FsPath) -> Result<(File, PathBuf)> {
    for n in 1u32.. {
        let mut name = path.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let staging = PathBuf::from(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&staging)
        {
            Ok(file) => return Ok((file, staging)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(format!("creating {}", staging.display()), e)),
        }
    }
    Err(io_error(
        format!("no staging name left for {}", path.display()),
        std::io::ErrorKind::AlreadyExists.into(),
    ))
}

/// Fsyncs the file at `path` and its directory.
fn sync_file_and_dir(path: &FsPath) -> Result<()> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|e| io_error(format!("syncing {}", path.display()), e))?;
    match path.parent() {
        Some(dir) => sink_local_fs::sync_dir(dir)
            .map_err(|e| io_error(format!("syncing {}", dir.display()), e)),
        None => Ok(()),
    }
}

impl DurableLocalStore {
    /// After `LocalFileSystem` made `to` (a copy, a rename): its bytes and
    /// its name durable, and the name it left, for a rename.
    async fn synced_after(&self, from: Option<&Path>, to: &Path) -> Result<()> {
        let to = self.inner.path_to_filesystem(to)?;
        let from_dir = match from {
            Some(from) => self
                .inner
                .path_to_filesystem(from)?
                .parent()
                .map(FsPath::to_path_buf),
            None => None,
        };
        blocking(move || {
            sync_file_and_dir(&to)?;
            match from_dir {
                Some(dir) if Some(dir.as_path()) != to.parent() => sink_local_fs::sync_dir(&dir)
                    .map_err(|e| io_error(format!("syncing {}", dir.display()), e)),
                _ => Ok(()),
            }
        })
        .await
    }
}

#[async_trait]
impl ObjectStore for DurableLocalStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        if !matches!(opts.mode, PutMode::Overwrite | PutMode::Create) || !opts.attributes.is_empty()
        {
            // What LocalFileSystem refuses, it refuses with its own error.
            return self.inner.put_opts(location, payload, opts).await;
        }
        let path = self.inner.path_to_filesystem(location)?;
        let mode = opts.mode;
        blocking(move || durable_put(&path, &payload, &mode)).await?;
        let meta = self.inner.head(location).await?;
        Ok(PutResult {
            e_tag: meta.e_tag,
            version: meta.version,
        })
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(DurableUpload {
            inner: upload,
            path: self.inner.path_to_filesystem(location)?,
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await?;
        self.synced_after(None, to).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await?;
        self.synced_after(Some(from), to).await
    }
}

/// A multipart upload of `LocalFileSystem`, synced when completed.
#[derive(Debug)]
struct DurableUpload {
    inner: Box<dyn MultipartUpload>,
    path: PathBuf,
}

#[async_trait]
impl MultipartUpload for DurableUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let result = self.inner.complete().await?;
        let path = self.path.clone();
        blocking(move || sync_file_and_dir(&path)).await?;
        Ok(result)
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn puts_are_placed_as_local_file_system_places_them_and_a_create_refuses_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let store = DurableLocalStore::default();
        let root = Path::from_filesystem_path(dir.path()).unwrap();
        let entry = root.join("_delta_log").join("00000000000000000000.json");
        let create = || PutOptions::from(PutMode::Create);
        store
            .put_opts(&entry, PutPayload::from_static(b"first"), create())
            .await
            .unwrap();
        let second = store
            .put_opts(&entry, PutPayload::from_static(b"second"), create())
            .await;
        assert!(
            matches!(second, Err(object_store::Error::AlreadyExists { .. })),
            "{second:?}"
        );
        let read = store.get(&entry).await.unwrap().bytes().await.unwrap();
        assert_eq!(&read[..], b"first");
        store
            .put(&entry, PutPayload::from_static(b"over"))
            .await
            .unwrap();
        let read = store.get(&entry).await.unwrap().bytes().await.unwrap();
        assert_eq!(&read[..], b"over");
        // No staging file is left, and listings show the entry once.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("_delta_log"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["00000000000000000000.json"]);
        let head = store.head(&entry).await.unwrap();
        assert_eq!(head.size, 4);
    }
}
