//! `file-sink-demo --format parquet --bucket-by event-hour` killed with
//! SIGKILL and run again until it finishes, on local files and on the
//! S3-compatible server (`scripts/with-seaweedfs`), its output then read by
//! two Parquet readers no one here wrote: pyarrow's dataset reader and
//! DuckDB (`scripts/with-parquet-reader`, which the README's test command
//! uses), with Hive partitioning. Every id is there once, and each row's
//! `dt` and `hour` directories are those of its `ts`.
//!
//! Without the readers (`PARQUET_READER` unset) the tests say "skipped: no
//! Parquet reader" and pass; the test command fails on those words.

use std::process::Command;

use crate::output::killed_until_finished;

/// The readers' command, split into program and arguments.
fn reader() -> Option<Vec<String>> {
    let command = std::env::var("PARQUET_READER").ok()?;
    Some(command.split_whitespace().map(str::to_string).collect())
}

/// Reads `out` with both readers (AWS_* variables from `env` for S3) and
/// fails unless each saw ids 0..records once, each in its own hour.
fn check_with_readers(reader: &[String], out: &str, records: u64, env: &[(&str, &str)]) {
    let output = Command::new(&reader[0])
        .args(&reader[1..])
        .args([out, &records.to_string()])
        .envs(env.iter().copied())
        .output()
        .expect("the Parquet reader runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the readers of {out} found problems: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{out} as pyarrow and DuckDB read it: {stdout}");
}

/// The demo's arguments for `records` Parquet rows by event hour into `out`.
fn args<'a>(out: &'a str, records: &'a str) -> Vec<&'a str> {
    let flags = ["--format", "parquet", "--bucket-by", "event-hour"];
    let run = ["--records", records, "--rate", "40000", "--json"];
    let mut args = vec!["--out", out];
    args.extend(flags.into_iter().chain(run));
    args
}

#[test]
fn killed_and_resumed_parquet_by_event_hour_is_read_back_by_pyarrow_and_duckdb_each_id_once() {
    let Some(reader) = reader() else {
        println!("skipped: no Parquet reader (run under scripts/with-parquet-reader)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().expect("a UTF-8 path");
    let seed = fastrand::u64(..);
    let (kills, report) = killed_until_finished(
        env!("CARGO_BIN_EXE_file-sink-demo"),
        &args(out, "200000"),
        4,
        seed,
    );
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");
    println!("seed {seed}: {kills} kills, then {report}");
    check_with_readers(&reader, out, 200_000, &[]);
}

#[cfg(feature = "s3")]
#[test]
fn killed_and_resumed_parquet_by_event_hour_on_s3_is_read_back_by_pyarrow_and_duckdb_each_id_once()
{
    let Some(reader) = reader() else {
        println!("skipped: no Parquet reader (run under scripts/with-parquet-reader)");
        return;
    };
    let Some(s3) = sink_testkit::servers::s3() else {
        return;
    };
    let prefix = format!("parquet-{}", fastrand::u64(..));
    let out = format!("s3://{}/{prefix}", s3.bucket);
    let state = format!("s3://{}/{prefix}-state", s3.bucket);
    let mut args = args(&out, "100000");
    args.extend(["--state", &state, "--endpoint", &s3.endpoint]);
    let seed = fastrand::u64(..);
    let (kills, report) =
        killed_until_finished(env!("CARGO_BIN_EXE_file-sink-demo"), &args, 3, seed);
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");
    println!("seed {seed}: {kills} kills, then {report}");
    check_with_readers(
        &reader,
        &out,
        100_000,
        &[("AWS_ENDPOINT_URL", s3.endpoint.as_str())],
    );
}
