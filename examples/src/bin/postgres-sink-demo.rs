//! The PostgreSQL sink demo: the file sink demo's records, into a table,
//! committed exactly once with prepared transactions.
//!
//! ```text
//! cargo run --release -p examples --bin postgres-sink-demo -- \
//!     --url "host=127.0.0.1 user=postgres dbname=postgres" --records 1000000 --json --fresh
//! ```
//!
//! Each record is one row `(id bigint, payload text)`: the id, and filler up
//! to `--record-size` bytes. The table is created when missing; the
//! checkpoints live in `--state-dir`, so the same command run again after a
//! crash resumes. `--json` prints the file sink demo's summary fields
//! (`committed` is counted with SQL) plus the transactions committed;
//! `--baseline` first loads the same rows with one plain `COPY`, for
//! comparison.
//!
//! With `--source kafka --brokers B --topic T --group G` (built with
//! `--features postgres,kafka`; `kafka-unbounded` with `--run-for`) each
//! message of the topic is a row: its partition × 2^40 plus its offset as
//! the id, its value as the payload. The partitions' positions are
//! committed in the same transactions as the rows (the sink's positions
//! table), so several instances of one group, each with its own `--job`
//! and `--state-dir`, may write one table.

use std::path::PathBuf;
use std::pin::pin;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_job::SourceKind;
#[cfg(feature = "kafka")]
use examples::kafka_input::KafkaSourceArgs;
use sink_cli::flags::parse_duration;
use sink_runtime::source::Source;
use sink_runtime::{
    CheckpointConfig, Job, JobReport, JobStatus, LocalCheckpointStorage, RuntimeMode,
    SequenceSource,
};
use sinks_postgres::{
    redact_connection_string, Column, PgRecord, PostgresSink, ToSql, TransactionId, Type,
    POSITIONS_TABLE,
};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::{Client, NoTls};

// No `Debug`: `url` may hold a password. Show it only through
// `redact_connection_string`.
#[derive(Parser)]
#[command(
    about = "Two-phase-commit PostgreSQL sink demo: the demo's records into a table, exactly once"
)]
struct Args {
    /// The server, as a libpq-style string or a postgresql:// URL.
    #[arg(long, default_value = "host=127.0.0.1 user=postgres dbname=postgres")]
    url: String,
    /// The table; created as (id bigint, payload text) when missing.
    #[arg(long, default_value = "demo_records")]
    table: String,
    /// Where the checkpoints are kept.
    #[arg(long, default_value = "./pg-demo-state")]
    state_dir: PathBuf,
    /// The job's name, which names its prepared transactions. Default:
    /// `postgres-sink-demo-<table>`. One live instance of a name per
    /// database: instances of one consumer group writing one table each
    /// need their own (and their own --state-dir).
    #[arg(long)]
    job: Option<String>,
    /// Records, with ids 0..N over all subtasks.
    #[arg(long, default_value_t = 160)]
    records: u64,
    /// What the job reads: the ids 0..N, ending after the last (bounded,
    /// the default) or not (unbounded), or a Kafka topic as a consumer
    /// group (kafka: to the offsets it had at the job's first start;
    /// kafka-unbounded: until --run-for is up).
    #[arg(long, value_enum, default_value = "bounded")]
    source: SourceKind,
    /// With --source kafka or kafka-unbounded: what to read.
    #[cfg(feature = "kafka")]
    #[command(flatten)]
    kafka: KafkaSourceArgs,
    /// How long an unbounded job runs before it is cancelled.
    #[arg(long, default_value = "12s", value_parser = parse_duration)]
    run_for: Duration,
    /// Subtasks (each with its own connection).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    parallelism: u64,
    /// Time between checkpoints, such as 1s or 200ms, or `off`.
    #[arg(long, default_value = "1s")]
    checkpoint_interval: String,
    /// Run in batch mode (one commit at the end).
    #[arg(long)]
    batch: bool,
    /// Bytes per record's payload plus its id (at least 21).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(21..=1_048_576))]
    record_size: u64,
    /// Records per second per subtask (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Drop the table's rows, this job's prepared transactions and the
    /// checkpoints first, and start over (with a Kafka source, also the
    /// group's positions in the sink's positions table).
    #[arg(long)]
    fresh: bool,
    /// Also load the same rows with one plain COPY (no sink, no
    /// checkpoints) into a scratch table, and report both rates.
    #[arg(long)]
    baseline: bool,
    /// Print one JSON object with the results on the last line of stdout.
    #[arg(long)]
    json: bool,
}

/// One row of the demo.
struct DemoRow {
    id: i64,
    payload: String,
}

impl DemoRow {
    fn new(id: u64, record_size: usize) -> DemoRow {
        DemoRow {
            id: i64::try_from(id).unwrap_or(i64::MAX),
            payload: "x".repeat(record_size.saturating_sub(21)),
        }
    }

    /// A Kafka message's row: its partition and offset as the id, its
    /// value (as text) as the payload.
    #[cfg(feature = "kafka")]
    fn of_message(message: &sources_kafka::KafkaMessage) -> DemoRow {
        DemoRow {
            id: examples::kafka_input::message_id(message),
            payload: String::from_utf8_lossy(message.value_bytes()).into_owned(),
        }
    }
}

