//! The Iceberg sink's parts driven by hand, as the runtime drives them: the
//! writer's files read back, the per-subtask committer's answers for files
//! missing or changed, and records the table cannot hold.

mod common;

use common::{Event, LocalTable};
use serde::Serialize;
use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer as _, Generation, InitContext, JobStart,
    Lineage, Sink as _, SinkWriter as _,
};
use sink_testkit::Destination as _;
use sinks_iceberg::{read, IcebergDataFile, IcebergSink};

fn context(generation: u64) -> InitContext {
    InitContext::new("job", Lineage::new("l1"), Generation(generation), 0, 1)
}

/// A start of the sink, then one writer's files of checkpoint 1 with
/// `records` events, checked by the committer.
async fn prepare_and_check(
    sink: &IcebergSink<Event>,
    context: &InitContext,
    records: u64,
) -> Vec<IcebergDataFile> {
    let start = JobStart::fresh(&context.job_name, &context.lineage, context.generation, 1);
    sink.on_start(&start).await.unwrap();
    let mut writer = sink.create_writer(context, Vec::new()).await.unwrap();
    // Batches of 100, as the runtime hands them: a file rolls between them.
    for first in (0..records).step_by(100) {
        let batch = (first..records.min(first + 100)).map(Event::new).collect();
        writer.write_batch(batch).await.unwrap();
    }
    let files = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    let mut committer = sink.create_committer(context).await.unwrap();
    let mut requests: Vec<_> = files
        .iter()
        .cloned()
        .map(|f| CommitRequest::new(f, CheckpointId(1), 0))
        .collect();
    committer.commit(&mut requests).await.unwrap();
    assert!(requests
        .iter()
        .all(|r| *r.outcome() == CommitOutcome::Committed));
    files
}

#[tokio::test]
async fn files_written_rolled_and_appended_read_back_with_their_statistics() {
    let table = LocalTable::new();
    let sink = IcebergSink::builder(table.catalog.clone(), table.ident.clone(), common::schema())
        .roll_files_at_checkpoints_and_at_size(4096)
        .build()
        .unwrap();
    let context = context(1);
    let files = prepare_and_check(&sink, &context, 2000).await;
    assert!(files.len() > 1, "rolled at 4 KiB: {} files", files.len());
    assert_eq!(files.iter().map(|f| f.rows).sum::<u64>(), 2000);
    // Nothing is visible before the global committer's append.
    assert!(table.committed_ids().await.is_empty());
    let factory = sink.global_committer().expect("the sink brings one");
    factory(&context)
        .commit_checkpoint(CheckpointId(1), files.clone())
        .await
        .unwrap();
    let mut ids = table.committed_ids().await;
    ids.sort_unstable();
    assert_eq!(ids, (0..2000).collect::<Vec<_>>());
    // Each file's entry kept the writer's column statistics.
    let loaded = table.table().await.unwrap();
    let appended = read::data_files(&loaded).await.unwrap();
    assert_eq!(appended.len(), files.len());
    assert!(
        appended.iter().all(
            |file| file.lower_bounds().contains_key(&1) && file.upper_bounds().contains_key(&1)
        ),
        "{appended:?}"
    );
    // Nothing is left open after the end of input.
    assert_eq!(table.open_transactions().await, Some(0));
}

