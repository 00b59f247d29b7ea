//! Parquet parts (feature `parquet`): records of a serde type into Arrow
//! arrays through `serde_arrow`, written by arrow-rs' `ArrowWriter`.
//!
//! ```text
//!  add     record ─▶ serde_arrow ArrayBuilder (up to BATCH_ROWS rows)
//!                 ─▶ RecordBatch ─▶ ArrowWriter: the row group in progress, encoded and compressed
//!                 ─▶ at `row_group_bytes`, the row group is flushed: its bytes go to the part
//!  finish  the last batch, the last row group, the footer ─▶ the part
//! ```
//!
//! Why serde types rather than `RecordBatch`es given by the user: the file
//! sink takes records one at a time, as every sink of the SDK does, and the
//! same record type then goes to JSON lines, CSV or Parquet by changing the
//! encoder only. A record that does not fit the schema fails the write,
//! naming the field, before anything of it is written.
//!
//! Memory per part in progress: the batch being built (at most
//! [`BATCH_ROWS`] records as Arrow arrays) and the row group being encoded
//! (up to `row_group_bytes` encoded, plus the values of the page being
//! built); finished row groups leave at once, through the part's file or
//! multipart upload.

use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{FieldRef, Schema, SchemaRef, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_arrow::ArrayBuilder;
use sink_api::SinkError;
use sink_arrow::{Format, TraceFields};

use crate::bulk::{BulkFormat, BulkPart, PartMerger};
use crate::encoder::Encoder;

/// Records converted to Arrow at a time: large enough that the conversion
/// and the writer's per-batch work are spread thin, small enough that a
/// part holds little beside its row group.
pub const BATCH_ROWS: usize = 1024;

/// The compression of a Parquet part's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ParquetCompression {
    /// Zstandard at level 1, the default: smaller files than Snappy's at
    /// about its speed.
    #[default]
    Zstd,
    /// Snappy: what older readers expect.
    Snappy,
    /// None.
    Uncompressed,
}

impl ParquetCompression {
    /// The name of each, as a `--compression` flag takes it.
    pub const NAMES: [&'static str; 3] = ["zstd", "snappy", "none"];

    /// The compression named `name` (one of [`NAMES`](Self::NAMES)).
    pub fn parse(name: &str) -> Result<ParquetCompression, SinkError> {
        match name {
            "zstd" => Ok(ParquetCompression::Zstd),
            "snappy" => Ok(ParquetCompression::Snappy),
            "none" => Ok(ParquetCompression::Uncompressed),
            other => Err(SinkError::msg(format!(
                "unknown Parquet compression '{other}': use one of {}",
                ParquetCompression::NAMES.join(", ")
            ))
            .permanent()),
        }
    }

    fn codec(self) -> Compression {
        match self {
            ParquetCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
            ParquetCompression::Snappy => Compression::SNAPPY,
            ParquetCompression::Uncompressed => Compression::UNCOMPRESSED,
        }
    }
}

/// Writes parts as Parquet files: records of the serde type `T`, with the
/// Arrow schema given to [`new`](Self::new). Given to
/// [`FileSink::builder`](crate::FileSink::builder) as its encoder; every
/// part is then finished at each checkpoint (see the `bulk` module).
///
/// Defaults: zstd, row groups of 64 MiB encoded, column statistics per
/// page and per column chunk, Parquet 2.0 pages.
///
/// ```
/// use std::sync::Arc;
/// use arrow_schema::{DataType, Field, Schema, TimeUnit};
/// use sinks_file::{FileSink, ParquetEncoder};
///
/// #[derive(serde::Serialize)]
/// struct Order { id: u64, ts: i64, note: String }
///
/// let schema = Schema::new(vec![
///     Field::new("id", DataType::UInt64, false),
///     Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
///     Field::new("note", DataType::Utf8, false),
/// ]);
/// let encoder = ParquetEncoder::<Order>::new(Arc::new(schema))?;
/// let sink = FileSink::builder("/tmp/orders", encoder).part_suffix(".parquet").build()?;
/// # Ok::<(), sink_api::SinkError>(())
/// ```
pub struct ParquetEncoder<T> {
    inner: Arc<Inner>,
    _record: PhantomData<fn(&T)>,
}

/// What Parquet stores: times in the records' own unit, unsigned integers.
const PARQUET: Format = Format {
    name: "Parquet",
    timestamp_method: "ParquetEncoder::timestamp",
    time_unit: None,
    unsigned: true,
};

/// What the parts of one encoder share.
#[derive(Clone)]
struct Inner {
    /// The record type's tracing and the timestamps declared so far, for
    /// an encoder made by [`ParquetEncoder::from_type`].
    traced: Option<(TraceFields, Vec<(String, TimeUnit)>)>,
    schema: SchemaRef,
    fields: Vec<FieldRef>,
    properties: WriterProperties,
    row_group_bytes: usize,
    compression: ParquetCompression,
}

impl<T> std::fmt::Debug for ParquetEncoder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetEncoder")
            .field("schema", &self.inner.schema)
            .field("compression", &self.inner.compression)
            .field("row_group_bytes", &self.inner.row_group_bytes)
            .finish()
    }
}

