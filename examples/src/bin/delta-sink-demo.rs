//! The Delta sink demo: the write-up's experiment ("no checkpoint, never
//! commits") with a Delta Lake table, and a job that survives being killed.
//!
//! With no flags it runs the write-up's three modes one after another (3 s
//! each for the unbounded ones) and prints its table, with Delta commits
//! where the file demo has files. With flags it runs one job; run the same
//! command again after a crash (even SIGKILL) and it resumes from its last
//! completed checkpoint.
//!
//! ```text
//! cargo run --release -p examples --features delta --bin delta-sink-demo
//! cargo run --release -p examples --features delta --bin delta-sink-demo -- --out ./events --records 1000000 --json
//! delta-sink-demo --out s3://bucket/events --state s3://bucket/events-state --endpoint http://127.0.0.1:9000
//! ```
//!
//! Each record is one row `(id bigint, payload string)`: the id, and filler
//! up to `--record-size` bytes. With `--source kafka --brokers B --topic T
//! --group G` (built with `--features delta,kafka`; `kafka-unbounded` with
//! `--run-for`) each message of the topic is a row: its partition and offset
//! as the id (`partition × 2^40 + offset`), its value as the payload; the
//! partitions' positions are committed in the table with the rows, so
//! several instances of one group (each with its own `--state`) may write
//! one table, and a partition's next owner reads on where the table ends. `--out` is the table's location; the
//! checkpoints live in `--out/.state` unless `--state` says where. The
//! summary counts the rows this job committed from the table's log (the
//! rows each of its transactions added, by its application id, so other
//! writers of the table are not counted), and, when only this job writes
//! there, checks the table's ids: each once.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_job::{self, JobArgs, JobConfig, Mode, Preset};
#[cfg(feature = "kafka")]
use examples::kafka_input::KafkaSourceArgs;
use serde::Serialize;
use sink_api::Lineage;
use sink_cli::location::{self, Location};
use sink_runtime::{BuildError, CheckpointConfig, Job, JobReport, JobStatus, RuntimeMode};
use sinks_delta::arrow_schema::{DataType, Field, Schema};
use sinks_delta::{Compaction, DeltaSink, TableLocation};

#[derive(Debug, Parser)]
#[command(
    about = "Two-phase-commit Delta Lake sink demo: the 'no checkpoint, never commits' experiment, with a table"
)]
struct Args {
    #[command(flatten)]
    job: JobArgs,
    /// Merge small files after the checkpoints that add to them (files
    /// under 16 MiB, once a partition holds 10).
    #[arg(long)]
    compaction: bool,
    /// With --source kafka or kafka-unbounded: what to read.
    #[cfg(feature = "kafka")]
    #[command(flatten)]
    kafka: KafkaSourceArgs,
}

/// The table's location when --out is not given.
const DEFAULT_OUT: &str = "./delta-demo-table";

/// One row of the demo.
#[derive(Debug, Serialize)]
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

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, false),
    ])
}

/// The demo's job name: with the lineage, its Delta application id.
const JOB_NAME: &str = "delta-sink-demo";

/// What the table holds after a run, read back from it.
struct TableCount {
    /// Rows this job's transactions added (its lineage's application id),
    /// however many other writers the table has.
    rows: u64,
    /// Rows in the table, every writer's.
    table_rows: u64,
    /// Distinct ids in the table; `None` when other writers' rows are in it
    /// too (their ids may equal this job's without a duplicate).
    distinct_ids: Option<u64>,
    /// This job's transactions that added files (one per checkpoint with
    /// data).
    delta_commits: usize,
    /// The newest table version (-1: no table).
    version: i64,
    /// Data files in the newest version.
    data_files: usize,
}

/// The table after a run of the job in `lineage`, counted from the log's
/// entries (each transaction's added rows, by application id) and the
/// table's ids.
async fn count(table: &TableLocation, lineage: Option<&Lineage>) -> anyhow::Result<TableCount> {
    let entries = sinks_delta::read::log_entries(table).await?;
    let Some(last) = entries.last() else {
        return Ok(TableCount {
            rows: 0,
            table_rows: 0,
            distinct_ids: Some(0),
            delta_commits: 0,
            version: -1,
            data_files: 0,
        });
    };
    let app_id = lineage.map(|lineage| format!("{JOB_NAME}/{lineage}"));
    let adding: Vec<_> = entries.iter().filter(|e| e.rows_added > 0).collect();
    let (ours, others): (Vec<_>, Vec<_>) = adding
        .into_iter()
        .partition(|e| app_id.is_some() && e.query_id == app_id);
    let ids = sinks_delta::read::int64_column(table, "id", None).await?;
    let distinct = others.is_empty().then(|| {
        let distinct: std::collections::BTreeSet<i64> = ids.iter().copied().collect();
        distinct.len() as u64
    });
    Ok(TableCount {
        rows: ours.iter().map(|e| e.rows_added).sum(),
        table_rows: ids.len() as u64,
        distinct_ids: distinct,
        delta_commits: ours.len(),
        version: i64::try_from(last.version).unwrap_or(i64::MAX),
        data_files: sinks_delta::read::active_files(table).await?.len(),
    })
}

