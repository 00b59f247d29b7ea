//! Kafka to files: the Kafka source and the file sink against a plain
//! consumer writing the same lines to one file, on the same topic, in one
//! run, as a ratio.
//!
//! ```text
//! scripts/with-kafka sh -c 'cargo run --profile bench -p sink-benches --features kafka \
//!     --bin kafka-source-bench -- --brokers $KAFKA_TEST_BROKERS --records 1000000 --json'
//! ```
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | throughput | a topic of `--records` messages (the demo's 100-byte lines) read by a consumer group (`sources-kafka`, bounded, `--parallelism` subtasks) into the file sink (each value a line, parts rolled at each 1 s checkpoint, positions committed with them, checkpoints on local disk) | one `read_committed` read of the topic (the same client), partition by partition, writing each value as a line into one file as it is fetched, synced at the end |
//! | peak RSS | the job, alone in its process | the consumer, alone in its process |
//!
//! The topic is written once and read once uncounted (the broker is busy
//! for a while after the writes); then the measurements alternate `--runs`
//! times, each kind first every other run, each in a child process of its
//! own (this binary with `--child`), each job in a group and an output
//! directory of its own, and the medians are compared. Every line is
//! counted afterwards.
//!
//! Two ratios: of whole runs (from the process's start of the measurement
//! to the output synced: the job's group join and start included), and of
//! the reading (from the first record to the output synced): a consumer
//! of a group pays the join too, and a broker's join delay
//! (`group.initial.rebalance.delay.ms`, 3 s on Kafka by default) is not
//! the job's cost.

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_line::DemoLine;
use examples::kafka_input::ValueLine;
use serde_json::{json, Value};
use sink_api::SinkError;
use sink_benches::{measurement, median_rate, peak_rss_bytes, peak_rss_mib};
use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage};
use sinks_file::{Encoder, FileSink, RollingPolicy};
use sinks_kafka::{delete_topic, read_committed_with, IdempotentProducer, KafkaRecord};
use sources_kafka::{KafkaMessage, KafkaSource};

#[derive(Debug, Parser)]
#[command(
    about = "Benchmarks Kafka to files (the Kafka source and the file sink) against a plain consumer writing one file"
)]
struct Args {
    /// The broker, host:port (default: KAFKA_TEST_BROKERS, which
    /// scripts/with-kafka sets).
    #[arg(long)]
    brokers: Option<String>,
    /// Messages in the topic.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Subtasks of the job.
    #[arg(long, default_value_t = 1)]
    parallelism: u64,
    /// Partitions of the topic (noida-db answers a fetch with a whole
    /// partition: keep each under 256 MiB).
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Measurements of each kind; the medians are compared.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Internal: run one measurement ("sink" or "plain") of this topic.
    #[arg(long, hide = true, num_args = 2, value_names = ["WHAT", "TOPIC"])]
    child: Option<Vec<String>>,
}

fn brokers(args: &Args) -> &str {
    args.brokers.as_deref().unwrap_or_default()
}

/// The lines under `dir` (every file not hidden, in directories not hidden).
fn count_lines(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut lines = 0;
    for path in sinks_file::finished_files(dir)? {
        lines += std::fs::read(&path)?
            .iter()
            .filter(|b| **b == b'\n')
            .count() as u64;
    }
    Ok(lines)
}

/// [`ValueLine`], noting when the first record came.
struct Timed {
    first: Arc<OnceLock<Instant>>,
}

impl Encoder<KafkaMessage> for Timed {
    fn encode(&self, message: &KafkaMessage, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.first.get_or_init(Instant::now);
        ValueLine.encode(message, out)
    }
}

async fn sink_job(args: &Args, topic: &str) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let (out, state) = (dir.path().join("out"), dir.path().join("state"));
    let group = format!("bench-{}", std::process::id());
    let started = Instant::now();
    let source = KafkaSource::builder(brokers(args), topic, group)
        .bounded()
        .build()
        .await?;
    let first = Arc::new(OnceLock::new());
    let encoder = Timed {
        first: first.clone(),
    };
    let sink = FileSink::builder(&out, encoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(128 * 1024 * 1024),
            ..RollingPolicy::on_checkpoint()
        })
        .part_suffix(".txt")
        .build()?;
    let report = Job::builder("kafka-source-bench", source, sink)
        .parallelism(args.parallelism as usize)
        .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
        .checkpoint_storage(LocalCheckpointStorage::open(&state)?)
        .build()?
        .run()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let reading = first.get().map_or(seconds, |t| t.elapsed().as_secs_f64());
    let lines = count_lines(&out)?;
    if lines != args.records || report.metrics.records_committed != args.records {
        bail!(
            "the job committed {} records, {lines} lines",
            report.metrics.records_committed
        );
    }
    Ok(
        json!({ "seconds": seconds, "reading_seconds": reading, "records": lines,
        "peak_rss_bytes": peak_rss_bytes() }),
    )
}