impl<T> Clone for ParquetEncoder<T> {
    fn clone(&self) -> ParquetEncoder<T> {
        ParquetEncoder {
            inner: self.inner.clone(),
            _record: PhantomData,
        }
    }
}

/// Row groups are flushed once this many encoded bytes are in progress.
const DEFAULT_ROW_GROUP_BYTES: usize = 64 * 1024 * 1024;

impl<T: Serialize + 'static> ParquetEncoder<T> {
    /// Parquet parts of `schema`, whose fields the records of `T` fill by
    /// name. Fails when `serde_arrow` cannot build a field of the schema
    /// (the error names it).
    pub fn new(schema: SchemaRef) -> Result<ParquetEncoder<T>, SinkError> {
        let fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
        check_builds(&fields)?;
        let compression = ParquetCompression::default();
        Ok(ParquetEncoder {
            inner: Arc::new(Inner {
                traced: None,
                properties: properties(compression),
                schema,
                fields,
                row_group_bytes: DEFAULT_ROW_GROUP_BYTES,
                compression,
            }),
            _record: PhantomData,
        })
    }

    /// Parquet parts whose columns are the fields of the record type `T`,
    /// traced through its serde `Deserialize`: the struct is declared once.
    /// A field's Rust type gives its column's type, `Option` makes it
    /// nullable; a time stored as an integer is declared with
    /// [`timestamp`](Self::timestamp).
    ///
    /// ```
    /// use sinks_file::{FileSink, ParquetEncoder, TimeUnit};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Order { id: u64, ts: i64, note: Option<String> }
    ///
    /// let encoder = ParquetEncoder::<Order>::from_type()?.timestamp("ts", TimeUnit::Millisecond)?;
    /// let sink = FileSink::builder("/tmp/orders", encoder).part_suffix(".parquet").build()?;
    /// # Ok::<(), sink_api::SinkError>(())
    /// ```
    ///
    /// # Errors
    /// A permanent error naming the field and the fix, for a field with no
    /// column type: a `chrono::DateTime` (serde shows it as a string; store
    /// it with `#[serde(with = "chrono::serde::ts_milliseconds")]` and
    /// declare it a timestamp) or a `serde_json::Value`.
    pub fn from_type() -> Result<ParquetEncoder<T>, SinkError>
    where
        T: DeserializeOwned,
    {
        ParquetEncoder::traced((sink_arrow::fields_of::<T>, Vec::new()))
    }

    /// With [`from_type`](Self::from_type): the record's field `field`, an
    /// integer count of `unit` since the epoch (such as a
    /// `chrono::DateTime` with
    /// `#[serde(with = "chrono::serde::ts_milliseconds")]`), is a UTC
    /// timestamp column of that unit.
    ///
    /// # Errors
    /// A permanent error when the encoder was given its schema by hand
    /// ([`new`](Self::new): declare the column's type there), or when
    /// `field` is not a field of the record type.
    pub fn timestamp(
        self,
        field: impl Into<String>,
        unit: TimeUnit,
    ) -> Result<ParquetEncoder<T>, SinkError> {
        let Some((trace, mut timestamps)) = self.inner.traced.clone() else {
            return Err(SinkError::msg(
                "ParquetEncoder::timestamp is for an encoder made by from_type: with a schema \
                 given to ParquetEncoder::new, give the column its timestamp type there",
            )
            .permanent());
        };
        timestamps.push((field.into(), unit));
        let traced = ParquetEncoder::<T>::traced((trace, timestamps))?;
        Ok(self.with(|inner| {
            inner.traced = traced.inner.traced.clone();
            inner.schema = traced.inner.schema.clone();
            inner.fields = traced.inner.fields.clone();
        }))
    }

    /// The encoder of the fields `traced` gives.
    fn traced(
        traced: (TraceFields, Vec<(String, TimeUnit)>),
    ) -> Result<ParquetEncoder<T>, SinkError> {
        let fields = (traced.0)(&traced.1, PARQUET)?;
        let mut encoder = ParquetEncoder::new(Arc::new(Schema::new(fields)))?;
        Arc::make_mut(&mut encoder.inner).traced = Some(traced);
        Ok(encoder)
    }

    /// The compression of the pages (default zstd).
    pub fn compression(self, compression: ParquetCompression) -> ParquetEncoder<T> {
        self.with(|inner| {
            inner.compression = compression;
            inner.properties = properties(compression);
        })
    }

    /// Flush a row group once this many encoded bytes are in progress
    /// (default 64 MiB, at least 1). Each part in progress holds about a
    /// row group in memory: with many buckets open, lower it.
    pub fn row_group_bytes(self, bytes: usize) -> ParquetEncoder<T> {
        self.with(|inner| inner.row_group_bytes = bytes.max(1))
    }

    /// The schema the parts are written with.
    pub fn schema(&self) -> &SchemaRef {
        &self.inner.schema
    }

    /// The writer properties of every part: compression, statistics, no
    /// row count limit on row groups. A baseline writing the same files
    /// without the sink (the benchmark's) uses these.
    pub fn writer_properties(&self) -> &WriterProperties {
        &self.inner.properties
    }

    fn with(self, change: impl FnOnce(&mut Inner)) -> ParquetEncoder<T> {
        let mut inner = Inner::clone(&self.inner);
        change(&mut inner);
        ParquetEncoder {
            inner: Arc::new(inner),
            _record: PhantomData,
        }
    }
}

