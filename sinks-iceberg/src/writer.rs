//! The writer: records into Parquet data files of the table, closed at
//! every checkpoint.
//!
//! ```text
//! write_batch(rows) ─▶ Arrow record batch (serde → arrow-json's decoder, the table's field ids)
//!                   ─▶ iceberg-rust's data file writer: Parquet, rolled at the target size
//! prepare_commit(n) ─▶ the open file closed (fsynced with its directory on a local table)
//!                   ─▶ IcebergDataFile committables (the manifest entries, statistics included)
//! ```
//!
//! The files are written through the table's storage (the catalog's
//! `FileIO`): on a local table that storage writes on blocking threads and
//! syncs each file and its directory when the file closes (the `storage`
//! module), so a checkpoint never records a file that a power cut can
//! take. A Parquet file is finished by its footer and cannot be reopened:
//! every checkpoint closes the writer's files, and its state type
//! [`NoResume`] has no values. Files written but never committed (a crash
//! before their checkpoint completed) are in no snapshot: readers never see
//! them, and Iceberg's orphan-file removal deletes them.

use std::marker::PhantomData;

use arrow_json::reader::Decoder;
use async_trait::async_trait;
use iceberg::spec::DataFileFormat;
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter as _, IcebergWriterBuilder as _};
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, Counter, SinkError, SinkWriter};

use crate::committable::IcebergDataFile;
use crate::errors::iceberg_error;

/// The state of an [`IcebergSinkWriter`]: none. A Parquet file cannot be
/// resumed after a restart, so every checkpoint closes the writer's files
/// and hands them out as committables. This type has no values: a restored
/// writer is always given an empty list of states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoResume {}

/// Counters a writer adds to, registered in the job's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriterCounters {
    pub files: Counter,
    pub rows: Counter,
    pub bytes: Counter,
}

/// iceberg-rust's data file writer as the sink builds it.
type FileWriterBuilder =
    DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;
type FileWriter =
    DataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

/// Writes one subtask's records into Parquet data files of the table.
///
/// Made by [`IcebergSink::create_writer`](crate::IcebergSink), one per
/// subtask and start; driven by the runtime as [`SinkWriter`] describes.
pub struct IcebergSinkWriter<T> {
    /// The table as the start read it: the files' schema, partition spec
    /// and location.
    table: Table,
    rows: Decoder,
    builder: FileWriterBuilder,
    /// The files being written since the last checkpoint; `None` until a
    /// record arrives.
    open: Option<FileWriter>,
    app_id: String,
    counters: WriterCounters,
    _records: PhantomData<fn(T)>,
}

impl<T> IcebergSinkWriter<T> {
    /// A writer of `table`'s files, named `<prefix>-NNNNN.parquet` in the
    /// table's data directory (the prefix unique to this writer: see
    /// `IcebergSink::create_writer`), rolled once a file reaches
    /// `target_file_size` bytes.
    pub(crate) fn new(
        table: Table,
        rows: Decoder,
        properties: parquet::file::properties::WriterProperties,
        prefix: String,
        target_file_size: usize,
        app_id: String,
        counters: WriterCounters,
    ) -> Result<IcebergSinkWriter<T>, SinkError> {
        let metadata = table.metadata();
        let locations = DefaultLocationGenerator::new(metadata)
            .map_err(|e| iceberg_error("placing the data files", e))?;
        let names = DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet);
        let parquet = ParquetWriterBuilder::new(properties, metadata.current_schema().clone());
        let rolling = RollingFileWriterBuilder::new(
            parquet,
            target_file_size,
            table.file_io().clone(),
            locations,
            names,
        );
        Ok(IcebergSinkWriter {
            table,
            rows,
            builder: DataFileWriterBuilder::new(rolling),
            open: None,
            app_id,
            counters,
            _records: PhantomData,
        })
    }
}

#[async_trait]
impl<T> SinkWriter for IcebergSinkWriter<T>
where
    T: Serialize + Send + Sync + 'static,
{
    type Input = T;
    type Committable = IcebergDataFile;
    type State = NoResume;

    async fn write(&mut self, record: T) -> Result<(), SinkError> {
        self.write_batch(vec![record]).await
    }

    /// Encodes the batch into Arrow and writes it into the open file,
    /// opening one first if none is. A record the table's schema cannot
    /// hold is a permanent error that names the column.
    async fn write_batch(&mut self, records: Vec<T>) -> Result<(), SinkError> {
        if records.is_empty() {
            return Ok(());
        }
        let unfit = |e| SinkError::other("a record does not fit the table's schema", e).permanent();
        self.rows.serialize(&records).map_err(unfit)?;
        let Some(batch) = self.rows.flush().map_err(unfit)? else {
            return Ok(());
        };
        let writer = match &mut self.open {
            Some(writer) => writer,
            None => self.open.insert(
                self.builder
                    .build(None)
                    .await
                    .map_err(|e| iceberg_error("opening a data file", e))?,
            ),
        };
        writer
            .write(batch)
            .await
            .map_err(|e| iceberg_error("writing records into a Parquet data file", e))
    }

    /// Closes the open files (a Parquet file cannot be resumed), durable
    /// once closed, and hands them out.
    async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<IcebergDataFile>, SinkError> {
        let Some(mut writer) = self.open.take() else {
            return Ok(Vec::new());
        };
        let files = writer
            .close()
            .await
            .map_err(|e| iceberg_error("closing the Parquet data files", e))?;
        files
            .into_iter()
            .map(|file| {
                let file = IcebergDataFile::new(&self.app_id, file, &self.table)?;
                self.counters.files.add(1);
                self.counters.rows.add(file.rows);
                self.counters.bytes.add(file.size);
                Ok(file)
            })
            .collect()
    }

    /// Drops the open file unfinished: it is in no snapshot, invisible,
    /// until orphan-file removal deletes it.
    async fn close(&mut self) -> Result<(), SinkError> {
        self.open = None;
        Ok(())
    }
}
