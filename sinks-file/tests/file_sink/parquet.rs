//! Parquet parts: rolled at every checkpoint and earlier at a size, row
//! groups by size, zstd or snappy with column statistics, on local files
//! and as multipart uploads, merged by compaction; Hive-style buckets from
//! each record's event time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{TimestampMicrosecondType, UInt64Type};
use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, Generation, InitContext, Sink, SinkError, SinkWriter};
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobStatus, RuntimeMode, SequenceSource};
use sinks_file::{
    BulkFormat, BulkPart, CompactionPolicy, Encoder, EventTimeBucketAssigner, FileSink,
    MemoryObjectStore, ObjectOutput, ParquetCompression, ParquetEncoder, PartMerger, RollingPolicy,
};

use crate::common::exactly_once_problem;

/// 2026-01-01T00:00:00Z, in microseconds.
const START_US: i64 = 1_767_225_600_000_000;

/// The demo's row: its id, its event time (the start plus the id in
/// seconds), a payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    id: u64,
    ts: i64,
    payload: String,
}

fn row(id: u64) -> Row {
    Row {
        id,
        ts: START_US + id as i64 * 1_000_000,
        payload: format!("payload of {id}"),
    }
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::UInt64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("payload", DataType::Utf8, false),
    ]))
}

fn encoder() -> ParquetEncoder<Row> {
    ParquetEncoder::new(schema()).expect("the schema fits serde records")
}

fn by_event_hour() -> EventTimeBucketAssigner<fn(&Row) -> i64> {
    EventTimeBucketAssigner::hourly(|row: &Row| row.ts / 1_000)
}

/// The ids and times in `batches`.
fn ids_and_times(batches: &[RecordBatch]) -> Vec<(u64, i64)> {
    let mut rows = Vec::new();
    for batch in batches {
        let ids = batch.column(0).as_primitive::<UInt64Type>();
        let times = batch.column(1).as_primitive::<TimestampMicrosecondType>();
        rows.extend(
            ids.values()
                .iter()
                .copied()
                .zip(times.values().iter().copied()),
        );
    }
    rows
}

/// Every finished file under `out`, relative path and bytes.
fn finished(out: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    sinks_file::read_finished(out)
        .expect("the output reads")
        .into_iter()
        .map(|(path, bytes)| (path.strip_prefix(out).unwrap_or(&path).to_path_buf(), bytes))
        .collect()
}

/// The hour directory `dt=…/hour=…` of the event time `ts_us`.
fn hour_dir(ts_us: i64) -> String {
    let time = chrono::DateTime::from_timestamp_micros(ts_us).expect("in range");
    time.format("dt=%Y-%m-%d/hour=%H").to_string()
}

