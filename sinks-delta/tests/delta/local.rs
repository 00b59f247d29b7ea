//! The Delta sink on local tables: one transaction per checkpoint, replays
//! recognised from the log, the end of input recorded after the final
//! files (and refused before them), two jobs on one table, partitions,
//! compaction, and a table of another schema refused.

use crate::common;

use std::time::Duration;

use common::{exactly_once, ids, schema, sink, Event};
use sink_api::{
    CheckpointId, CommitRequest, Committer, Generation, InitContext, Lineage, Sink, SinkWriter,
};
use sink_runtime::{CheckpointConfig, Job, JobStatus, SequenceSource, Source};
use sinks_delta::arrow_schema::{DataType, Field, Schema};
use sinks_delta::read::log_entries;
use sinks_delta::{Compaction, DeltaCommittable, DeltaSink, TableLocation};

/// A global committer that does nothing.
struct Nothing;

#[sink_api::async_trait]
impl sink_api::GlobalCommitter for Nothing {
    type Committable = DeltaCommittable;
    async fn commit_checkpoint(
        &mut self,
        _: CheckpointId,
        _: Vec<DeltaCommittable>,
    ) -> Result<(), sink_api::SinkError> {
        Ok(())
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn local() -> (tempfile::TempDir, TableLocation) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let location = TableLocation::local(dir.path().join("table")).expect("a table directory");
    (dir, location)
}

/// A bounded job of `records` events at `per_second`, checkpoints every
/// `interval` (or none), `parallelism` subtasks.
fn job(
    name: &str,
    sink: DeltaSink<Event>,
    records: u64,
    per_second: u64,
    interval: Option<Duration>,
    parallelism: usize,
) -> Job<impl Source<Record = Event>, DeltaSink<Event>> {
    let source = SequenceSource::bounded(records)
        .paced(per_second)
        .map(Event::new);
    let builder = Job::builder(name, source, sink).parallelism(parallelism);
    let builder = match interval {
        Some(interval) => builder.checkpointing(CheckpointConfig::every(interval)),
        None => builder,
    };
    builder.build().expect("a valid job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_job_commits_every_row_once_in_one_transaction_per_checkpoint() {
    let (_dir, location) = local();
    let report = job(
        "events",
        sink(&location, false),
        6_000,
        20_000,
        Some(ms(50)),
        2,
    )
    .run()
    .await
    .expect("the job runs");
    assert_eq!(report.status, JobStatus::Finished);
    exactly_once(&ids(&location, None).await, 6_000).unwrap();

    let entries = log_entries(&location).await.unwrap();
    let updates: Vec<_> = entries
        .iter()
        .filter(|e| e.operation == "STREAMING UPDATE" && e.added > 0)
        .collect();
    let epochs: Vec<i64> = updates.iter().map(|e| e.epoch.expect("an epoch")).collect();
    assert!(
        updates.len() >= 3,
        "several checkpoints committed: {entries:?}"
    );
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "one transaction per checkpoint, in order: {epochs:?}"
    );
    for update in &updates {
        let app = update.query_id.clone().unwrap();
        assert_eq!(
            update.transactions,
            vec![
                (app.clone(), update.epoch.unwrap()),
                (format!("{app}/owner"), 1)
            ],
            "each transaction carries its txn, and its start's generation as the owner"
        );
    }
    let claim = &entries[1];
    assert_eq!(
        (claim.added, claim.transactions.len()),
        (0, 1),
        "the start claimed the table before its first commit: {entries:?}"
    );
    assert!(claim.transactions[0].0.ends_with("/owner"), "{claim:?}");
    sinks_delta::read::check_owners_in_order(&entries).unwrap();
    // Both subtasks' files of a checkpoint are in its one transaction.
    assert!(updates.iter().any(|e| e.added >= 2), "{updates:?}");
    let last = entries.last().expect("entries");
    assert!(
        last.transactions
            .iter()
            .any(|(app, _)| app.ends_with("/end-of-input")),
        "the end of input is recorded last: {last:?}"
    );
}

/// Writes `records` events with a fresh writer of `sink` for checkpoint 1
/// and commits them through the committer; returns the committed files.
async fn prepare_and_commit(
    sink: &DeltaSink<Event>,
    context: &InitContext,
    records: u64,
) -> Vec<sinks_delta::DeltaCommittable> {
    let start =
        sink_api::JobStart::fresh(&context.job_name, &context.lineage, context.generation, 1);
    sink.on_start(&start).await.unwrap();
    let mut writer = sink.create_writer(context, Vec::new()).await.unwrap();
    writer
        .write_batch((0..records).map(Event::new).collect())
        .await
        .unwrap();
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
        .all(|r| *r.outcome() == sink_api::CommitOutcome::Committed));
    files
}