#[tokio::test]
async fn a_missing_data_file_is_reported_lost_unless_the_table_holds_its_checkpoint() {
    let table = LocalTable::new();
    let sink = table.sink().await;
    let first = context(1);
    let files = prepare_and_check(&sink, &first, 50).await;
    let file = files[0].clone();
    std::fs::remove_file(file.path.trim_start_matches("file://")).unwrap();

    let mut committer = sink.create_committer(&first).await.unwrap();
    let mut request = [CommitRequest::new(file.clone(), CheckpointId(1), 0)];
    committer.commit(&mut request).await.unwrap();
    assert_eq!(*request[0].outcome(), CommitOutcome::RetryLater);
    let mut request = [CommitRequest::new(file.clone(), CheckpointId(1), 3)];
    committer.commit(&mut request).await.unwrap();
    assert_eq!(
        request[0].records_lost(),
        Some(50),
        "{:?}",
        request[0].outcome()
    );

    // Once the table holds checkpoint 1, the same file missing is a replay
    // of something committed (and since rewritten by table maintenance).
    let kept = prepare_and_check(&sink, &context(2), 10).await;
    let factory = sink.global_committer().unwrap();
    factory(&context(2))
        .commit_checkpoint(CheckpointId(1), kept)
        .await
        .unwrap();
    let mut request = [CommitRequest::new(file, CheckpointId(1), 0)];
    committer.commit(&mut request).await.unwrap();
    assert_eq!(*request[0].outcome(), CommitOutcome::AlreadyCommitted);
}

#[tokio::test]
async fn a_data_file_of_another_size_fails_its_commit() {
    let table = LocalTable::new();
    let sink = table.sink().await;
    let context = context(1);
    let files = prepare_and_check(&sink, &context, 50).await;
    let file = files[0].clone();
    std::fs::write(file.path.trim_start_matches("file://"), b"not this file").unwrap();
    let mut committer = sink.create_committer(&context).await.unwrap();
    let mut request = [CommitRequest::new(file, CheckpointId(1), 0)];
    committer.commit(&mut request).await.unwrap();
    assert!(
        matches!(
            request[0].outcome(),
            CommitOutcome::FailedWithUnknownReason(_)
        ),
        "{:?}",
        request[0].outcome()
    );
}

#[tokio::test]
async fn a_record_the_table_cannot_hold_is_a_permanent_error_naming_the_problem() {
    #[derive(Serialize)]
    struct Wrong {
        id: String,
        payload: String,
    }
    let table = LocalTable::new();
    let sink =
        IcebergSink::<Wrong>::builder(table.catalog.clone(), table.ident.clone(), common::schema())
            .build()
            .unwrap();
    let context = context(1);
    let start = JobStart::fresh(&context.job_name, &context.lineage, context.generation, 1);
    sink.on_start(&start).await.unwrap();
    let mut writer = sink.create_writer(&context, Vec::new()).await.unwrap();
    let error = writer
        .write(Wrong {
            id: "seven".into(),
            payload: "x".into(),
        })
        .await
        .unwrap_err();
    assert!(error.is_permanent(), "{error}");
    assert!(error.to_string().contains("schema"), "{error}");
}

