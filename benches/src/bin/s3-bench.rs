//! The file sink on an S3-compatible server against a plain multipart
//! upload of the same bytes to the same server, in one run, as a ratio.
//!
//! ```text
//! scripts/with-s3 cargo run --profile bench -p sink-benches --bin s3-bench -- --out s3://eo-test/bench --json
//! ```
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | throughput | 1 GB of demo lines (101 bytes) through the file sink, parallelism 2, 1 s checkpoints (stored on the same server), parts of 5 MiB, 2 in flight per object, rolled at each checkpoint | two tasks uploading the same lines with `object_store`'s `WriteMultipart`, parts of 5 MiB, 2 in flight each |
//! | peak RSS | the job, alone in its process | the baseline, alone in its process |
//!
//! `--rolling default` runs the job with the sink's default rolling policy
//! instead (128 MiB or 60 s a part): each checkpoint then keeps the tail of
//! every upload in progress, up to a part, in the writer state.
//!
//! Each measurement runs in a child process of its own (the same binary,
//! with `--child`), so that its peak resident set size is its own; the
//! job and the baseline alternate, `--runs` times each, and the medians are
//! compared. Everything written is removed after each measurement.

use object_store::ObjectStoreExt;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_line::DemoLine;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::WriteMultipart;
use serde_json::{json, Value};
use sink_benches::{measurement, median_rate, peak_rss_bytes, peak_rss_mib};
use sink_cli::location::{object_output, s3_options};
use sink_runtime::storage::ObjectCheckpointStorage;
use sink_runtime::{CheckpointConfig, Job, SequenceSource};
use sinks_file::{FileSink, ObjectOutputStore, RollingPolicy};

#[derive(Debug, Parser)]
#[command(about = "Benchmarks the file sink on S3 against a plain multipart upload")]
struct Args {
    /// Where to write: an s3://bucket/prefix URL (emptied after each run).
    #[arg(long)]
    out: String,
    /// The S3 endpoint, for S3-compatible servers.
    #[arg(long)]
    endpoint: Option<String>,
    /// Megabytes (10^6 bytes) of lines per measurement.
    #[arg(long, default_value_t = 1000)]
    megabytes: u64,
    /// Measurements of each kind; the medians are compared.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Part size in MiB.
    #[arg(long, default_value_t = 5)]
    part_mib: usize,
    /// Parts in flight per object.
    #[arg(long, default_value_t = 2)]
    parts_in_flight: usize,
    /// When the job's parts roll: at each checkpoint, or by the sink's
    /// default policy (128 MiB or 60 s).
    #[arg(long, value_enum, default_value_t = Rolling::OnCheckpoint)]
    rolling: Rolling,
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Internal: run one measurement ("sink" or "plain") and print it as JSON.
    #[arg(long, hide = true)]
    child: Option<String>,
}

/// The job's rolling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Rolling {
    /// At each checkpoint (and at 128 MiB): every checkpoint commits what
    /// was written before it.
    OnCheckpoint,
    /// The sink's default, `RollingPolicy::default()`.
    Default,
}

impl Rolling {
    fn policy(self) -> RollingPolicy {
        match self {
            Rolling::OnCheckpoint => RollingPolicy {
                max_part_size_bytes: Some(128 * 1024 * 1024),
                ..RollingPolicy::on_checkpoint()
            },
            Rolling::Default => RollingPolicy::default(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Rolling::OnCheckpoint => "on-checkpoint",
            Rolling::Default => "default",
        }
    }
}

const LINE: DemoLine = DemoLine { record_size: 100 };
const LINE_BYTES: u64 = 101;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")
}

/// The store and prefix of `url`, configured as the sink's.
fn store(
    url: &str,
    options: &[(String, String)],
) -> anyhow::Result<(Arc<dyn ObjectOutputStore>, Path)> {
    let output = object_output(url, options)?;
    Ok((output.store(), output.prefix().clone()))
}

/// Removes everything under `url`.
async fn clear(url: &str, options: &[(String, String)]) -> anyhow::Result<()> {
    let (store, prefix) = store(url, options)?;
    let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    for meta in listed {
        store.delete(&meta.location).await?;
    }
    Ok(())
}

