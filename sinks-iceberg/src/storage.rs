//! Local table files as the sink needs them: durable when written, and
//! written off the async workers.
//!
//! iceberg-rust's own local storage calls `std::fs` inside its async
//! functions (blocking the worker that runs them) and writes a table's
//! metadata file without fsyncing it or its directory: after a power cut
//! the catalog, whose row is durable, can point at an empty or missing
//! `metadata.json`, and the table is lost. [`DurableLocalStorage`] is the
//! catalog's storage instead, so every file iceberg-rust writes through it
//! (data files, manifests, manifest lists, metadata) is:
//!
//! ```text
//! write / writer ─▶ its directory created, the entries above it synced (once per directory)
//!                ─▶ bytes written on a blocking thread
//!                ─▶ close: the file fsynced, then its directory ─▶ Ok
//! ```
//!
//! So what iceberg-rust reports written survives a power cut: the catalog's
//! compare-and-swap names a metadata file only after it is on disk, and a
//! checkpoint names a data file only after its writer closed it.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt as _;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Builds [`DurableLocalStorage`] for a catalog's `file://` tables.
///
/// Given to the SQL catalog by [`SqliteCatalog::open`](crate::SqliteCatalog);
/// the storages it builds share the set of directories already made
/// durable, so each directory's ancestors are synced once.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DurableLocalStorageFactory {
    #[serde(skip)]
    synced_dirs: SyncedDirs,
}

#[typetag::serde]
impl StorageFactory for DurableLocalStorageFactory {
    fn build(&self, _: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(DurableLocalStorage {
            synced_dirs: self.synced_dirs.clone(),
        }))
    }
}

/// Directories whose entry, and their ancestors', are known durable.
#[derive(Debug, Clone, Default)]
struct SyncedDirs(Arc<Mutex<HashSet<PathBuf>>>);

impl SyncedDirs {
    /// Creates `dir` if missing and syncs the entries above it, unless an
    /// earlier call did. Blocking.
    fn ensure(&self, dir: &Path) -> std::io::Result<()> {
        if self.lock().contains(dir) {
            return Ok(());
        }
        sink_local_fs::create_dir_all(dir)?;
        self.lock().insert(dir.to_path_buf());
        Ok(())
    }

    /// Forgets `dir`: it was removed (its table dropped and made again, by
    /// this process or another), and the next [`ensure`](Self::ensure)
    /// creates and syncs it again.
    fn forget(&self, dir: &Path) {
        self.lock().remove(dir);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A table's local files, read and written on blocking threads, each file
/// written fsynced with its directory before the write is reported done.
///
/// Made by [`DurableLocalStorageFactory`]; called by iceberg-rust's
/// `FileIO` for every file of a `file://` table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DurableLocalStorage {
    #[serde(skip)]
    synced_dirs: SyncedDirs,
}

/// `file:///a/b` (and `file:/a/b`, `/a/b`) as the local path `/a/b`.
fn local_path(location: &str) -> PathBuf {
    let path = location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
        .unwrap_or(location);
    if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        PathBuf::from(format!("/{path}"))
    }
}

/// An I/O error as iceberg-rust's, naming what was done. A missing file is
/// `DataInvalid`, as iceberg-rust's local storage reports it (transient:
/// a restart reads again); what needs a person (a permission, a read-only
/// or full file system) is `PreconditionFailed`, which the sink classes
/// permanent.
fn io_error(doing: String, error: std::io::Error) -> Error {
    use std::io::ErrorKind as Io;
    let kind = match error.kind() {
        Io::NotFound => ErrorKind::DataInvalid,
        Io::PermissionDenied | Io::ReadOnlyFilesystem | Io::StorageFull | Io::QuotaExceeded => {
            ErrorKind::PreconditionFailed
        }
        _ => ErrorKind::Unexpected,
    };
    Error::new(kind, format!("{doing}: {error}")).with_source(error)
}

/// Runs blocking file I/O on tokio's blocking threads.
async fn blocking<T, F>(work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::new(ErrorKind::Unexpected, "a file I/O task failed").with_source(e))?
}

impl DurableLocalStorage {
    /// Syncs the directory holding `path` (its new entry becomes durable).
    fn sync_parent(path: &Path) -> Result<()> {
        let parent = path.parent().unwrap_or(Path::new("/"));
        sink_local_fs::sync_dir(parent)
            .map_err(|e| io_error(format!("syncing the directory of {}", path.display()), e))
    }

    /// Creates the directory holding `path`, durably.
    fn prepare_parent(&self, path: &Path) -> Result<()> {
        let parent = path.parent().unwrap_or(Path::new("/"));
        self.synced_dirs
            .ensure(parent)
            .map_err(|e| io_error(format!("creating the directory {}", parent.display()), e))
    }

