//! Benchmarks of the runtime and the file sink, each against a plain
//! baseline measured in the same run, reported as ratios.
//!
//! ```text
//! cargo run --profile bench -p sink-bench -- --json
//! cargo run --profile bench -p sink-bench -- --scale 0.01   # a quick smoke run
//! ```
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | runtime overhead | a counting two-phase sink (prepare_commit returns the count, commit adds it up), sequence source, 1 G records, parallelism 2, 1 s checkpoints; timed from the first record written to the job's end | two threads generating the same batches and counting them |
//! | file sink | 10 M demo lines (101 bytes), parallelism 2, 1 s checkpoints | two threads writing the same bytes through a buffered writer, fsync at the end |
//! | checkpoint cost | the file-sink job with 100 ms checkpoints | the same with checkpointing off |
//! | durability cost | the file-sink job with 100 ms checkpoints | two threads writing the same bytes, making them durable every 100 ms as a careful plain writer would: fsync the file, rename it to its final name, fsync the directory, start the next file |
//! | peak RSS, start-up | the file-sink job, alone in its process | - |
//! | Parquet, memory by buckets | see the `parquet` module: the demo's rows as Parquet | `ArrowWriter`, one file per checkpoint interval |
//!
//! Each job runs in a child process of its own (the same binary, with
//! `--child`), so that its peak resident set size and its start-up are its
//! own.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_line::DemoLine;
use serde_json::{json, Value};
use sink_api::{
    async_trait, CheckpointId, CommitRequest, Committer, InitContext, Sink, SinkError, SinkWriter,
};
use sink_benches::{measurement, peak_rss_bytes};
use sink_runtime::{CheckpointConfig, Job, SequenceSource};
use sinks_file::{FileSink, RollingPolicy};

mod parquet;

#[derive(Debug, Parser)]
#[command(about = "Benchmarks the runtime and the file sink against plain baselines")]
struct Args {
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Scale the record counts (1.0: 1 G and 10 M records).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Where the file benchmarks write (a temporary directory by default).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: run one measurement and print it as JSON.
    #[arg(long, hide = true)]
    child: Option<String>,
    /// Internal: records of the child's measurement.
    #[arg(long, hide = true, default_value_t = 0)]
    records: u64,
}

/// When the process started, as near as the program can tell.
static STARTED: OnceLock<Instant> = OnceLock::new();
/// When the first record reached a writer.
static FIRST_WRITE: OnceLock<Instant> = OnceLock::new();

/// Counts records; `prepare_commit` hands the count over, `commit` adds it up.
#[derive(Clone, Default)]
struct CountingSink(Arc<AtomicU64>);
struct CountingWriter(u64);

#[async_trait]
impl Sink for CountingSink {
    type Writer = CountingWriter;
    type Committer = CountingSink;

    async fn create_writer(
        &self,
        _: &InitContext,
        _: Vec<u64>,
    ) -> Result<CountingWriter, SinkError> {
        Ok(CountingWriter(0))
    }

    async fn create_committer(&self, _: &InitContext) -> Result<CountingSink, SinkError> {
        Ok(self.clone())
    }
}

#[async_trait]
impl SinkWriter for CountingWriter {
    type Input = u64;
    type Committable = u64;
    type State = u64;

    async fn write(&mut self, _: u64) -> Result<(), SinkError> {
        self.0 += 1;
        Ok(())
    }

    async fn write_batch(&mut self, records: Vec<u64>) -> Result<(), SinkError> {
        FIRST_WRITE.get_or_init(Instant::now);
        self.0 += std::hint::black_box(records).len() as u64;
        Ok(())
    }

    async fn flush(&mut self, _: bool) -> Result<(), SinkError> {
        Ok(())
    }

    async fn prepare_commit(
        &mut self,
        _checkpoint_id: sink_api::CheckpointId,
    ) -> Result<Vec<u64>, SinkError> {
        Ok(vec![std::mem::take(&mut self.0)])
    }

