//! The committable: one finished Parquet data file, carried in checkpoints
//! as the table's manifests will describe it.
//!
//! iceberg-rust's `DataFile` has no serde form, and rebuilding one from a
//! few fields would drop the column statistics readers prune with. So the
//! committable carries the file's entry encoded as Iceberg itself encodes
//! it in a manifest (Avro, the `data_file` struct of the table's format
//! version, statistics included), and decodes it against the table each
//! append is built on, only when the table's marks do not show the
//! checkpoint committed already (a replay needs no decoding). A partition
//! spec that is gone fails the commit naming the file; a schema changed
//! since the file was written decodes with the table's current types.

use iceberg::spec::{read_data_files_from_avro, write_data_files_to_avro, DataFile, FormatVersion};
use iceberg::table::Table;
use serde::{Deserialize, Serialize};
use sink_api::SinkError;

use crate::errors::iceberg_error;

/// One data file a writer finished: written in full under the table's
/// location, in no snapshot yet, so invisible to readers.
///
/// Made by the writer's `prepare_commit`; stored in checkpoints until
/// committed; made durable by the per-subtask committer; appended to the
/// table by the global committer, in one snapshot with every other file of
/// its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IcebergDataFile {
    /// The job's name and lineage (`<job>/<lineage>`), which the table's
    /// marks are kept under.
    pub app_id: String,
    /// The file's location, as the table's manifests name it.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The rows it holds.
    pub rows: u64,
    /// The table's format version the entry is encoded for.
    pub format_version: u8,
    /// The partition spec the file was written under.
    pub partition_spec_id: i32,
    /// The file's manifest entry, Avro-encoded (see the module
    /// documentation).
    #[serde(with = "serde_bytes")]
    pub entry: Vec<u8>,
}

impl IcebergDataFile {
    /// Describes `file`, written for `table` under its default partition
    /// spec (the table as the writer read it when it opened the file),
    /// under `app_id`.
    pub(crate) fn new(
        app_id: &str,
        file: DataFile,
        table: &Table,
    ) -> Result<IcebergDataFile, SinkError> {
        let metadata = table.metadata();
        let partition_spec_id = metadata.default_partition_spec_id();
        let encoding = || format!("describing the data file {}", file.file_path());
        let spec = metadata
            .partition_spec_by_id(partition_spec_id)
            .ok_or_else(|| {
                SinkError::msg(format!(
                    "{}: the table has no partition spec {partition_spec_id}",
                    encoding()
                ))
                .permanent()
            })?;
        let partition_type = spec
            .partition_type(metadata.current_schema())
            .map_err(|e| iceberg_error(encoding(), e))?;
        let format_version = metadata.format_version();
        let (path, size, rows) = (
            file.file_path().to_string(),
            file.file_size_in_bytes(),
            file.record_count(),
        );
        let mut entry = Vec::new();
        write_data_files_to_avro(&mut entry, [file], &partition_type, format_version)
            .map_err(|e| iceberg_error(format!("describing the data file {path}"), e))?;
        Ok(IcebergDataFile {
            app_id: app_id.to_string(),
            path,
            size,
            rows,
            format_version: format_version as u8,
            partition_spec_id,
            entry,
        })
    }