#[tokio::test]
async fn a_replayed_checkpoint_is_recognised_from_the_log_and_adds_nothing() {
    let (_dir, location) = local();
    let sink = sink(&location, true);
    let context = InitContext::new("replay", Lineage::new("l1"), Generation(1), 0, 1);
    let files = prepare_and_commit(&sink, &context, 300).await;
    assert!(files.len() == 3, "one file per day: {files:?}");
    assert!(
        ids(&location, None).await.is_empty(),
        "nothing visible before the global commit"
    );

    let factory = sink
        .global_committer()
        .expect("the sink brings its global committer");
    factory(&context)
        .commit_checkpoint(CheckpointId(1), files.clone())
        .await
        .unwrap();
    exactly_once(&ids(&location, None).await, 300).unwrap();
    let before = log_entries(&location).await.unwrap().len();

    // A restarted job (generation 2 of the same lineage) replays it.
    let restarted = InitContext::new("replay", Lineage::new("l1"), Generation(2), 0, 1);
    factory(&restarted)
        .commit_checkpoint(CheckpointId(1), files.clone())
        .await
        .unwrap();
    assert_eq!(
        log_entries(&location).await.unwrap().len(),
        before,
        "no new log entry"
    );
    exactly_once(&ids(&location, None).await, 300).unwrap();

    // The same files under another lineage are another job's: refused.
    let other = InitContext::new("replay", Lineage::new("l2"), Generation(1), 0, 1);
    let refused = factory(&other)
        .commit_checkpoint(CheckpointId(1), files)
        .await
        .expect_err("another job's files are refused");
    assert!(
        refused.is_permanent() && refused.to_string().contains("mixed up"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_missing_data_file_is_reported_lost_unless_the_log_holds_its_checkpoint() {
    let (dir, location) = local();
    let sink = sink(&location, false);
    let context = InitContext::new("missing", Lineage::new("l1"), Generation(1), 0, 1);
    let files = prepare_and_commit(&sink, &context, 50).await;
    let file = files[0].clone();
    let sinks_delta::DeltaCommittable::File(data) = &file else {
        panic!("a data file first: {file:?}");
    };
    std::fs::remove_file(dir.path().join("table").join(&data.path)).unwrap();

    let mut committer = sink.create_committer(&context).await.unwrap();
    let mut request = [CommitRequest::new(file.clone(), CheckpointId(1), 0)];
    committer.commit(&mut request).await.unwrap();
    assert_eq!(*request[0].outcome(), sink_api::CommitOutcome::RetryLater);
    let mut request = [CommitRequest::new(file.clone(), CheckpointId(1), 3)];
    committer.commit(&mut request).await.unwrap();
    assert_eq!(
        request[0].records_lost(),
        Some(50),
        "{:?}",
        request[0].outcome()
    );

    // Once the log holds checkpoint 1, the same file missing is a replay of
    // something committed (and since compacted and vacuumed).
    let factory = sink.global_committer().unwrap();
    let kept = prepare_and_commit(&sink, &context, 10).await;
    factory(&context)
        .commit_checkpoint(CheckpointId(1), kept)
        .await
        .unwrap();
    let mut request = [CommitRequest::new(file, CheckpointId(1), 0)];
    committer.commit(&mut request).await.unwrap();
    assert_eq!(
        *request[0].outcome(),
        sink_api::CommitOutcome::AlreadyCommitted
    );
}

/// A bounded job without checkpoints: everything is committed once at end
/// of input, by the final checkpoint's transaction.
async fn run_at_end_of_input(
    defer: bool,
) -> (tempfile::TempDir, TableLocation, Result<JobStatus, String>) {
    let (dir, location) = local();
    let source = SequenceSource::bounded(2_000).map(Event::new);
    let builder = Job::builder("final", source, sink(&location, false)).parallelism(2);
    let builder = if defer {
        builder
    } else {
        builder.unsafe_disable_end_of_stream_deferral()
    };
    let result = builder
        .build()
        .unwrap()
        .run()
        .await
        .map(|report| report.status)
        .map_err(|e| e.to_string());
    (dir, location, result)
}

/// Seed 000 (FLINK-38614) against the table: the final checkpoint's files
/// are committed before the end of input is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_files_are_in_the_table_before_the_end_of_input_is_recorded() {
    let (_dir, location, result) = run_at_end_of_input(true).await;
    assert_eq!(result, Ok(JobStatus::Finished));
    let entries = log_entries(&location).await.unwrap();
    let marker = entries
        .iter()
        .find(|e| {
            e.transactions
                .iter()
                .any(|(app, _)| app.ends_with("/end-of-input"))
        })
        .expect("the end of input is recorded");
    exactly_once(&ids(&location, Some(marker.version)).await, 2_000).unwrap();
}

/// The same job with the runtime's deferral switched off: the end of input
/// overtakes the final files, and the table refuses them after it. Proves
/// the test above would catch a regression.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_deferral_the_final_files_come_after_the_end_of_input_and_fail_the_job() {
    let (_dir, location, result) = run_at_end_of_input(false).await;
    let error = result.expect_err("the job fails");
    assert!(
        error.contains("after the end of input was recorded"),
        "{error}"
    );
    let entries = log_entries(&location).await.unwrap();
    let marker = entries
        .iter()
        .find(|e| {
            e.transactions
                .iter()
                .any(|(app, _)| app.ends_with("/end-of-input"))
        })
        .expect("the end of input was recorded");
    assert!(
        exactly_once(&ids(&location, Some(marker.version)).await, 2_000).is_err(),
        "the rows were not in the table when its end of input was recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_write_one_partitioned_table_at_once_and_each_row_is_there_once() {
    let (dir, location) = local();
    let first = job(
        "first",
        sink(&location, true),
        3_000,
        10_000,
        Some(ms(40)),
        2,
    );
    // The second job's ids follow the first's.
    let source = SequenceSource::bounded(3_000)
        .paced(10_000)
        .map(|id| Event::new(id + 3_000));
    let second = Job::builder("second", source, sink(&location, true))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(40)))
        .build()
        .unwrap();
    let (a, b) = tokio::join!(first.run(), second.run());
    assert_eq!(a.unwrap().status, JobStatus::Finished);
    assert_eq!(b.unwrap().status, JobStatus::Finished);
    exactly_once(&ids(&location, None).await, 6_000).unwrap();
    let apps: std::collections::BTreeSet<_> = log_entries(&location)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.query_id)
        .filter(|q| !q.ends_with("/end-of-input"))
        .map(|q| q.split('/').next().unwrap().to_string())
        .collect();
    assert_eq!(apps.into_iter().collect::<Vec<_>>(), ["first", "second"]);
    for day in 1..=3 {
        let partition = dir.path().join("table").join(format!("day=2026-12-0{day}"));
        assert!(partition.is_dir(), "{} exists", partition.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_are_compacted_after_commit_and_every_row_stays_once() {
    let (_dir, location) = local();
    let sink = DeltaSink::builder(location.clone(), schema())
        .partition_by(["day"])
        .compaction(Compaction {
            min_files: 4,
            ..Compaction::default()
        })
        .build()
        .unwrap();
    let report = job("compacted", sink, 4_000, 10_000, Some(ms(30)), 2)
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    exactly_once(&ids(&location, None).await, 4_000).unwrap();
    let entries = log_entries(&location).await.unwrap();
    let optimized: Vec<_> = entries
        .iter()
        .filter(|e| e.operation == "OPTIMIZE")
        .collect();
    assert!(
        !optimized.is_empty(),
        "some partition was compacted: {entries:?}"
    );
    assert!(
        optimized.iter().all(|e| e.removed >= 4 && e.added == 1),
        "{optimized:?}"
    );
    let added: usize = entries.iter().map(|e| e.added).sum();
    let removed: usize = entries.iter().map(|e| e.removed).sum();
    assert!(added - removed <= 3 * 4, "at most min_files - 1 small files per partition, plus merged ones: {added} added, {removed} removed");
}

/// What the log says each job added (`LogEntry::rows_added`, which the
/// demo reports as committed): every row once, under the job's own
/// application id, whatever the compaction rewrote (its adds change no
/// data) and whatever another job added to the same table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_counts_each_jobs_rows_once_through_compaction() {
    let (_dir, location) = local();
    let compacted = || {
        DeltaSink::builder(location.clone(), schema())
            .partition_by(["day"])
            .compaction(Compaction {
                min_files: 2,
                ..Compaction::default()
            })
            .build()
            .unwrap()
    };
    let first = job("first", compacted(), 1_500, 10_000, Some(ms(30)), 2)
        .run()
        .await
        .unwrap();
    let second = job("second", compacted(), 700, 10_000, Some(ms(30)), 2)
        .run()
        .await
        .unwrap();
    let entries = log_entries(&location).await.unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e.operation == "OPTIMIZE" && e.rows_added == 0),
        "a compaction ran, adding no rows: {entries:?}"
    );
    for (name, report, rows) in [("first", first, 1_500), ("second", second, 700)] {
        let app_id = format!("{name}/{}", report.lineage.expect("a lineage"));
        let added: u64 = entries
            .iter()
            .filter(|e| e.query_id.as_deref() == Some(app_id.as_str()))
            .map(|e| e.rows_added)
            .sum();
        assert_eq!(added, rows, "{name}");
    }
    assert_eq!(entries.iter().map(|e| e.rows_added).sum::<u64>(), 2_200);
}

