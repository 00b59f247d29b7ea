//! The benchmarks run as a user runs them, at a small scale: each reports
//! every figure (smoke runs; no timing is asserted).

use std::process::{Command, Output};

/// The last line of a successful run's stdout, as JSON.
fn summary(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a line of output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
}

/// The benchmark runs end to end at a small scale and reports every figure
/// (a smoke run: no timing is asserted).
#[test]
fn the_benchmark_smoke_run_reports_every_figure() {
    let output = Command::new(env!("CARGO_BIN_EXE_sink-bench"))
        .args(["--scale", "0.002", "--json"])
        .output()
        .expect("the benchmark runs");
    let report = summary(&output);
    for path in [
        ["runtime_overhead", "ratio"],
        ["runtime_overhead", "job_records_per_s"],
        ["file_sink", "ratio"],
        ["file_sink", "job_bytes_per_s"],
        ["checkpoint_cost", "ratio"],
        ["parquet", "ratio"],
        ["parquet", "ratio_to_arrow_builders"],
        ["parquet", "peak_rss_mib"],
    ] {
        let value = report[path[0]][path[1]].as_f64();
        assert!(
            value.is_some_and(|v| v.is_finite() && v > 0.0),
            "{path:?}: {report}"
        );
    }
    // The runtime's cost per batch is a difference of two timings: finite,
    // of either sign in a run this small.
    for path in [
        ["runtime_overhead", "runtime_ns_per_batch"],
        ["runtime_overhead", "job_startup_ms"],
        ["runtime_overhead", "job_total_seconds"],
    ] {
        let value = report[path[0]][path[1]].as_f64();
        assert!(value.is_some_and(f64::is_finite), "{path:?}: {report}");
    }
    assert!(
        report["peak_rss_mib"].as_f64().is_some_and(|v| v > 0.0),
        "{report}"
    );
    assert!(
        report["startup_to_first_record_ms"].as_f64().is_some(),
        "{report}"
    );
}
