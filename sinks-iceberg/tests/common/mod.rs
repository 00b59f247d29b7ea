//! What the Iceberg sink's tests share: the record, its schema, and a
//! table of its own in a temporary catalog, which the kit certifies.

#![allow(dead_code)]

use serde::Serialize;
use sink_testkit::Destination;
use sinks_iceberg::iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use sinks_iceberg::iceberg::TableIdent;
use sinks_iceberg::{read, IcebergSink, SqliteCatalog};

/// The kit's record: an id and some text.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub id: i64,
    pub payload: String,
}

impl Event {
    pub fn new(id: u64) -> Event {
        Event {
            id: id as i64,
            payload: format!("event number {id}"),
        }
    }
}

pub fn schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "payload", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .expect("a schema")
}

/// The sink the kit certifies: files rolled at 1 KiB, so that a subtask's
/// checkpoint hands out several, a commit call holds several requests, and
/// a lost answer can fall in the middle of one.
fn kit_sink(
    catalog: impl Into<sinks_iceberg::IcebergCatalog>,
    ident: &TableIdent,
) -> IcebergSink<Event> {
    kit_sink_committing_every(catalog, ident, 1)
}

/// [`kit_sink`] committing once per `checkpoints` checkpoints.
fn kit_sink_committing_every(
    catalog: impl Into<sinks_iceberg::IcebergCatalog>,
    ident: &TableIdent,
    checkpoints: u32,
) -> IcebergSink<Event> {
    IcebergSink::builder(catalog, ident.clone(), schema())
        .roll_files_at_checkpoints_and_at_size(1024)
        .commit_every(std::num::NonZeroU32::new(checkpoints).expect("above zero"))
        .build()
        .expect("a valid sink")
}

/// The ids in `table` (none without a table).
async fn ids(table: Option<sinks_iceberg::iceberg::table::Table>) -> Vec<u64> {
    let Some(table) = table else {
        return Vec::new();
    };
    read::int64_column(&table, "id")
        .await
        .expect("the table reads")
        .into_iter()
        .map(|id| id as u64)
        .collect()
}

/// A catalog and warehouse of their own for one kit scenario.
pub struct LocalTable {
    pub catalog: SqliteCatalog,
    pub ident: TableIdent,
    pub dir: tempfile::TempDir,
    /// The sink's commit schedule: once per this many checkpoints.
    pub commit_every: u32,
    /// The catalog as the test reads it, opened once.
    opened: Opened,
}

/// A catalog opened at its first read, then shared by the reads.
type Opened = tokio::sync::OnceCell<std::sync::Arc<dyn sinks_iceberg::iceberg::Catalog>>;

impl LocalTable {
    pub fn new() -> LocalTable {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let catalog = SqliteCatalog::new(&dir.path().join("catalog.db"), &dir.path().join("wh"))
            .expect("a catalog");
        LocalTable {
            catalog,
            ident: TableIdent::from_strs(["db", "events"]).expect("a name"),
            dir,
            commit_every: 1,
            opened: Opened::new(),
        }
    }

    pub async fn table(&self) -> Option<sinks_iceberg::iceberg::table::Table> {
        let catalog = self
            .opened
            .get_or_init(|| async { self.catalog.open().await.expect("the catalog opens") })
            .await;
        read::table(catalog.as_ref(), &self.ident)
            .await
            .expect("the catalog reads")
    }
}

#[sink_api::async_trait]
impl Destination for LocalTable {
    type Sink = IcebergSink<Event>;

    async fn sink(&self) -> IcebergSink<Event> {
        kit_sink_committing_every(self.catalog.clone(), &self.ident, self.commit_every)
    }

    async fn committed_ids(&self) -> Vec<u64> {
        ids(self.table().await).await
    }

    /// Data files in the table's data directory that no snapshot names.
    async fn open_transactions(&self) -> Option<usize> {
        let Some(table) = self.table().await else {
            return Some(0);
        };
        let live = read::live_files(&table).await.expect("the manifests read");
        let data = self
            .catalog
            .table_dir(&self.ident)
            .expect("a local table")
            .join("data");
        let written = match std::fs::read_dir(&data) {
            Ok(entries) => entries
                .map(|entry| {
                    let path = entry.expect("a directory entry").path();
                    format!("file://{}", path.display())
                })
                .collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("the data directory cannot be read: {e}"),
        };
        Some(written.iter().filter(|path| !live.contains(*path)).count())
    }
}

/// A table of its own on the S3-compatible test server for one kit
/// scenario: a warehouse under a fresh prefix of the test bucket, its
/// catalog database in a temporary directory.
#[cfg(feature = "s3")]
pub struct S3Table {
    pub catalog: SqliteCatalog,
    pub ident: TableIdent,
    pub prefix: String,
    pub dir: tempfile::TempDir,
    opened: Opened,
}

