//! The Kafka sink demo: the file sink demo's records, into a Kafka topic,
//! committed exactly once with Kafka transactions.
//!
//! ```text
//! cargo run --release -p examples --features kafka --bin kafka-sink-demo -- \
//!     --brokers 127.0.0.1:9092 --topic demo-records --records 1000000 --json --fresh
//! ```
//!
//! Each record is one message whose value is the file demo's line without
//! its newline: the id in 20 digits, a comma, filler up to
//! `--record-size` bytes. The topic is created when missing (with
//! `--partitions` partitions, by default the parallelism); the checkpoints
//! live in `--state` (a directory, or `s3://bucket/prefix` with
//! `--endpoint` for S3-compatible servers), so the same command run again
//! after a crash (even SIGKILL), or on another machine with the same
//! `s3://` state, resumes, and commits the transactions the crashed process had
//! prepared. The summary reads the topic back as a `read_committed`
//! consumer does and checks that every id is there once (and, once the job
//! finished, that none is missing, counting what the topic lacks); `--baseline`
//! first writes the same records with a plain idempotent producer, for the
//! ratio.
//!
//! Kafka to Kafka: `--source kafka --input-topic T --group G` (bounded:
//! ends at the input's end as the job first saw it) or `--source
//! kafka-unbounded` (stops after `--run-for`) copies each message of `T`
//! (key and value) into `--topic`, the group's offsets committed in the
//! same transactions. Several instances of one group, each with its own
//! `--state`, share the input's partitions. The summary checks that the
//! output holds each input record below the job's positions exactly once,
//! with its key, value (a tombstone stays one), headers and timestamp.

use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_line::DemoLine;
use examples::kafka_check::{self, InputAtPositions};
use sink_cli::flags::parse_duration;
use sink_cli::location::{self, Location, Storage};
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobReport, JobStatus, SequenceSource};
use sinks_kafka::{
    delete_topic, open_transactions, read_committed, Brokers, ClientProperties, CommittedMessage,
    CommittedTopic, IdempotentProducer, KafkaRecord, KafkaSink,
};

#[derive(Debug, Parser)]
#[command(
    about = "Two-phase-commit Kafka sink demo: the demo's records into a topic, exactly once"
)]
struct Args {
    /// The brokers to start from, host:port, several separated by commas.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// A Kafka client properties file (Java's client.properties format):
    /// security.protocol, sasl.mechanism, sasl.username, sasl.password,
    /// ssl.ca.location, ssl.certificate.location, ssl.key.location,
    /// compression.type (docs/kafka.md, "Settings"). Secrets in it are
    /// never printed.
    #[arg(long, value_name = "FILE")]
    kafka_config: Option<std::path::PathBuf>,
    /// --brokers with --kafka-config's security, made after parsing.
    #[arg(skip)]
    cluster: Brokers,
    /// --kafka-config, read.
    #[arg(skip)]
    properties: ClientProperties,
    /// The topic; created when missing.
    #[arg(long, default_value = "kafka-demo-records")]
    topic: String,
    /// Partitions of the topic when the demo creates it. Default: the
    /// parallelism.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    partitions: Option<u32>,
    /// Where the checkpoints are kept: a directory, or `s3://bucket/prefix`
    /// (built with the `s3` feature), which instances on other machines can
    /// resume from.
    #[arg(long, default_value = "./kafka-demo-state")]
    state: String,
    /// The S3 endpoint of an `s3://` state, for S3-compatible servers
    /// (default: AWS_ENDPOINT_URL, else AWS).
    #[arg(long)]
    endpoint: Option<String>,
    /// Records, with ids 0..N over all subtasks.
    #[arg(long, default_value_t = 160)]
    records: u64,
    /// Subtasks (each with its own transactions).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    parallelism: u64,
    /// Time between checkpoints, such as 1s or 200ms, or `off`.
    #[arg(long, default_value = "1s")]
    checkpoint_interval: String,
    /// Bytes per record (at least 21).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(21..=1_000_000))]
    record_size: u64,
    /// Records per second per subtask (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Delete the topic and the checkpoints first, and start over.
    #[arg(long)]
    fresh: bool,
    /// Also write the same records with a plain idempotent producer (no
    /// transactions, no checkpoints) into a scratch topic, and report both
    /// rates.
    #[arg(long)]
    baseline: bool,
    /// Print one JSON object with the results on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// What to read: the demo's numbered records (`sequence`), or a Kafka
    /// topic as a consumer group (`kafka`: up to its end as the job first
    /// saw it; `kafka-unbounded`: until --run-for is up).
    #[arg(long, value_enum, default_value_t = InputKind::Sequence)]
    source: InputKind,
    /// With --source kafka*: the topic to read (on --brokers).
    #[arg(long)]
    input_topic: Option<String>,
    /// With --source kafka*: the consumer group. Its offsets are committed
    /// with the output's transactions; every instance of the group (each
    /// with its own --state) shares the input's partitions.
    #[arg(long)]
    group: Option<String>,
    /// With --source kafka-unbounded: how long to run, such as 30s.
    #[arg(long, default_value = "12s")]
    run_for: String,
    /// With --source kafka*: go on past records that retention deleted
    /// before the group read them (they are lost; without it, the run
    /// stops and says which).
    #[arg(long)]
    skip_deleted_records: bool,
    /// With --source kafka*: read a topic that was deleted and created
    /// again from its start (without it, the run stops and says so).
    #[arg(long)]
    recreated_topic_from_start: bool,
    /// With --source kafka or kafka-unbounded: how long a member waits for
    /// the group to deal it partitions before the run fails naming the
    /// group's state and members (default: twice the rebalance timeout
    /// plus the session timeout, 130 s).
    #[arg(long, value_parser = parse_duration)]
    group_wait_timeout: Option<std::time::Duration>,
}