/// What one run gives.
struct Outcome {
    report: JobReport,
    table: TableCount,
    wall: Duration,
}

async fn run(config: &JobConfig, args: &Args, show_progress: bool) -> anyhow::Result<Outcome> {
    if config.source.is_kafka() {
        return run_kafka(config, args, show_progress).await;
    }
    let record_size = config.record_size;
    let source = config.sequence_source()?;
    let source = sink_runtime::source::Source::map(source, move |id| DemoRow::new(id, record_size));
    run_job(config, source, args.compaction, show_progress).await
}

#[cfg(feature = "kafka")]
async fn run_kafka(
    config: &JobConfig,
    args: &Args,
    show_progress: bool,
) -> anyhow::Result<Outcome> {
    let source = args.kafka.source(!config.source.is_unbounded()).await?;
    let source = sink_runtime::source::Source::map(source, |message| DemoRow::of_message(&message));
    let outcome = run_job(config, source, args.compaction, show_progress).await?;
    // The end check (examples::kafka_check): each record of the input below
    // the job's positions is a row of the table once, by its id.
    let table = location::delta_table(&config.out, &config.options)?;
    let sink = DeltaSink::<DemoRow>::builder(table.clone(), schema()).build()?;
    let positions = args.kafka.job_positions(&sink).await?;
    let ids = sinks_delta::read::int64_column(&table, "id", None)
        .await
        .with_context(|| format!("reading the table {} back", config.out))?;
    let input = args.kafka.input_at(&positions).await?;
    let id = |m: &sinks_kafka::CommittedMessage| {
        [examples::kafka_input::message_id_at(m.partition, m.offset)]
    };
    input.compare(id, ids).check(
        &format!("the table {}", config.out),
        &input.topic,
        "row id: partition and offset",
    )?;
    Ok(outcome)
}

#[cfg(not(feature = "kafka"))]
async fn run_kafka(_: &JobConfig, _: &Args, _: bool) -> anyhow::Result<Outcome> {
    bail!(
        "this build of delta-sink-demo reads no Kafka: build it with --features delta,kafka \
         (cargo run -p examples --features delta,kafka --bin delta-sink-demo -- --source kafka \
         --brokers … --topic … --group …)"
    )
}

/// Runs `source` into the demo's table, as `config` says.
async fn run_job<Src>(
    config: &JobConfig,
    source: Src,
    compaction: bool,
    show_progress: bool,
) -> anyhow::Result<Outcome>
where
    Src: sink_runtime::source::Source<Record = DemoRow>,
{
    let table = location::delta_table(&config.out, &config.options)?;
    let storage = demo_job::open_state(config).await?;
    let builder = DeltaSink::<DemoRow>::builder(table.clone(), schema());
    let sink = match compaction {
        true => builder.compaction(Compaction::default()),
        false => builder,
    }
    .build()?;
    let mut builder = Job::builder(JOB_NAME, source, sink)
        .parallelism(config.parallelism)
        .mode(match config.mode {
            Mode::Streaming => RuntimeMode::Streaming,
            Mode::Batch => RuntimeMode::Batch,
        })
        .checkpoint_storage(storage);
    if let Some(interval) = config.checkpoint_interval {
        builder = builder.checkpointing(CheckpointConfig::every(interval));
    }
    if config.allow_uncommitted {
        builder = builder.allow_uncommitted_output();
    }
    #[cfg(feature = "kafka")]
    if config.source.is_kafka() {
        builder = builder.restart_strategy(examples::kafka_input::RESTARTS);
    }
    let job = builder.build()?;
    let started = Instant::now();
    let handle = job.start();
    let report = demo_job::wait_for(handle, config, started, show_progress).await?;
    let wall = started.elapsed();
    let table = count(&table, report.lineage.as_ref())
        .await
        .with_context(|| format!("reading the table {} back", config.out))?;
    // Only this job writes there: each of its rows once, and nothing else.
    if let Some(distinct) = table.distinct_ids {
        if table.table_rows != distinct || table.rows != table.table_rows {
            bail!(
                "the table {} holds {} rows, {} distinct ids, and the job's transactions added {}",
                config.out,
                table.table_rows,
                distinct,
                table.rows
            );
        }
    }
    Ok(Outcome {
        report,
        table,
        wall,
    })
}

