//! Where a table lives: a local directory or a prefix of an object store,
//! and how the sink opens, creates and checks it.
//!
//! ```text
//! TableLocation::local("/data/events")         file:///data/events   the file system's root store
//! TableLocation::object_store(s3, "s3://b/t")  s3://b/t              the bucket's root store
//!            │
//!            ▼  log store (delta-rs' default: commits by conditional create)
//!      _delta_log/00000000000000000000.json, …     data files beside it
//! ```
//!
//! The log store is built here from the caller's object store, not from
//! delta-rs' process-wide registry of URL schemes: the sink keeps no global
//! state, and any `ObjectStore` (S3, an S3-compatible server, in memory)
//! works as long as it supports conditional creates (`PutMode::Create`),
//! which is how every Delta commit is made atomic.

use object_store::ObjectStoreExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::StructType;
use deltalake_core::logstore::{default_logstore, LogStore, LogStoreRef, StorageConfig};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::SaveMode;
use deltalake_core::{DeltaTable, DeltaTableConfig, DeltaTableError};
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use sink_api::SinkError;
use url::Url;

use crate::durable_store::DurableLocalStore;
use crate::errors::delta_error;

/// Where the sink's Delta table lives. Given to
/// [`DeltaSink::builder`](crate::DeltaSink::builder) by the user; cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct TableLocation {
    /// The store with `/` at its root (the file system's root, a bucket).
    root: Arc<dyn ObjectStore>,
    /// The table's URL: `file:///…` or `s3://bucket/prefix`.
    url: Url,
    /// The table's directory, for a local table.
    local_dir: Option<PathBuf>,
}

impl TableLocation {
    /// A table in the local directory `dir`, created if missing with every
    /// entry above it synced. Its objects are written through
    /// `DurableLocalStore`: each is fsynced before it is placed under its
    /// name (object_store's local file system does not sync at all).
    ///
    /// # Errors
    /// A permanent error if the directory cannot be created or its path is
    /// not absolute after canonicalisation.
    pub fn local(dir: impl AsRef<FsPath>) -> Result<TableLocation, SinkError> {
        let dir = dir.as_ref();
        sink_local_fs::create_dir_all(dir)
            .and_then(|()| dir.canonicalize())
            .map_err(|e| {
                SinkError::io(
                    format!("cannot create the table directory {}", dir.display()),
                    e,
                )
                .permanent()
            })
            .and_then(|dir| {
                let url = Url::from_directory_path(&dir).map_err(|()| {
                    SinkError::msg(format!(
                        "the table directory {} is not an absolute path",
                        dir.display()
                    ))
                    .permanent()
                })?;
                Ok(TableLocation {
                    // Every write on disk before it is visible by name.
                    root: Arc::new(DurableLocalStore::default()),
                    url,
                    local_dir: Some(dir),
                })
            })
    }

    /// A table at `url` (such as `s3://bucket/tables/events`) in `root`, a
    /// store whose `/` is the root the URL's path starts from (for S3: the
    /// bucket). The store must support conditional creates.
    pub fn object_store(root: Arc<dyn ObjectStore>, url: Url) -> TableLocation {
        TableLocation {
            root,
            url,
            local_dir: None,
        }
    }

    /// The table's URL, as readers name it.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The table's directory, for a local table.
    pub fn local_dir(&self) -> Option<&FsPath> {
        self.local_dir.as_deref()
    }

    /// The table's files: a store whose root is the table's root.
    pub(crate) fn table_store(&self) -> Arc<dyn ObjectStore> {
        Arc::new(PrefixStore::new(self.root.clone(), self.prefix()))
    }

    fn prefix(&self) -> Path {
        // The URL path is percent-encoded; object_store's paths are not.
        Path::from_url_path(self.url.path()).unwrap_or_else(|_| Path::from(self.url.path()))
    }

    /// A log store on this location, through delta-rs' default log store
    /// (commits by conditional create).
    pub(crate) fn log_store(&self) -> LogStoreRef {
        default_logstore(
            self.table_store(),
            self.root.clone(),
            &self.url,
            &StorageConfig::default(),
        )
    }

