//! The Delta sink demo, run as a user would run it: the write-up's table
//! with Delta commits, and kill -9 and resume, the table read back by a
//! reader no one here wrote (the `deltalake` Python package, through
//! `scripts/with-delta-reader`, which the README's test command uses).
//!
//! Without the reader (`DELTA_READER` unset) the kill test reads the table
//! with this project's reader and says the external one was skipped; the
//! test command's stage fails on that word.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::output::{summary, text};

fn demo(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_delta-sink-demo"))
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("the demo runs")
}

/// The table read by the `deltalake` Python package, or `None` (with the
/// reason printed) without it.
fn external_read(table: &Path) -> Option<serde_json::Value> {
    let reader = sink_testkit::servers::delta_reader()?;
    let output = Command::new(&reader[0])
        .args(&reader[1..])
        .arg(table)
        .output()
        .expect("the reader runs");
    Some(summary(&output))
}

#[test]
fn the_three_presets_give_the_write_ups_table_with_delta_commits() {
    let dir = tempfile::tempdir().unwrap();

    let unbounded = summary(&demo(
        &dir.path().join("a"),
        &["--preset", "unbounded", "--run-for", "3s", "--json"],
    ));
    assert_eq!(unbounded["written"], 160);
    assert_eq!(unbounded["committed"], 160, "{unbounded}");
    assert_eq!(unbounded["distinct_ids"], 160, "{unbounded}");
    assert!(
        unbounded["delta_commits"].as_u64().unwrap() >= 1,
        "{unbounded}"
    );

    let refused = demo(
        &dir.path().join("b"),
        &["--preset", "unbounded-nockpt", "--run-for", "1s"],
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("Enable checkpointing"),
        "{}",
        text(&refused)
    );

    let forced = summary(&demo(
        &dir.path().join("c"),
        &[
            "--preset",
            "unbounded-nockpt",
            "--allow-uncommitted",
            "--run-for",
            "2s",
            "--json",
        ],
    ));
    assert_eq!(forced["written"], 160);
    assert_eq!(forced["committed"], 0, "{forced}");
    assert_eq!(forced["delta_commits"], 0, "{forced}");

    let nockpt = summary(&demo(
        &dir.path().join("d"),
        &["--preset", "nockpt", "--json"],
    ));
    assert_eq!(nockpt["committed"], 160, "{nockpt}");
    assert_eq!(nockpt["prepare_commit_calls"], 2, "{nockpt}");
    assert_eq!(
        nockpt["delta_commits"], 1,
        "one transaction at end of input: {nockpt}"
    );
}

#[test]
fn with_no_flags_it_prints_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let output = demo(dir.path(), &[]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("delta commits"), "{out}");
    for row in [
        "unbounded ",
        "unbounded-nockpt ",
        "unbounded-nockpt (forced)",
        "nockpt ",
    ] {
        assert!(out.contains(row), "{row} missing: {out}");
    }
    assert!(out.contains("refused"), "{out}");
}

/// Logging at INFO, a first start on a new table and a second on the same
/// table say nothing from delta-rs or its kernel (their INFO output is
/// whole snapshots), and no ERROR: the kernel's "No files in log segment"
/// for the new table's empty log was a false alarm. Named in `RUST_LOG`,
/// the kernel's INFO shows.
#[test]
fn at_info_a_new_table_logs_no_delta_rs_dumps_and_no_false_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = |log: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_delta-sink-demo"))
            .env("RUST_LOG", log)
            .arg("--out")
            .arg(dir.path().join("table"))
            .args([
                "--records",
                "500",
                "--checkpoint-interval",
                "50ms",
                "--json",
            ])
            .output()
            .expect("the demo runs");
        // The second start finds the job finished and reads the table.
        let made = summary(&output);
        assert!(
            made["status"] == "Finished" || made["status"] == "AlreadyFinished",
            "{made}"
        );
        assert_eq!(made["table_rows"], 500, "{made}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    for start in ["new table", "existing table"] {
        let stderr = run("info");
        assert!(!stderr.contains("ERROR"), "{start}: {stderr}");
        for library in ["deltalake_core", "buoyant_kernel"] {
            assert!(!stderr.contains(library), "{start}: {stderr}");
        }
    }
    let named = run("warn,buoyant_kernel=info");
    assert!(named.contains("buoyant_kernel"), "{named}");
}