async fn plain(args: &Args, topic: &str) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("out.txt");
    let started = Instant::now();
    let mut file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
    let mut written: std::io::Result<()> = Ok(());
    let mut first = None;
    // Each value written as it is fetched, as a consumer loop would.
    read_committed_with(brokers(args), topic, |_, record| {
        first.get_or_insert_with(Instant::now);
        if written.is_ok() {
            let value = record.value.as_deref().unwrap_or_default();
            written = file.write_all(value).and_then(|()| file.write_all(b"\n"));
        }
    })
    .await?;
    written?;
    let file = file.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let seconds = started.elapsed().as_secs_f64();
    let reading = first.map_or(seconds, |t: Instant| t.elapsed().as_secs_f64());
    let lines = count_lines(dir.path())?;
    if lines != args.records {
        bail!("the consumer wrote {lines} lines");
    }
    Ok(
        json!({ "seconds": seconds, "reading_seconds": reading, "records": lines,
        "peak_rss_bytes": peak_rss_bytes() }),
    )
}

/// Writes the topic: the demo's lines of ids `0..records`, keyed by id.
async fn fill(args: &Args, topic: &str) -> anyhow::Result<()> {
    let line = DemoLine { record_size: 100 };
    let mut producer = IdempotentProducer::connect(brokers(args), topic, args.partitions).await?;
    let mut ids = 0..args.records;
    loop {
        let chunk: Vec<KafkaRecord> = ids
            .by_ref()
            .take(4096)
            .map(|id| {
                let mut value = Vec::with_capacity(101);
                line.append(id, &mut value);
                value.pop();
                KafkaRecord::new(value).with_key(id.to_string())
            })
            .collect();
        if chunk.is_empty() {
            break;
        }
        producer.send_batch(chunk).await?;
    }
    producer.flush().await?;
    Ok(())
}

fn measure(args: &Args, what: &str, topic: &str) -> anyhow::Result<Value> {
    let output = Command::new(std::env::current_exe()?)
        .args(["--child", what, topic])
        .args(["--brokers", brokers(args)])
        .args(["--records", &args.records.to_string()])
        .args(["--parallelism", &args.parallelism.to_string()])
        .args(["--partitions", &args.partitions.to_string()])
        .output()
        .with_context(|| format!("running the {what} measurement"))?;
    measurement(what, output)
}

fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let mut args = Args::parse();
    if args.brokers.is_none() {
        args.brokers = std::env::var("KAFKA_TEST_BROKERS").ok();
    }
    if args.brokers.is_none() {
        bail!("name the broker with --brokers HOST:PORT (or run under scripts/with-kafka)");
    }
    let runtime = tokio::runtime::Runtime::new()?;
    if let Some(child) = &args.child {
        let result = match child[0].as_str() {
            "sink" => runtime.block_on(sink_job(&args, &child[1]))?,
            "plain" => runtime.block_on(plain(&args, &child[1]))?,
            other => bail!("unknown measurement '{other}'"),
        };
        println!("{result}");
        return Ok(());
    }
    let topic = format!("kafka-source-bench-{}", std::process::id());
    runtime.block_on(fill(&args, &topic))?;
    // A first read, not counted: the broker is still busy with the topic
    // just written, and whichever measurement came first paid for it.
    measure(&args, "plain", &topic)?;
    let (mut sink, mut plain) = (Vec::new(), Vec::new());
    for run in 0..args.runs.max(1) {
        // Each kind goes first every other run: neither always meets the
        // other's dirty pages.
        let order = match run % 2 {
            0 => ["plain", "sink"],
            _ => ["sink", "plain"],
        };
        for what in order {
            let result = measure(&args, what, &topic)?;
            match what {
                "sink" => sink.push(result),
                _ => plain.push(result),
            }
        }
    }
    runtime.block_on(delete_topic(brokers(&args), &topic))?;
    let (sink_rate, plain_rate) = (
        median_rate(&sink, "records"),
        median_rate(&plain, "records"),
    );
    let reading = |runs: &[Value]| {
        let runs: Vec<Value> = runs
            .iter()
            .map(|v| json!({ "records": v["records"], "seconds": v["reading_seconds"] }))
            .collect();
        median_rate(&runs, "records")
    };
    let (sink_reading, plain_reading) = (reading(&sink), reading(&plain));
    let summary = json!({
        "records": args.records,
        "parallelism": args.parallelism,
        "runs": args.runs,
        "sink_records_per_s": sink_rate,
        "plain_records_per_s": plain_rate,
        "ratio": sink_rate / plain_rate,
        "sink_reading_records_per_s": sink_reading,
        "plain_reading_records_per_s": plain_reading,
        "reading_ratio": sink_reading / plain_reading,
        "sink_peak_rss_mib": peak_rss_mib(&sink),
        "plain_peak_rss_mib": peak_rss_mib(&plain),
        "sink": sink,
        "plain": plain,
    });
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "Kafka to files: {sink_rate:.0} records/s; plain consumer to one file: \
             {plain_rate:.0} records/s; ratio {:.3}",
            sink_rate / plain_rate
        );
        println!(
            "reading (first record to the output synced): {sink_reading:.0} against \
             {plain_reading:.0} records/s; ratio {:.3}",
            sink_reading / plain_reading
        );
        println!(
            "peak RSS: job {:.0} MiB, plain consumer {:.0} MiB",
            peak_rss_mib(&sink),
            peak_rss_mib(&plain)
        );
    }
    Ok(())
}