async fn write_up_table(args: &Args) -> anyhow::Result<()> {
    println!(
        "{:<27} {:<26} {:<11} {:>8} {:>10} {:>15} {:>14}",
        "mode", "source", "checkpoint", "received", "committed", "prepare_commit", "delta commits"
    );
    let out = match &args.job.out {
        Some(out) => out.clone(),
        None => Location::parse(DEFAULT_OUT).map_err(anyhow::Error::msg)?,
    };
    let mut notes = Vec::new();
    for (label, preset) in Preset::ALL {
        let mut config = JobConfig::table_row(label, preset, &out, args.job.endpoint.as_deref())?;
        let (source, checkpoint) = (config.source_text(), config.checkpoint_text());
        match run(&config, args, false).await {
            Ok(outcome) => {
                print_row(label, &source, &checkpoint, &outcome);
                sink_cli::flags::fail_if_output_lost(&outcome.report)?;
            }
            Err(error) if error.downcast_ref::<BuildError>().is_some() => {
                println!(
                    "{label:<27} {source:<26} {checkpoint:<11} {:>8} {:>10} {:>15} {:>14}",
                    "-", "refused", "-", "-"
                );
                notes.push(format!("{label}: refused at build time: {error}"));
                config.allow_uncommitted = true;
                let forced = run(&config, args, false).await?;
                print_row("unbounded-nockpt (forced)", &source, &checkpoint, &forced);
            }
            Err(error) => return Err(error),
        }
    }
    for note in notes {
        println!("\n{note}");
    }
    println!(
        "\nThe tables are under {out}; committed rows are counted by reading each table back."
    );
    Ok(())
}

fn print_row(label: &str, source: &str, checkpoint: &str, outcome: &Outcome) {
    let m = &outcome.report.metrics;
    println!(
        "{label:<27} {source:<26} {checkpoint:<11} {:>8} {:>10} {:>15} {:>14}",
        m.records_written, outcome.table.rows, m.prepare_commit_calls, outcome.table.delta_commits
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    if args.job.is_table() && !args.compaction {
        return write_up_table(&args).await;
    }
    let label = args.job.label();
    let config = JobConfig::from_args(&args.job, DEFAULT_OUT)?;
    let outcome = match run(&config, &args, !args.job.json).await {
        Ok(outcome) => outcome,
        Err(error) => {
            if let Some(build) = error.downcast_ref::<BuildError>() {
                bail!("{build}\n(for this demo: pass --checkpoint-interval 1s, or --allow-uncommitted to see the pitfall)");
            }
            return Err(error);
        }
    };
    if outcome.report.status == JobStatus::AlreadyFinished {
        eprintln!(
            "the job in {} has finished already; nothing was written (pass --fresh to start over)",
            config.out
        );
    }
    let m = &outcome.report.metrics;
    let wall_s = outcome.wall.as_secs_f64();
    if args.job.json {
        let summary = serde_json::json!({
            "mode": label,
            "status": format!("{:?}", outcome.report.status),
            "records": config.records,
            "parallelism": config.parallelism,
            "written": m.records_written,
            "committed": outcome.table.rows,
            "table_rows": outcome.table.table_rows,
            "distinct_ids": outcome.table.distinct_ids,
            "prepare_commit_calls": m.prepare_commit_calls,
            "commit_calls": m.commit_calls,
            "checkpoints_completed": m.checkpoints_completed,
            "delta_commits": outcome.table.delta_commits,
            "table_version": outcome.table.version,
            "data_files": outcome.table.data_files,
            "wall_s": wall_s,
            "records_per_s": if wall_s > 0.0 { m.records_written as f64 / wall_s } else { 0.0 },
            "group_wait_ms": examples::demo_job::group_wait_ms(&outcome.report.metrics),
            "losses": sink_cli::flags::losses_json(&outcome.report),
            "counters": sink_cli::flags::counters_json(&outcome.report),
        });
        println!("{summary}");
    } else {
        println!(
            "{label}: {:?}; written {}, {} rows committed by this job, {} in the table ({}), \
             {} prepare_commit calls, {} checkpoints, {} Delta commits, table version {}, {} data \
             files, {:.2} s",
            outcome.report.status,
            m.records_written,
            outcome.table.rows,
            outcome.table.table_rows,
            match outcome.table.distinct_ids {
                Some(distinct) => format!("{distinct} distinct ids"),
                None => "other writers' rows too".to_string(),
            },
            m.prepare_commit_calls,
            m.checkpoints_completed,
            outcome.table.delta_commits,
            outcome.table.version,
            outcome.table.data_files,
            wall_s
        );
    }
    sink_cli::flags::fail_if_output_lost(&outcome.report)
}