    async fn snapshot_state(&mut self, _: CheckpointId) -> Result<Vec<u64>, SinkError> {
        Ok(Vec::new())
    }
}

#[async_trait]
impl Committer for CountingSink {
    type Committable = u64;

    async fn commit(&mut self, requests: &mut [CommitRequest<u64>]) -> Result<(), SinkError> {
        for request in requests.iter_mut() {
            self.0.fetch_add(*request.committable(), Ordering::Relaxed);
            request.signal_committed();
        }
        Ok(())
    }
}

/// Notes the first write of the file sink: the demo line encoder, timed.
#[derive(Clone, Copy)]
struct TimedLine(DemoLine);

impl sinks_file::Encoder<u64> for TimedLine {
    fn encode(&self, id: &u64, out: &mut Vec<u8>) -> Result<(), SinkError> {
        FIRST_WRITE.get_or_init(Instant::now);
        self.0.append(*id, out);
        Ok(())
    }
}

const LINE: DemoLine = DemoLine { record_size: 100 };
/// The buckets of the Parquet memory figures: parts in progress per subtask.
const BUCKETS: [u64; 4] = [1, 10, 100, 1000];
/// Records of the runtime-overhead figure at scale 1: enough that the
/// job's fixed costs (its final checkpoint, the tasks' ends) are a few
/// percent of its time.
const COUNT_RECORDS: u64 = 1_000_000_000;
/// The records in one batch: the job's default batch size, set on the job
/// and used by the loop.
const BATCH: u64 = 4096;

/// The jobs' tokio runtime: two workers, as the machine has two cores.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")
}

/// The counting sink under the runtime. Timed from the first record
/// reaching a writer to the job's end (its final checkpoint and commit
/// included): what the runtime costs while records flow, without starting
/// tokio, building the job and starting its tasks, reported apart as
/// `startup_ms`.
fn counting_job(records: u64) -> anyhow::Result<Value> {
    let sink = CountingSink::default();
    let committed = sink.0.clone();
    let started = Instant::now();
    let report = runtime()?.block_on(
        Job::builder("bench-count", SequenceSource::bounded(records), sink)
            .parallelism(2)
            .batch_size(BATCH as usize)
            .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
            .build()?
            .run(),
    )?;
    let ended = Instant::now();
    if committed.load(Ordering::Relaxed) != records {
        bail!(
            "the counting job committed {} of {records} records",
            committed.load(Ordering::Relaxed)
        );
    }
    let first = FIRST_WRITE
        .get()
        .copied()
        .context("no record reached a writer")?;
    Ok(json!({
        "seconds": ended.duration_since(first).as_secs_f64(),
        "total_seconds": ended.duration_since(started).as_secs_f64(),
        "startup_ms": first.duration_since(started).as_secs_f64() * 1000.0,
        "checkpoints": report.metrics.checkpoints_completed,
    }))
}

