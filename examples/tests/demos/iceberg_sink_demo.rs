//! The Iceberg sink demo, run as a user would run it: kill -9 and resume,
//! two jobs writing one table at once, and bad flags; each table read back
//! by a reader no one here wrote (PyIceberg, through
//! `scripts/with-iceberg-reader`, which the README's test command uses).
//!
//! Without the reader (`ICEBERG_READER` unset) the tests read the table
//! with this project's reader and say the external one was skipped; the
//! test command's stage fails on that word.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use sinks_iceberg::iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

use crate::output::{summary, text};

/// The demo on the warehouse `warehouse` (its catalog database in it).
fn command(warehouse: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_iceberg-sink-demo"));
    command.arg("--warehouse").arg(warehouse).args(args);
    command
}

fn demo(warehouse: &Path, args: &[&str]) -> Output {
    command(warehouse, args).output().expect("the demo runs")
}

fn spawn(warehouse: &Path, args: &[&str]) -> Child {
    command(warehouse, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo starts")
}

/// The table `demo.events` of the warehouse's catalog, read by PyIceberg,
/// or `None` (with the reason printed) without it.
fn external_read(warehouse: &Path) -> Option<serde_json::Value> {
    let reader = sink_testkit::servers::iceberg_reader()?;
    let output = Command::new(&reader[0])
        .args(&reader[1..])
        .arg(warehouse.join("catalog.db"))
        .arg(warehouse)
        .arg("demo.events")
        .output()
        .expect("the reader runs");
    Some(summary(&output))
}

/// The snapshots of `read` that added rows, as (lineage, checkpoint,
/// rows).
fn appends(read: &serde_json::Value) -> Vec<(String, u64, u64)> {
    read["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter(|s| s["added_files"].as_u64().unwrap_or(0) > 0)
        .map(|s| {
            (
                s["lineage"]
                    .as_str()
                    .expect("the sink's lineage")
                    .to_string(),
                s["checkpoint"].as_u64().expect("the sink's checkpoint"),
                s["added_records"].as_u64().expect("rows added"),
            )
        })
        .collect()
}

/// Kill -9 at random moments, then run to the end: every id once in the
/// table as PyIceberg reads it, and at most one snapshot adding rows per
/// checkpoint, in checkpoint order.
#[test]
fn killed_and_resumed_it_commits_every_row_once_as_pyiceberg_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let args = [
        "--records",
        "300000",
        "--rate",
        "60000",
        "--checkpoint-interval",
        "200ms",
        "--json",
    ];
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    let mut last = None;
    for attempt in 0..20 {
        let mut child = spawn(&warehouse, &args);
        if attempt < 4 {
            std::thread::sleep(Duration::from_millis(rng.u64(300..1_500)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let report = summary(&child.wait_with_output().unwrap());
        let finished_before = kills > 0 && report["status"] == "AlreadyFinished";
        assert!(
            report["status"] == "Finished" || finished_before,
            "seed {seed}: {report}"
        );
        assert_eq!(report["committed"], 300_000, "seed {seed}: {report}");
        assert_eq!(report["distinct_ids"], 300_000, "seed {seed}: {report}");
        assert_eq!(
            report["checkpoints_appended_twice"], 0,
            "seed {seed}: {report}"
        );
        last = Some(report);
        break;
    }
    let last = last.expect("the demo finished");
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");

    let Some(read) = external_read(&warehouse) else {
        return;
    };
    println!(
        "PyIceberg read, after {kills} kills: {} rows, {} distinct ids, {} snapshots",
        read["rows"],
        read["distinct_ids"],
        read["snapshots"].as_array().map_or(0, Vec::len)
    );
    assert_eq!(read["rows"], 300_000, "seed {seed}: {read}");
    assert_eq!(read["distinct_ids"], 300_000, "seed {seed}: {read}");
    let appends = appends(&read);
    let checkpoints: Vec<u64> = appends.iter().map(|(_, c, _)| *c).collect();
    assert!(checkpoints.len() >= 3, "several checkpoints: {read}");
    assert!(
        checkpoints.windows(2).all(|w| w[0] < w[1]),
        "at most one snapshot adding rows per checkpoint, in order: {checkpoints:?}"
    );
    assert!(
        appends.iter().all(|(lineage, _, _)| Some(lineage.as_str())
            == last["lineage"]
                .as_str()
                .map(|l| format!("iceberg-sink-demo/{l}"))
                .as_deref()),
        "one lineage through every kill: {read}"
    );
    assert_eq!(
        appends.iter().map(|(_, _, rows)| rows).sum::<u64>(),
        300_000,
        "{read}"
    );
}

/// The demo with its table and checkpoints on the S3-compatible test
/// server (`scripts/with-s3`), its catalog database local: killed once,
/// resumed, every id once as PyIceberg reads the table on the server.
#[test]
fn on_s3_killed_and_resumed_it_commits_every_row_once_as_pyiceberg_reads_it() {
    let Some(s3) = sink_testkit::servers::s3() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let warehouse = format!("s3://{}/iceberg-demo-{}", s3.bucket, fastrand::u64(..));
    let catalog = dir.path().join("catalog.db");
    let catalog_flag = format!("sqlite:{}", catalog.display());
    let args = [
        "--warehouse",
        warehouse.as_str(),
        "--catalog",
        catalog_flag.as_str(),
        "--endpoint",
        s3.endpoint.as_str(),
        "--records",
        "60000",
        "--rate",
        "20000",
        "--checkpoint-interval",
        "200ms",
        "--json",
    ];
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_iceberg-sink-demo"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts")
    };
    let mut child = run();
    std::thread::sleep(Duration::from_millis(900));
    let killed = child.try_wait().unwrap().is_none();
    if killed {
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let report = summary(&run().wait_with_output().unwrap());
    assert!(
        report["status"] == "Finished" || report["status"] == "AlreadyFinished",
        "{report}"
    );
    assert_eq!(report["committed"], 60_000, "{report}");
    assert_eq!(report["distinct_ids"], 60_000, "{report}");
    assert_eq!(report["checkpoints_appended_twice"], 0, "{report}");
    let Some(reader) = sink_testkit::servers::iceberg_reader() else {
        return;
    };
    let read = summary(
        &Command::new(&reader[0])
            .args(&reader[1..])
            .arg(&catalog)
            .arg(&warehouse)
            .arg("demo.events")
            .output()
            .expect("the reader runs"),
    );
    println!(
        "PyIceberg read the table on S3 (killed: {killed}): {} rows, {} distinct ids",
        read["rows"], read["distinct_ids"]
    );
    assert_eq!(read["rows"], 60_000, "{read}");
    assert_eq!(read["distinct_ids"], 60_000, "{read}");
}

/// Two jobs (each its own checkpoints) append to one table at the same
/// time, their commits racing for the catalog's compare-and-swap: every row
/// of both once.
#[test]
fn two_jobs_writing_one_table_at_once_write_every_row_of_both_once() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    // The table and its namespace exist before the race.
    let created = summary(&demo(&warehouse, &["--records", "0", "--json"]));
    assert_eq!(created["table_rows"], 0, "{created}");
    let job = |state: &str, first_id: &str| {
        let state = dir.path().join(state);
        let state = state.to_str().expect("a UTF-8 path").to_string();
        let args = [
            "--state",
            &state,
            "--first-id",
            first_id,
            "--records",
            "100000",
            "--rate",
            "25000",
            "--checkpoint-interval",
            "100ms",
            "--json",
        ];
        spawn(&warehouse, &args)
    };
    let (a, b) = (job("state-a", "1000000"), job("state-b", "2000000"));
    for child in [a, b] {
        let report = summary(&child.wait_with_output().unwrap());
        assert_eq!(report["status"], "Finished", "{report}");
        assert_eq!(report["committed"], 100_000, "{report}");
        assert_eq!(report["checkpoints_appended_twice"], 0, "{report}");
        assert!(report["iceberg_appends"].as_u64().unwrap() >= 5, "{report}");
    }
    let Some(read) = external_read(&warehouse) else {
        return;
    };
    println!(
        "PyIceberg read two jobs' table: {} rows, {} distinct ids, {} snapshots",
        read["rows"],
        read["distinct_ids"],
        read["snapshots"].as_array().map_or(0, Vec::len)
    );
    assert_eq!(read["rows"], 200_000, "{read}");
    assert_eq!(read["distinct_ids"], 200_000, "{read}");
    assert_eq!(
        (read["min_id"].as_u64(), read["max_id"].as_u64()),
        (Some(1_000_000), Some(2_099_999))
    );
    let lineages: std::collections::BTreeSet<String> = appends(&read)
        .into_iter()
        .map(|(lineage, _, _)| lineage)
        .collect();
    assert_eq!(lineages.len(), 2, "{read}");
}

/// Bad flags and a table the sink cannot write are refused with a message
/// that names the fix, and write nothing.
#[test]
fn bad_flags_and_a_table_of_another_schema_are_refused_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    for (args, expected) in [
        (vec!["--table", "events"], "NAMESPACE.NAME"),
        (vec!["--catalog", "postgres://x"], "sqlite:PATH"),
        (vec!["--out", "x"], "not --out"),
    ] {
        let output = demo(&warehouse, &args);
        assert!(!output.status.success(), "{args:?}");
        assert!(
            text(&output).contains(expected),
            "{args:?}: {}",
            text(&output)
        );
    }
    // The catalog's database cannot be made: a directory is at its path.
    std::fs::create_dir_all(dir.path().join("a-directory")).unwrap();
    let catalog = format!("sqlite:{}", dir.path().join("a-directory").display());
    let unreachable = demo(&warehouse, &["--catalog", &catalog, "--records", "10"]);
    assert!(!unreachable.status.success());
    assert!(
        text(&unreachable).contains("preparing the catalog database"),
        "{}",
        text(&unreachable)
    );
    // A table of another schema at the name: refused naming both schemas,
    // and left as it was.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let catalog =
        sinks_iceberg::SqliteCatalog::new(&warehouse.join("catalog.db"), &warehouse).unwrap();
    let ident = sinks_iceberg::parse_table_name("demo.events").unwrap();
    let other = Schema::builder()
        .with_fields(vec![NestedField::required(
            1,
            "id",
            Type::Primitive(PrimitiveType::String),
        )
        .into()])
        .build()
        .unwrap();
    runtime.block_on(async {
        let opened = catalog.open().await.unwrap();
        sinks_iceberg::load_or_create(opened.as_ref(), &ident, &other, None)
            .await
            .unwrap();
    });
    let refused = demo(&warehouse, &["--records", "10", "--json"]);
    assert!(!refused.status.success());
    let message = text(&refused);
    assert!(
        message.contains("id string not null") && message.contains("id long not null"),
        "{message}"
    );
    assert!(message.contains("give another table"), "{message}");
}

/// `--fresh` clears only the named table's own place in the warehouse.
/// Refused, nothing deleted:
/// - a name with a level holding `/` (before: `ns/x.metadata` named the
///   metadata directory of the table `ns.x`, which `--fresh` emptied, and
///   an absolute namespace a directory outside the warehouse);
/// - a table inside another table's location (`ns.x.metadata`);
/// - a table whose location holds other tables (`ns.y`, with `ns.y.t`).
///
/// The tables `ns.x` and `ns.y.t` then read whole.
#[test]
fn fresh_clears_only_the_named_tables_own_place() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    for (table, records) in [("ns.x", "300"), ("ns.y.t", "20")] {
        let made = demo(
            &warehouse,
            &["--table", table, "--records", records, "--json"],
        );
        assert_eq!(summary(&made)["status"], "Finished", "{table}");
    }
    let metadata = warehouse.join("ns").join("x").join("metadata");
    let files = |dir: &Path| std::fs::read_dir(dir).map_or(0, |d| d.count());
    let before = files(&metadata);
    assert!(before > 0, "the table ns.x has no metadata files");
    let outside = dir.path().join("outside");
    let absolute = format!("{}.t", outside.display());
    for (table, expected) in [
        ("ns/x.metadata", "not an Iceberg name level"),
        (absolute.as_str(), "not an Iceberg name level"),
        ("ns.x.metadata", "inside the table ns.x's"),
        ("ns.y", "holds the namespace ns.y"),
    ] {
        let refused = demo(
            &warehouse,
            &["--table", table, "--fresh", "--records", "10"],
        );
        assert!(!refused.status.success(), "{table}: {}", text(&refused));
        assert!(
            text(&refused).contains(expected),
            "{table}: {}",
            text(&refused)
        );
        assert_eq!(
            files(&metadata),
            before,
            "--table {table} --fresh touched ns.x"
        );
        assert!(
            !outside.exists(),
            "--table {table} --fresh wrote outside the warehouse"
        );
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let catalog =
        sinks_iceberg::SqliteCatalog::new(&warehouse.join("catalog.db"), &warehouse).unwrap();
    runtime.block_on(async {
        let opened = catalog.open().await.unwrap();
        for (table, count) in [("ns.x", 300), ("ns.y.t", 20)] {
            let ident = sinks_iceberg::parse_table_name(table).unwrap();
            let read = sinks_iceberg::read::table(opened.as_ref(), &ident)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("the table {table} is gone"));
            let mut ids = sinks_iceberg::read::int64_column(&read, "id")
                .await
                .unwrap();
            ids.sort_unstable();
            assert_eq!(ids, (0..count).collect::<Vec<i64>>(), "{table}");
        }
    });
}