/// A catalog database that does not hold the table whose files are at the
/// location it would give a new one (another host's database, an older
/// copy): the start is refused, naming the metadata found, instead of a
/// new table hiding the rows already committed. Metadata of a table with
/// no snapshot, or cut short (a start killed while it created the table),
/// is passed over.
#[tokio::test]
async fn a_catalog_without_the_table_whose_files_are_there_is_refused() {
    let table = LocalTable::new();
    let warehouse = match table.catalog.warehouse() {
        sinks_iceberg::Warehouse::Local(dir) => dir.clone(),
        other => panic!("a local warehouse: {other:?}"),
    };
    // A table created, and nothing committed, through another database.
    let first =
        sinks_iceberg::SqliteCatalog::new(&table.dir.path().join("first.db"), &warehouse).unwrap();
    let opened = first.open().await.unwrap();
    sinks_iceberg::load_or_create(opened.as_ref(), &table.ident, &common::schema(), None)
        .await
        .unwrap();
    // And a newer metadata file a power cut left empty.
    std::fs::write(
        warehouse.join("db/events/metadata/00001-cut.metadata.json"),
        b"",
    )
    .unwrap();
    let sink = table.sink().await;
    let files = prepare_and_check(&sink, &context(1), 10).await;
    let factory = sink.global_committer().unwrap();
    factory(&context(1))
        .commit_checkpoint(CheckpointId(1), files)
        .await
        .unwrap();
    let warehouse = match table.catalog.warehouse() {
        sinks_iceberg::Warehouse::Local(dir) => dir.clone(),
        other => panic!("a local warehouse: {other:?}"),
    };
    let other =
        sinks_iceberg::SqliteCatalog::new(&table.dir.path().join("other.db"), &warehouse).unwrap();
    let stranger = IcebergSink::<Event>::builder(other, table.ident.clone(), common::schema())
        .build()
        .unwrap();
    let lineage = Lineage::new("l2");
    let start = JobStart::fresh("job", &lineage, Generation(1), 1);
    let error = stranger.on_start(&start).await.unwrap_err();
    assert!(error.is_permanent(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("metadata.json") && text.contains("register_table"),
        "{text}"
    );
    // The table's rows are untouched.
    assert_eq!(table.committed_ids().await.len(), 10);
}

/// Flink's FLINK-38614 on a real table: a job with checkpoints, whose last
/// records come after the last periodic barrier, records its end of input
/// only after the final checkpoint's files are in the table. The last
/// snapshot is the end of input (no files), no snapshot adds files past
/// the checkpoint it names, and every record is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_input_is_recorded_after_the_final_checkpoints_files() {
    use sink_runtime::{CheckpointConfig, Job, SequenceSource, Source as _};

    let table = LocalTable::new();
    let sink = table.sink().await;
    let report = Job::builder(
        "final",
        SequenceSource::bounded(3000).paced(10_000).map(Event::new),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(std::time::Duration::from_millis(
        40,
    )))
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    let lineage = report.lineage.expect("a lineage");
    let app_id = format!("final/{lineage}");
    let loaded = table.table().await.expect("the table");
    let mut ids = read::int64_column(&loaded, "id").await.unwrap();
    ids.sort_unstable();
    assert_eq!(ids, (0..3000).collect::<Vec<_>>());
    let properties = loaded.metadata().properties();
    let end: u64 = properties[&format!("eo-sink.end-of-input/{app_id}")]
        .parse()
        .unwrap();
    let snapshots = read::snapshots(&loaded);
    let last = snapshots.last().expect("snapshots");
    assert_eq!(
        (last.lineage.as_deref(), last.checkpoint, last.added_files),
        (Some(app_id.as_str()), Some(end), 0),
        "the end of input is the last snapshot: {snapshots:?}"
    );
    let appends: Vec<u64> = snapshots
        .iter()
        .filter(|s| s.added_files > 0)
        .filter_map(|s| s.checkpoint)
        .collect();
    assert!(appends.len() >= 2, "several checkpoints: {snapshots:?}");
    assert!(appends.iter().all(|&c| c <= end), "{appends:?} after {end}");
}

/// An event as a user declares it once: its columns are traced from the
/// type, its time is in milliseconds, the table is partitioned by its day.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Timed {
    id: i64,
    /// Milliseconds since the epoch.
    ts: i64,
    note: Option<String>,
}

/// 2026-12-01T00:00:00Z, in milliseconds.
const DEC_1_MS: i64 = 1_796_083_200_000;

fn timed(id: u64) -> Timed {
    Timed {
        id: id as i64,
        // Three days: an event every 129.6 seconds.
        ts: DEC_1_MS + id as i64 * 129_600,
        note: id.is_multiple_of(3).then(|| format!("note {id}")),
    }
}

fn timed_sink(table: &LocalTable) -> Result<IcebergSink<Timed>, sink_api::SinkError> {
    IcebergSink::<Timed>::builder_from_type(table.catalog.clone(), table.ident.clone())
        .timestamp("ts", sinks_iceberg::TimeUnit::Millisecond)
        .partition_by(sinks_iceberg::parse_partition_spec("day(ts)")?)
        .build()
}