/// What the demo reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum InputKind {
    /// Records with ids 0..--records.
    Sequence,
    /// A Kafka topic as a consumer group, up to its end.
    Kafka,
    /// A Kafka topic as a consumer group, until --run-for is up.
    KafkaUnbounded,
}

/// The Kafka source `args` name; an error names a missing flag.
async fn kafka_source(args: &Args) -> anyhow::Result<sources_kafka::KafkaSource> {
    let missing = |flag: &str| anyhow::anyhow!("--source kafka needs {flag}");
    let topic = args
        .input_topic
        .clone()
        .ok_or_else(|| missing("--input-topic"))?;
    let group = args.group.clone().ok_or_else(|| missing("--group"))?;
    if topic == args.topic {
        bail!("--input-topic and --topic are both {topic}: the demo would read its own output");
    }
    let mut builder = sources_kafka::KafkaSource::builder(&args.cluster, topic, group);
    if args.source == InputKind::Kafka {
        builder = builder.bounded();
    }
    if args.skip_deleted_records {
        builder = builder.skip_deleted_records();
    }
    if args.recreated_topic_from_start {
        builder = builder.read_recreated_topic_from_start();
    }
    if let Some(bound) = args.group_wait_timeout {
        builder = builder.group_wait_timeout(bound);
    }
    Ok(builder.build().await?)
}

/// A message read as the same message to write: key, value (a tombstone
/// stays one), headers and timestamp; the partition is the key's, as the
/// input's producer picked it (or the writer's turn without a key).
fn copied(message: sources_kafka::KafkaMessage) -> KafkaRecord {
    KafkaRecord {
        key: message.key.map(|k| k.to_vec()),
        value: message.value.map(|v| v.to_vec()),
        headers: message.headers,
        timestamp: Some(message.timestamp),
        partition: None,
    }
}

/// The sequence's check: every id once in the output, none twice, and, once
/// the job finished, every id of `0..--records` there. Counts what the
/// output lacks, not what the job saw fail.
fn check_sequence(args: &Args, report: &JobReport, read: &CommittedTopic) -> anyhow::Result<()> {
    let mut ids: Vec<u64> = Vec::with_capacity(read.messages.len());
    for m in &read.messages {
        let id = std::str::from_utf8(m.value_bytes())
            .ok()
            .and_then(|v| v.split(',').next())
            .and_then(|id| id.parse().ok());
        match id {
            Some(id) => ids.push(id),
            None => bail!(
                "{}/{} offset {} is not a demo record",
                args.topic,
                m.partition,
                m.offset
            ),
        }
    }
    ids.sort_unstable();
    let all = ids.len();
    ids.dedup();
    if ids.len() != all {
        bail!(
            "{} holds {all} committed messages but only {} distinct ids: {} are there twice",
            args.topic,
            ids.len(),
            all - ids.len()
        );
    }
    let finished = matches!(
        report.status,
        JobStatus::Finished | JobStatus::AlreadyFinished
    );
    let present = ids.iter().filter(|id| **id < args.records).count() as u64;
    if finished && present < args.records {
        bail!(
            "{} lacks {} of the {} records the finished job wrote (read back read_committed: {} \
             there); records the job reported committed are missing, for example because the \
             broker lost acknowledged data (docs/kafka.md, \"Tested against\")",
            args.topic,
            args.records - present,
            args.records,
            present
        );
    }
    Ok(())
}

/// What a copied message is compared by: key, value (a tombstone apart
/// from empty), headers and timestamp.
type Copy<'a> = (
    Option<&'a [u8]>,
    Option<&'a [u8]>,
    &'a [sinks_kafka::KafkaHeader],
    i64,
);