/// The demo's end check reads the table's rows, not the job's snapshots:
/// after table maintenance (PyIceberg) expired every snapshot but the
/// current one, the finished job's command run again exits 0, saying it
/// has finished. Before, it exited 1, counting the rows of the job's
/// snapshots that were left.
#[test]
fn after_its_snapshots_expired_the_finished_demo_still_checks_out() {
    let Some(reader) = sink_testkit::servers::iceberg_reader() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    // At 1000 records a second per subtask the run takes 1.5 s: many
    // checkpoints commit before the end, however loaded the machine. As
    // fast as it can go, the job once ended in 0.3 s with one checkpoint
    // before its last, which found nothing to commit (one snapshot).
    let args = [
        "--records",
        "3000",
        "--rate",
        "1000",
        "--checkpoint-interval",
        "20ms",
        "--json",
    ];
    let made = summary(&demo(&warehouse, &args));
    assert_eq!(made["status"], "Finished", "{made}");
    assert!(made["iceberg_appends"].as_u64() > Some(1), "{made}");
    let expired = Command::new(&reader[0])
        .args(&reader[1..])
        .arg(warehouse.join("catalog.db"))
        .arg(&warehouse)
        .arg("demo.events")
        .arg("--expire-snapshots")
        .output()
        .expect("the reader runs");
    let read = summary(&expired);
    assert_eq!(
        read["snapshots"].as_array().map(Vec::len),
        Some(1),
        "{read}"
    );
    assert_eq!(
        (read["rows"].as_u64(), read["distinct_ids"].as_u64()),
        (Some(3000), Some(3000))
    );
    let again = demo(&warehouse, &args);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("finished already"),
        "{}",
        text(&again)
    );
}

