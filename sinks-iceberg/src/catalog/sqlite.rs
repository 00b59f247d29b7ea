//! An SQL catalog on a local SQLite database, over a warehouse directory
//! or an `s3://` prefix.
//!
//! The catalog is iceberg-rust's `SqlCatalog`, whose tables
//! (`iceberg_tables`, `iceberg_namespace_properties`) are the ones
//! PyIceberg's `SqlCatalog` reads: a catalog named `default` here is
//! `SqlCatalog("default", uri="sqlite:////path/catalog.db")` there. A
//! commit is a compare-and-swap of the table's metadata location in
//! `iceberg_tables`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iceberg::io::StorageFactory;
use iceberg::{Catalog, CatalogBuilder, TableIdent};
use iceberg_catalog_sql::{
    SqlBindStyle, SqlCatalogBuilder, SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI,
    SQL_CATALOG_PROP_WAREHOUSE,
};
use sink_api::SinkError;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};

use crate::errors::iceberg_error;
use crate::storage::DurableLocalStorageFactory;

/// The catalog name the sink uses, as PyIceberg's `SqlCatalog("default",
/// …)` names it: rows of other names in the same database are other
/// catalogs.
pub const CATALOG_NAME: &str = "default";

/// An SQL catalog on a SQLite database, with tables in a warehouse: a
/// local directory, or an `s3://` prefix (the `s3` feature).
///
/// Made by users, the demo (`--catalog sqlite:PATH --warehouse DIR|s3://…`)
/// and the ingest service; [`open`](Self::open) gives the catalog the
/// commits go through.
#[derive(Debug, Clone)]
pub struct SqliteCatalog {
    /// The SQLite database file (absolute), created when missing. A local
    /// file even for tables on object storage: its commits are what the
    /// catalog's compare-and-swap rests on.
    database: PathBuf,
    /// Where new tables go: `<warehouse>/<namespace>/<table>`.
    warehouse: Warehouse,
}

/// Where a catalog's tables are.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Warehouse {
    /// A local directory (absolute).
    Local(PathBuf),
    /// An `s3://bucket/prefix` URL (without a trailing `/`), and the client
    /// of its bucket.
    #[cfg(feature = "s3")]
    S3 {
        /// The URL.
        url: String,
        /// The client, rooted at the bucket.
        store: std::sync::Arc<dyn object_store::ObjectStore>,
    },
}

impl SqliteCatalog {
    /// The catalog in `database` over the local directory `warehouse`;
    /// both are made absolute (the catalog stores the table's location as
    /// a URL). A path holding `?`, `#` or `%` is refused: it would be read
    /// as part of a URL.
    pub fn new(database: &Path, warehouse: &Path) -> Result<SqliteCatalog, SinkError> {
        Ok(SqliteCatalog {
            database: absolute(database, "catalog database")?,
            warehouse: Warehouse::Local(absolute(warehouse, "warehouse directory")?),
        })
    }

    /// The SQLite database file (absolute).
    pub fn database(&self) -> &Path {
        &self.database
    }

    /// Where the catalog's new tables go.
    pub fn warehouse(&self) -> &Warehouse {
        &self.warehouse
    }

    /// The catalog in `database` over the warehouse `url`
    /// (`s3://bucket/prefix`), reached with the client `sink-object-store`
    /// makes of it: endpoint, region and credentials from the usual
    /// `AWS_*` variables, then from `options` (such as `endpoint`), which
    /// win. Contacts nothing: a missing bucket or refused credentials fail
    /// the first start.
    #[cfg(feature = "s3")]
    pub fn s3(
        database: &Path,
        url: &str,
        options: &[(String, String)],
    ) -> Result<SqliteCatalog, SinkError> {
        let s3 = sink_object_store::s3(url, options).map_err(|e| {
            SinkError::msg(format!("the warehouse URL {url} is not usable: {e}")).permanent()
        })?;
        Ok(SqliteCatalog {
            database: absolute(database, "catalog database")?,
            warehouse: Warehouse::S3 {
                url: url.trim_end_matches('/').to_string(),
                store: std::sync::Arc::new(s3.store),
            },
        })
    }

    /// The warehouse as a URL: `file:///dir` or `s3://bucket/prefix`.
    pub fn warehouse_url(&self) -> String {
        match &self.warehouse {
            Warehouse::Local(dir) => format!("file://{}", dir.display()),
            #[cfg(feature = "s3")]
            Warehouse::S3 { url, .. } => url.clone(),
        }
    }

    /// Where the catalog puts a new table `ident`:
    /// `<warehouse>/<namespace levels>/<name>`, as a URL (a namespace with
    /// a location property of its own puts it there instead).
    pub fn table_location(&self, ident: &TableIdent) -> String {
        let mut location = self.warehouse_url();
        for level in ident
            .namespace()
            .iter()
            .chain([ident.name().to_string()].iter())
        {
            location.push('/');
            location.push_str(level);
        }
        location
    }