#[tokio::test]
async fn a_table_of_another_schema_is_refused_naming_both() {
    let (_dir, location) = local();
    let context = InitContext::new("schemas", Lineage::new("l1"), Generation(1), 0, 1);
    prepare_and_commit(&sink(&location, false), &context, 5).await;
    let other = DeltaSink::<Event>::builder(
        location.clone(),
        Schema::new(vec![Field::new("id", DataType::Utf8, false)]),
    )
    .build()
    .unwrap();
    let start = sink_api::JobStart::fresh("schemas", &context.lineage, Generation(1), 1);
    let error = other.on_start(&start).await.expect_err("refused");
    assert!(error.is_permanent(), "{error}");
    assert!(error.to_string().contains("has the schema"), "{error}");
    let partitioned = sink(&location, true);
    let error = partitioned.on_start(&start).await.expect_err("refused");
    assert!(error.to_string().contains("partitioned by"), "{error}");
}

#[tokio::test]
async fn a_job_cannot_add_a_second_global_committer() {
    let (_dir, location) = local();
    let source = SequenceSource::bounded(1).map(Event::new);
    let built = Job::builder("two", source, sink(&location, false))
        .global_committer(|| Nothing)
        .build();
    let Err(error) = built else {
        panic!("a second global committer was accepted")
    };

    assert!(
        error
            .to_string()
            .contains("brings its own global committer"),
        "{error}"
    );
}