    /// The file as `table` (the table being committed to) reads it.
    pub(crate) fn data_file(&self, table: &Table) -> Result<DataFile, SinkError> {
        let metadata = table.metadata();
        let refused = |why: String| {
            SinkError::msg(format!(
                "the data file {} cannot be added to the table: {why}; the table was changed \
                 while the job ran",
                self.path
            ))
            .permanent()
        };
        let format_version = match self.format_version {
            1 => FormatVersion::V1,
            2 => FormatVersion::V2,
            3 => FormatVersion::V3,
            other => return Err(refused(format!("its format version {other} is unknown"))),
        };
        let spec = metadata
            .partition_spec_by_id(self.partition_spec_id)
            .ok_or_else(|| {
                refused(format!(
                    "its partition spec {} is gone",
                    self.partition_spec_id
                ))
            })?;
        let schema = metadata.current_schema();
        let decoding = || format!("reading the description of the data file {}", self.path);
        let partition_type = spec
            .partition_type(schema)
            .map_err(|e| iceberg_error(decoding(), e))?;
        let mut files = read_data_files_from_avro(
            &mut self.entry.as_slice(),
            schema,
            self.partition_spec_id,
            &partition_type,
            format_version,
        )
        .map_err(|e| iceberg_error(decoding(), e).permanent())?;
        match (files.pop(), files.is_empty()) {
            (Some(file), true) if file.file_path() == self.path => Ok(file),
            _ => Err(SinkError::msg(format!(
                "the description of the data file {} does not hold that one file (the \
                 checkpoint is damaged)",
                self.path
            ))
            .permanent()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use iceberg::spec::{DataContentType, DataFileBuilder, DataFileFormat, Datum, Struct};

    use super::*;
    use crate::test_table::fixture;

    #[tokio::test]
    async fn a_data_file_round_trips_through_its_manifest_entry_statistics_included() {
        let fx = fixture().await;
        let table = fx.table().await;
        let file = DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(format!("{}/data/a.parquet", table.metadata().location()))
            .file_format(DataFileFormat::Parquet)
            .record_count(3)
            .file_size_in_bytes(1234)
            .partition(Struct::empty())
            .partition_spec_id(0)
            .column_sizes(HashMap::from([(1, 24), (2, 40)]))
            .value_counts(HashMap::from([(1, 3), (2, 3)]))
            .null_value_counts(HashMap::from([(1, 0), (2, 1)]))
            .lower_bounds(HashMap::from([(1, Datum::long(7))]))
            .upper_bounds(HashMap::from([(1, Datum::long(9))]))
            .build()
            .unwrap();
        let carried = IcebergDataFile::new("job/lineage", file.clone(), &table).unwrap();
        assert_eq!((carried.size, carried.rows), (1234, 3));
        let stored: IcebergDataFile =
            serde_json::from_str(&serde_json::to_string(&carried).unwrap()).unwrap();
        assert_eq!(stored.data_file(&table).unwrap(), file);
        // A damaged description is refused, naming the file.
        let damaged = IcebergDataFile {
            entry: stored.entry[..stored.entry.len() / 2].to_vec(),
            ..stored
        };
        let error = damaged.data_file(&table).unwrap_err();
        assert!(error.is_permanent());
        assert!(error.to_string().contains("/data/a.parquet"), "{error}");
    }

    /// A committable as format version 1 stores it (the runtime's bincode
    /// serializer, version 1): checkpoints taken now must read for good.
    const GOLDEN_V1: &[u8] = &[
        // blob header: magic and version 1
        b'E', b'O', 1, 0, 0, 0, //
        // app_id "j/L"
        3, b'j', b'/', b'L', //
        // path "a.parquet"
        9, b'a', b'.', b'p', b'a', b'r', b'q', b'u', b'e', b't', //
        // size 9, rows 2, format_version 2, partition_spec_id 0 (zigzag)
        9, 2, 2, 0, //
        // entry: 3 bytes
        3, 1, 2, 3,
    ];

    #[test]
    fn a_version_1_committable_reads_for_good() {
        use sink_api::{deserialize_versioned, serialize_versioned, Sink as _};

        use crate::{IcebergSink, SqliteCatalog};

        let committable = IcebergDataFile {
            app_id: "j/L".into(),
            path: "a.parquet".into(),
            size: 9,
            rows: 2,
            format_version: 2,
            partition_spec_id: 0,
            entry: vec![1, 2, 3],
        };
        // The sink's own serializer (the catalog is opened at the first
        // start, so none is needed here).
        let catalog =
            SqliteCatalog::new("/nowhere/catalog.db".as_ref(), "/nowhere".as_ref()).unwrap();
        let ident = iceberg::TableIdent::from_strs(["db", "t"]).unwrap();
        let sink = IcebergSink::<u8>::builder(catalog, ident, crate::test_table::schema())
            .build()
            .unwrap();
        let format = sink.committable_serializer();
        assert_eq!(
            serialize_versioned(format.as_ref(), &committable).unwrap(),
            GOLDEN_V1
        );
        assert_eq!(
            deserialize_versioned(format.as_ref(), GOLDEN_V1).unwrap(),
            committable
        );
    }
}
