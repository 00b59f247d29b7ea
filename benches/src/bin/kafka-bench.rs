//! The Kafka sink against a plain idempotent producer, on the same records,
//! in one run, as a ratio.
//!
//! ```text
//! scripts/with-kafka sh -c 'cargo run --profile bench -p sink-benches --features kafka \
//!     --bin kafka-bench -- --brokers $KAFKA_TEST_BROKERS --records 2000000 --json'
//! ```
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | throughput | the demo's records (an id and 79 bytes of filler, as the file demo's line) through the Kafka sink, `--parallelism` subtasks, 1 s checkpoints on local disk, one transaction per checkpoint and subtask, committed | as many `IdempotentProducer`s (the sink's client without transactions: same batching, pipelining and acknowledgements), one per task, writing the same records |
//! | peak RSS | the job, alone in its process | the producers, alone in their process |
//!
//! Each measurement runs in a child process of its own (this binary with
//! `--child`), into a topic of its own (deleted afterwards) of
//! `--partitions` partitions; they alternate `--runs` times and the medians are
//! compared. Every record is counted in the topic afterwards, as a
//! `read_committed` consumer sees it.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_line::DemoLine;
use serde_json::{json, Value};
use sink_benches::{measurement, median_rate, peak_rss_bytes, peak_rss_mib};
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage, SequenceSource};
use sinks_kafka::{delete_topic, read_committed, IdempotentProducer, KafkaRecord, KafkaSink};

#[derive(Debug, Parser)]
#[command(
    about = "Benchmarks the Kafka sink against a plain idempotent producer on the same records"
)]
struct Args {
    /// The broker, host:port (default: KAFKA_TEST_BROKERS, which
    /// scripts/with-kafka sets).
    #[arg(long)]
    brokers: Option<String>,
    /// Records per measurement.
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Subtasks of the job, and producers of the baseline.
    #[arg(long, default_value_t = 1)]
    parallelism: u64,
    /// Partitions of each measurement's topic (noida-db answers a fetch
    /// with a whole partition, whatever its size: the read-back needs
    /// partitions under 256 MiB).
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Measurements of each kind; the medians are compared.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Internal: run one measurement ("sink" or "plain") into this topic.
    #[arg(long, hide = true, num_args = 2, value_names = ["WHAT", "TOPIC"])]
    child: Option<Vec<String>>,
}

fn brokers(args: &Args) -> &str {
    args.brokers.as_deref().unwrap_or_default()
}

const LINE: DemoLine = DemoLine { record_size: 100 };

fn message(id: u64) -> KafkaRecord {
    let mut value = Vec::with_capacity(101);
    LINE.append(id, &mut value);
    value.pop();
    KafkaRecord::new(value)
}

async fn sink_job(args: &Args, topic: &str) -> anyhow::Result<Value> {
    let state = tempfile::tempdir()?;
    let sink = KafkaSink::builder(brokers(args), topic)
        .partitions(args.partitions)
        .connect()
        .await?;
    let source = SequenceSource::bounded(args.records).map(message);
    let started = Instant::now();
    let report = Job::builder(format!("kafka-bench-{topic}"), source, sink)
        .parallelism(args.parallelism as usize)
        .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
        .checkpoint_storage(LocalCheckpointStorage::open(state.path())?)
        .build()?
        .run()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    if report.metrics.records_committed != args.records {
        bail!(
            "the job committed {} records",
            report.metrics.records_committed
        );
    }
    Ok(
        json!({ "seconds": seconds, "records": args.records, "peak_rss_bytes": peak_rss_bytes(),
               "transactions": report.metrics.commits_succeeded }),
    )
}

async fn plain(args: &Args, topic: &str) -> anyhow::Result<Value> {
    let tasks = args.parallelism.max(1);
    let mut producers = Vec::new();
    for _ in 0..tasks {
        producers.push(IdempotentProducer::connect(brokers(args), topic, args.partitions).await?);
    }
    let started = Instant::now();
    let mut running = Vec::new();
    for (task, mut producer) in producers.into_iter().enumerate() {
        let (records, tasks) = (args.records, tasks);
        running.push(tokio::spawn(async move {
            let mut ids = (task as u64..records).step_by(tasks as usize);
            loop {
                let chunk: Vec<KafkaRecord> = ids.by_ref().take(4096).map(message).collect();
                if chunk.is_empty() {
                    break;
                }
                producer.send_batch(chunk).await?;
            }
            producer.flush().await
        }));
    }
    for task in running {
        task.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({ "seconds": seconds, "records": args.records, "peak_rss_bytes": peak_rss_bytes() }))
}

fn measure(args: &Args, what: &str, run: usize) -> anyhow::Result<Value> {
    let exe = std::env::current_exe()?;
    let topic = format!("kafka-bench-{what}-{}-{run}", std::process::id());
    let output = Command::new(exe)
        .args(["--child", what, &topic])
        .args(["--brokers", brokers(args)])
        .args(["--records", &args.records.to_string()])
        .args(["--parallelism", &args.parallelism.to_string()])
        .args(["--partitions", &args.partitions.to_string()])
        .output()
        .with_context(|| format!("running the {what} measurement"))?;
    let mut value = measurement(what, output)?;
    // Counted as a read_committed consumer sees the topic, then dropped.
    let runtime = tokio::runtime::Runtime::new()?;
    let counted = runtime.block_on(async {
        let read = read_committed(brokers(args), &topic).await?;
        delete_topic(brokers(args), &topic).await?;
        anyhow::Ok(read.messages.len() as u64)
    })?;
    if counted != args.records {
        bail!("the {what} measurement left {counted} records in {topic}");
    }
    value["counted"] = json!(counted);
    Ok(value)
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
    if let Some(child) = &args.child {
        let runtime = tokio::runtime::Runtime::new()?;
        let result = match child[0].as_str() {
            "sink" => runtime.block_on(sink_job(&args, &child[1]))?,
            "plain" => runtime.block_on(plain(&args, &child[1]))?,
            other => bail!("unknown measurement '{other}'"),
        };
        println!("{result}");
        return Ok(());
    }
    let (mut sink, mut plain) = (Vec::new(), Vec::new());
    for run in 0..args.runs.max(1) {
        plain.push(measure(&args, "plain", run)?);
        sink.push(measure(&args, "sink", run)?);
    }
    let (sink_rate, plain_rate) = (
        median_rate(&sink, "records"),
        median_rate(&plain, "records"),
    );
    let summary = json!({
        "records": args.records,
        "parallelism": args.parallelism,
        "runs": args.runs,
        "sink_records_per_s": sink_rate,
        "plain_records_per_s": plain_rate,
        "ratio": sink_rate / plain_rate,
        "sink_peak_rss_mib": peak_rss_mib(&sink),
        "plain_peak_rss_mib": peak_rss_mib(&plain),
        "sink": sink,
        "plain": plain,
    });
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "Kafka sink: {sink_rate:.0} records/s; plain idempotent producer: {plain_rate:.0} \
             records/s; ratio {:.3}",
            sink_rate / plain_rate
        );
        println!(
            "peak RSS: Kafka sink {:.0} MiB, plain producer {:.0} MiB",
            peak_rss_mib(&sink),
            peak_rss_mib(&plain)
        );
    }
    Ok(())
}