/// Checks each file is complete Parquet whose rows are in their event
/// hour's directory; returns every id, sorted.
fn check_files(files: &[(std::path::PathBuf, Vec<u8>)]) -> Vec<u64> {
    let mut ids = Vec::new();
    for (path, bytes) in files {
        let batches = sinks_file::read_parquet(bytes.clone())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (id, ts) in ids_and_times(&batches) {
            assert_eq!(ts, row(id).ts, "{}", path.display());
            assert!(
                path.starts_with(hour_dir(ts)),
                "{id} is in {}, its hour is {}",
                path.display(),
                hour_dir(ts)
            );
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_parts_roll_at_every_checkpoint_into_event_hours_and_hold_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // The default policy keeps a row format's part for 60 s; a bulk
    // format's parts roll at every checkpoint whatever it says.
    let sink = FileSink::builder(&out, encoder().row_group_bytes(16 * 1024))
        .bucket_assigner(by_event_hour())
        .rolling_policy(RollingPolicy::default())
        .part_suffix(".parquet")
        .build()
        .unwrap();
    let stats = sink.stats();
    // 20 000 ids are 5.6 hours of event time.
    let source = SequenceSource::bounded(20_000).paced(5_000).map(row);
    let report = Job::builder("parquet", source, sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let files = finished(&out);
    let ids = check_files(&files);
    assert_eq!(exactly_once_problem(&ids, 20_000), None);
    assert_eq!(stats.snapshot().committed_records, 20_000);
    // 6 hours × 2 subtasks would be 12 files with a part per bucket; the
    // checkpoints cut many more.
    let checkpoints = report.metrics.checkpoints_completed;
    assert!(checkpoints >= 5, "{:?}", report.metrics);
    assert!(
        files.len() as u64 > 12 + checkpoints / 2,
        "{} files for {checkpoints} checkpoints",
        files.len()
    );
    // zstd, statistics per column chunk.
    let (_, bytes) = files
        .iter()
        .max_by_key(|(_, bytes)| bytes.len())
        .expect("files");
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes.clone())).unwrap();
    for group in reader.metadata().row_groups() {
        for column in group.columns() {
            assert!(matches!(column.compression(), Compression::ZSTD(_)));
            assert!(column.statistics().is_some(), "{column:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_part_rolls_early_at_the_policys_size_and_snappy_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let encoder = encoder()
        .compression(ParquetCompression::Snappy)
        .row_group_bytes(4 * 1024);
    let sink = FileSink::builder(dir.path(), encoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(32 * 1024),
            ..RollingPolicy::default()
        })
        .build()
        .unwrap();
    let source = SequenceSource::bounded(50_000).map(row);
    // Batch: one commit at the end; only the size rolls parts before it.
    let report = Job::builder("sizes", source, sink)
        .mode(RuntimeMode::Batch)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let files = finished(dir.path());
    assert!(files.len() > 4, "{} files", files.len());
    let mut ids = Vec::new();
    for (path, bytes) in &files {
        // The size is checked after each record: a part passes it by at
        // most a batch's row group.
        assert!(
            bytes.len() < 128 * 1024,
            "{}: {}",
            path.display(),
            bytes.len()
        );
        let reader = SerializedFileReader::new(bytes::Bytes::from(bytes.clone())).unwrap();
        let metadata = reader.metadata();
        let column = metadata.row_group(0).column(0).compression();
        assert_eq!(column, Compression::SNAPPY);
        // Row groups of about 4 KiB in parts of about 32 KiB.
        if bytes.len() >= 16 * 1024 {
            assert!(
                metadata.num_row_groups() > 1,
                "{} ({} bytes) has one row group",
                path.display(),
                bytes.len()
            );
        }
        let batches = sinks_file::read_parquet(bytes.clone()).unwrap();
        ids.extend(ids_and_times(&batches).into_iter().map(|(id, _)| id));
    }
    ids.sort_unstable();
    assert_eq!(exactly_once_problem(&ids, 50_000), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_parts_are_multipart_uploads_on_an_object_store() {
    let store = Arc::new(MemoryObjectStore::new());
    let output = ObjectOutput::new(
        store.clone(),
        object_store::path::Path::from("out"),
        "memory://out",
    );
    // Parts of 1 KiB: each object is many uploaded parts.
    let sink = FileSink::object_store_builder(output.clone(), encoder().row_group_bytes(8 * 1024))
        .bucket_assigner(by_event_hour())
        .part_size(1024)
        .part_suffix(".parquet")
        .build()
        .unwrap();
    let source = SequenceSource::bounded(10_000).paced(40_000).map(row);
    let report = Job::builder("objects", source, sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let mut files = Vec::new();
    for object in sinks_file::finished_objects(&output).await.unwrap() {
        let bytes = sinks_file::read_object(&output, &object).await.unwrap();
        files.push((std::path::PathBuf::from(object), bytes.to_vec()));
    }
    assert!(files.iter().any(|(_, bytes)| bytes.len() > 4 * 1024));
    let ids = check_files(&files);
    assert_eq!(exactly_once_problem(&ids, 10_000), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_parquet_parts_into_one_parquet_file_per_segment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = FileSink::builder(&out, encoder())
        .bucket_assigner(by_event_hour())
        .part_suffix(".parquet")
        .compaction(CompactionPolicy::every(Duration::from_millis(200)).retention(Duration::ZERO))
        .build()
        .unwrap();
    let stats = sink.stats();
    let source = SequenceSource::bounded(20_000).paced(20_000).map(row);
    let report = Job::builder("compacted", source, sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let snapshot = stats.snapshot();
    assert!(snapshot.compactions > 0, "{snapshot:?}");
    assert_eq!(snapshot.compaction_failures, 0, "{snapshot:?}");
    // What readers see: fewer files than were committed, each complete
    // Parquet, every record once, in its hour (under a segment directory).
    let files = finished(&out);
    assert!(
        (files.len() as u64) < snapshot.committed_files,
        "{} files visible, {} committed",
        files.len(),
        snapshot.committed_files
    );
    let ids = check_files(&files);
    assert_eq!(exactly_once_problem(&ids, 20_000), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_columns_traced_from_the_record_type_are_those_written_by_hand() {
    let traced = ParquetEncoder::<Row>::from_type()
        .and_then(|encoder| encoder.timestamp("ts", TimeUnit::Microsecond))
        .unwrap();
    assert_eq!(traced.schema().fields(), schema().fields());
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), traced)
        .bucket_assigner(by_event_hour())
        .part_suffix(".parquet")
        .build()
        .unwrap();
    let source = SequenceSource::bounded(3_000).map(row);
    let report = Job::builder("traced", source, sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let ids = check_files(&finished(dir.path()));
    assert_eq!(exactly_once_problem(&ids, 3_000), None);
    // What has no column type is refused when the encoder is made.
    #[derive(Serialize, Deserialize)]
    struct Loose {
        id: u64,
        extra: serde_json::Value,
    }
    let error = ParquetEncoder::<Loose>::from_type()
        .unwrap_err()
        .to_string();
    assert!(error.contains("its field extra"), "{error}");
    let error = ParquetEncoder::<Row>::from_type()
        .and_then(|encoder| encoder.timestamp("when", TimeUnit::Millisecond))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("ParquetEncoder::timestamp(…) names no field"),
        "{error}"
    );
    let error = encoder()
        .timestamp("ts", TimeUnit::Millisecond)
        .unwrap_err()
        .to_string();
    assert!(error.contains("from_type"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_fit_the_schema_fails_the_job_naming_the_schema() {
    #[derive(Serialize)]
    struct Wrong {
        id: String,
        ts: i64,
        payload: String,
    }
    let dir = tempfile::tempdir().unwrap();
    let encoder = ParquetEncoder::<Wrong>::new(schema()).unwrap();
    let sink = FileSink::builder(dir.path(), encoder).build().unwrap();
    let source = SequenceSource::bounded(10).map(|id| Wrong {
        id: format!("id-{id}"),
        ts: 0,
        payload: String::new(),
    });
    let error = Job::builder("wrong", source, sink)
        .build()
        .unwrap()
        .run()
        .await
        .expect_err("a record of the wrong type");
    let text = format!("{error:#}");
    assert!(text.contains("does not fit the Parquet schema"), "{text}");
    assert!(text.contains("\"id\""), "{text}");
    assert!(sinks_file::finished_files(dir.path()).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_checkpoint_records_a_parquet_part_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), encoder())
        .rolling_policy(RollingPolicy::default())
        .build()
        .unwrap();
    let context = InitContext::new(
        "parquet",
        sink_api::Lineage::new("test-lineage"),
        Generation(1),
        0,
        1,
    );
    let mut writer = sink.create_writer(&context, Vec::new()).await.unwrap();
    writer
        .write_batch((0..100).map(row).collect())
        .await
        .unwrap();
    let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    assert_eq!(committables.len(), 1);
    assert_eq!(committables[0].records, 100);
    let states = writer.snapshot_state(CheckpointId(1)).await.unwrap();
    assert!(
        states.iter().all(|state| state.in_progress.is_empty()),
        "{states:?}"
    );
}

/// A bulk format that cannot merge its parts.
struct Unmergeable;

impl Encoder<Row> for Unmergeable {
    fn encode(&self, _: &Row, _: &mut Vec<u8>) -> Result<(), SinkError> {
        unreachable!("a bulk format")
    }

    fn bulk(&self) -> Option<&dyn BulkFormat<Row>> {
        Some(self)
    }
}

impl BulkFormat<Row> for Unmergeable {
    fn open_part(&self) -> Result<Box<dyn BulkPart<Row>>, SinkError> {
        Err(SinkError::msg("not written in this test"))
    }

    fn merger(&self) -> Option<Arc<dyn PartMerger>> {
        None
    }
}

#[test]
fn compaction_is_refused_for_a_bulk_format_that_cannot_merge() {
    let dir = tempfile::tempdir().unwrap();
    let refused = FileSink::builder(dir.path(), Unmergeable)
        .compaction(CompactionPolicy::default())
        .build()
        .err()
        .expect("refused");
    assert!(refused.to_string().contains("cannot merge"), "{refused}");
    assert!(FileSink::builder(dir.path(), Unmergeable).build().is_ok());
}