/// Two threads generating the same batches as the source and counting them.
fn counting_loop(records: u64) -> anyhow::Result<Value> {
    let started = Instant::now();
    let total: u64 = std::thread::scope(|scope| {
        let halves = [(0, records / 2), (records / 2, records)];
        let workers: Vec<_> = halves
            .iter()
            .map(|&(from, to)| {
                scope.spawn(move || {
                    let mut count = 0u64;
                    let mut next = from;
                    while next < to {
                        let end = (next + BATCH).min(to);
                        let batch: Vec<u64> = (next..end).collect();
                        count += std::hint::black_box(batch).len() as u64;
                        next = end;
                    }
                    count
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
    });
    if total != records {
        bail!("the plain loop counted {total} of {records}");
    }
    Ok(json!({"seconds": started.elapsed().as_secs_f64()}))
}

/// The file sink under the runtime.
fn file_job(records: u64, dir: &Path, interval: Option<Duration>) -> anyhow::Result<Value> {
    let out = dir.join(format!(
        "job-{}",
        interval.map_or("off".into(), |i| i.as_millis().to_string())
    ));
    let _ = std::fs::remove_dir_all(&out);
    let sink = FileSink::builder(&out, TimedLine(LINE))
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(128 * 1024 * 1024),
            ..RollingPolicy::on_checkpoint()
        })
        .build()?;
    let stats = sink.stats();
    let mut builder =
        Job::builder("bench-file", SequenceSource::bounded(records), sink).parallelism(2);
    if let Some(interval) = interval {
        builder = builder.checkpointing(CheckpointConfig::every(interval));
    }
    let started = Instant::now();
    let report = runtime()?.block_on(builder.build()?.run())?;
    let seconds = started.elapsed().as_secs_f64();
    let committed = stats.snapshot();
    if committed.committed_records != records {
        bail!(
            "the file job committed {} of {records} records",
            committed.committed_records
        );
    }
    let startup_ms = match (STARTED.get(), FIRST_WRITE.get()) {
        (Some(start), Some(first)) => first.duration_since(*start).as_secs_f64() * 1000.0,
        _ => f64::NAN,
    };
    let _ = std::fs::remove_dir_all(&out);
    Ok(json!({
        "seconds": seconds,
        "bytes": committed.committed_bytes,
        "checkpoints": report.metrics.checkpoints_completed,
        "peak_rss_bytes": peak_rss_bytes(),
        "startup_to_first_record_ms": startup_ms,
    }))
}

/// Two threads writing the same lines, each making what it wrote durable
/// every `interval` as a careful plain writer would: fsync the file, rename
/// it to its final name, fsync the directory, go on in a new file. The
/// baseline of the durability cost: the same fsyncs a power cut asks for,
/// without a runtime, a checkpoint or a commit.
fn file_loop_synced(records: u64, dir: &Path, interval: Duration) -> anyhow::Result<Value> {
    let dir = dir.join("plain-synced");
    std::fs::create_dir_all(&dir)?;
    let started = Instant::now();
    let (bytes, fsyncs): (u64, u64) = std::thread::scope(|scope| -> anyhow::Result<(u64, u64)> {
        let halves = [(0, records / 2), (records / 2, records)];
        let workers: Vec<_> = halves
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| {
                let dir = dir.clone();
                scope.spawn(move || -> anyhow::Result<(u64, u64)> {
                    let (mut bytes, mut fsyncs, mut part) = (0u64, 0u64, 0u64);
                    let hidden = |part: u64| dir.join(format!(".plain-{i}-{part}"));
                    let open = |part: u64| -> std::io::Result<std::io::BufWriter<std::fs::File>> {
                        let file = std::fs::File::create(hidden(part))?;
                        Ok(std::io::BufWriter::with_capacity(256 * 1024, file))
                    };
                    let seal = |writer: std::io::BufWriter<std::fs::File>,
                                part: u64|
                     -> anyhow::Result<()> {
                        let file = writer.into_inner().map_err(|e| e.into_error())?;
                        file.sync_data()?;
                        std::fs::rename(hidden(part), dir.join(format!("plain-{i}-{part}")))?;
                        std::fs::File::open(&dir)?.sync_all()?;
                        Ok(())
                    };
                    let mut writer = open(part)?;
                    let mut line = Vec::with_capacity(128);
                    let mut next_seal = Instant::now() + interval;
                    for id in from..to {
                        line.clear();
                        LINE.append(id, &mut line);
                        writer.write_all(&line)?;
                        bytes += line.len() as u64;
                        if id % 1024 == 0 && Instant::now() >= next_seal {
                            seal(writer, part)?;
                            fsyncs += 2;
                            part += 1;
                            writer = open(part)?;
                            next_seal = Instant::now() + interval;
                        }
                    }
                    seal(writer, part)?;
                    fsyncs += 2;
                    Ok((bytes, fsyncs))
                })
            })
            .collect();
        workers.into_iter().try_fold((0, 0), |(b, f), w| {
            let (bytes, fsyncs) = w
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a writer thread panicked")))?;
            Ok((b + bytes, f + fsyncs))
        })
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({"seconds": seconds, "bytes": bytes, "fsyncs": fsyncs}))
}

/// Two threads writing the same lines through a buffered writer, fsync at
/// the end.
fn file_loop(records: u64, dir: &Path) -> anyhow::Result<Value> {
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let bytes: u64 = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let halves = [(0, records / 2), (records / 2, records)];
        let workers: Vec<_> = halves
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| {
                let path = dir.join(format!("plain-{i}"));
                scope.spawn(move || -> anyhow::Result<u64> {
                    let file = std::fs::File::create(&path)?;
                    let mut writer = std::io::BufWriter::with_capacity(256 * 1024, file);
                    let mut line = Vec::with_capacity(128);
                    let mut bytes = 0u64;
                    for id in from..to {
                        line.clear();
                        LINE.append(id, &mut line);
                        writer.write_all(&line)?;
                        bytes += line.len() as u64;
                    }
                    let file = writer.into_inner().map_err(|e| e.into_error())?;
                    file.sync_all()?;
                    std::fs::remove_file(&path)?;
                    Ok(bytes)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a writer thread panicked")))
            })
            .sum()
    })?;
    Ok(json!({"seconds": started.elapsed().as_secs_f64(), "bytes": bytes}))
}

fn child(what: &str, records: u64, dir: &Path) -> anyhow::Result<Value> {
    match what {
        "count-job" => counting_job(records),
        "count-loop" => counting_loop(records),
        "file-job" => file_job(records, dir, Some(Duration::from_secs(1))),
        "file-job-100ms" => file_job(records, dir, Some(Duration::from_millis(100))),
        "file-job-off" => file_job(records, dir, None),
        "file-loop" => file_loop(records, dir),
        "file-loop-synced-100ms" => file_loop_synced(records, dir, Duration::from_millis(100)),
        "parquet-job" => parquet::job(records, dir, 1),
        "parquet-plain" => {
            parquet::plain(records, dir, Duration::from_secs(1), parquet::Arrays::Serde)
        }
        "parquet-plain-builders" => parquet::plain(
            records,
            dir,
            Duration::from_secs(1),
            parquet::Arrays::Builders,
        ),
        buckets if buckets.starts_with("parquet-buckets-") => {
            let count = buckets["parquet-buckets-".len()..]
                .parse()
                .context("the buckets of a parquet-buckets measurement")?;
            parquet::job(records, dir, count)
        }
        other => bail!("unknown measurement '{other}'"),
    }
}

/// Runs one measurement in a child process.
fn measure(what: &str, records: u64, dir: &Path) -> anyhow::Result<Value> {
    let exe = std::env::current_exe().context("finding this program")?;
    let output = Command::new(exe)
        .args(["--child", what, "--records", &records.to_string(), "--dir"])
        .arg(dir)
        .output()
        .with_context(|| format!("running the {what} measurement"))?;
    measurement(what, output)
}

fn seconds(value: &Value) -> f64 {
    value["seconds"].as_f64().unwrap_or(f64::NAN)
}

fn main() -> anyhow::Result<()> {
    STARTED.get_or_init(Instant::now);
    let args = Args::parse();
    let temp;
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    if let Some(what) = &args.child {
        println!("{}", child(what, args.records, &dir)?);
        return Ok(());
    }
    if args.scale.is_nan() || args.scale <= 0.0 {
        bail!("--scale must be above 0");
    }
    let count_records = ((COUNT_RECORDS as f64 * args.scale) as u64).max(2);
    let file_records = ((10_000_000.0 * args.scale) as u64).max(2);

    let count_loop = measure("count-loop", count_records, &dir)?;
    let count_job = measure("count-job", count_records, &dir)?;
    let file_loop = measure("file-loop", file_records, &dir)?;
    let file_job = measure("file-job", file_records, &dir)?;
    let file_100ms = measure("file-job-100ms", file_records, &dir)?;
    let file_off = measure("file-job-off", file_records, &dir)?;
    let synced_100ms = measure("file-loop-synced-100ms", file_records, &dir)?;
    let parquet_plain = measure("parquet-plain", file_records, &dir)?;
    let parquet_builders = measure("parquet-plain-builders", file_records, &dir)?;
    let parquet_job = measure("parquet-job", file_records, &dir)?;
    let mut by_buckets = serde_json::Map::new();
    // A smoke run keeps the bucket counts that leave each bucket a thousand
    // records at least.
    for buckets in BUCKETS
        .into_iter()
        .filter(|b| *b <= (file_records / 1_000).max(1))
    {
        let job = measure(&format!("parquet-buckets-{buckets}"), file_records, &dir)?;
        let mib = job["peak_rss_bytes"].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0);
        by_buckets.insert(buckets.to_string(), json!(mib));
    }

    let rate = |records: u64, v: &Value| records as f64 / seconds(v);
    let batches = count_records.div_ceil(BATCH) as f64;
    let report = json!({
        "runtime_overhead": {
            "records": count_records,
            "job_records_per_s": rate(count_records, &count_job),
            "loop_records_per_s": rate(count_records, &count_loop),
            "ratio": seconds(&count_loop) / seconds(&count_job),
            "runtime_ns_per_batch": (seconds(&count_job) - seconds(&count_loop)) * 1e9 / batches,
            "job_startup_ms": count_job["startup_ms"],
            "job_total_seconds": count_job["total_seconds"],
            "target": 0.5,
        },
        "file_sink": {
            "records": file_records,
            "job_bytes_per_s": file_job["bytes"].as_f64().unwrap_or(0.0) / seconds(&file_job),
            "plain_bytes_per_s": file_loop["bytes"].as_f64().unwrap_or(0.0) / seconds(&file_loop),
            "job_records_per_s": rate(file_records, &file_job),
            "ratio": seconds(&file_loop) / seconds(&file_job),
            "target": 0.7,
        },
        "checkpoint_cost": {
            "records_per_s_100ms": rate(file_records, &file_100ms),
            "records_per_s_off": rate(file_records, &file_off),
            "checkpoints_100ms": file_100ms["checkpoints"],
            "ratio": seconds(&file_off) / seconds(&file_100ms),
            "target": 0.9,
        },
        "durability_cost": {
            "records_per_s_job_100ms": rate(file_records, &file_100ms),
            "records_per_s_plain_synced_100ms": rate(file_records, &synced_100ms),
            "plain_fsyncs": synced_100ms["fsyncs"],
            "ratio": seconds(&synced_100ms) / seconds(&file_100ms),
        },
        "parquet": {
            "records": file_records,
            "job_records_per_s": rate(file_records, &parquet_job),
            "plain_records_per_s": rate(file_records, &parquet_plain),
            "job_bytes": parquet_job["bytes"],
            "plain_bytes": parquet_plain["bytes"],
            "ratio": seconds(&parquet_plain) / seconds(&parquet_job),
            "target": 0.8,
            "plain_arrow_builders_records_per_s": rate(file_records, &parquet_builders),
            "ratio_to_arrow_builders": seconds(&parquet_builders) / seconds(&parquet_job),
            "peak_rss_mib": parquet_job["peak_rss_bytes"].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0),
            "peak_rss_mib_by_buckets": by_buckets,
        },
        "peak_rss_mib": file_job["peak_rss_bytes"].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0),
        "peak_rss_target_mib": 64,
        "startup_to_first_record_ms": file_job["startup_to_first_record_ms"],
        "startup_target_ms": 20,
    });
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
