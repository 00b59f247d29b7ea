//! The PostgreSQL sink demo against a real server (`scripts/with-postgres`
//! provides `PG_TEST_URL`; `cargo test -p examples --features
//! postgres-tests --test postgres_sink_demo`): its `--json` summary, and a
//! run killed with SIGKILL and started again that leaves every row once.

use crate::output::summary;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The test server (`scripts/with-postgres` sets `PG_TEST_URL`).
pub fn url() -> String {
    std::env::var("PG_TEST_URL").unwrap_or_else(|_| {
        panic!(
            "PG_TEST_URL is not set: run through scripts/with-postgres (./scripts/test-all does)"
        )
    })
}

fn demo(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_postgres-sink-demo"));
    command
        .args(["--url", &url()])
        .args(args)
        .env("RUST_LOG", "warn");
    command
}

/// Rows in `table` now, counted with SQL (0 while the table is missing).
fn committed_rows(table: &str) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
            .await
            .expect("connecting to the test server");
        tokio::spawn(connection);
        client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .map_or(0, |row| row.get(0))
    })
}

#[test]
fn the_json_summary_has_the_file_demos_fields_and_counts_rows_with_sql() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let output = demo(&[
        "--table",
        "demo_json",
        "--records",
        "5000",
        "--json",
        "--fresh",
    ])
    .arg("--state-dir")
    .arg(&state_dir)
    .output()
    .unwrap();
    let json = summary(&output);
    for field in [
        "mode",
        "status",
        "records",
        "parallelism",
        "written",
        "committed",
        "prepare_commit_calls",
        "commit_calls",
        "checkpoints_completed",
        "wall_s",
        "records_per_s",
    ] {
        assert!(json.get(field).is_some(), "{field} missing: {json}");
    }
    assert_eq!(json["status"], "Finished");
    assert_eq!(json["written"], 5000);
    assert_eq!(json["committed"], 5000);
    assert!(
        json["transactions_committed"].as_u64().unwrap_or(0) >= 2,
        "{json}"
    );
}

#[test]
fn killed_and_started_again_it_leaves_every_row_once() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    let args = [
        "--table",
        "demo_kill",
        "--records",
        "20000",
        "--rate",
        "5000",
        "--checkpoint-interval",
        "100ms",
        "--json",
    ];
    // First run: killed after about a second, mid-way.
    let mut first = demo(&args)
        .arg("--fresh")
        .arg("--state-dir")
        .arg(&state_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once some rows are committed (so the second run has a
    // checkpoint to resume from), long before the last.
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed_rows("demo_kill") == 0 {
        assert!(
            Instant::now() < deadline,
            "the first run committed nothing in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    // Second run on the same state: resumes, and the demo itself refuses to
    // report success if any id is in the table twice.
    let started = Instant::now();
    let output = demo(&args)
        .arg("--state-dir")
        .arg(&state_dir)
        .output()
        .unwrap();
    let json = summary(&output);
    assert_eq!(json["committed"], 20000, "{json}");
    assert!(
        json["written"].as_u64().unwrap_or(u64::MAX) < 20000,
        "the second run started over instead of resuming: {json}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
