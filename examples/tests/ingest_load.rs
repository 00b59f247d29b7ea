//! A smoke run of the load test: small, so it checks that the tool works
//! and that what it reports holds together, not how fast anything is.

use std::process::Command;

#[test]
fn a_small_load_run_reports_rates_and_latencies_and_finds_every_event_once() {
    let output = Command::new(env!("CARGO_BIN_EXE_ingest-load"))
        .args(["--requests", "300", "--concurrency", "8", "--events", "5"])
        .args([
            "--checkpoint-interval",
            "50ms",
            "--max-duration",
            "60s",
            "--json",
        ])
        .args(["--service", env!("CARGO_BIN_EXE_ingest-service")])
        .env("RUST_LOG", "warn")
        .output()
        .expect("ingest-load runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ingest-load failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).expect("one JSON object on stdout");
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
