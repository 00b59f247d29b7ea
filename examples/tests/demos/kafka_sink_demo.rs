//! The Kafka sink demo against the test broker (`scripts/with-kafka`
//! provides `KAFKA_TEST_BROKERS`; `cargo test -p examples --features
//! kafka-pause-points --test demos kafka`): its `--json` summary, and runs
//! killed with SIGKILL, once between a checkpoint's completion and its
//! transaction's commit, then resumed: every record once in the
//! `read_committed` view, no transaction of the job left open.

use crate::kafka_topics::{brokers, unique};
use crate::output::summary;
use std::process::Command;

fn demo(topic: &str, state: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kafka-sink-demo"));
    command
        .args(["--brokers", &brokers(), "--topic", topic])
        .arg("--state")
        .arg(state)
        .args(args)
        .env("RUST_LOG", "warn");
    command
}

#[test]
fn the_json_summary_reads_the_topic_back_and_finds_no_transaction_open() {
    let state = tempfile::tempdir().unwrap();
    let topic = unique("demo-json");
    let output = demo(
        &topic,
        &state.path().join("state"),
        &[
            "--records",
            "5000",
            "--partitions",
            "3",
            "--checkpoint-interval",
            "100ms",
            "--json",
            "--fresh",
        ],
    )
    .output()
    .unwrap();
    let json = summary(&output);
    for field in [
        "status",
        "written",
        "committed",
        "prepare_commit_calls",
        "commit_calls",
        "checkpoints_completed",
        "transactions_committed",
        "open_transactions",
        "wall_s",
        "records_per_s",
        "peak_rss_bytes",
    ] {
        assert!(json.get(field).is_some(), "{field} missing: {json}");
    }
    assert_eq!(json["status"], "Finished");
    assert_eq!(json["committed"], 5000, "{json}");
    assert_eq!(json["partitions"], 3, "{json}");
    assert_eq!(json["open_transactions"], serde_json::json!([]), "{json}");
    assert_eq!(json["open_partitions"], serde_json::json!([]), "{json}");
}

/// Runs the demo until its stderr says it paused at `point`, then kills it
/// with SIGKILL there.
#[cfg(feature = "kafka-pause-points")]
fn kill_at(mut command: Command, point: &str) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = command
        .env("EO_PAUSE_AT", point)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let paused = line.starts_with("paused at");
            let _ = tx.send(line);
            if paused {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("paused at") => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("the demo never reached {point} within 60 s: {seen:?}");
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[cfg(feature = "kafka-pause-points")]
#[test]
fn killed_between_checkpoint_and_commit_and_at_random_it_writes_every_record_once() {
    use std::process::Stdio;
    use std::time::Duration;
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    let topic = unique("demo-kill");
    let records = 30_000;
    let args = [
        "--records",
        "30000",
        "--rate",
        "4000",
        "--partitions",
        "3",
        "--checkpoint-interval",
        "100ms",
        "--json",
    ];
    // Killed after a checkpoint completed and before its transaction's
    // commit: the next process commits it from the checkpoint (the source
    // resumes after that checkpoint, so an abort would lose its records).
    let mut first = demo(&topic, &state, &args);
    first.arg("--fresh");
    kill_at(first, "kafka-before-end-txn");
    // Then killed at random moments, each run resuming the last.
    let mut rng = fastrand::Rng::with_seed(34);
    for _ in 0..3 {
        let mut run = demo(&topic, &state, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.u64(300..1500)));
        run.kill().unwrap();
        run.wait().unwrap();
    }
    let output = demo(&topic, &state, &args).output().unwrap();
    let json = summary(&output);
    // The demo itself fails on an id seen twice.
    assert_eq!(json["committed"], records, "{json}");
    assert_eq!(json["open_transactions"], serde_json::json!([]), "{json}");
    assert_eq!(json["open_partitions"], serde_json::json!([]), "{json}");
    assert_eq!(json["losses"]["records_lost"], 0, "{json}");
    assert!(
        json["written"].as_u64().unwrap_or(u64::MAX) < records,
        "the last run started over instead of resuming: {json}"
    );
}