/// Checks that serde_arrow can build records into `fields`.
fn check_builds(fields: &[FieldRef]) -> Result<(), SinkError> {
    ArrayBuilder::from_arrow(fields).map_err(|e| {
        SinkError::msg(format!(
            "the Parquet schema cannot be built from serde records: {e}"
        ))
        .permanent()
    })?;
    Ok(())
}

/// The writer properties of `compression`: statistics per page (and so
/// per column chunk), no row count limit below the size one.
fn properties(compression: ParquetCompression) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(compression.codec())
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(None)
        .build()
}

impl<T: Serialize + 'static> Encoder<T> for ParquetEncoder<T> {
    /// Never called by the file writer, which writes a bulk format's parts
    /// through [`bulk`](Encoder::bulk): refuses.
    fn encode(&self, _record: &T, _out: &mut Vec<u8>) -> Result<(), SinkError> {
        Err(SinkError::msg(
            "ParquetEncoder is a bulk format: its parts are written through Encoder::bulk, not one \
             record at a time",
        )
        .permanent())
    }

    fn bulk(&self) -> Option<&dyn BulkFormat<T>> {
        Some(self)
    }
}

impl<T: Serialize + 'static> BulkFormat<T> for ParquetEncoder<T> {
    fn open_part(&self) -> Result<Box<dyn BulkPart<T>>, SinkError> {
        let builder = ArrayBuilder::from_arrow(&self.inner.fields)
            .map_err(|e| SinkError::other("making the Arrow arrays of a Parquet part", e))?;
        let writer = ArrowWriter::try_new(
            Vec::new(),
            self.inner.schema.clone(),
            Some(self.inner.properties.clone()),
        )
        .map_err(|e| SinkError::other("starting a Parquet part", e).permanent())?;
        Ok(Box::new(ParquetPart {
            inner: self.inner.clone(),
            builder,
            rows: 0,
            rows_written: 0,
            in_progress_bytes: 0,
            row_bytes: 0,
            writer,
            _record: PhantomData,
        }))
    }

    fn merger(&self) -> Option<Arc<dyn PartMerger>> {
        Some(Arc::new(ParquetMerger {
            inner: self.inner.clone(),
        }))
    }
}

/// One Parquet part being written.
struct ParquetPart<T> {
    inner: Arc<Inner>,
    /// The records since the last batch, as Arrow arrays being built.
    builder: ArrayBuilder,
    /// How many records the builder holds.
    rows: usize,
    /// How many records went to the writer.
    rows_written: u64,
    /// The writer's row group in progress, encoded, and the encoded bytes
    /// of one record so far, as of the last batch (asking the writer costs
    /// a walk over its columns: once per batch, not per record).
    in_progress_bytes: u64,
    row_bytes: u64,
    /// The file: its row group in progress, and the bytes not yet handed
    /// out in its `Vec`.
    writer: ArrowWriter<Vec<u8>>,
    _record: PhantomData<fn(&T)>,
}

impl<T> ParquetPart<T> {
    /// Writes the records built so far as one batch; flushes the row group
    /// once it holds `row_group_bytes`.
    fn write_batch(&mut self) -> Result<(), SinkError> {
        if self.rows == 0 {
            return Ok(());
        }
        let batch = self
            .builder
            .to_record_batch()
            .map_err(|e| SinkError::other("making a batch of a Parquet part", e))?;
        self.rows_written += self.rows as u64;
        self.rows = 0;
        // serde_arrow names the batch's schema after the fields; the
        // writer's keeps the schema's metadata.
        let batch = RecordBatch::try_new(self.inner.schema.clone(), batch.columns().to_vec())
            .map_err(|e| SinkError::other("making a batch of a Parquet part", e))?;
        self.writer
            .write(&batch)
            .map_err(|e| SinkError::other("encoding a batch of a Parquet part", e))?;
        let mut in_progress = self.writer.in_progress_size();
        if in_progress >= self.inner.row_group_bytes {
            self.writer
                .flush()
                .map_err(|e| SinkError::other("flushing a row group of a Parquet part", e))?;
            in_progress = 0;
        }
        self.in_progress_bytes = in_progress as u64;
        let encoded = self.writer.bytes_written() as u64 + self.in_progress_bytes;
        self.row_bytes = encoded.checked_div(self.rows_written).unwrap_or(0);
        Ok(())
    }

