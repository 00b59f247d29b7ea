//! The writer: records into Parquet data files of the table, closed at
//! every checkpoint.
//!
//! ```text
//! write_batch(rows) ─▶ Arrow record batch (serde → arrow-json's decoder, the table's field ids)
//!                   ─▶ (partitioned table) split by partition value, one file writer per partition
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
//!
//! The first file after a checkpoint is opened on the table read again, so
//! that a partition spec changed while the job runs is written from the
//! next checkpoint's files on.

use std::marker::PhantomData;

use arrow_array::RecordBatch;
use arrow_json::reader::Decoder;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::PartitioningWriter as _;
use iceberg::writer::{IcebergWriter as _, IcebergWriterBuilder as _};
use iceberg::TableIdent;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, Counter, SinkError, SinkWriter};

use crate::catalog::Connection;
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

/// The data files being written for one table: since the last checkpoint
/// (the writer's), or of one file rewritten under the table's current spec
/// (the `rewrite` module's).
// One value per writer: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum OpenFiles {
    /// An unpartitioned table's: one file at a time, rolled at the size.
    One(FileWriter),
    /// A partitioned table's: a file per partition value met.
    Partitioned {
        splitter: RecordBatchPartitionSplitter,
        files: FanoutWriter<FileWriterBuilder>,
    },
}

impl OpenFiles {
    /// Files of `table`, under its default partition spec, named by `names`
    /// and rolled at `target_file_size` bytes.
    pub(crate) async fn open(
        table: &Table,
        properties: &WriterProperties,
        names: &DefaultFileNameGenerator,
        target_file_size: usize,
    ) -> Result<OpenFiles, SinkError> {
        let metadata = table.metadata();
        let locations = DefaultLocationGenerator::new(metadata)
            .map_err(|e| iceberg_error("placing the data files", e))?;
        let parquet =
            ParquetWriterBuilder::new(properties.clone(), metadata.current_schema().clone());
        let rolling = RollingFileWriterBuilder::new(
            parquet,
            target_file_size,
            table.file_io().clone(),
            locations,
            names.clone(),
        );
        let builder = DataFileWriterBuilder::new(rolling);
        let spec = metadata.default_partition_spec();
        if spec.is_unpartitioned() {
            let file = builder
                .build(None)
                .await
                .map_err(|e| iceberg_error("opening a data file", e))?;
            return Ok(OpenFiles::One(file));
        }
        let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
            metadata.current_schema().clone(),
            spec.clone(),
        )
        .map_err(|e| {
            iceberg_error(
                format!("partitioning rows by the spec of {}", table.identifier()),
                e,
            )
            .permanent()
        })?;
        Ok(OpenFiles::Partitioned {
            splitter,
            files: FanoutWriter::new(builder),
        })
    }

    /// Writes `batch`, split by partition value on a partitioned table.
    pub(crate) async fn write(&mut self, batch: RecordBatch) -> Result<(), SinkError> {
        let writing = |e| iceberg_error("writing records into a Parquet data file", e);
        match self {
            OpenFiles::One(file) => file.write(batch).await.map_err(writing),
            OpenFiles::Partitioned { splitter, files } => {
                let parts = splitter.split(&batch).map_err(|e| {
                    iceberg_error("computing the rows' partition values", e).permanent()
                })?;
                for (key, rows) in parts {
                    files.write(key, rows).await.map_err(writing)?;
                }
                Ok(())
            }
        }
    }

    /// Closes every file, durable once closed, and describes them.
    pub(crate) async fn close(self) -> Result<Vec<DataFile>, SinkError> {
        let closing = |e| iceberg_error("closing the Parquet data files", e);
        match self {
            OpenFiles::One(mut file) => file.close().await.map_err(closing),
            OpenFiles::Partitioned { files, .. } => files.close().await.map_err(closing),
        }
    }
}