/// `builder_from_type`: the table's columns are the type's fields, the
/// time is kept in microseconds, and its rows are filed by the day of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_traced_from_the_record_type_partitioned_by_the_day_of_a_time_in_milliseconds() {
    use futures::TryStreamExt as _;
    use sink_runtime::{CheckpointConfig, Job, SequenceSource, Source as _};
    use sinks_iceberg::iceberg::spec::{PrimitiveType, Type};

    let table = LocalTable::new();
    let report = Job::builder(
        "timed",
        SequenceSource::bounded(2_000).map(timed),
        timed_sink(&table).unwrap(),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(std::time::Duration::from_millis(
        50,
    )))
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, sink_runtime::JobStatus::Finished);
    let loaded = table.table().await.expect("the table");
    let schema = loaded.metadata().current_schema();
    let columns: Vec<(String, Type, bool)> = (schema.as_struct().fields().iter())
        .map(|f| (f.name.clone(), f.field_type.as_ref().clone(), f.required))
        .collect();
    assert_eq!(
        columns,
        vec![
            ("id".into(), Type::Primitive(PrimitiveType::Long), true),
            (
                "ts".into(),
                Type::Primitive(PrimitiveType::Timestamptz),
                true
            ),
            ("note".into(), Type::Primitive(PrimitiveType::String), false),
        ]
    );
    let batches: Vec<arrow_array::RecordBatch> = loaded
        .scan()
        .select(["id", "ts"])
        .build()
        .unwrap()
        .to_arrow()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut rows = Vec::new();
    for batch in &batches {
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>();
        let times =
            (batch.column(1).as_any()).downcast_ref::<arrow_array::TimestampMicrosecondArray>();
        let (ids, times) = (ids.expect("longs"), times.expect("microseconds"));
        rows.extend(
            ids.values()
                .iter()
                .copied()
                .zip(times.values().iter().copied()),
        );
    }
    rows.sort_unstable();
    let expected: Vec<(i64, i64)> = (0..2_000)
        .map(|id| (id as i64, timed(id).ts * 1_000))
        .collect();
    let first_wrong = (rows.iter().zip(&expected)).find(|(row, expected)| row != expected);
    assert_eq!(
        (rows.len(), first_wrong),
        (expected.len(), None),
        "every event once, its time in microseconds"
    );
    // Filed by day: three days, each data file of one.
    let spec = loaded.metadata().default_partition_spec();
    let names: Vec<&str> = spec.fields().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["ts_day"]);
    let files = read::data_files(&loaded).await.unwrap();
    let days: std::collections::BTreeSet<String> = files
        .iter()
        .map(|file| format!("{:?}", file.partition()))
        .collect();
    // Days since the epoch: 2026-12-01 is day 20 788.
    let expected: std::collections::BTreeSet<String> = (20_788..20_791)
        .map(|day| format!("Struct {{ fields: [Some(Primitive(Int({day})))] }}"))
        .collect();
    assert_eq!(days, expected);
}

/// What has no Iceberg column type is refused at build, naming the field;
/// a time past what microseconds hold fails the job naming its column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_with_no_iceberg_type_is_refused_at_build_and_a_time_out_of_range_at_its_record() {
    use sink_runtime::{Job, SequenceSource, Source as _};

    #[derive(Serialize, serde::Deserialize)]
    #[allow(dead_code)]
    struct Unsigned {
        id: u64,
    }
    let table = LocalTable::new();
    let error =
        IcebergSink::<Unsigned>::builder_from_type(table.catalog.clone(), table.ident.clone())
            .build()
            .err()
            .expect("refused")
            .to_string();
    assert!(
        error.contains("field id") && error.contains("Iceberg"),
        "{error}"
    );
    let error = Job::builder(
        "far",
        SequenceSource::bounded(10).map(|id| Timed {
            ts: if id == 7 { i64::MAX / 10 } else { DEC_1_MS },
            ..timed(id)
        }),
        timed_sink(&table).unwrap(),
    )
    .build()
    .unwrap()
    .run()
    .await
    .expect_err("a time past microseconds' range");
    let text = format!("{error:#}");
    assert!(text.contains("column ts"), "{text}");
}
