//! Where the table is: an SQL catalog (SQLite) over a warehouse directory,
//! and the table's name in it.
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
use iceberg::spec::{NestedFieldRef, Schema, Type};
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
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

/// The sink's catalog, opened at its first use and then shared by the
/// start hook, the writers, the committers and the global committer (one
/// connection pool to the catalog's database). An open that failed is
/// tried again at the next use.
#[derive(Clone)]
pub(crate) struct Connection {
    config: Option<SqliteCatalog>,
    opened: Arc<tokio::sync::OnceCell<Arc<dyn Catalog>>>,
}

impl Connection {
    /// What the catalog was opened from (`None` for one opened already).
    pub(crate) fn config(&self) -> Option<&SqliteCatalog> {
        self.config.as_ref()
    }

    /// The catalog `config` describes, opened when first used.
    pub(crate) fn new(config: SqliteCatalog) -> Connection {
        Connection {
            config: Some(config),
            opened: Arc::default(),
        }
    }

    /// A catalog opened already (tests).
    #[cfg(test)]
    pub(crate) fn of(catalog: Arc<dyn Catalog>) -> Connection {
        Connection {
            config: None,
            opened: Arc::new(tokio::sync::OnceCell::new_with(Some(catalog))),
        }
    }

    /// The catalog, opened now if no earlier call did.
    pub(crate) async fn catalog(&self) -> Result<Arc<dyn Catalog>, SinkError> {
        self.opened
            .get_or_try_init(|| async {
                match &self.config {
                    Some(config) => config.open().await,
                    None => Err(SinkError::msg("no catalog to open").permanent()),
                }
            })
            .await
            .cloned()
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

/// A table's name in its catalog, `namespace.name` (a namespace of several
/// levels as `a.b.name`).
///
/// Parsed by users and the demo from `--table`; names the table to the
/// catalog at every commit.
pub fn parse_table_name(text: &str) -> Result<TableIdent, SinkError> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() < 2 || parts.iter().any(|part| part.is_empty()) {
        return Err(SinkError::msg(format!(
            "{text:?} is not a table name: give it as NAMESPACE.NAME, such as db.events"
        ))
        .permanent());
    }
    let ident = TableIdent::from_strs(parts)
        .map_err(|e| iceberg_error(format!("reading the table name {text:?}"), e))?;
    check_table_name(&ident)?;
    Ok(ident)
}

/// Refuses a table name whose levels could reach outside the table's own
/// place in the warehouse: every level of the namespace and the name must
/// be non-empty, not `.` or `..`, and hold no `/`, `\` or control
/// character (each level is a directory or a key segment of the table's
/// location). Called by [`parse_table_name`] and by the sink's builder, so
/// that a name made in code is checked too.
pub fn check_table_name(ident: &TableIdent) -> Result<(), SinkError> {
    let levels = ident
        .namespace()
        .iter()
        .map(String::as_str)
        .chain([ident.name()]);
    for level in levels {
        let bad = level.is_empty()
            || level == "."
            || level == ".."
            || level
                .chars()
                .any(|c| c == '/' || c == '\\' || c.is_control());
        if bad {
            return Err(SinkError::msg(format!(
                "{level:?} in the table name {ident} is not an Iceberg name level: each level \
                 of a table's name is a directory of its location, so none may be empty, `.` \
                 or `..`, or hold `/`, `\\` or a control character"
            ))
            .permanent());
        }
    }
    Ok(())
}

/// The table `ident` in `catalog`, created (with its namespace) with
/// `schema` when missing; an existing table of another schema is refused,
/// naming both. Called by the sink at start.
pub async fn load_or_create(
    catalog: &dyn Catalog,
    ident: &TableIdent,
    schema: &Schema,
) -> Result<Table, SinkError> {
    let loading = || format!("reading the Iceberg table {ident}");
    let exists = catalog
        .table_exists(ident)
        .await
        .map_err(|e| iceberg_error(loading(), e))?;
    if exists {
        let table = catalog
            .load_table(ident)
            .await
            .map_err(|e| iceberg_error(loading(), e))?;
        check_schema(ident, table.metadata().current_schema(), schema)?;
        return Ok(table);
    }
    let namespace: &NamespaceIdent = ident.namespace();
    let namespace_exists = catalog
        .namespace_exists(namespace)
        .await
        .map_err(|e| iceberg_error(loading(), e))?;
    if !namespace_exists {
        // Another start may create it meanwhile: its error is taken for
        // success if the namespace is there after.
        if let Err(error) = catalog.create_namespace(namespace, HashMap::new()).await {
            let there = catalog.namespace_exists(namespace).await.unwrap_or(false);
            if !there {
                return Err(iceberg_error(
                    format!("creating the namespace {}", namespace.to_url_string()),
                    error,
                ));
            }
        }
    }
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(schema.clone())
        .build();
    match catalog.create_table(namespace, creation).await {
        Ok(table) => Ok(table),
        Err(error) => {
            // Created by another start meanwhile: use it, if its schema is
            // ours.
            let table = catalog
                .load_table(ident)
                .await
                .map_err(|_| iceberg_error(format!("creating the Iceberg table {ident}"), error))?;
            check_schema(ident, table.metadata().current_schema(), schema)?;
            Ok(table)
        }
    }
}

/// Refuses a table whose columns (names, types, nullability, in order,
/// nested ones included) are not `expected`'s. Field ids are the table's
/// own and are not compared.
fn check_schema(ident: &TableIdent, found: &Schema, expected: &Schema) -> Result<(), SinkError> {
    let (found, expected) = (
        describe_fields(found.as_struct().fields()),
        describe_fields(expected.as_struct().fields()),
    );
    if found != expected {
        return Err(SinkError::msg(format!(
            "the Iceberg table {ident} has the columns [{found}], but the sink writes \
             [{expected}]: give another table, or drop this one"
        ))
        .permanent());
    }
    Ok(())
}

/// `fields` as `name type [not] null`, comma-separated, with the element,
/// key and value types of nested types spelled out (iceberg-rust's own
/// `Display` of a list or a map names no element type).
fn describe_fields(fields: &[NestedFieldRef]) -> String {
    let field = |field: &NestedFieldRef| {
        let null = if field.required { "not null" } else { "null" };
        format!("{} {} {null}", field.name, describe_type(&field.field_type))
    };
    fields.iter().map(field).collect::<Vec<_>>().join(", ")
}

fn describe_type(field_type: &Type) -> String {
    let element = |field: &NestedFieldRef| {
        let null = if field.required { "" } else { " null" };
        format!("{}{null}", describe_type(&field.field_type))
    };
    match field_type {
        Type::Primitive(primitive) => primitive.to_string(),
        Type::Struct(fields) => format!("struct<{}>", describe_fields(fields.fields())),
        Type::List(list) => format!("list<{}>", element(&list.element_field)),
        Type::Map(map) => format!(
            "map<{}, {}>",
            element(&map.key_field),
            element(&map.value_field)
        ),
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;
    use crate::test_table::{fixture, schema};

    #[test]
    fn a_table_name_cannot_reach_outside_its_place_in_the_warehouse() {
        for good in ["demo.events", "a.b.c", "ns.x-1", "ns.événements"] {
            assert!(parse_table_name(good).is_ok(), "{good} refused");
        }
        // A namespace holding a `/` named the metadata directory of the
        // table ns.x (`ns/x.metadata`); an absolute one, a directory
        // outside the warehouse.
        for bad in [
            "ns/x.metadata",
            "/tmp/out.t",
            "ns.a\\b",
            "ns..t",
            "ns.t\n",
            ".t",
            "t",
        ] {
            let error = parse_table_name(bad).expect_err(bad).to_string();
            assert!(error.contains("table name"), "{bad}: {error}");
        }
        let made_in_code = TableIdent::from_strs(["..", "t"]).unwrap();
        assert!(check_table_name(&made_in_code).is_err());
    }

    #[test]
    fn a_table_name_needs_a_namespace_and_no_empty_part() {
        let ident = parse_table_name("db.events").unwrap();
        assert_eq!(ident.name(), "events");
        for bad in ["events", "db.", ".events", "a..b"] {
            let error = parse_table_name(bad).unwrap_err();
            assert!(error.is_permanent());
            assert!(error.to_string().contains("NAMESPACE.NAME"), "{error}");
        }
    }

    #[test]
    fn nested_types_are_compared_with_their_elements_and_nullability() {
        let list_of = |element: PrimitiveType, required: bool| {
            let element = NestedField::list_element(10, Type::Primitive(element), required);
            Schema::builder()
                .with_fields(vec![NestedField::required(
                    1,
                    "tags",
                    Type::List(iceberg::spec::ListType::new(element.into())),
                )
                .into()])
                .build()
                .unwrap()
        };
        let ident = TableIdent::from_strs(["db", "t"]).unwrap();
        let ints = list_of(PrimitiveType::Int, true);
        assert!(check_schema(&ident, &ints, &list_of(PrimitiveType::Int, true)).is_ok());
        let error = check_schema(&ident, &ints, &list_of(PrimitiveType::String, true))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("list<int>") && error.contains("list<string>"),
            "{error}"
        );
        assert!(check_schema(&ident, &ints, &list_of(PrimitiveType::Int, false)).is_err());
    }

    #[tokio::test]
    async fn a_table_of_another_schema_is_refused_naming_both_and_the_same_one_is_opened() {
        let fx = fixture().await;
        load_or_create(fx.catalog.as_ref(), &fx.ident, &schema())
            .await
            .unwrap();
        let other = Schema::builder()
            .with_fields(vec![NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::String),
            )
            .into()])
            .build()
            .unwrap();
        let error = load_or_create(fx.catalog.as_ref(), &fx.ident, &other)
            .await
            .unwrap_err();
        assert!(error.is_permanent());
        let text = error.to_string();
        assert!(
            text.contains("id long not null") && text.contains("id string not null"),
            "{text}"
        );
    }
}
