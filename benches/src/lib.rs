//! What the benchmarks share: the figures they compute from their runs.
//!
//! Each benchmark is a binary (`src/bin/`) that measures a job of the SDK
//! and a plain baseline doing the same work in the same run, each in a child
//! process of its own, and reports their ratio: `sink-bench` (the runtime
//! and the file sink on local disk), `s3-bench` (the file sink on an
//! S3-compatible server), `delta-bench` (the Delta sink, `delta` feature), `iceberg-bench` (the
//! Iceberg sink, `iceberg` feature).

/// Peak resident set size of this process, in bytes (Linux; 0 elsewhere).
/// Read by the benchmarks at the end of a measurement.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// The median of `values` (sorted in place; NaN when empty). Used by the
/// benchmarks, which compare medians of alternating runs.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What a measurement's child process printed: its last line of stdout, as
/// JSON; an error with its stderr when it failed. Called by each
/// benchmark's parent on the `Output` of its child (this program run again
/// with `--child`).
pub fn measurement(what: &str, output: std::process::Output) -> anyhow::Result<serde_json::Value> {
    if !output.status.success() {
        anyhow::bail!(
            "the {what} measurement failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .map_err(|e| anyhow::anyhow!("reading the {what} measurement ({e}): {last}"))
}

/// The median over `runs` of `runs[i][amount] / runs[i]["seconds"]`: a
/// rate (records, rows or bytes per second) of alternating measurements.
pub fn median_rate(runs: &[serde_json::Value], amount: &str) -> f64 {
    let mut rates: Vec<f64> = runs
        .iter()
        .map(|v| v[amount].as_f64().unwrap_or(0.0) / v["seconds"].as_f64().unwrap_or(f64::NAN))
        .collect();
    median(&mut rates)
}

/// The highest `peak_rss_bytes` over `runs`, in MiB.
pub fn peak_rss_mib(runs: &[serde_json::Value]) -> f64 {
    runs.iter()
        .filter_map(|v| v["peak_rss_bytes"].as_u64())
        .max()
        .unwrap_or(0) as f64
        / 1_048_576.0
}

/// Alternates the two measurements of a table benchmark `runs` times (at
/// least once), the baseline first: each is this program run again as
/// `--child <WHAT> <dir>/<WHAT>-<run> --rows <rows>` (its table made and
/// removed in `dir`). Returns the sink's and the baseline's measurements.
/// Called by `delta-bench` and `iceberg-bench`.
pub fn alternate_children(
    runs: usize,
    rows: u64,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<serde_json::Value>, Vec<serde_json::Value>)> {
    use anyhow::Context as _;

    let exe = std::env::current_exe().context("finding this program")?;
    let measure = |what: &str, run: usize| {
        let place = dir.join(format!("{what}-{run}"));
        let output = std::process::Command::new(&exe)
            .arg("--child")
            .arg(what)
            .arg(&place)
            .args(["--rows", &rows.to_string()])
            .output()
            .with_context(|| format!("running the {what} measurement"));
        let _ = std::fs::remove_dir_all(&place);
        measurement(what, output?)
    };
    let (mut sink, mut plain) = (Vec::new(), Vec::new());
    for run in 0..runs.max(1) {
        plain.push(measure("plain", run)?);
        sink.push(measure("sink", run)?);
    }
    Ok((sink, plain))
}

/// The figures of a table benchmark from its measurements: rows per second
/// of each side (medians), their ratio, and each side's peak RSS, with
/// every measurement.
pub fn table_summary(
    rows: u64,
    runs: usize,
    sink: Vec<serde_json::Value>,
    plain: Vec<serde_json::Value>,
) -> serde_json::Value {
    let (sink_rate, plain_rate) = (median_rate(&sink, "rows"), median_rate(&plain, "rows"));
    serde_json::json!({
        "rows": rows,
        "runs": runs,
        "sink_rows_per_s": sink_rate,
        "plain_rows_per_s": plain_rate,
        "ratio": sink_rate / plain_rate,
        "sink_peak_rss_mib": peak_rss_mib(&sink),
        "plain_peak_rss_mib": peak_rss_mib(&plain),
        "sink": sink,
        "plain": plain,
    })
}