/// The copy's check (`examples::kafka_check`): the output holds each input
/// record below the positions the job committed (the group's offsets)
/// exactly once, with its key, value, headers and timestamp, and besides
/// only records past them, once each. Counts what the output lacks and
/// what it holds more than once.
async fn check_copy(args: &Args) -> anyhow::Result<()> {
    let (Some(input), Some(group)) = (&args.input_topic, &args.group) else {
        return Ok(());
    };
    let sink = KafkaSink::builder(&args.cluster, &args.topic)
        .properties(&args.properties)
        .connect()
        .await?;
    let positions = kafka_check::job_positions(&sink, input, group).await?;
    let read = read_committed(&args.cluster, &args.topic)
        .await
        .with_context(|| format!("reading {} back", args.topic))?;
    let source = InputAtPositions::read(&args.cluster, input, &positions).await?;
    fn key(m: &CommittedMessage) -> Copy<'_> {
        (
            m.key.as_deref(),
            m.value.as_deref(),
            &m.headers[..],
            m.timestamp,
        )
    }
    source
        .compare(|m| [key(m)], read.messages.iter().map(key))
        .check(&args.topic, input, "key, value, headers and timestamp")
}

/// Runs `builder`'s job; an unbounded one is cancelled after `run_for`.
async fn run<Src, Snk>(
    builder: sink_runtime::JobBuilder<Src, Snk>,
    run_for: Option<std::time::Duration>,
) -> anyhow::Result<JobReport>
where
    Src: Source,
    Snk: sink_api::Sink<Writer: sink_api::SinkWriter<Input = Src::Record>>,
{
    let handle = builder.build()?.start();
    if let Some(run_for) = run_for {
        let deadline = Instant::now() + run_for;
        while !handle.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        if !handle.is_finished() {
            handle.cancel();
        }
    }
    Ok(handle.join().await?)
}

/// The message of record `id`: the file demo's line without its newline.
fn message(line: DemoLine, id: u64) -> KafkaRecord {
    let mut value = Vec::with_capacity(line.record_size + 1);
    line.append(id, &mut value);
    value.pop();
    KafkaRecord::new(value)
}

/// Writes the records with a plain idempotent producer into `<topic>-baseline`
/// (made anew); returns records per second.
async fn baseline(args: &Args, partitions: u32, line: DemoLine) -> anyhow::Result<f64> {
    let scratch = format!("{}-baseline", args.topic);
    delete_topic(&args.cluster, &scratch).await?;
    let mut producer = IdempotentProducer::connect(&args.cluster, &scratch, partitions).await?;
    let started = Instant::now();
    let mut ids = 0..args.records;
    loop {
        let chunk: Vec<KafkaRecord> = ids
            .by_ref()
            .take(4096)
            .map(|id| message(line, id))
            .collect();
        if chunk.is_empty() {
            break;
        }
        producer.send_batch(chunk).await?;
    }
    producer.flush().await?;
    let seconds = started.elapsed().as_secs_f64();
    delete_topic(&args.cluster, &scratch).await?;
    Ok(args.records as f64 / seconds.max(1e-9))
}