/// The file sink under the runtime.
async fn sink_job(args: &Args, url: &str, records: u64) -> anyhow::Result<Value> {
    let options = s3_options(args.endpoint.as_deref());
    let sink = FileSink::object_store_builder(object_output(url, &options)?, LINE)
        .rolling_policy(args.rolling.policy())
        .part_size(args.part_mib * 1024 * 1024)
        .parts_in_flight(args.parts_in_flight)
        .build()?;
    let stats = sink.stats();
    let started = Instant::now();
    // Checkpoints on the same server, as in a deployment: none kept in
    // this process's memory.
    let storage = ObjectCheckpointStorage::s3(&format!("{url}-state"), &options)?;
    let report = Job::builder("s3-bench", SequenceSource::bounded(records), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
        .checkpoint_storage(storage)
        .build()?
        .run()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let committed = stats.snapshot();
    if committed.committed_records != records {
        bail!(
            "the job committed {} of {records} records",
            committed.committed_records
        );
    }
    Ok(json!({
        "seconds": seconds,
        "bytes": committed.committed_bytes,
        "objects": committed.committed_files,
        "checkpoints": report.metrics.checkpoints_completed,
        "peak_rss_bytes": peak_rss_bytes(),
    }))
}

/// Two tasks uploading the same lines, one object each.
async fn plain_upload(args: &Args, url: &str, records: u64) -> anyhow::Result<Value> {
    let (store, prefix) = store(url, &s3_options(args.endpoint.as_deref()))?;
    let part_size = args.part_mib * 1024 * 1024;
    let in_flight = args.parts_in_flight;
    let started = Instant::now();
    let halves = [(0, records / 2), (records / 2, records)];
    let tasks: Vec<_> = halves
        .iter()
        .enumerate()
        .map(|(i, &(from, to))| {
            let store = store.clone();
            let path = prefix.clone().join(format!("plain-{i}"));
            tokio::spawn(async move {
                let upload = store.put_multipart(&path).await?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
                let mut buffer = Vec::with_capacity(64 * 1024);
                let mut bytes = 0u64;
                for id in from..to {
                    LINE.append(id, &mut buffer);
                    if buffer.len() >= 64 * 1024 {
                        writer.wait_for_capacity(in_flight).await?;
                        writer.write(&buffer);
                        bytes += buffer.len() as u64;
                        buffer.clear();
                    }
                }
                writer.write(&buffer);
                bytes += buffer.len() as u64;
                writer.finish().await?;
                Ok::<u64, object_store::Error>(bytes)
            })
        })
        .collect();
    let mut bytes = 0;
    for task in tasks {
        bytes += task.await??;
    }
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "bytes": bytes,
        "peak_rss_bytes": peak_rss_bytes(),
    }))
}

/// Runs one measurement in a child process, and empties its prefix.
fn measure(args: &Args, what: &str, run: usize) -> anyhow::Result<Value> {
    let exe = std::env::current_exe().context("finding this program")?;
    let url = format!("{}/{what}-{run}", args.out.trim_end_matches('/'));
    let mut command = Command::new(exe);
    command.args(["--child", what, "--out", &url]);
    command.args(["--megabytes", &args.megabytes.to_string()]);
    command.args(["--part-mib", &args.part_mib.to_string()]);
    command.args(["--parts-in-flight", &args.parts_in_flight.to_string()]);
    command.args(["--rolling", args.rolling.name()]);
    if let Some(endpoint) = &args.endpoint {
        command.args(["--endpoint", endpoint]);
    }
    let output = command
        .output()
        .with_context(|| format!("running the {what} measurement"))?;
    let options = s3_options(args.endpoint.as_deref());
    runtime()?.block_on(async {
        clear(&url, &options).await?;
        clear(&format!("{url}-state"), &options).await
    })?;
    measurement(what, output)
}

fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    let records = args.megabytes * 1_000_000 / LINE_BYTES;
    if let Some(what) = &args.child {
        let result = match what.as_str() {
            "sink" => runtime()?.block_on(sink_job(&args, &args.out, records))?,
            "plain" => runtime()?.block_on(plain_upload(&args, &args.out, records))?,
            other => bail!("unknown measurement '{other}'"),
        };
        println!("{result}");
        return Ok(());
    }
    if !args.out.starts_with("s3://") {
        bail!("--out must be an s3://bucket/prefix URL");
    }
    let (mut sink, mut plain) = (Vec::new(), Vec::new());
    for run in 0..args.runs.max(1) {
        plain.push(measure(&args, "plain", run)?);
        sink.push(measure(&args, "sink", run)?);
    }
    let (sink_mb_s, plain_mb_s) = (
        median_rate(&sink, "bytes") / 1e6,
        median_rate(&plain, "bytes") / 1e6,
    );
    let part_bytes = args.part_mib as f64;
    // Per upload in progress (two subtasks with one each): the tail and the
    // parts in flight; at the default rolling, while a checkpoint is stored,
    // the tail's encoding in the checkpoint and in its frame as well
    // (docs/performance.md).
    let held_at_checkpoints = match args.rolling {
        Rolling::OnCheckpoint => 0.0,
        Rolling::Default => 2.0,
    };
    let bound_mib = 2.0 * (args.parts_in_flight as f64 + 1.0 + held_at_checkpoints) * part_bytes;
    let summary = json!({
        "megabytes": args.megabytes,
        "runs": args.runs,
        "part_mib": args.part_mib,
        "parts_in_flight": args.parts_in_flight,
        "rolling": args.rolling.name(),
        "sink_mb_per_s": sink_mb_s,
        "plain_mb_per_s": plain_mb_s,
        "ratio": sink_mb_s / plain_mb_s,
        "sink_peak_rss_mib": peak_rss_mib(&sink),
        "plain_peak_rss_mib": peak_rss_mib(&plain),
        "sink_buffer_bound_mib": bound_mib,
        "objects_per_run": sink.first().map(|v| v["objects"].clone()),
        "sink": sink,
        "plain": plain,
    });
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "file sink on S3: {sink_mb_s:.1} MB/s; plain multipart upload: {plain_mb_s:.1} MB/s; ratio {:.3}",
            sink_mb_s / plain_mb_s
        );
        println!(
            "peak RSS: file sink {:.0} MiB (its part buffers at most {bound_mib:.0} MiB), plain {:.0} MiB",
            peak_rss_mib(&sink),
            peak_rss_mib(&plain)
        );
    }
    Ok(())
}