/// Writes one subtask's records into Parquet data files of the table.
///
/// Made by [`IcebergSink::create_writer`](crate::IcebergSink), one per
/// subtask and start; driven by the runtime as [`SinkWriter`] describes.
pub struct IcebergSinkWriter<T> {
    connection: Connection,
    /// The table as last read (at start, then after each checkpoint): the
    /// files' partition spec and location.
    table: Table,
    /// Whether to read the table again before the next file is opened.
    stale: bool,
    rows: Rows,
    properties: WriterProperties,
    /// Names every file of this writer: one counter, whatever the spec.
    names: DefaultFileNameGenerator,
    target_file_size: usize,
    open: Option<OpenFiles>,
    app_id: String,
    counters: WriterCounters,
    _records: PhantomData<fn(T)>,
}

/// Records into Arrow batches of the table's schema: serialized into
/// arrow-json's decoder, then cast where the records carry a column in
/// another type than the table's (a time in milliseconds). Made by
/// `IcebergSink::create_writer`.
pub(crate) struct Rows {
    /// The decoder, of the table's schema with the records' own types.
    pub decoder: Decoder,
    /// The table's schema, when the decoder's differs from it.
    pub conform_to: Option<SchemaRef>,
}

impl Rows {
    /// `records` as one batch of the table's schema, if there are any.
    fn batch<T: Serialize>(&mut self, records: &[T]) -> Result<Option<RecordBatch>, SinkError> {
        let unfit = |e| SinkError::other("a record does not fit the table's schema", e).permanent();
        self.decoder.serialize(records).map_err(unfit)?;
        let Some(batch) = self.decoder.flush().map_err(unfit)? else {
            return Ok(None);
        };
        match &self.conform_to {
            Some(table) => sink_arrow::conform(batch, table).map(Some),
            None => Ok(Some(batch)),
        }
    }
}

impl<T> IcebergSinkWriter<T> {
    /// A writer of `table`'s files, named `<prefix>-NNNNN.parquet` in the
    /// table's data directory (under each file's partition path; the prefix
    /// unique to this writer: see `IcebergSink::create_writer`), rolled
    /// once a file reaches `target_file_size` bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        connection: Connection,
        table: Table,
        rows: Rows,
        properties: WriterProperties,
        prefix: String,
        target_file_size: usize,
        app_id: String,
        counters: WriterCounters,
    ) -> Result<IcebergSinkWriter<T>, SinkError> {
        Ok(IcebergSinkWriter {
            connection,
            table,
            stale: false,
            rows,
            properties,
            names: DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet),
            target_file_size,
            open: None,
            app_id,
            counters,
            _records: PhantomData,
        })
    }

    fn ident(&self) -> &TableIdent {
        self.table.identifier()
    }

    /// Opens the files of the next checkpoint, on the table read again if
    /// a checkpoint passed since it was read.
    async fn open_files(&mut self) -> Result<OpenFiles, SinkError> {
        if self.stale {
            let catalog = self.connection.catalog().await?;
            self.table = catalog.load_table(self.ident()).await.map_err(|e| {
                iceberg_error(format!("reading the Iceberg table {}", self.ident()), e)
            })?;
            self.stale = false;
        }
        OpenFiles::open(
            &self.table,
            &self.properties,
            &self.names,
            self.target_file_size,
        )
        .await
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

    /// Encodes the batch into Arrow and writes it into the open files
    /// (split by partition value on a partitioned table), opening them
    /// first if none are. A record the table's schema cannot hold is a
    /// permanent error that names the column.
    async fn write_batch(&mut self, records: Vec<T>) -> Result<(), SinkError> {
        if records.is_empty() {
            return Ok(());
        }
        let Some(batch) = self.rows.batch(&records)? else {
            return Ok(());
        };
        let open = match self.open.take() {
            Some(open) => open,
            None => self.open_files().await?,
        };
        self.open.insert(open).write(batch).await
    }

    /// Closes the open files (a Parquet file cannot be resumed), durable
    /// once closed, and hands them out.
    async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<IcebergDataFile>, SinkError> {
        let Some(open) = self.open.take() else {
            return Ok(Vec::new());
        };
        self.stale = true;
        open.close()
            .await?
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

    /// Drops the open files unfinished: they are in no snapshot, invisible,
    /// until orphan-file removal deletes them.
    async fn close(&mut self) -> Result<(), SinkError> {
        self.open = None;
        Ok(())
    }
}