/// Peak resident memory of this process so far, from /proc (Linux).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// With the `kafka-pause-points` feature, `EO_PAUSE_AT=<point>` stops the
/// process at that crash point (announced on stderr) for a minute, so that
/// a test can kill it there with SIGKILL: `kafka-before-end-txn` is after
/// the checkpoint completed and before the transaction's commit.
fn pause_points() {
    #[cfg(feature = "kafka-pause-points")]
    if let Ok(point) = std::env::var("EO_PAUSE_AT") {
        let name = point.clone();
        let set = fail::cfg_callback(point, move || {
            eprintln!("paused at {name}");
            std::thread::sleep(std::time::Duration::from_secs(60));
        });
        if let Err(e) = set {
            eprintln!("EO_PAUSE_AT: {e}");
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    pause_points();
    let mut args = Args::parse();
    if let Some(path) = &args.kafka_config {
        args.properties = ClientProperties::read(path).map_err(anyhow::Error::msg)?;
        for ignored in &args.properties.ignored {
            eprintln!(
                "warning: {}: the Kafka client property {ignored} is not used by this client",
                path.display()
            );
        }
    }
    args.cluster =
        Brokers::from(&args.brokers).secured(std::sync::Arc::new(args.properties.security.clone()));
    let parallelism = args.parallelism as usize;
    let partitions = args.partitions.unwrap_or(args.parallelism as u32);
    let job = format!("kafka-sink-demo-{}", args.topic);
    let checkpoint_interval = match args.checkpoint_interval.as_str() {
        "off" => None,
        text => Some(parse_duration(text).map_err(anyhow::Error::msg)?),
    };
    let line = DemoLine {
        record_size: args.record_size as usize,
    };
    if args.fresh {
        delete_topic(&args.cluster, &args.topic)
            .await
            .with_context(|| format!("deleting the topic {}", args.topic))?;
    }
    let baseline_rate = match args.baseline {
        true => Some(baseline(&args, partitions, line).await?),
        false => None,
    };
    let sink = KafkaSink::builder(&args.cluster, &args.topic)
        .properties(&args.properties)
        .partitions(partitions)
        .connect()
        .await?;
    let stats = sink.stats_handle();
    let state = Location::parse(&args.state).map_err(anyhow::Error::msg)?;
    let storage = Storage::open(&state, &location::s3_options(args.endpoint.as_deref()))
        .with_context(|| format!("opening the checkpoint storage {state}"))?;
    if args.fresh {
        storage
            .start_over()
            .await
            .with_context(|| format!("starting over in {state}"))?;
    }
    let checkpointing = checkpoint_interval.map(CheckpointConfig::every);
    let started = Instant::now();
    let report = match args.source {
        InputKind::Sequence => {
            let source = SequenceSource::bounded(args.records)
                .paced(args.rate)
                .map(move |id| message(line, id));
            let builder = Job::builder(job.clone(), source, sink)
                .parallelism(parallelism)
                .checkpoint_storage(storage);
            let builder = match checkpointing {
                Some(config) => builder.checkpointing(config),
                None => builder,
            };
            run(builder, None).await?
        }
        InputKind::Kafka | InputKind::KafkaUnbounded => {
            let source = kafka_source(&args).await?.map(copied);
            let builder = Job::builder(job.clone(), source, sink)
                .parallelism(parallelism)
                .checkpoint_storage(storage)
                .restart_strategy(examples::kafka_input::RESTARTS);
            let builder = match checkpointing {
                Some(config) => builder.checkpointing(config),
                None => builder,
            };
            let run_for = match args.source {
                InputKind::KafkaUnbounded => {
                    Some(parse_duration(&args.run_for).map_err(anyhow::Error::msg)?)
                }
                _ => None,
            };
            run(builder, run_for).await?
        }
    };
    let wall = started.elapsed();
    if report.status == JobStatus::AlreadyFinished {
        eprintln!(
            "the job in {state} has finished already; nothing was written (pass --fresh to start \
             over)"
        );
    }
    let read = read_committed(&args.cluster, &args.topic)
        .await
        .with_context(|| format!("reading {} back", args.topic))?;
    let committed = read.messages.len() as u64;
    match args.source {
        InputKind::Sequence => check_sequence(&args, &report, &read)?,
        InputKind::Kafka | InputKind::KafkaUnbounded => check_copy(&args).await?,
    }
    let open = open_transactions(&args.cluster, &format!("{job}."))
        .await
        .context("listing the job's open transactions")?;
    let m = &report.metrics;
    let wall_s = wall.as_secs_f64();
    let rate = if wall_s > 0.0 {
        m.records_written as f64 / wall_s
    } else {
        0.0
    };
    let s = stats();
    if args.json {
        let summary = serde_json::json!({
            "status": format!("{:?}", report.status),
            "records": args.records,
            "parallelism": parallelism,
            "partitions": partitions,
            "written": m.records_written,
            "committed": committed,
            "prepare_commit_calls": m.prepare_commit_calls,
            "commit_calls": m.commit_calls,
            "checkpoints_completed": m.checkpoints_completed,
            "transactions_committed": s.transactions_committed,
            "transactions_superseded": s.transactions_superseded,
            "already_committed": s.already_committed,
            "aborted_at_start": s.aborted_at_start,
            "open_transactions": open,
            "open_partitions": read.open_partitions,
            "wall_s": wall_s,
            "records_per_s": rate,
            "baseline_idempotent_records_per_s": baseline_rate,
            "ratio_to_baseline": baseline_rate.map(|b| rate / b),
            "peak_rss_bytes": peak_rss_bytes(),
            "group_wait_ms": examples::demo_job::group_wait_ms(&report.metrics),
            "losses": sink_cli::flags::losses_json(&report),
            "counters": sink_cli::flags::counters_json(&report),
        });
        println!("{summary}");
    } else {
        println!(
            "{:?}: written {}, committed {} messages in {} (read back read_committed), {} \
             transactions committed, {} checkpoints, {:.2} s, {:.0} records/s, {} transactions \
             of the job open",
            report.status,
            m.records_written,
            committed,
            args.topic,
            s.transactions_committed,
            m.checkpoints_completed,
            wall_s,
            rate,
            open.len()
        );
        if let Some(base) = baseline_rate {
            println!(
                "baseline: a plain idempotent producer of the same records: {base:.0} records/s \
                 (the sink: {:.2}x)",
                rate / base
            );
        }
    }
    sink_cli::flags::fail_if_output_lost(&report)
}
