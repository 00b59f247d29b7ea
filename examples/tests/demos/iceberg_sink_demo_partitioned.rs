//! The Iceberg sink demo on partitioned tables of its SQL catalog, read back
//! by PyIceberg (`scripts/with-iceberg-reader`): each data file holds one
//! partition, a partition filter reads exactly its rows, a spec changed
//! while the job runs is written from the next checkpoint on, and a spec
//! that does not fit is refused.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::output::{summary, text};

fn demo(warehouse: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iceberg-sink-demo"))
        .arg("--warehouse")
        .arg(warehouse)
        .args(args)
        .output()
        .expect("the demo runs")
}

/// The table `demo.events`, read by PyIceberg with `options`, or `None`
/// (with the reason printed) without it.
fn read(warehouse: &Path, options: &[&str]) -> Option<serde_json::Value> {
    let reader = sink_testkit::servers::iceberg_reader()?;
    let output = Command::new(&reader[0])
        .args(&reader[1..])
        .arg(warehouse.join("catalog.db"))
        .arg(warehouse)
        .arg("demo.events")
        .args(options)
        .output()
        .expect("the reader runs");
    Some(summary(&output))
}

/// Seconds in a day: the demo's id `n` happened `n` seconds after
/// 2026-01-01T00:00:00Z.
const DAY: u64 = 86_400;

/// Every live file of a table partitioned by `day(ts)` under spec
/// `spec_id` holds the rows of one day, the one its partition value names.
pub fn assert_each_file_holds_its_day(read: &serde_json::Value, spec_id: u64) {
    let files = read["files"].as_array().expect("the live files");
    let partitioned: Vec<_> = files
        .iter()
        .filter(|file| file["spec_id"] == spec_id)
        .collect();
    assert!(!partitioned.is_empty(), "no file of spec {spec_id}: {read}");
    for file in partitioned {
        let day = file["partition"]["ts_day"].as_u64();
        let days = &file["ts_days"];
        assert!(day.is_some(), "no day partition: {file}");
        assert_eq!(
            (days[0].as_u64(), days[1].as_u64()),
            (day, day),
            "a file holding other days than its partition's: {file}"
        );
    }
}

/// A table partitioned by `day(ts)`: each data file holds one day's rows,
/// the day of its partition value, and PyIceberg's read with a filter on
/// `ts` (pruning files by partition, then rows) returns exactly the second
/// day's ids.
#[test]
fn partitioned_by_day_each_file_holds_its_day_and_a_filter_reads_exactly_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let args = [
        "--partition-by",
        "day(ts)",
        "--records",
        "300000",
        "--checkpoint-interval",
        "200ms",
        "--json",
    ];
    let report = summary(&demo(&warehouse, &args));
    assert_eq!(report["status"], "Finished", "{report}");
    assert_eq!(report["distinct_ids"], 300_000, "{report}");
    // 300 000 s: days 0 to 3, each of a file at least.
    assert!(report["data_files"].as_u64() >= Some(4), "{report}");
    let Some(whole) = read(&warehouse, &[]) else {
        return;
    };
    assert_eq!(
        (whole["rows"].as_u64(), whole["distinct_ids"].as_u64()),
        (Some(300_000), Some(300_000)),
        "{whole}"
    );
    assert_each_file_holds_its_day(&whole, 0);
    let filter = "ts >= '2026-01-02T00:00:00+00:00' and ts < '2026-01-03T00:00:00+00:00'";
    let day_two = read(&warehouse, &["--filter", filter]).expect("the reader");
    println!(
        "PyIceberg read the day-partitioned table: {} files; with a filter on the second day, \
         {} rows",
        whole["files"].as_array().map_or(0, Vec::len),
        day_two["rows"]
    );
    assert_eq!(
        (
            day_two["rows"].as_u64(),
            day_two["distinct_ids"].as_u64(),
            day_two["min_id"].as_u64(),
            day_two["max_id"].as_u64()
        ),
        (Some(DAY), Some(DAY), Some(DAY), Some(2 * DAY - 1)),
        "{day_two}"
    );
    // The same spec again is accepted; another is refused, naming both,
    // and the table is left as it was.
    let again = demo(&warehouse, &args);
    assert!(again.status.success(), "{}", text(&again));
    let other_state = dir.path().join("other-state");
    let other = demo(
        &warehouse,
        &[
            "--state",
            other_state.to_str().expect("a UTF-8 path"),
            "--partition-by",
            "hour(ts)",
            "--records",
            "10",
        ],
    );
    let message = text(&other);
    assert!(!other.status.success(), "{message}");
    assert!(
        message.contains("partitioned by day(ts)") && message.contains("hour(ts)"),
        "{message}"
    );
}