/// Kill -9 at random moments, then run to the end: every id once in the
/// table, as the `deltalake` Python package reads it, and its history one
/// streaming update per checkpoint, epochs increasing.
#[test]
fn killed_and_resumed_it_commits_every_row_once_as_an_external_reader_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("table");
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
    for attempt in 0..20 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_delta-sink-demo"))
            .arg("--out")
            .arg(&out)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts");
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
        break;
    }
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");

    let Some(read) = external_read(&out) else {
        return;
    };
    println!("the deltalake package read, after {kills} kills: {read}");
    assert_eq!(read["rows"], 300_000, "seed {seed}: {read}");
    assert_eq!(read["distinct_ids"], 300_000, "seed {seed}: {read}");
    let history = read["history"].as_array().expect("a history");
    let epochs: Vec<i64> = history
        .iter()
        .filter(|e| e["operation"] == "STREAMING UPDATE")
        .filter(|e| {
            // The end of input and each start's claim of the table are
            // streaming updates of their own application ids.
            let query = e["query"].as_str().unwrap_or_default();
            !query.ends_with("/end-of-input") && !query.ends_with("/owner")
        })
        .map(|e| e["epoch"].as_i64().expect("an epoch"))
        .collect();
    assert!(epochs.len() >= 3, "several checkpoints: {read}");
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "one commit per checkpoint, in order, none repeated: {epochs:?}"
    );
}

/// The demo with its table and checkpoints on the S3-compatible test
/// server (`scripts/with-s3`): killed once, resumed, every id once as the
/// `deltalake` package reads the table on the server.
#[test]
fn on_s3_killed_and_resumed_it_commits_every_row_once() {
    let Some(s3) = sink_testkit::servers::s3() else {
        return;
    };
    let (endpoint, bucket) = (s3.endpoint, s3.bucket);
    let prefix = format!("s3://{bucket}/delta-demo-{}", fastrand::u64(..));
    let table = format!("{prefix}/table");
    let args = [
        "--out",
        table.as_str(),
        "--state",
        &format!("{prefix}/state"),
        "--endpoint",
        endpoint.as_str(),
        "--records",
        "60000",
        "--rate",
        "20000",
        "--checkpoint-interval",
        "200ms",
        "--json",
    ];
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_delta-sink-demo"))
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
    let Some(reader) = sink_testkit::servers::delta_reader() else {
        return;
    };
    let read = summary(
        &Command::new(&reader[0])
            .args(&reader[1..])
            .arg(&table)
            .output()
            .expect("the reader runs"),
    );
    println!("the deltalake package read the table on S3 (killed: {killed}): {read}");
    assert_eq!(read["rows"], 60_000, "{read}");
    assert_eq!(read["distinct_ids"], 60_000, "{read}");
}

/// Two jobs writing one table (two state directories, so two lineages):
/// each reports the rows it committed, not the table's, and leaves out the
/// ids check that the other job's ids would fail. It used to report every
/// row of the table, or stop on the "duplicates" of the other job.
#[test]
fn a_table_shared_with_another_job_counts_only_this_jobs_rows() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("shared");
    let run = |state: &str, records: &str| {
        let state = dir.path().join(state);
        let state = state.to_str().expect("a UTF-8 path");
        summary(&demo(
            &table,
            &[
                "--state",
                state,
                "--records",
                records,
                "--checkpoint-interval",
                "200ms",
                "--json",
            ],
        ))
    };
    let first = run("first-state", "500");
    assert_eq!(first["committed"], 500, "{first}");
    assert_eq!(first["table_rows"], 500, "{first}");
    assert_eq!(first["distinct_ids"], 500, "{first}");
    let second = run("second-state", "300");
    assert_eq!(second["status"], "Finished", "{second}");
    assert_eq!(second["committed"], 300, "{second}");
    assert_eq!(second["table_rows"], 800, "{second}");
    assert!(second["distinct_ids"].is_null(), "{second}");
}