/// A start whose checkpoint storage is older than the table (a newer
/// checkpoint deleted, or the storage copied) would take its new
/// checkpoints for replays and drop them: refused, naming both.
#[tokio::test]
async fn a_start_behind_the_tables_checkpoints_is_refused() {
    let (_dir, location) = local();
    let sink = sink(&location, false);
    let context = InitContext::new("behind", Lineage::new("l1"), Generation(1), 0, 1);
    let files = prepare_and_commit(&sink, &context, 20).await;
    let factory = sink.global_committer().unwrap();
    factory(&context)
        .commit_checkpoint(CheckpointId(3), files)
        .await
        .unwrap();

    let fresh = sink_api::JobStart::fresh("behind", &context.lineage, Generation(2), 1);
    let error = sink.on_start(&fresh).await.expect_err("refused");
    assert!(error.is_permanent(), "{error}");
    assert!(error.to_string().contains("holds checkpoint 3"), "{error}");

    let no_states: Vec<&sinks_delta::NoResume> = Vec::new();
    let behind = sink_api::JobStart::fresh("behind", &context.lineage, Generation(2), 1).restored(
        CheckpointId(2),
        1,
        Vec::new(),
        no_states.clone(),
    );
    let error = sink.on_start(&behind).await.expect_err("refused");
    assert!(
        error.to_string().contains("restores checkpoint 2"),
        "{error}"
    );

    let level = sink_api::JobStart::fresh("behind", &context.lineage, Generation(2), 1).restored(
        CheckpointId(3),
        1,
        Vec::new(),
        no_states,
    );
    sink.on_start(&level)
        .await
        .expect("the newest checkpoint resumes");
}