    /// [`table_location`](Self::table_location) as a local directory, for
    /// a local warehouse; `None` on object storage.
    pub fn table_dir(&self, ident: &TableIdent) -> Option<PathBuf> {
        match &self.warehouse {
            Warehouse::Local(dir) => {
                let mut dir = dir.clone();
                dir.extend(ident.namespace().iter());
                dir.push(ident.name());
                Some(dir)
            }
            #[cfg(feature = "s3")]
            Warehouse::S3 { .. } => None,
        }
    }

    /// The newest metadata file under the location the catalog would give
    /// a new table `ident`, if it describes a table with snapshots: a table
    /// whose catalog entry is not in this database (another host's
    /// database, an older copy). Read by the sink before it creates a
    /// table, so that it never starts a new table over the rows of one
    /// another catalog holds. Metadata with no snapshot, or that does not
    /// read as metadata, is passed over: a start killed while it created
    /// the table leaves it (the file written, or part of it, and the
    /// catalog's row not), and there are no rows to hide.
    pub(crate) async fn table_with_rows_at(
        &self,
        ident: &TableIdent,
    ) -> Result<Option<String>, SinkError> {
        let location = self.table_location(ident);
        let looking = || format!("looking for table metadata under {location}/metadata");
        let mut files = self.metadata_files(ident).await?;
        // `NNNNN-<uuid>.metadata.json`: the highest version is the newest.
        files.sort_by_key(|file| {
            let name = file.rsplit('/').next().unwrap_or_default();
            name.split('-').next().and_then(|v| v.parse::<u64>().ok())
        });
        let storage = self
            .storage()
            .build(&iceberg::io::StorageConfig::new())
            .map_err(|e| iceberg_error(looking(), e))?;
        // The newest file that reads as metadata decides; one that does not
        // (a write a power cut cut short, before its table was ever in a
        // catalog) is passed over.
        while let Some(newest) = files.pop() {
            let bytes = storage
                .read(&newest)
                .await
                .map_err(|e| iceberg_error(format!("reading {newest}"), e))?;
            let Ok(metadata) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                continue;
            };
            let has_snapshots = metadata["snapshots"]
                .as_array()
                .is_some_and(|snapshots| !snapshots.is_empty());
            return Ok(has_snapshots.then_some(newest));
        }
        Ok(None)
    }

    /// The metadata files (`*.metadata.json`) under the location a new
    /// table `ident` gets, as URLs.
    async fn metadata_files(&self, ident: &TableIdent) -> Result<Vec<String>, SinkError> {
        let location = self.table_location(ident);
        let listing = || format!("listing the metadata files under {location}/metadata");
        let is_metadata = |name: &str| name.ends_with(".metadata.json");
        match &self.warehouse {
            Warehouse::Local(_) => {
                let Some(dir) = self.table_dir(ident).map(|dir| dir.join("metadata")) else {
                    return Ok(Vec::new());
                };
                let names = tokio::task::spawn_blocking(move || match std::fs::read_dir(&dir) {
                    Ok(entries) => entries
                        .map(|entry| entry.map(|entry| entry.file_name()))
                        .collect::<Result<Vec<_>, _>>(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                    Err(e) => Err(e),
                })
                .await
                .map_err(|e| SinkError::other(listing(), e))?
                .map_err(|e| SinkError::io(listing(), e))?;
                Ok(names
                    .iter()
                    .filter_map(|name| name.to_str())
                    .filter(|name| is_metadata(name))
                    .map(|name| format!("{location}/metadata/{name}"))
                    .collect())
            }
            #[cfg(feature = "s3")]
            Warehouse::S3 { url, store } => {
                use futures::TryStreamExt as _;

                let bucket = url
                    .trim_start_matches("s3://")
                    .split('/')
                    .next()
                    .unwrap_or_default();
                let prefix = location
                    .trim_start_matches("s3://")
                    .split_once('/')
                    .map_or(String::new(), |(_, key)| format!("{key}/metadata"));
                let listed: Vec<_> = store
                    .list(Some(&object_store::path::Path::from(prefix)))
                    .try_collect()
                    .await
                    .map_err(|e| SinkError::other(listing(), e))?;
                Ok(listed
                    .iter()
                    .map(|meta| meta.location.to_string())
                    .filter(|name| is_metadata(name))
                    .map(|name| format!("s3://{bucket}/{name}"))
                    .collect())
            }
        }
    }

    /// The storage the catalog's tables are written through.
    fn storage(&self) -> Arc<dyn StorageFactory> {
        match &self.warehouse {
            Warehouse::Local(_) => Arc::new(DurableLocalStorageFactory::default()),
            #[cfg(feature = "s3")]
            Warehouse::S3 { url, store } => {
                let bucket = url
                    .trim_start_matches("s3://")
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                Arc::new(crate::object_storage::ObjectStorageFactory::new(
                    store.clone(),
                    bucket,
                ))
            }
        }
    }

    /// Opens the catalog, creating the database and its tables when
    /// missing. Called by the sink at start and by tests.
    pub async fn open(&self) -> Result<Arc<dyn Catalog>, SinkError> {
        self.prepare_database().await?;
        let props = HashMap::from([
            (
                SQL_CATALOG_PROP_URI.to_string(),
                // `mode=rwc`: create the database file when missing.
                format!("sqlite://{}?mode=rwc", self.database.display()),
            ),
            (SQL_CATALOG_PROP_WAREHOUSE.to_string(), self.warehouse_url()),
            (
                SQL_CATALOG_PROP_BIND_STYLE.to_string(),
                SqlBindStyle::QMark.to_string(),
            ),
        ]);
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(self.storage())
            .load(CATALOG_NAME, props)
            .await
            .map_err(|e| {
                iceberg_error(
                    format!("opening the SQL catalog in {}", self.database.display()),
                    e,
                )
            })?;
        Ok(Arc::new(catalog))
    }
}