impl PgRecord for DemoRow {
    fn columns() -> Vec<Column> {
        vec![
            Column::new("id", Type::INT8),
            Column::new("payload", Type::TEXT),
        ]
    }
    fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>) {
        out.push(&self.id);
        out.push(&self.payload);
    }
}

/// Connects to `url`; a failure names the server through
/// `redact_connection_string`, never with its password.
async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {}", redact_connection_string(url)))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Creates the table if needed; with `fresh`, empties it, rolls back this
/// job's prepared transactions and removes the positions of `scope` (the
/// Kafka source's, when it reads one).
async fn prepare(
    client: &mut Client,
    args: &Args,
    job: &str,
    scope: Option<&str>,
) -> anyhow::Result<()> {
    let table = &args.table;
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (id bigint NOT NULL, payload text NOT NULL)"
        ))
        .await
        .with_context(|| format!("creating table {table}"))?;
    if args.fresh {
        let prepared = client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
                &[],
            )
            .await?;
        for row in prepared {
            let gid: String = row.get(0);
            if TransactionId::parse(&gid).is_none_or(|id| id.job != job) {
                continue;
            }
            client
                .batch_execute(&format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''")))
                .await?;
        }
        // The rows and the positions they were read to go together: a
        // crash in between leaves both.
        let transaction = client.transaction().await?;
        transaction
            .batch_execute(&format!("TRUNCATE {table}"))
            .await?;
        if let Some(scope) = scope {
            // The positions table exists once a sink connected.
            let exists: Option<String> = transaction
                .query_one(
                    &format!("SELECT to_regclass('{POSITIONS_TABLE}')::text"),
                    &[],
                )
                .await?
                .get(0);
            if exists.is_some() {
                transaction
                    .execute(
                        &format!("DELETE FROM {POSITIONS_TABLE} WHERE scope = $1"),
                        &[&scope],
                    )
                    .await
                    .with_context(|| format!("removing the positions of {scope}"))?;
            }
        }
        transaction.commit().await?;
        if args.state_dir.exists() {
            std::fs::remove_dir_all(&args.state_dir)
                .with_context(|| format!("removing {}", args.state_dir.display()))?;
        }
    }
    Ok(())
}

/// Loads the same rows with one plain COPY; returns rows per second.
async fn baseline(client: &Client, args: &Args) -> anyhow::Result<f64> {
    let scratch = format!("{}_baseline", args.table);
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {scratch}; CREATE TABLE {scratch} (id bigint NOT NULL, payload text NOT NULL)"
        ))
        .await?;
    let started = Instant::now();
    let sink = client
        .copy_in(&format!(
            "COPY {scratch} (id, payload) FROM STDIN (FORMAT binary)"
        ))
        .await?;
    let mut copy = pin!(BinaryCopyInWriter::new(sink, &[Type::INT8, Type::TEXT]));
    for id in 0..args.records {
        let row = DemoRow::new(id, args.record_size as usize);
        copy.as_mut().write(&[&row.id, &row.payload]).await?;
    }
    copy.finish().await?;
    let seconds = started.elapsed().as_secs_f64();
    client
        .batch_execute(&format!("DROP TABLE {scratch}"))
        .await?;
    Ok(args.records as f64 / seconds.max(1e-9))
}