    /// Creates `path` for writing in its directory, made durably first; a
    /// directory removed since it was made is made again, once.
    fn create(&self, path: &Path) -> Result<File> {
        self.prepare_parent(path)?;
        match File::create(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.synced_dirs
                    .forget(path.parent().unwrap_or(Path::new("/")));
                self.prepare_parent(path)?;
                File::create(path)
            }
            other => other,
        }
        .map_err(|e| io_error(format!("creating {}", path.display()), e))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for DurableLocalStorage {
    async fn exists(&self, location: &str) -> Result<bool> {
        let path = local_path(location);
        blocking(move || {
            path.try_exists()
                .map_err(|e| io_error(format!("looking for {}", path.display()), e))
        })
        .await
    }

    async fn metadata(&self, location: &str) -> Result<FileMetadata> {
        let path = local_path(location);
        blocking(move || {
            let metadata = std::fs::metadata(&path)
                .map_err(|e| io_error(format!("reading the size of {}", path.display()), e))?;
            Ok(FileMetadata {
                size: metadata.len(),
            })
        })
        .await
    }

    async fn read(&self, location: &str) -> Result<Bytes> {
        let path = local_path(location);
        blocking(move || {
            std::fs::read(&path)
                .map(Bytes::from)
                .map_err(|e| io_error(format!("reading {}", path.display()), e))
        })
        .await
    }

    async fn reader(&self, location: &str) -> Result<Box<dyn FileRead>> {
        let path = local_path(location);
        let file = blocking(move || {
            File::open(&path).map_err(|e| io_error(format!("opening {}", path.display()), e))
        })
        .await?;
        Ok(Box::new(BlockingRead(Arc::new(file))))
    }

    async fn write(&self, location: &str, bytes: Bytes) -> Result<()> {
        let path = local_path(location);
        let storage = self.clone();
        blocking(move || {
            let mut file = storage.create(&path)?;
            file.write_all(&bytes)
                .and_then(|()| file.sync_all())
                .map_err(|e| io_error(format!("writing {}", path.display()), e))?;
            DurableLocalStorage::sync_parent(&path)
        })
        .await
    }

    async fn writer(&self, location: &str) -> Result<Box<dyn FileWrite>> {
        let path = local_path(location);
        let storage = self.clone();
        blocking(move || {
            let file = storage.create(&path)?;
            Ok(Box::new(DurableWrite {
                file: Some(file),
                path,
            }) as Box<dyn FileWrite>)
        })
        .await
    }

    async fn delete(&self, location: &str) -> Result<()> {
        let path = local_path(location);
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => DurableLocalStorage::sync_parent(&path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(format!("removing {}", path.display()), e)),
        })
        .await
    }

    async fn delete_prefix(&self, location: &str) -> Result<()> {
        let path = local_path(location);
        blocking(move || match std::fs::remove_dir_all(&path) {
            Ok(()) => DurableLocalStorage::sync_parent(&path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(format!("removing {}", path.display()), e)),
        })
        .await
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

/// Reads ranges of a local file on blocking threads.
struct BlockingRead(Arc<File>);

#[async_trait]
impl FileRead for BlockingRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let file = self.0.clone();
        blocking(move || {
            let length = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| {
                Error::new(ErrorKind::DataInvalid, "a read range too large to hold")
            })?;
            let mut buffer = vec![0; length];
            file.read_exact_at(&mut buffer, range.start)
                .map_err(|e| io_error(format!("reading bytes {range:?}"), e))?;
            Ok(Bytes::from(buffer))
        })
        .await
    }
}

/// A local file being written on blocking threads; closing it fsyncs it and
/// its directory.
struct DurableWrite {
    /// Taken while a blocking write holds it; `None` once closed.
    file: Option<File>,
    path: PathBuf,
}

impl DurableWrite {
    fn take(&mut self) -> Result<File> {
        self.file.take().ok_or_else(|| {
            Error::new(
                ErrorKind::Unexpected,
                format!(
                    "{} was closed, or a write to it failed",
                    self.path.display()
                ),
            )
        })
    }
}

#[async_trait]
impl FileWrite for DurableWrite {
    async fn write(&mut self, bytes: Bytes) -> Result<()> {
        let mut file = self.take()?;
        let path = self.path.clone();
        let file = blocking(move || {
            file.write_all(&bytes)
                .map_err(|e| io_error(format!("writing {}", path.display()), e))?;
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        let file = self.take()?;
        let path = self.path.clone();
        blocking(move || {
            file.sync_all()
                .map_err(|e| io_error(format!("syncing {}", path.display()), e))?;
            DurableLocalStorage::sync_parent(&path)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_and_paths_name_the_same_local_file() {
        for location in ["file:///a/b.json", "file:/a/b.json", "/a/b.json"] {
            assert_eq!(
                local_path(location),
                PathBuf::from("/a/b.json"),
                "{location}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn files_written_in_new_directories_read_back_and_a_closed_writer_refuses_more() {
        let dir = tempfile::tempdir().unwrap();
        let storage = DurableLocalStorageFactory::default()
            .build(&StorageConfig::new())
            .unwrap();
        let whole = format!("file://{}/t/metadata/v1.json", dir.path().display());
        storage.write(&whole, Bytes::from("{}")).await.unwrap();
        assert_eq!(storage.read(&whole).await.unwrap(), Bytes::from("{}"));
        let streamed = format!("{}/t/data/a.parquet", dir.path().display());
        let mut writer = storage.writer(&streamed).await.unwrap();
        writer.write(Bytes::from("abc")).await.unwrap();
        writer.write(Bytes::from("def")).await.unwrap();
        writer.close().await.unwrap();
        assert!(writer.write(Bytes::from("g")).await.is_err());
        assert_eq!(storage.metadata(&streamed).await.unwrap().size, 6);
        let reader = storage.reader(&streamed).await.unwrap();
        assert_eq!(reader.read(2..5).await.unwrap(), Bytes::from("cde"));
        storage.delete(&streamed).await.unwrap();
        assert!(!storage.exists(&streamed).await.unwrap());
        // Deleting what is not there is not an error.
        storage.delete(&streamed).await.unwrap();
        // A directory removed behind the storage's back is made again.
        std::fs::remove_dir_all(dir.path().join("t")).unwrap();
        storage.write(&whole, Bytes::from("[]")).await.unwrap();
        assert_eq!(storage.read(&whole).await.unwrap(), Bytes::from("[]"));
    }
}
