//! A table in a SQLite catalog on a temporary directory, and data file
//! entries for it, for the tests of the commit path.

use std::sync::Arc;

use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, NestedField, PrimitiveType, Schema,
    Struct, Type,
};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use sink_api::SinkError;

use crate::catalog::{load_or_create, SqliteCatalog};
use crate::committable::IcebergDataFile;
use crate::table_commit::{commit, Commit, Outcome};

pub fn schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "payload", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap()
}

/// A data file entry (the commit never reads the file itself).
pub fn data_file(table: &Table, name: &str) -> DataFile {
    DataFileBuilder::default()
        .content(DataContentType::Data)
        .file_path(format!(
            "{}/data/{name}.parquet",
            table.metadata().location()
        ))
        .file_format(DataFileFormat::Parquet)
        .record_count(10)
        .file_size_in_bytes(1000)
        .partition(Struct::empty())
        .partition_spec_id(0)
        .build()
        .unwrap()
}

/// [`data_file`] as the committable carrying it, under `job/lineage`.
pub fn file(table: &Table, name: &str) -> IcebergDataFile {
    IcebergDataFile::new("job/lineage", data_file(table, name), table).unwrap()
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub catalog: Arc<dyn Catalog>,
    pub ident: TableIdent,
}

pub async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let catalog = SqliteCatalog::new(&dir.path().join("catalog.db"), &dir.path().join("wh"))
        .unwrap()
        .open()
        .await
        .unwrap();
    let ident = TableIdent::from_strs(["db", "events"]).unwrap();
    load_or_create(catalog.as_ref(), &ident, &schema(), None)
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        catalog,
        ident,
    }
}

/// A table in a namespace of its own in the REST test catalog
/// (`scripts/with-seaweedfs`), or `None` (the test skipped, saying so)
/// without it.
#[cfg(feature = "rest")]
pub async fn rest_fixture() -> Option<Fixture> {
    let server = sink_testkit::servers::iceberg_rest()?;
    let catalog = crate::catalog::RestCatalog::new(&server.uri, server.properties())
        .unwrap()
        .open()
        .await
        .unwrap();
    let namespace = format!("unit_{:016x}", fastrand::u64(..));
    let ident = TableIdent::from_strs([namespace.as_str(), "events"]).unwrap();
    load_or_create(catalog.as_ref(), &ident, &schema(), None)
        .await
        .unwrap();
    Some(Fixture {
        _dir: tempfile::tempdir().unwrap(),
        catalog,
        ident,
    })
}

impl Fixture {
    pub async fn table(&self) -> Table {
        self.catalog.load_table(&self.ident).await.unwrap()
    }

    pub async fn commit(
        &self,
        generation: u64,
        checkpoint: u64,
        files: &[IcebergDataFile],
    ) -> Result<Outcome, SinkError> {
        let files: Vec<_> = files.iter().map(|f| (checkpoint, f.clone())).collect();
        let work = Commit {
            app_id: "job/lineage",
            generation,
            checkpoint: Some(checkpoint),
            restored: None,
            files: &files,
            end_of_input: false,
        };
        commit(self.catalog.as_ref(), &self.ident, &work).await
    }

    pub async fn snapshots(&self) -> usize {
        self.table().await.metadata().snapshots().count()
    }

    pub async fn files(&self) -> Vec<String> {
        let table = self.table().await;
        let Some(snapshot) = table.metadata().current_snapshot() else {
            return Vec::new();
        };
        let list = table.manifest_list_reader(snapshot).load().await.unwrap();
        let mut paths = Vec::new();
        for manifest in list.entries() {
            let manifest = manifest.load_manifest(table.file_io()).await.unwrap();
            for entry in manifest.entries() {
                paths.push(entry.data_file().file_path().to_string());
            }
        }
        paths.sort();
        paths
    }
}