#[cfg(feature = "s3")]
impl S3Table {
    pub fn new(server: &sink_testkit::servers::S3Server) -> S3Table {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let prefix = format!("iceberg/{:016x}", fastrand::u64(..));
        let url = format!("s3://{}/{prefix}", server.bucket);
        let options = vec![
            ("endpoint".to_string(), server.endpoint.clone()),
            ("allow_http".to_string(), "true".to_string()),
        ];
        let catalog =
            SqliteCatalog::s3(&dir.path().join("catalog.db"), &url, &options).expect("a catalog");
        S3Table {
            catalog,
            ident: TableIdent::from_strs(["db", "events"]).expect("a name"),
            prefix,
            dir,
            opened: Opened::new(),
        }
    }

    pub async fn table(&self) -> Option<sinks_iceberg::iceberg::table::Table> {
        let catalog = self
            .opened
            .get_or_init(|| async { self.catalog.open().await.expect("the catalog opens") })
            .await;
        read::table(catalog.as_ref(), &self.ident)
            .await
            .expect("the catalog reads")
    }
}

#[cfg(feature = "s3")]
#[sink_api::async_trait]
impl Destination for S3Table {
    type Sink = IcebergSink<Event>;

    async fn sink(&self) -> IcebergSink<Event> {
        kit_sink(self.catalog.clone(), &self.ident)
    }

    async fn committed_ids(&self) -> Vec<u64> {
        ids(self.table().await).await
    }

    /// Data objects under the table's `data/` that no snapshot names.
    async fn open_transactions(&self) -> Option<usize> {
        use futures::TryStreamExt as _;

        let Some(table) = self.table().await else {
            return Some(0);
        };
        let live = read::live_files(&table).await.expect("the manifests read");
        let sinks_iceberg::Warehouse::S3 { url, store } = self.catalog.warehouse() else {
            panic!("an S3 warehouse");
        };
        let bucket = url
            .trim_start_matches("s3://")
            .split('/')
            .next()
            .unwrap_or_default();
        let data = object_store::path::Path::from(format!("{}/db/events/data", self.prefix));
        let written: Vec<_> = store
            .list(Some(&data))
            .try_collect()
            .await
            .expect("the data objects list");
        Some(
            written
                .iter()
                .filter(|meta| !live.contains(&format!("s3://{bucket}/{}", meta.location)))
                .count(),
        )
    }
}

/// A table of its own in the REST test catalog (`scripts/with-seaweedfs`)
/// for one kit scenario: a fresh namespace, placed by the catalog in its
/// table bucket.
#[cfg(feature = "rest")]
pub struct RestTable {
    pub catalog: sinks_iceberg::RestCatalog,
    pub ident: TableIdent,
    server: sink_testkit::servers::IcebergRestServer,
    opened: Opened,
}

#[cfg(feature = "rest")]
impl RestTable {
    pub fn new(server: &sink_testkit::servers::IcebergRestServer) -> RestTable {
        let catalog = sinks_iceberg::RestCatalog::new(&server.uri, server.properties())
            .expect("a REST catalog");
        let namespace = format!("kit_{:016x}", fastrand::u64(..));
        RestTable {
            catalog,
            ident: TableIdent::from_strs([namespace.as_str(), "events"]).expect("a name"),
            server: server.clone(),
            opened: Opened::new(),
        }
    }

    pub async fn table(&self) -> Option<sinks_iceberg::iceberg::table::Table> {
        let catalog = self
            .opened
            .get_or_init(|| async { self.catalog.open().await.expect("the catalog opens") })
            .await;
        read::table(catalog.as_ref(), &self.ident)
            .await
            .expect("the catalog reads")
    }
}

#[cfg(feature = "rest")]
#[sink_api::async_trait]
impl Destination for RestTable {
    type Sink = IcebergSink<Event>;

    async fn sink(&self) -> IcebergSink<Event> {
        kit_sink(self.catalog.clone(), &self.ident)
    }

    async fn committed_ids(&self) -> Vec<u64> {
        ids(self.table().await).await
    }

    /// Data objects under the table's `data/` that no snapshot names.
    async fn open_transactions(&self) -> Option<usize> {
        use futures::TryStreamExt as _;
        use object_store::ObjectStore as _;

        let Some(table) = self.table().await else {
            return Some(0);
        };
        let live = read::live_files(&table).await.expect("the manifests read");
        let location = table
            .metadata()
            .location()
            .trim_end_matches('/')
            .to_string();
        let (bucket, key) = location
            .trim_start_matches("s3://")
            .split_once('/')
            .expect("an s3:// table location");
        let options = vec![
            ("endpoint".to_string(), self.server.s3_endpoint.clone()),
            ("allow_http".to_string(), "true".to_string()),
            (
                "access_key_id".to_string(),
                self.server.access_key_id.clone(),
            ),
            (
                "secret_access_key".to_string(),
                self.server.secret_access_key.clone(),
            ),
            ("region".to_string(), self.server.region.clone()),
        ];
        let store = sink_object_store::s3(&format!("s3://{bucket}"), &options)
            .expect("a client of the table bucket")
            .store;
        let data = object_store::path::Path::from(format!("{key}/data"));
        let written: Vec<_> = store
            .list(Some(&data))
            .try_collect()
            .await
            .expect("the data objects list");
        Some(
            written
                .iter()
                .filter(|meta| !live.contains(&format!("s3://{bucket}/{}", meta.location)))
                .count(),
        )
    }
}
