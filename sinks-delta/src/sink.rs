//! The sink and its builder: where the table is, its schema and partition
//! columns, how large files grow, and whether small files are compacted.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use arrow_schema::{Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use deltalake_core::parquet::basic::Compression;
use deltalake_core::parquet::file::properties::WriterProperties;
use deltalake_core::writer::RecordBatchWriter;
use deltalake_core::DeltaTable;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sink_api::{
    CommittedPositions, GlobalCommitterFactory, InitContext, JobStart, Sink, SinkError,
    SinkMetrics, VersionedSerializer,
};
use sink_arrow::{Format, TraceFields};

use crate::committable::DeltaCommittable;
use crate::committer::DeltaFileCommitter;
use crate::compaction::Compaction;
use crate::derived::{Derivation, Derived, DerivedColumn};
use crate::errors::delta_error;
use crate::format::CommittableFormat;
use crate::global_committer::DeltaGlobalCommitter;
use crate::location::TableLocation;
use crate::positions;
use crate::writer::{DeltaSinkWriter, NoResume, RowShape, WriterCounters};

/// Rows per Parquet row group: bounds the memory of an open file's
/// unencoded rows.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// The Delta Lake sink: records of type `T` (any `serde::Serialize` type
/// whose fields match the table's columns by name) into Parquet files,
/// committed to a Delta table one transaction per checkpoint.
///
/// Made with [`DeltaSink::builder`]; given to the job builder, which also
/// takes its global committer from it (`Sink::global_committer`), so a job
/// cannot run it without one.
///
/// ```text
/// writers ─▶ Parquet files ─▶ committables ─▶ committers (durable) ─▶ global committer ─▶ Delta log
/// ```
pub struct DeltaSink<T> {
    location: TableLocation,
    schema: SchemaRef,
    partition_by: Vec<String>,
    /// Columns computed from others (in `schema` and `partition_by` once
    /// built); `None` without any.
    derived: Option<Arc<Derived>>,
    /// The derived columns asked for, made part of the schema by `build`.
    deriving: Vec<DerivedColumn>,
    /// With [`DeltaSink::builder_from_type`]: how `build` traces the
    /// schema from the record type, and the fields it makes timestamps.
    from_type: Option<(TraceFields, Vec<(String, TimeUnit)>)>,
    target_file_size: usize,
    compaction: Option<Compaction>,
    counters: WriterCounters,
    start_table: StartTable,
    _records: PhantomData<fn(T)>,
}

/// The table as this sink's newest start read it, lent to the writers and
/// the global committer made after that start, each of which would
/// otherwise load the whole log again (on object storage, a GET per log
/// entry). `on_start` sets it from a full load, so every start reads the
/// table afresh; the global committer brings its copy up to date before
/// each transaction.
#[derive(Clone, Default)]
struct StartTable(Arc<Mutex<Option<DeltaTable>>>);

impl StartTable {
    fn set(&self, table: Option<DeltaTable>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = table;
    }

    fn get(&self) -> Option<DeltaTable> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What Delta stores: times in microseconds, no unsigned integers.
const DELTA: Format = Format {
    name: "Delta",
    timestamp_method: "DeltaSinkBuilder::timestamp",
    time_unit: Some(TimeUnit::Microsecond),
    unsigned: false,
};

/// Configures a [`DeltaSink`]. Made by [`DeltaSink::builder`].
pub struct DeltaSinkBuilder<T> {
    sink: DeltaSink<T>,
}

impl<T> DeltaSink<T> {
    /// A sink writing to the table at `location`, whose columns are
    /// `schema`'s. The table is created at the first start if it does not
    /// exist; an existing one must have exactly these columns.
    pub fn builder(location: TableLocation, schema: Schema) -> DeltaSinkBuilder<T> {
        DeltaSinkBuilder {
            sink: DeltaSink {
                location,
                schema: Arc::new(schema),
                partition_by: Vec::new(),
                derived: None,
                deriving: Vec::new(),
                from_type: None,
                target_file_size: 128 << 20,
                compaction: None,
                counters: WriterCounters::default(),
                start_table: StartTable::default(),
                _records: PhantomData,
            },
        }
    }

    /// A sink writing to the table at `location`, whose columns are the
    /// fields of the record type `T`, traced through its serde
    /// `Deserialize`: the struct is declared once. A field that has no
    /// column type of its own (a `chrono::DateTime`, an unsigned integer,
    /// a `serde_json::Value`) is refused by [`build`](DeltaSinkBuilder::build),
    /// naming it and the fix; a time is stored as an integer
    /// (`#[serde(with = "chrono::serde::ts_milliseconds")]`) and declared
    /// with [`timestamp`](DeltaSinkBuilder::timestamp). Otherwise as
    /// [`builder`](Self::builder).
    pub fn builder_from_type(location: TableLocation) -> DeltaSinkBuilder<T>
    where
        T: DeserializeOwned,
    {
        let mut builder = DeltaSink::builder(location, Schema::empty());
        builder.sink.from_type = Some((sink_arrow::fields_of::<T>, Vec::new()));
        builder
    }