    /// The table, loaded at its newest version, or `None` if there is no
    /// table here yet.
    ///
    /// An empty log is seen by listing it first: delta-kernel logs its
    /// failure to load one at ERROR ("No files in log segment"), which
    /// made every new table's first start report a false alarm.
    pub(crate) async fn open(&self) -> Result<Option<DeltaTable>, DeltaTableError> {
        let log_store = self.log_store();
        if !log_store.is_delta_table_location().await? {
            return Ok(None);
        }
        let mut table = DeltaTable::new(log_store, DeltaTableConfig::default());
        // A log removed between the listing and the load.
        match table.load().await {
            Ok(()) => Ok(Some(table)),
            Err(DeltaTableError::NotATable(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The table, created with `schema` and `partition_by` if there is none.
    /// An existing table must have the same columns (names, types,
    /// nullability) and partition columns, or this is a permanent error that
    /// names both. Two jobs creating the same table at once are resolved by
    /// the log's conditional create: the loser opens the winner's table.
    pub(crate) async fn open_or_create(
        &self,
        schema: &arrow_schema::Schema,
        partition_by: &[String],
    ) -> Result<DeltaTable, SinkError> {
        let wanted = StructType::try_from_arrow(schema).map_err(|e| {
            SinkError::other("the sink's Arrow schema has no Delta equivalent", e).permanent()
        })?;
        let opening = || format!("opening the Delta table {}", self.url);
        let table = match self.open().await.map_err(|e| delta_error(opening(), e))? {
            Some(table) => {
                self.check(&table, &wanted, partition_by)?;
                table
            }
            None => {
                let created = CreateBuilder::new()
                    .with_log_store(self.log_store())
                    .with_columns(wanted.fields().cloned())
                    .with_partition_columns(partition_by.to_vec())
                    .with_save_mode(SaveMode::ErrorIfExists)
                    .await;
                match created {
                    Ok(table) => table,
                    Err(e) => match self.open().await.map_err(|e| delta_error(opening(), e))? {
                        // Another job created it meanwhile (the log's first
                        // entry is a conditional create): open theirs and
                        // check it.
                        Some(table) => {
                            self.check(&table, &wanted, partition_by)?;
                            table
                        }
                        None => {
                            return Err(delta_error(
                                format!("creating the Delta table {}", self.url),
                                e,
                            ))
                        }
                    },
                }
            }
        };
        // Whatever made the log (this start's create, a start killed before
        // it synced), what the table's state stands on is durable before a
        // checkpoint can depend on it.
        self.make_log_durable().await.map_err(|e| {
            SinkError::io(
                format!("making the log of the Delta table {} durable", self.url),
                e,
            )
        })?;
        Ok(table)
    }

    /// Makes durable, for a local table, what its current state is read
    /// from: the log's JSON entries from its newest log checkpoint on (all
    /// of them without one), that checkpoint and `_last_checkpoint`, and the
    /// directories up to the file system's root. Called at each start: the
    /// create of the table, and entries an earlier start wrote before it
    /// was killed, were never synced. Does nothing for object stores.
    pub(crate) async fn make_log_durable(&self) -> std::io::Result<()> {
        let Some(dir) = self.local_dir.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || sync_log(&dir))
            .await
            .map_err(std::io::Error::other)?
    }

    fn check(
        &self,
        table: &DeltaTable,
        wanted: &StructType,
        partition_by: &[String],
    ) -> Result<(), SinkError> {
        let metadata = table
            .snapshot()
            .map_err(|e| delta_error(format!("reading the Delta table {}", self.url), e))?
            .metadata();
        let found = metadata.parse_schema().map_err(|e| {
            SinkError::other(format!("the schema of the Delta table {}", self.url), e).permanent()
        })?;
        if &found != wanted {
            return Err(SinkError::msg(format!(
                "the Delta table {} has the schema {found:?}, the sink writes {wanted:?}; \
                 write to another table or change the sink's schema",
                self.url
            ))
            .permanent());
        }
        if metadata.partition_columns() != partition_by {
            return Err(SinkError::msg(format!(
                "the Delta table {} is partitioned by {:?}, the sink by {partition_by:?}; \
                 write to another table or change the sink's partition columns",
                self.url,
                metadata.partition_columns()
            ))
            .permanent());
        }
        Ok(())
    }

    /// Makes the log entry that holds `txn(app_id, version)` durable: after
    /// a restart, an earlier attempt may have written it without the sync.
    /// For local tables; does nothing for object stores.
    pub(crate) async fn sync_log_entry_holding(
        &self,
        app_id: &str,
        version: i64,
        newest: u64,
    ) -> std::io::Result<()> {
        let Some(dir) = self.local_dir.clone() else {
            return Ok(());
        };
        let app_id = app_id.to_string();
        tokio::task::spawn_blocking(move || sync_txn_entry(&dir, &app_id, version, newest))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Checks that the store refuses to create an object twice (S3's
    /// `If-None-Match`): Delta's log depends on it, and a store that ignores
    /// it would let two writers overwrite each other's version. Writes and
    /// removes a probe under `_eo_sink_probe/` (underscore paths are not
    /// the table's data).
    pub(crate) async fn check_conditional_create(&self) -> Result<(), SinkError> {
        use object_store::{PutMode, PutOptions, PutPayload};
        if self.local_dir.is_some() {
            return Ok(());
        }
        let store = self.table_store();
        let probe = Path::from(format!(
            "_eo_sink_probe/{:016x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        ));
        let create = || PutOptions::from(PutMode::Create);
        let probing = |e| {
            crate::errors::store_error(format!("probing conditional writes at {}", self.url), e)
        };
        store
            .put_opts(&probe, PutPayload::from_static(b"probe"), create())
            .await
            .map_err(probing)?;
        let second = store
            .put_opts(&probe, PutPayload::from_static(b"probe"), create())
            .await;
        let _ = store.delete(&probe).await;
        match second {
            Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(probing(e)),
            Ok(_) => Err(SinkError::msg(format!(
                "the object store at {} accepted a second create of the same object: it ignores \
                 conditional writes (If-None-Match), which Delta's log needs to keep two writers \
                 from overwriting each other's version; use a store that supports them",
                self.url
            ))
            .permanent()),
        }
    }

    /// Makes the table-relative `paths` and their directories durable, on a
    /// blocking thread. Does nothing for object stores (a completed write
    /// is durable there). A missing file is an error of kind `NotFound`.
    pub(crate) async fn make_durable(&self, paths: Vec<String>) -> std::io::Result<()> {
        let Some(dir) = self.local_dir.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || sync_files(&dir, &paths))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// Versions looked through, newest first, for the entry holding a `txn`
/// whose durability is not known (after a restart). Past it, the entry is
/// long durable by the file system's own writeback.
const TXN_SEARCH_DEPTH: u64 = 1000;

/// The log entry holding `txn(app_id, version)` or later, found among the
/// JSON entries from `newest` down, fsynced with the log directory. For
/// local tables; does nothing for object stores.
fn sync_txn_entry(root: &FsPath, app_id: &str, version: i64, newest: u64) -> std::io::Result<()> {
    let log = root.join("_delta_log");
    for v in (newest.saturating_sub(TXN_SEARCH_DEPTH)..=newest).rev() {
        let path = log.join(format!("{v:020}.json"));
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let holds = text.lines().any(|line| {
            serde_json::from_str::<serde_json::Value>(line).is_ok_and(|action| {
                let txn = &action["txn"];
                txn["appId"] == app_id && txn["version"].as_i64().is_some_and(|v| v >= version)
            })
        });
        if holds {
            std::fs::File::open(&path)?.sync_all()?;
            return std::fs::File::open(&log)?.sync_all();
        }
    }
    Ok(())
}

/// `fsync` of the log entries a local table's state is read from (see
/// [`TableLocation::make_log_durable`]), of `_delta_log`, and of the table
/// directory and every one above it.
fn sync_log(root: &FsPath) -> std::io::Result<()> {
    let log = root.join("_delta_log");
    let from = match std::fs::read_to_string(log.join("_last_checkpoint")) {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["version"].as_i64())
            .unwrap_or(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    for entry in std::fs::read_dir(&log)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // `<version>.json`, `<version>.checkpoint[.<part>.<parts>].parquet`.
        let version = name.split('.').next().and_then(|v| v.parse::<i64>().ok());
        let needed = match version {
            Some(v) if name.ends_with(".json") => v >= from,
            Some(v) if name.contains(".checkpoint") => v == from,
            _ => name == "_last_checkpoint",
        };
        if needed && entry.file_type()?.is_file() {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(&log)?.sync_all()?;
    std::fs::File::open(root)?.sync_all()?;
    sink_local_fs::sync_entries_of(root)
}

/// `fsync` of each file under `root`, then of each directory from the
/// file's up to `root`.
fn sync_files(root: &FsPath, paths: &[String]) -> std::io::Result<()> {
    let mut dirs = std::collections::BTreeSet::new();
    for path in paths {
        let file = root.join(path);
        std::fs::File::open(&file)?.sync_all()?;
        let mut dir = file.parent();
        while let Some(d) = dir {
            if !d.starts_with(root) {
                break;
            }
            dirs.insert(d.to_path_buf());
            dir = d.parent();
        }
    }
    for dir in dirs {
        std::fs::File::open(&dir)?.sync_all()?;
    }
    Ok(())
}
