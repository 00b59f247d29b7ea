//! The sink and its builder: the catalog, the table's name and schema, and
//! how large files grow.

use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::{DataType, FieldRef, Schema as ArrowSchema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use iceberg::arrow::arrow_schema_to_schema_auto_assign_ids;
use iceberg::spec::Schema;
use iceberg::table::Table;
use iceberg::TableIdent;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sink_api::{
    CommitSchedule, GlobalCommitterFactory, InitContext, JobStart, Sink, SinkError, SinkMetrics,
};
use sink_arrow::{Format, TraceFields};

use crate::catalog::{load_or_create, Connection, IcebergCatalog};
use crate::committable::IcebergDataFile;
use crate::committer::IcebergFileCommitter;
use crate::errors::iceberg_error;
use crate::global_committer::IcebergGlobalCommitter;
#[cfg(doc)]
use crate::partition::parse_partition_spec;
use crate::partition::PartitionBy;
use crate::writer::{IcebergSinkWriter, NoResume, Rows, WriterCounters};

/// Rows per Parquet row group: bounds the memory of an open file's
/// unencoded rows.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// The Apache Iceberg sink: records of type `T` (any `serde::Serialize`
/// type whose fields match the table's columns by name) into Parquet data
/// files, appended to an Iceberg table one snapshot per checkpoint.
///
/// Made with [`IcebergSink::builder`]; given to the job builder, which also
/// takes its global committer from it (`Sink::global_committer`), so a job
/// cannot run it without one.
///
/// ```text
/// writers ─▶ Parquet files ─▶ committables ─▶ committers (checked) ─▶ global committer ─▶ fast append
/// ```
pub struct IcebergSink<T> {
    connection: Connection,
    ident: TableIdent,
    schema: Schema,
    /// For a sink made by [`IcebergSink::builder_from_type`]: the record
    /// type's tracing and the timestamps declared, until `build`.
    from_type: Option<(TraceFields, Vec<(String, TimeUnit)>)>,
    /// The columns the records carry in another type than the table's (a
    /// time in milliseconds): decoded so, then cast.
    record_types: Vec<(String, DataType)>,
    /// The partition spec given, if any: the table is created with it, and
    /// an existing table must have it.
    partition: Option<Vec<PartitionBy>>,
    target_file_size: usize,
    /// When the global committer commits.
    schedule: CommitSchedule,
    counters: WriterCounters,
    _records: PhantomData<fn(T)>,
}

/// What Iceberg stores: times in microseconds (`timestamptz`), no unsigned
/// integers.
const ICEBERG: Format = Format {
    name: "Iceberg",
    timestamp_method: "IcebergSinkBuilder::timestamp",
    time_unit: Some(TimeUnit::Microsecond),
    unsigned: false,
};

/// Configures an [`IcebergSink`]. Made by [`IcebergSink::builder`].
pub struct IcebergSinkBuilder<T> {
    sink: IcebergSink<T>,
}

impl<T> IcebergSink<T> {
    /// A sink writing to the table `table` of `catalog` (an
    /// [`SqliteCatalog`](crate::SqliteCatalog) or a `RestCatalog`), whose
    /// columns are `schema`'s (the field ids are the table's own once it
    /// exists). The table, and its namespace, are created at the first
    /// start if missing, unpartitioned unless
    /// [`partition_by`](IcebergSinkBuilder::partition_by) says otherwise;
    /// an existing table must have exactly these columns, and is written
    /// with its own partition spec.
    pub fn builder(
        catalog: impl Into<IcebergCatalog>,
        table: TableIdent,
        schema: Schema,
    ) -> IcebergSinkBuilder<T> {
        IcebergSinkBuilder {
            sink: IcebergSink {
                connection: Connection::new(catalog.into()),
                ident: table,
                schema,
                from_type: None,
                record_types: Vec::new(),
                partition: None,
                target_file_size: 128 << 20,
                schedule: CommitSchedule::every_checkpoint(),
                counters: WriterCounters::default(),
                _records: PhantomData,
            },
        }
    }

    /// A sink writing to the table `table` of `catalog`, whose columns are
    /// the fields of the record type `T`, traced through its serde
    /// `Deserialize`: the struct is declared once. A field's Rust type
    /// gives its column's type, `Option` makes it optional. A field that
    /// has no column type of its own (a `chrono::DateTime`, an unsigned
    /// integer, a `serde_json::Value`) is refused by
    /// [`build`](IcebergSinkBuilder::build), naming it and the fix; a time
    /// is stored as an integer
    /// (`#[serde(with = "chrono::serde::ts_milliseconds")]`) and declared
    /// with [`timestamp`](IcebergSinkBuilder::timestamp). Partitions come
    /// from transforms of a column:
    /// `partition_by(parse_partition_spec("day(ts)")?)`. Otherwise as
    /// [`builder`](Self::builder).
    pub fn builder_from_type(
        catalog: impl Into<IcebergCatalog>,
        table: TableIdent,
    ) -> IcebergSinkBuilder<T>
    where
        T: DeserializeOwned,
    {
        // Replaced by the traced columns at `build`.
        let none = Schema::builder()
            .build()
            .expect("a schema with no field and no identifier is valid");
        let mut builder = IcebergSink::builder(catalog, table, none);
        builder.sink.from_type = Some((sink_arrow::fields_of::<T>, Vec::new()));
        builder
    }

    /// The table's name in its catalog.
    pub fn table(&self) -> &TableIdent {
        &self.ident
    }

    /// The table as the catalog has it now.
    async fn load(&self) -> Result<Table, SinkError> {
        let catalog = self.connection.catalog().await?;
        catalog
            .load_table(&self.ident)
            .await
            .map_err(|e| iceberg_error(format!("reading the Iceberg table {}", self.ident), e))
    }
}

impl<T> IcebergSinkBuilder<T> {
    /// With [`IcebergSink::builder_from_type`]: the record's field `field`,
    /// an integer count of `unit` since the epoch (such as a
    /// `chrono::DateTime` with
    /// `#[serde(with = "chrono::serde::ts_milliseconds")]`), is a
    /// `timestamptz` column. Iceberg keeps microseconds: the writers
    /// convert, and a time past their range is an error naming the column.
    /// Ignored with a schema given by hand.
    pub fn timestamp(mut self, field: impl Into<String>, unit: TimeUnit) -> Self {
        if let Some((_, timestamps)) = &mut self.sink.from_type {
            timestamps.push((field.into(), unit));
        }
        self
    }

    /// Partitions the table by `fields` (see [`parse_partition_spec`] for
    /// their text form): the sink creates a missing table with this spec,
    /// and refuses an existing table whose spec is another. Each writer
    /// writes a data file per partition its rows fall in, per checkpoint.
    /// Without it the sink writes a table with the spec it has, or creates
    /// an unpartitioned one.
    ///
    /// A spec changed on the table while the job runs is used from the
    /// next checkpoint's files on (each writer reads the table again when
    /// it opens its first file after a checkpoint); files written under
    /// the spec before are appended as they are, as Iceberg allows.
    pub fn partition_by(mut self, fields: Vec<PartitionBy>) -> Self {
        self.sink.partition = Some(fields);
        self
    }

    /// A writer's open Parquet file is closed at every checkpoint (a
    /// Parquet file cannot be resumed), and earlier once it holds more than
    /// `bytes` (encoded and buffered), checked before each batch of records
    /// the runtime hands the writer. Default 128 MiB; a writer holds up to
    /// a row group of unencoded rows in memory.
    pub fn roll_files_at_checkpoints_and_at_size(mut self, bytes: usize) -> Self {
        self.sink.target_file_size = bytes;
        self
    }

    /// Commits once per `checkpoints` completed checkpoints, their files in
    /// one snapshot (the table's marks record the newest), instead of a
    /// snapshot per checkpoint: at 1 s checkpoints, `commit_every(60)`
    /// makes a snapshot a minute. Writers still close their files at every
    /// checkpoint; the files wait, in the job's checkpoints, for the
    /// commit. Records become visible, and a pipeline's tickets resolve, at
    /// that commit. Everything is committed at end of input. Default 1.
    pub fn commit_every(mut self, checkpoints: NonZeroU32) -> Self {
        self.sink.schedule = self.sink.schedule.with_checkpoints(checkpoints);
        self
    }

    /// Commits no sooner than `interval` after the previous commit (the
    /// first counted from the start), at the first checkpoint completed
    /// after it; with [`commit_every`](Self::commit_every), once both
    /// hold. Default: no least interval.
    pub fn commit_at_most_every(mut self, interval: Duration) -> Self {
        self.sink.schedule = self.sink.schedule.with_at_most_every(interval);
        self
    }

    /// Checks the configuration and returns the sink.
    ///
    /// # Errors
    /// A permanent error naming the problem: a schema with no column, a
    /// target size of zero, a partition field whose column is missing or
    /// does not take its transform.
    pub fn build(self) -> Result<IcebergSink<T>, SinkError> {
        let mut sink = self.sink;
        if let Some((trace, timestamps)) = sink.from_type.take() {
            let fields = trace(&timestamps, ICEBERG)?;
            sink.schema = arrow_schema_to_schema_auto_assign_ids(&ArrowSchema::new(fields))
                .map_err(|e| {
                    iceberg_error(
                        format!(
                            "making an Iceberg schema of the record type {}",
                            std::any::type_name::<T>()
                        ),
                        e,
                    )
                    .permanent()
                })?;
            sink.record_types = sink_arrow::record_types(&timestamps, ICEBERG);
        }
        if sink.schema.as_struct().fields().is_empty() {
            return Err(SinkError::msg("the table's schema has no column").permanent());
        }
        if sink.target_file_size == 0 {
            return Err(SinkError::msg("the file size to roll at must be above zero").permanent());
        }
        crate::catalog::check_table_name(&sink.ident)?;
        if let Some(fields) = &sink.partition {
            crate::partition::bind(&sink.schema, fields)?;
        }
        Ok(sink)
    }
}

#[async_trait]
impl<T> Sink for IcebergSink<T>
where
    T: Serialize + Send + Sync + 'static,
{
    type Writer = IcebergSinkWriter<T>;
    type Committer = IcebergFileCommitter;

    /// Creates the table if there is none (refusing a location that holds
    /// another catalog's table) or checks that the one there has the
    /// sink's columns (and its partition spec, if given), then claims it for this
    /// start: a table holding a checkpoint of this job lineage beyond the
    /// restored one is refused (the job's new checkpoints would be taken
    /// for replays and dropped), and older starts of the job commit nothing
    /// after this.
    async fn on_start(
        &self,
        start: &JobStart<'_, IcebergDataFile, NoResume>,
    ) -> Result<(), SinkError> {
        let catalog = self.connection.catalog().await?;
        let exists = catalog
            .table_exists(&self.ident)
            .await
            .map_err(|e| iceberg_error(format!("reading the Iceberg table {}", self.ident), e))?;
        if let (false, Some(IcebergCatalog::Sqlite(config))) = (exists, self.connection.config()) {
            if let Some(found) = config.table_with_rows_at(&self.ident).await? {
                return Err(SinkError::msg(format!(
                    "the catalog {} has no table {}, but its location holds the metadata of \
                     one with snapshots ({found}): this is not the catalog database the table \
                     was made in \
                     (another host's, or an older copy). Run the job with that catalog, or \
                     register the table in this one (PyIceberg's `register_table`); a new table \
                     there would hide its rows",
                    config.database().display(),
                    self.ident
                ))
                .permanent());
            }
        }
        let spec = match &self.partition {
            Some(fields) => Some(crate::partition::bind(&self.schema, fields)?),
            None => None,
        };
        let table =
            load_or_create(catalog.as_ref(), &self.ident, &self.schema, spec.as_ref()).await?;
        crate::partition::check_spec(
            &self.ident,
            table.metadata().default_partition_spec(),
            table.metadata().current_schema(),
            self.partition.as_deref(),
        )?;
        let mut committer = IcebergGlobalCommitter::for_start(
            self.connection.clone(),
            self.ident.clone(),
            format!("{}/{}", start.job_name, start.lineage),
            start.generation.0,
            start.restored_checkpoint_id.map(|id| id.0),
        );
        committer.claim().await
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        _restored: Vec<NoResume>,
    ) -> Result<IcebergSinkWriter<T>, SinkError> {
        register(&context.metrics, &self.counters);
        let table = self.load().await?;
        let arrow = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
            .map_err(|e| iceberg_error("mapping the table's schema to Arrow", e))?;
        let (decoded, conform_to) = match self.record_types.is_empty() {
            true => (Arc::new(arrow), None),
            false => {
                let table = Arc::new(arrow);
                (with_types(&table, &self.record_types), Some(table))
            }
        };
        // Strict: a field the table has no column for is an error, not
        // silently dropped.
        let decoder = arrow_json::ReaderBuilder::new(decoded)
            .with_strict_mode(true)
            .build_decoder()
            .map_err(|e| SinkError::other("preparing the record encoder", e).permanent())?;
        let rows = Rows {
            decoder,
            conform_to,
        };
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        // Unique to this subtask of this start of this life of the job: no
        // other writer, and no later start, writes a file of the same name.
        let prefix = format!(
            "{}-g{}-s{}",
            context.lineage, context.generation, context.subtask_index
        );
        IcebergSinkWriter::new(
            self.connection.clone(),
            table,
            rows,
            properties,
            prefix,
            self.target_file_size,
            app_id(context),
            self.counters.clone(),
        )
    }

    async fn create_committer(&self, _: &InitContext) -> Result<IcebergFileCommitter, SinkError> {
        let table = self.load().await?;
        Ok(IcebergFileCommitter::new(
            self.connection.catalog().await?,
            self.ident.clone(),
            table.file_io().clone(),
        ))
    }

    /// The Iceberg global committer: one fast append per checkpoint, or per
    /// several on the sink's commit schedule.
    fn global_committer(&self) -> Option<GlobalCommitterFactory<IcebergDataFile>> {
        let (connection, ident, schedule) =
            (self.connection.clone(), self.ident.clone(), self.schedule);
        Some(Box::new(move |context: &InitContext| {
            Box::new(
                IcebergGlobalCommitter::new(connection.clone(), ident.clone(), context)
                    .on_schedule(schedule),
            )
        }))
    }
}

/// `table` with the columns named in `types` of those types (their
/// metadata, the field ids, kept; a time in the table's own zone,
/// `+00:00`, which arrow-json reads without a zone database).
fn with_types(table: &SchemaRef, types: &[(String, DataType)]) -> SchemaRef {
    let fields: Vec<FieldRef> = (table.fields().iter())
        .map(
            |field| match types.iter().find(|(name, _)| name == field.name()) {
                Some((_, data_type)) => {
                    let data_type = match (data_type, field.data_type()) {
                        (DataType::Timestamp(unit, _), DataType::Timestamp(_, zone)) => {
                            DataType::Timestamp(*unit, zone.clone())
                        }
                        _ => data_type.clone(),
                    };
                    Arc::new(field.as_ref().clone().with_data_type(data_type))
                }
                None => field.clone(),
            },
        )
        .collect();
    Arc::new(ArrowSchema::new_with_metadata(
        fields,
        table.metadata().clone(),
    ))
}

/// The job identity the table's marks are kept under: its name and
/// lineage, which no other job, and no run on fresh checkpoint storage,
/// shares.
fn app_id(context: &InitContext) -> String {
    format!("{}/{}", context.job_name, context.lineage)
}

fn register(metrics: &SinkMetrics, counters: &WriterCounters) {
    metrics.register_all([
        (
            "iceberg_sink_files_written",
            "Parquet data files written",
            &counters.files,
        ),
        (
            "iceberg_sink_rows_written",
            "rows written into data files",
            &counters.rows,
        ),
        (
            "iceberg_sink_bytes_written",
            "bytes of data files written",
            &counters.bytes,
        ),
    ]);
}