    /// Where the table is.
    pub fn location(&self) -> &TableLocation {
        &self.location
    }
}

impl<T> DeltaSinkBuilder<T> {
    /// Partitions the table by these columns (Hive-style directories,
    /// `day=2026-12-01/`). Their values come from each record.
    pub fn partition_by<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sink.partition_by = columns.into_iter().map(Into::into).collect();
        self
    }

    /// With [`DeltaSink::builder_from_type`]: the record's field `field`
    /// (an integer, such as a `chrono::DateTime` with
    /// `#[serde(with = "chrono::serde::ts_milliseconds")]`) is a timestamp
    /// column of `unit`, in UTC. Ignored with a schema given by hand.
    pub fn timestamp(mut self, field: impl Into<String>, unit: TimeUnit) -> Self {
        if let Some((_, timestamps)) = &mut self.sink.from_type {
            timestamps.push((field.into(), unit));
        }
        self
    }

    /// Partitions the table by `column`, the day of the timestamp (or
    /// date) column `of`, which the records carry: `partition_by_day("day",
    /// "ts")` files each row under `day=2026-12-01/`. The records need no
    /// field for it: each writer computes it from `of` (the UTC date, for
    /// a timestamp with a time zone). `column` is a `date` column of the
    /// table, added to the schema by [`build`](Self::build), after the
    /// partition columns [`partition_by`](Self::partition_by) names.
    pub fn partition_by_day(mut self, column: impl Into<String>, of: impl Into<String>) -> Self {
        self.sink.deriving.push(DerivedColumn {
            name: column.into(),
            source: of.into(),
            derivation: Derivation::Day,
        });
        self
    }

    /// A writer's open Parquet files are closed at every checkpoint (a
    /// Parquet file cannot be resumed), and earlier once their encoded
    /// sizes, summed over the writer's open files (one per partition it
    /// writes to), reach `bytes`. Default 128 MiB. A writer holds about
    /// this much in memory.
    pub fn roll_files_at_checkpoints_and_at_size(mut self, bytes: usize) -> Self {
        self.sink.target_file_size = bytes;
        self
    }

    /// Merges small files after the checkpoints that add to them (see
    /// [`Compaction`]). Off by default.
    pub fn compaction(mut self, compaction: Compaction) -> Self {
        self.sink.compaction = Some(compaction);
        self
    }

    /// Checks the configuration and returns the sink.
    ///
    /// # Errors
    /// A permanent error naming the problem: a partition column missing
    /// from the schema, every column a partition column, a target size of
    /// zero, or compaction limits of zero.
    pub fn build(self) -> Result<DeltaSink<T>, SinkError> {
        let mut sink = self.sink;
        let invalid = |what: String| SinkError::msg(what).permanent();
        // Times the records carry in another unit than Delta's microseconds.
        let mut record_types = Vec::new();
        if let Some((trace, timestamps)) = sink.from_type.take() {
            sink.schema = Arc::new(Schema::new(trace(&timestamps, DELTA)?));
            record_types = sink_arrow::record_types(&timestamps, DELTA);
        }
        if !sink.deriving.is_empty() || !record_types.is_empty() {
            let mut fields: Vec<_> = sink.schema.fields().iter().cloned().collect();
            for derived in &sink.deriving {
                if sink.schema.field_with_name(&derived.name).is_ok() {
                    return Err(invalid(format!(
                        "the derived partition column {} is a column of the schema already: \
                         name it otherwise, or partition by the column itself (partition_by)",
                        derived.name
                    )));
                }
                let source = sink.schema.field_with_name(&derived.source).map_err(|_| {
                    invalid(format!(
                        "the partition column {} is derived from {}, which is not in the schema",
                        derived.name, derived.source
                    ))
                })?;
                fields.push(Arc::new(derived.field(source).map_err(invalid)?));
                sink.partition_by.push(derived.name.clone());
            }
            sink.schema = Arc::new(Schema::new(fields));
            let deriving = std::mem::take(&mut sink.deriving);
            sink.derived = Some(Arc::new(Derived::new(
                deriving,
                sink.schema.clone(),
                &record_types,
            )));
        }
        for column in &sink.partition_by {
            if sink.schema.field_with_name(column).is_err() {
                return Err(invalid(format!(
                    "the partition column {column} is not in the schema"
                )));
            }
        }
        if sink.partition_by.len() >= sink.schema.fields().len() {
            return Err(invalid(
                "every column is a partition column: the data files would hold no column".into(),
            ));
        }
        if sink.target_file_size == 0 {
            return Err(invalid(
                "the file size to roll at must be above zero".into(),
            ));
        }
        if let Some(c) = &sink.compaction {
            if c.min_files < 2 || c.small_file_size == 0 || c.small_file_size > c.target_size {
                return Err(invalid(format!(
                    "compaction needs at least 2 files, and a small-file size above zero and at \
                     most the target size, got {c:?}"
                )));
            }
        }
        Ok(sink)
    }
}