/// A record with a field the table has no column for is refused, not
/// written without it.
#[tokio::test]
async fn a_record_with_a_field_the_table_lacks_is_a_permanent_error() {
    #[derive(serde::Serialize)]
    struct Wider {
        id: i64,
        day: String,
        payload: String,
        extra: u8,
    }
    let (_dir, location) = local();
    let sink = DeltaSink::<Wider>::builder(location.clone(), schema())
        .build()
        .unwrap();
    let context = InitContext::new("wider", Lineage::new("l1"), Generation(1), 0, 1);
    let start = sink_api::JobStart::fresh("wider", &context.lineage, Generation(1), 1);
    sink.on_start(&start).await.unwrap();
    let mut writer = sink.create_writer(&context, Vec::new()).await.unwrap();
    let error = writer
        .write(Wider {
            id: 1,
            day: "2026-12-01".into(),
            payload: "p".into(),
            extra: 7,
        })
        .await
        .expect_err("refused");
    assert!(error.is_permanent(), "{error}");
    assert!(error.to_string().contains("does not fit"), "{error}");
}

/// In a job that sends bad records to a dead-letter sink, a record the
/// table's schema refuses (here a null in the required `day` column) goes
/// there, as the JSON of the record with the reason, and the rest of its
/// batch is written: every other record once in the table, every refused
/// one once among the dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_schema_refuses_go_to_the_dead_letters_and_the_rest_to_the_table() {
    #[derive(Debug, Clone, serde::Serialize)]
    struct Loose {
        id: i64,
        day: Option<String>,
        payload: String,
    }
    #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    struct Letter {
        error: String,
        json: String,
    }
    impl From<sink_api::BadRecord> for Letter {
        fn from(bad: sink_api::BadRecord) -> Letter {
            Letter {
                error: bad.error().to_string(),
                json: String::from_utf8_lossy(bad.payload_bytes()).into_owned(),
            }
        }
    }
    let (_dir, location) = local();
    let sink = DeltaSink::<Loose>::builder(location.clone(), schema())
        .build()
        .unwrap();
    let letters = sinks_memory::MemoryStore::<Letter>::new();
    let source = SequenceSource::bounded(300).map(|id| Loose {
        id: id as i64,
        day: (id % 10 != 0).then(|| "2026-12-01".to_string()),
        payload: format!("event {id}"),
    });
    let report = Job::builder("loose", source, sink)
        .parallelism(2)
        .batch_size(16)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .dead_letters(sinks_memory::MemorySink::new(letters.clone()))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let mut table = ids(&location, None).await;
    table.sort_unstable();
    let fit: Vec<i64> = (0..300).filter(|id| id % 10 != 0).collect();
    assert_eq!(table, fit, "every record that fits, once");
    let dead = letters.committed();
    assert_eq!(dead.len(), 30, "{dead:?}");
    assert!(
        letters.violations().is_empty(),
        "{:?}",
        letters.violations()
    );
    let mut refused: Vec<i64> = (dead.iter())
        .map(|l| {
            assert!(l.error.contains("does not fit the table's schema"), "{l:?}");
            let row: serde_json::Value = serde_json::from_str(&l.json).unwrap();
            row["id"].as_i64().unwrap()
        })
        .collect();
    refused.sort_unstable();
    assert_eq!(refused, (0..300).step_by(10).collect::<Vec<i64>>());
    assert_eq!(
        report.metrics.counter("bad_records_dead_lettered"),
        Some(30)
    );
}

/// A table partitioned by the day of a timestamp the records carry
/// (`partition_by_day("day", "ts")`): the records have no day field; every
/// row is filed under the UTC day of its `ts`, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_partitioned_by_the_day_of_a_timestamp_files_each_row_under_its_day() {
    use sinks_delta::arrow_schema::TimeUnit;
    #[derive(Debug, Clone, serde::Serialize)]
    struct Click {
        id: i64,
        ts: String,
        page: String,
    }
    let (_dir, location) = local();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("page", DataType::Utf8, false),
    ]);
    let sink = DeltaSink::<Click>::builder(location.clone(), schema.clone())
        .partition_by_day("day", "ts")
        .build()
        .unwrap();
    // Event n is n hours after 2026-12-01T00:00Z: day n / 24.
    let source = SequenceSource::bounded(300).map(|n| Click {
        id: n as i64,
        ts: format!("2026-12-{:02}T{:02}:30:00Z", 1 + n / 24, n % 24),
        page: format!("/p/{n}"),
    });
    let report = Job::builder("by-day", source, sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let by_file = sinks_delta::read::int64_column_by_file(&location, "id")
        .await
        .unwrap();
    let mut ids = Vec::new();
    for (path, file_ids) in &by_file {
        let day = path
            .split('/')
            .find_map(|part| part.strip_prefix("day="))
            .unwrap_or_else(|| panic!("{path} is under no day"));
        for id in file_ids {
            assert_eq!(
                day,
                format!("2026-12-{:02}", 1 + id / 24),
                "id {id} in {path}"
            );
        }
        ids.extend(file_ids);
    }
    exactly_once(&ids, 300).unwrap();

    // The derivation needs a timestamp or a date, named in the error.
    let error = DeltaSink::<Click>::builder(location.clone(), schema)
        .partition_by_day("day", "page")
        .build()
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains("the day of page, which is of type Utf8"),
        "{error}"
    );
}