    /// Moves the bytes the writer finished into `out`: without a copy
    /// when `out` is empty (the writer then fills `out`'s old buffer).
    fn hand_out(&mut self, out: &mut Vec<u8>) {
        let finished = self.writer.inner_mut();
        match out.is_empty() {
            true => std::mem::swap(out, finished),
            false => out.append(finished),
        }
    }
}

impl<T: Serialize + 'static> BulkPart<T> for ParquetPart<T> {
    fn add(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.builder.push(record).map_err(|e| {
            SinkError::msg(format!(
                "a record does not fit the Parquet schema {:?}: {e}",
                field_names(&self.inner.schema)
            ))
            .permanent()
        })?;
        self.rows += 1;
        if self.rows >= BATCH_ROWS {
            self.write_batch()?;
            self.hand_out(out);
        }
        Ok(())
    }

    /// The row group in progress, encoded, and the records still in the
    /// builder at the size of those encoded so far.
    fn buffered_bytes(&self) -> u64 {
        self.in_progress_bytes + self.row_bytes * self.rows as u64
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.write_batch()?;
        self.writer
            .finish()
            .map_err(|e| SinkError::other("finishing a Parquet part", e))?;
        self.hand_out(out);
        Ok(())
    }
}

fn field_names(schema: &Schema) -> Vec<&str> {
    schema.fields().iter().map(|f| f.name().as_str()).collect()
}

/// Compaction of Parquet parts: their row groups read back through arrow
/// and written again as one file, with the encoder's properties.
struct ParquetMerger {
    inner: Arc<Inner>,
}

impl PartMerger for ParquetMerger {
    fn merge(&self, sources: &[(PathBuf, u64)], merged: &mut File) -> Result<u64, SinkError> {
        let mut writer = ArrowWriter::try_new(
            &mut *merged,
            self.inner.schema.clone(),
            Some(self.inner.properties.clone()),
        )
        .map_err(|e| SinkError::other("starting a merged Parquet file", e))?;
        let mut rows = 0u64;
        for (path, bytes) in sources {
            let file = File::open(path)
                .map_err(|e| crate::io_error::io_error(format!("opening {}", path.display()), e))?;
            let size = file
                .metadata()
                .map_err(|e| crate::io_error::io_error(format!("reading {}", path.display()), e))?
                .len();
            if size != *bytes {
                return Err(SinkError::msg(format!(
                    "{} changed while it was merged ({size} bytes, {bytes} listed); the segment is \
                     left as it is",
                    path.display()
                )));
            }
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .and_then(|builder| builder.with_batch_size(BATCH_ROWS).build())
                .map_err(|e| {
                    SinkError::msg(format!(
                        "{} is not a Parquet file this sink can merge: {e}",
                        path.display()
                    ))
                })?;
            for batch in reader {
                let batch = batch
                    .map_err(|e| SinkError::msg(format!("reading {}: {e}", path.display())))?;
                let batch =
                    RecordBatch::try_new(self.inner.schema.clone(), batch.columns().to_vec())
                        .map_err(|e| {
                            SinkError::msg(format!(
                                "{} does not hold the sink's schema: {e}",
                                path.display()
                            ))
                        })?;
                rows += batch.num_rows() as u64;
                writer
                    .write(&batch)
                    .map_err(|e| SinkError::other("writing a merged Parquet file", e))?;
                if writer.in_progress_size() >= self.inner.row_group_bytes {
                    writer
                        .flush()
                        .map_err(|e| SinkError::other("writing a merged Parquet file", e))?;
                }
            }
        }
        writer
            .close()
            .map_err(|e| SinkError::other("finishing a merged Parquet file", e))?;
        Ok(rows)
    }
}

/// The records of one Parquet file, as Arrow batches: for checks of what
/// a Parquet sink wrote (tests, the demos' end checks), with the file's
/// bytes from [`read_finished`](crate::read_finished) or
/// `read_object` (feature `object-store`). Fails on anything but a complete
/// Parquet file.
pub fn read_parquet(bytes: Vec<u8>) -> Result<Vec<RecordBatch>, SinkError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
        .and_then(|builder| builder.with_batch_size(BATCH_ROWS).build())
        .map_err(|e| SinkError::msg(format!("not a complete Parquet file: {e}")))?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SinkError::msg(format!("reading a Parquet file: {e}")))
}