#[async_trait]
impl<T> Sink for DeltaSink<T>
where
    T: Serialize + Send + Sync + 'static,
{
    type Writer = DeltaSinkWriter<T>;
    type Committer = DeltaFileCommitter;

    /// Checks that the store refuses a second create of an object (Delta's
    /// log needs it), creates the table if there is none or checks that the
    /// one there has the sink's columns and partition columns, and checks
    /// that the table holds no checkpoint of this job beyond the restored
    /// one: the job's ids would repeat, and its new checkpoints be taken for
    /// replays and dropped.
    async fn on_start(
        &self,
        start: &JobStart<'_, DeltaCommittable, NoResume>,
    ) -> Result<(), SinkError> {
        self.location.check_conditional_create().await?;
        let table = self
            .location
            .open_or_create(&self.schema, &self.partition_by)
            .await?;
        let app_id = format!("{}/{}", start.job_name, start.lineage);
        let url = self.location.url();
        let committed = table
            .snapshot()
            .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?
            .transaction_version(table.log_store().as_ref(), &app_id)
            .await
            .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?;
        let restored = start.restored_checkpoint_id.map(|c| c.0);
        match (committed, restored) {
            (Some(done), restored) if restored.is_none_or(|r| done > 0 && done as u64 > r) => {
                Err(SinkError::msg(format!(
                    "the Delta table {url} holds checkpoint {done} of the job {app_id}, but this \
                     start restores {}: its checkpoint storage is older than the table (a newer \
                     checkpoint was deleted, or the storage was copied). Resume from the newest \
                     checkpoint, or start the job on fresh checkpoint storage",
                    restored.map_or("none".to_string(), |r| format!("checkpoint {r}"))
                ))
                .permanent())
            }
            _ => {
                let mut committer = DeltaGlobalCommitter::new(
                    self.location.clone(),
                    Some(table),
                    None,
                    app_id,
                    start.generation,
                );
                committer.claim().await?;
                self.start_table.set(committer.into_table());
                Ok(())
            }
        }
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        _restored: Vec<NoResume>,
    ) -> Result<DeltaSinkWriter<T>, SinkError> {
        register(&context.metrics, &self.counters);
        let table = match self.start_table.get() {
            Some(table) => Some(table),
            None => self.location.open().await.map_err(|e| {
                delta_error(
                    format!("opening the Delta table {}", self.location.url()),
                    e,
                )
            })?,
        };
        let table = table.ok_or_else(|| {
            SinkError::msg(format!(
                "there is no Delta table at {}",
                self.location.url()
            ))
        })?;
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        let files = RecordBatchWriter::for_table(&table)
            .map_err(|e| delta_error("preparing the Parquet writer", e))?
            .with_writer_properties(properties);
        let shape = RowShape {
            records: match &self.derived {
                Some(derived) => derived.record_schema(),
                None => files.arrow_schema(),
            },
            derived: self.derived.clone(),
        };
        DeltaSinkWriter::new(
            files,
            shape,
            app_id(context),
            self.target_file_size,
            self.location.clone(),
            self.counters.clone(),
        )
    }

    async fn create_committer(&self, _: &InitContext) -> Result<DeltaFileCommitter, SinkError> {
        Ok(DeltaFileCommitter::new(self.location.clone()))
    }

    /// The Delta global committer: one table transaction per checkpoint.
    fn global_committer(&self) -> Option<GlobalCommitterFactory<DeltaCommittable>> {
        let location = self.location.clone();
        let compaction = self.compaction.clone();
        let start_table = self.start_table.clone();
        Some(Box::new(move |context: &InitContext| {
            Box::new(DeltaGlobalCommitter::new(
                location.clone(),
                start_table.get(),
                compaction.clone(),
                app_id(context),
                context.generation,
            ))
        }))
    }

    /// Format version 2 (the `format` module): a data file, or the source
    /// positions of a subtask's files. Version 1 blobs (a data file) are
    /// read.
    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<DeltaCommittable>> {
        Arc::new(CommittableFormat)
    }

    /// Yes: a checkpoint's transaction moves each split its records were
    /// read from (a `txn` per split), if the split is still where they
    /// start (the `positions` module).
    fn commits_positions(&self) -> bool {
        true
    }

    /// Each split of `scope` in the table's split registry, at the position
    /// its `txn` holds in the newest version of the table.
    async fn committed_positions(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        positions::committed_positions(&self.location, self.start_table.get(), scope).await
    }
}

/// The Delta application id of a job's commits: its name and lineage, which
/// no other job, and no run on fresh checkpoint storage, shares.
fn app_id(context: &InitContext) -> String {
    format!("{}/{}", context.job_name, context.lineage)
}

fn register(metrics: &SinkMetrics, counters: &WriterCounters) {
    metrics.register_all([
        (
            "delta_sink_files_written",
            "Parquet data files written",
            &counters.files,
        ),
        (
            "delta_sink_rows_written",
            "rows written into data files",
            &counters.rows,
        ),
        (
            "delta_sink_bytes_written",
            "bytes of data files written",
            &counters.bytes,
        ),
    ]);
}
