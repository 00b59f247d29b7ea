//! What the benchmarks share: the figures they compute from their runs.
//!
//! Each benchmark is a binary (`src/bin/`) that measures a job of the SDK
//! and a plain baseline doing the same work in the same run, each in a child
//! process of its own, and reports their ratio: `sink-bench` (the runtime
//! and the file sink on local disk), `s3-bench` (the file sink on an
//! S3-compatible server), `delta-bench` (the Delta sink, `delta` feature).

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