/// Partition fields that do not read or do not fit the demo's columns are
/// refused before anything is written, naming the field.
#[test]
fn a_partition_spec_that_does_not_read_or_fit_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    for (spec, named) in [
        ("week(ts)", "\"week(ts)\" is not a partition field"),
        ("bucket(id)", "is not a partition field"),
        ("day(id)", "day(id)"),
        ("day(missing)", "day(missing)"),
    ] {
        let refused = demo(&warehouse, &["--partition-by", spec, "--records", "10"]);
        let message = text(&refused);
        assert!(!refused.status.success(), "{spec}: {message}");
        assert!(message.contains(named), "{spec}: {message}");
    }
    assert!(
        !warehouse.join("demo").join("events").join("data").exists(),
        "a refused spec wrote data"
    );
}

/// The table's spec changed (PyIceberg adds `day(ts)` to an unpartitioned
/// table) while the job runs: the job's files of the checkpoints after the
/// change are partitioned by day, each holding its day, those before are
/// not, and every row is in the table once. The job runs slowly until the
/// table shows a file of the new spec (so that the running job, not a new
/// start, wrote it), is then killed, and run again to its end.
#[test]
fn a_spec_changed_while_the_job_runs_is_written_from_the_next_checkpoint() {
    if sink_testkit::servers::iceberg_reader().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let created = summary(&demo(&warehouse, &["--records", "0", "--json"]));
    assert_eq!(created["status"], "Finished", "{created}");
    let state = dir.path().join("state");
    let args = |rate: &'static str| {
        let mut args = vec![
            "--state".to_string(),
            state.to_str().expect("a UTF-8 path").to_string(),
            "--records".to_string(),
            "300000".to_string(),
            "--checkpoint-interval".to_string(),
            "200ms".to_string(),
            "--json".to_string(),
        ];
        if !rate.is_empty() {
            args.extend(["--rate".to_string(), rate.to_string()]);
        }
        args
    };
    let mut job = Command::new(env!("CARGO_BIN_EXE_iceberg-sink-demo"))
        .arg("--warehouse")
        .arg(&warehouse)
        .args(args("10000"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo starts");
    std::thread::sleep(Duration::from_millis(500));
    let evolved = read(&warehouse, &["--evolve-spec", "day(ts)"]).expect("the reader");
    // Until the running job appended a file of the new spec.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let catalog =
        sinks_iceberg::SqliteCatalog::new(&warehouse.join("catalog.db"), &warehouse).unwrap();
    let ident = sinks_iceberg::parse_table_name("demo.events").unwrap();
    let mut waited = 0;
    loop {
        let partitioned = runtime.block_on(async {
            let opened = catalog.open().await.unwrap();
            let table = sinks_iceberg::read::table(opened.as_ref(), &ident)
                .await
                .unwrap()
                .expect("the table");
            let files = sinks_iceberg::read::live_files(&table).await.unwrap();
            files.iter().any(|path| path.contains("/ts_day="))
        });
        if partitioned {
            break;
        }
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before it wrote a file of the new spec"
        );
        assert!(waited < 600, "no file of the new spec after 60 s");
        waited += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    job.kill().unwrap(); // SIGKILL
    job.wait().unwrap();
    let report = summary(&demo(
        &warehouse,
        &args("").iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert_eq!(report["status"], "Finished", "{report}");
    let whole = read(&warehouse, &[]).expect("the reader");
    println!(
        "the spec changed mid-run ({} conflicts): {} rows, files by spec: {:?}",
        evolved["spec_conflicts"],
        whole["rows"],
        whole["files"].as_array().map(|files| files
            .iter()
            .map(|f| f["spec_id"].clone())
            .collect::<Vec<_>>())
    );
    assert_eq!(
        (whole["rows"].as_u64(), whole["distinct_ids"].as_u64()),
        (Some(300_000), Some(300_000)),
        "{whole}"
    );
    let files = whole["files"].as_array().expect("the live files");
    assert!(
        files.iter().any(|file| file["spec_id"] == 0),
        "the job wrote nothing before the change: {whole}"
    );
    assert_each_file_holds_its_day(&whole, 1);
}