/// Runs `source` into `sink` as the flags say; an unbounded source is
/// cancelled after `--run-for`.
async fn run_job<Src>(
    args: &Args,
    job: &str,
    checkpoint_interval: Option<Duration>,
    source: Src,
    sink: PostgresSink<DemoRow>,
) -> anyhow::Result<JobReport>
where
    Src: Source<Record = DemoRow>,
{
    let storage = LocalCheckpointStorage::open(&args.state_dir)
        .with_context(|| format!("opening the state directory {}", args.state_dir.display()))?;
    let mut builder = Job::builder(job, source, sink)
        .parallelism(args.parallelism as usize)
        .checkpoint_storage(storage)
        .mode(if args.batch {
            RuntimeMode::Batch
        } else {
            RuntimeMode::Streaming
        });
    if let Some(interval) = checkpoint_interval {
        builder = builder.checkpointing(CheckpointConfig::every(interval));
    }
    #[cfg(feature = "kafka")]
    if args.source.is_kafka() {
        builder = builder.restart_strategy(examples::kafka_input::RESTARTS);
    }
    let handle = builder.build()?.start();
    if args.source.is_unbounded() {
        let deadline = Instant::now() + args.run_for;
        while !handle.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        handle.cancel();
    }
    Ok(handle.join().await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    let job = args
        .job
        .clone()
        .unwrap_or_else(|| format!("postgres-sink-demo-{}", args.table));
    let checkpoint_interval = match args.checkpoint_interval.as_str() {
        "off" => None,
        text => Some(parse_duration(text).map_err(anyhow::Error::msg)?),
    };
    let mut client = connect(&args.url).await?;
    #[cfg(feature = "kafka")]
    let kafka = match args.source.is_kafka() {
        true => Some(args.kafka.source(!args.source.is_unbounded()).await?),
        false => None,
    };
    #[cfg(feature = "kafka")]
    let scope = kafka.as_ref().map(|source| source.scope());
    #[cfg(not(feature = "kafka"))]
    let scope: Option<String> = None;
    prepare(&mut client, &args, &job, scope.as_deref()).await?;
    let baseline_rate = match args.baseline {
        true => Some(baseline(&client, &args).await?),
        false => None,
    };
    let parallelism = args.parallelism as usize;
    let sink = PostgresSink::<DemoRow>::connect(&args.url, &args.table, parallelism).await?;
    let stats = sink.stats_handle();
    let record_size = args.record_size as usize;
    let started = Instant::now();
    let report = match args.source {
        SourceKind::Bounded | SourceKind::Unbounded => {
            let ids = match args.source {
                SourceKind::Bounded => SequenceSource::bounded(args.records),
                _ => SequenceSource::unbounded(args.records),
            };
            let source = ids
                .paced(args.rate)
                .map(move |id| DemoRow::new(id, record_size));
            run_job(&args, &job, checkpoint_interval, source, sink).await?
        }
        #[cfg(feature = "kafka")]
        SourceKind::Kafka | SourceKind::KafkaUnbounded => {
            let Some(source) = kafka else {
                bail!("the Kafka source was not made");
            };
            let source = source.map(|message| DemoRow::of_message(&message));
            run_job(&args, &job, checkpoint_interval, source, sink).await?
        }
        #[cfg(not(feature = "kafka"))]
        SourceKind::Kafka | SourceKind::KafkaUnbounded => bail!(
            "this build of postgres-sink-demo reads no Kafka: build it with --features \
             postgres,kafka (cargo run -p examples --features postgres,kafka --bin \
             postgres-sink-demo -- --source kafka --brokers … --topic … --group …)"
        ),
    };
    let wall = started.elapsed();
    if report.status == JobStatus::AlreadyFinished {
        eprintln!(
            "the job in {} has finished already; nothing was written (pass --fresh to start over)",
            args.state_dir.display()
        );
    }
    let committed: i64 = client
        .query_one(&format!("SELECT count(*) FROM {}", args.table), &[])
        .await?
        .get(0);
    let distinct: i64 = client
        .query_one(
            &format!("SELECT count(DISTINCT id) FROM {}", args.table),
            &[],
        )
        .await?
        .get(0);
    if distinct != committed {
        bail!(
            "{} holds {committed} rows but only {distinct} distinct ids",
            args.table
        );
    }
    // The end check (examples::kafka_check): each record of the input below
    // the job's positions is a row of the table once, by its id.
    #[cfg(feature = "kafka")]
    if args.source.is_kafka() {
        let sink = PostgresSink::<DemoRow>::connect(&args.url, &args.table, 1).await?;
        let positions = args.kafka.job_positions(&sink).await?;
        let ids: Vec<i64> = client
            .query(&format!("SELECT id FROM {}", args.table), &[])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let input = args.kafka.input_at(&positions).await?;
        let id = |m: &sinks_kafka::CommittedMessage| {
            [examples::kafka_input::message_id_at(m.partition, m.offset)]
        };
        input
            .compare(id, ids)
            .check(&args.table, &input.topic, "row id: partition and offset")?;
    }
    let m = &report.metrics;
    let wall_s = wall.as_secs_f64();
    let per_s = |rows: u64| {
        if wall_s > 0.0 {
            rows as f64 / wall_s
        } else {
            0.0
        }
    };
    if args.json {
        let summary = serde_json::json!({
            "mode": if args.batch { "batch" } else { "streaming" },
            "status": format!("{:?}", report.status),
            "records": args.records,
            "parallelism": parallelism,
            "written": m.records_written,
            "committed": committed,
            "prepare_commit_calls": m.prepare_commit_calls,
            "commit_calls": m.commit_calls,
            "checkpoints_completed": m.checkpoints_completed,
            "transactions_committed": stats().transactions_committed,
            "wall_s": wall_s,
            "records_per_s": per_s(m.records_written),
            "baseline_copy_records_per_s": baseline_rate,
            "group_wait_ms": examples::demo_job::group_wait_ms(&report.metrics),
            "losses": sink_cli::flags::losses_json(&report),
            "counters": sink_cli::flags::counters_json(&report),
        });
        println!("{summary}");
    } else {
        println!(
            "{:?}: written {}, committed {} rows in {} (counted with SQL), {} prepare_commit calls, \
             {} transactions committed, {} checkpoints, {:.2} s, {:.0} rows/s",
            report.status,
            m.records_written,
            committed,
            args.table,
            m.prepare_commit_calls,
            stats().transactions_committed,
            m.checkpoints_completed,
            wall_s,
            per_s(m.records_written)
        );
        if let Some(rate) = baseline_rate {
            println!("baseline: one plain COPY of the same rows: {rate:.0} rows/s");
        }
    }
    sink_cli::flags::fail_if_output_lost(&report)
}