/// The struct declared once: the table's columns traced from the record
/// type, its time stored as milliseconds and declared a timestamp, the
/// table partitioned by the day of it. A time left undeclared is refused at
/// build, naming the field and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tables_columns_come_from_the_record_type() {
    use chrono::{DateTime, TimeZone, Utc};
    use sinks_delta::arrow_schema::TimeUnit;
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Click {
        id: i64,
        #[serde(with = "chrono::serde::ts_milliseconds")]
        ts: DateTime<Utc>,
        page: Option<String>,
    }
    let (_dir, location) = local();
    let sink = DeltaSink::<Click>::builder_from_type(location.clone())
        .timestamp("ts", TimeUnit::Millisecond)
        .partition_by_day("day", "ts")
        .build()
        .unwrap();
    let start = Utc.with_ymd_and_hms(2026, 12, 1, 0, 30, 0).unwrap();
    let source = SequenceSource::bounded(100).map(move |n| Click {
        id: n as i64,
        ts: start + chrono::Duration::hours(n as i64),
        page: (n % 2 == 0).then(|| format!("/p/{n}")),
    });
    let report = Job::builder("typed", source, sink)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let mut ids = Vec::new();
    for (path, file_ids) in sinks_delta::read::int64_column_by_file(&location, "id")
        .await
        .unwrap()
    {
        for id in &file_ids {
            let day = format!("day=2026-12-{:02}", 1 + id / 24);
            assert!(path.contains(&day), "id {id} in {path}");
        }
        ids.extend(file_ids);
    }
    exactly_once(&ids, 100).unwrap();

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Undeclared {
        id: i64,
        ts: DateTime<Utc>,
    }
    let (_dir, other) = local();
    let error = DeltaSink::<Undeclared>::builder_from_type(other)
        .build()
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.contains("its field ts") && error.contains("ts_milliseconds"),
        "{error}"
    );
}

/// A time the records carry in milliseconds that the table cannot hold in
/// microseconds (past their range) is refused by the sink, in a job that
/// sends bad records to a dead-letter sink; the rest of its batch is
/// written, every other record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_past_the_tables_range_goes_to_the_dead_letters() {
    use sinks_delta::arrow_schema::TimeUnit;
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Reading {
        id: i64,
        ts: i64,
    }
    #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    struct Letter(String);
    impl From<sink_api::BadRecord> for Letter {
        fn from(bad: sink_api::BadRecord) -> Letter {
            Letter(String::from_utf8_lossy(bad.payload_bytes()).into_owned())
        }
    }
    let (_dir, location) = local();
    let sink = DeltaSink::<Reading>::builder_from_type(location.clone())
        .timestamp("ts", TimeUnit::Millisecond)
        .build()
        .unwrap();
    let letters = sinks_memory::MemoryStore::<Letter>::new();
    let source = SequenceSource::bounded(100).map(|n| Reading {
        id: n as i64,
        // 1 Dec 2026 in milliseconds; every 25th past what microseconds hold.
        ts: if n % 25 == 7 {
            i64::MAX / 10
        } else {
            1_795_996_800_000 + n as i64
        },
    });
    let report = Job::builder("ranges", source, sink)
        .batch_size(10)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .dead_letters(sinks_memory::MemorySink::new(letters.clone()))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let mut table = ids(&location, None).await;
    table.sort_unstable();
    let fit: Vec<i64> = (0..100).filter(|n| n % 25 != 7).collect();
    assert_eq!(table, fit);
    let mut refused: Vec<i64> = (letters.committed().iter())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(&l.0).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    refused.sort_unstable();
    assert_eq!(refused, vec![7, 32, 57, 82]);
}