/// `--commit-every 10` with 100 ms checkpoints: the table gains one
/// snapshot per ten checkpoints (and one at the end), not one per
/// checkpoint; killed at random and resumed on that schedule, every id is
/// in the table once.
#[test]
fn committing_every_ten_checkpoints_makes_a_snapshot_per_ten_and_a_kill_loop_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let scheduled = [
        "--commit-every",
        "10",
        "--checkpoint-interval",
        "100ms",
        "--json",
    ];
    let steady: Vec<&str> = ["--records", "200000", "--rate", "20000"]
        .into_iter()
        .chain(scheduled)
        .collect();
    let report = summary(&demo(&warehouse, &steady));
    assert_eq!(report["status"], "Finished", "{report}");
    assert_eq!(report["distinct_ids"], 200_000, "{report}");
    let checkpoints = report["checkpoints_completed"].as_u64().unwrap();
    let appends = report["iceberg_appends"].as_u64().unwrap();
    println!("--commit-every 10: {checkpoints} checkpoints, {appends} appends");
    assert!(checkpoints >= 20, "{report}");
    assert!(
        appends >= 2 && appends <= checkpoints / 10 + 1,
        "{appends} appends for {checkpoints} checkpoints: {report}"
    );

    let killed = dir.path().join("killed");
    let looped: Vec<&str> = ["--records", "200000", "--rate", "50000"]
        .into_iter()
        .chain(scheduled)
        .collect();
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    for attempt in 0..20 {
        let mut child = spawn(&killed, &looped);
        if attempt < 4 {
            std::thread::sleep(Duration::from_millis(rng.u64(300..2_000)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let report = summary(&child.wait_with_output().unwrap());
        assert!(
            report["status"] == "Finished" || (kills > 0 && report["status"] == "AlreadyFinished"),
            "seed {seed}: {report}"
        );
        assert_eq!(report["distinct_ids"], 200_000, "seed {seed}: {report}");
        assert_eq!(report["table_rows"], 200_000, "seed {seed}: {report}");
        assert_eq!(
            report["checkpoints_appended_twice"], 0,
            "seed {seed}: {report}"
        );
        assert!(kills >= 1, "seed {seed}: the demo finished before any kill");
        return;
    }
    panic!("seed {seed}: the demo never finished");
}
