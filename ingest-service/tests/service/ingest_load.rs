//! A smoke run of the load test: small, so it checks that the tool works
//! and that what it reports holds together, not how fast anything is.

use std::process::Command;

/// Runs ingest-load with `args` against this build's service (and
/// baseline) and returns its JSON report; fails the test, with what it
/// printed, when it fails.
fn run(args: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_ingest-load"))
        .args(args)
        .args(["--json", "--service", env!("CARGO_BIN_EXE_ingest-service")])
        .args(["--baseline-binary", env!("CARGO_BIN_EXE_ingest-baseline")])
        .env("RUST_LOG", "warn")
        .output()
        .expect("ingest-load runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ingest-load failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON object on stdout")
}

#[test]
fn a_small_load_run_reports_rates_and_latencies_and_finds_every_event_once() {
    let report = run(&[
        "--requests",
        "300",
        "--concurrency",
        "8",
        "--events",
        "5",
        "--checkpoint-interval",
        "50ms",
        "--max-duration",
        "60s",
    ]);
    assert_eq!(report["requests_acknowledged"], 300);
    assert_eq!(report["output_events"], 1500);
    assert_eq!(report["exactly_once"], true);
    let latency = &report["latency_ms"];
    let (p50, p99, max) = (
        latency["p50"].as_f64().unwrap_or(-1.0),
        latency["p99"].as_f64().unwrap_or(-1.0),
        latency["max"].as_f64().unwrap_or(-1.0),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{latency}");
    assert!(report["requests_per_second"].as_f64().unwrap_or(0.0) > 0.0);
}

/// `--tls`: the service over HTTPS with a token, its certificate from a CA
/// made for the run, the clients trusting that CA only; every event once,
/// and the target says so.
#[test]
fn a_small_load_run_over_https_with_a_token_finds_every_event_once() {
    let report = run(&[
        "--requests",
        "200",
        "--concurrency",
        "4",
        "--events",
        "3",
        "--checkpoint-interval",
        "on-demand",
        "--tls",
    ]);
    assert_eq!(report["requests_acknowledged"], 200);
    assert_eq!(report["output_events"], 600);
    assert_eq!(report["exactly_once"], true);
    let target = report["target"].as_str().unwrap_or_default();
    assert!(target.contains("HTTPS + token"), "{target}");
}

/// `--compare` against the test server (`scripts/with-postgres`): every
/// target (files at an interval and on demand, PostgreSQL on demand, the
/// baseline) is loaded with the same client, its output counted, and the
/// report says what each committed. Asserts no timing.
#[test]
fn a_small_comparison_runs_every_target_and_finds_every_event_once() {
    let Some(url) = sink_testkit::servers::postgres() else {
        return;
    };
    let report = run(&[
        "--compare",
        "--concurrency",
        "2,4",
        "--requests",
        "60",
        "--events",
        "3",
        "--checkpoint-interval",
        "50ms",
        "--url",
        &url,
    ]);
    let runs = report["runs"].as_array().expect("a list of runs");
    assert_eq!(runs.len(), 10, "5 targets at 2 concurrencies: {report}");
    for run in runs {
        assert_eq!(run["requests_acknowledged"], 60, "{run}");
        assert_eq!(run["output_events"], 180, "{run}");
        assert_eq!(run["exactly_once"], true, "{run}");
        assert!(run["commits"].as_u64().unwrap_or(0) > 0, "{run}");
    }
    let targets: Vec<&str> = runs[..5]
        .iter()
        .map(|run| run["target"].as_str().unwrap_or_default())
        .collect();
    assert!(
        targets[0].contains("files") && targets[0].contains("50ms"),
        "{targets:?}"
    );
    assert!(
        targets[1].contains("files") && targets[1].contains("on-demand"),
        "{targets:?}"
    );
    assert!(targets[2].contains("compaction"), "{targets:?}");
    assert!(targets[3].contains("postgres"), "{targets:?}");
    assert!(targets[4].contains("baseline"), "{targets:?}");
    assert_eq!(
        runs[4]["commits"], 60,
        "one transaction per request: {report}"
    );
    // Compacted at the end: one file for the whole (short) run.
    assert_eq!(runs[2]["finished_files"], 1, "{report}");
    assert!(report["postgres"]["fsync"].is_string(), "{report}");
}