impl SqliteCatalog {
    /// Creates the database (and its directory) when missing, durably, and
    /// puts it in WAL mode, where a commit is durable once SQLite returns.
    ///
    /// In SQLite's default rollback-journal mode a commit ends by deleting
    /// the journal, and at `synchronous=FULL` (the default, and all the SQL
    /// catalog's connection URL can ask for) that deletion is not synced:
    /// after a power cut the journal can come back and roll the commit
    /// back, taking a snapshot the sink had reported committed (seen by the
    /// power-loss test of the demo). In WAL mode at `FULL` the log is
    /// synced at every commit. The mode is kept in the database file, so
    /// the catalog's own connections, and PyIceberg's, use it.
    async fn prepare_database(&self) -> Result<(), SinkError> {
        let database = self.database.clone();
        let preparing = || format!("preparing the catalog database {}", self.database.display());
        if let Some(parent) = database.parent().map(Path::to_path_buf) {
            tokio::task::spawn_blocking(move || sink_local_fs::create_dir_all(&parent))
                .await
                .map_err(|e| SinkError::other(preparing(), e))?
                .map_err(|e| SinkError::io(preparing(), e).permanent())?;
        }
        // SQLite refuses a change of journal mode while another connection
        // (another start, a reader) holds the database, without waiting:
        // the switch is tried again for a while.
        let mut attempt = 0;
        loop {
            match switch_to_wal(&database).await {
                Ok(()) => break,
                Err(error) if is_busy(&error) && attempt < BUSY_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(BUSY_PAUSE).await;
                }
                Err(sqlx::Error::Protocol(mode)) => {
                    return Err(SinkError::msg(format!(
                        "{}: SQLite kept the journal mode {mode} instead of WAL, in which alone \
                         a commit survives a power cut; put the database on a local file system",
                        preparing()
                    ))
                    .permanent())
                }
                Err(error) => return Err(SinkError::other(preparing(), error)),
            }
        }
        tokio::task::spawn_blocking(move || sink_local_fs::sync_entries_of(&database))
            .await
            .map_err(|e| SinkError::other(preparing(), e))?
            .map_err(|e| SinkError::io(preparing(), e))
    }
}

/// Times a database another connection holds is tried again, and the
/// pause between (about 5 s in all).
const BUSY_ATTEMPTS: u32 = 50;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Puts the SQLite database `database` (created when missing) in WAL mode,
/// if it is not already (only the switch takes a lock other connections'
/// reads refuse). A mode SQLite keeps instead is `Protocol(mode)`.
async fn switch_to_wal(database: &Path) -> Result<(), sqlx::Error> {
    let mut connection = SqliteConnectOptions::new()
        .filename(database)
        .create_if_missing(true)
        .connect()
        .await?;
    let mut mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut connection)
        .await?;
    if !mode.eq_ignore_ascii_case("wal") {
        // SQLite answers the mode it is in, which is not WAL where the
        // file system cannot hold one (no shared memory).
        mode = sqlx::query_scalar("PRAGMA journal_mode = WAL")
            .fetch_one(&mut connection)
            .await?;
    }
    connection.close().await?;
    match mode.eq_ignore_ascii_case("wal") {
        true => Ok(()),
        false => Err(sqlx::Error::Protocol(mode)),
    }
}

/// Whether SQLite refused for another connection's lock (`SQLITE_BUSY`,
/// `SQLITE_LOCKED`).
fn is_busy(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "5" || code == "6")
}

/// `path`, absolute, or a permanent error naming its role. A path holding
/// `?`, `#` or `%`, which the catalog would read as part of a URL, or that
/// is not UTF-8, is refused.
fn absolute(path: &Path, what: &str) -> Result<PathBuf, SinkError> {
    let Some(text) = path.to_str().filter(|text| !text.contains(['?', '#', '%'])) else {
        return Err(SinkError::msg(format!(
            "the {what} {} cannot be named in the catalog's URLs: give a path of UTF-8 \
             without ?, # or %",
            path.display()
        ))
        .permanent());
    };
    std::path::absolute(text).map_err(|e| {
        SinkError::io(format!("resolving the {what} {}", path.display()), e).permanent()
    })
}
