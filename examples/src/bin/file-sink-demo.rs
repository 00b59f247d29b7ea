//! The file sink demo: the write-up's experiment ("no checkpoint, never
//! commits") with real files, and a job that survives being killed.
//!
//! With no flags it runs the write-up's three modes one after another (3 s
//! each for the unbounded ones) and prints its table. With flags it runs one
//! job; run the same command again after a crash (even SIGKILL) and it
//! resumes from its last completed checkpoint.
//!
//! ```text
//! cargo run --release -p examples --bin file-sink-demo
//! cargo run --release -p examples --bin file-sink-demo -- --records 1000000 --rate 200000 --json
//! ```
//!
//! Each record is one line: its id as 20 zero-padded digits, a comma, filler
//! up to `--record-size` bytes, a newline. With `--format jsonl|csv|parquet`
//! each record is a row `(id, ts, payload)` instead, `ts` its event time
//! (2026-01-01T00:00:00Z plus the id in seconds); Parquet needs the
//! `parquet` feature. `--bucket-by event-hour|event-day` writes into Hive-style
//! `dt=…/hour=…` directories by that time. Finished files are every
//! non-hidden file under `--out`; the checkpoints live in `--out/.state`
//! unless `--state` says where.
//!
//! ```text
//! cargo run --release -p examples --features parquet --bin file-sink-demo -- --format parquet --bucket-by event-hour --records 1000000
//! ```
//!
//! On S3 or an S3-compatible server (credentials and region from the usual
//! `AWS_*` variables):
//!
//! ```text
//! file-sink-demo --out s3://bucket/demo --state s3://bucket/demo-state --endpoint http://127.0.0.1:9000 --records 100000
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_job::{self, JobArgs, JobConfig, Mode, Preset};
use examples::demo_row::{self, BucketBy, Format};
#[cfg(feature = "kafka")]
use examples::kafka_input::{KafkaSourceArgs, ValueLine};
use examples::timeline::{render, Sample};
use sink_cli::location::{self, Location};
use sink_runtime::source::Source;
use sink_runtime::{BuildError, CheckpointConfig, Job, JobReport, JobStatus, RuntimeMode};
use sinks_file::{BucketAssigner, Encoder, FileSinkStats, RollingPolicy};

#[derive(Debug, Parser)]
#[command(
    about = "Two-phase-commit file sink demo: the 'no checkpoint, never commits' experiment, with real files"
)]
struct Args {
    #[command(flatten)]
    job: JobArgs,
    /// With --source kafka or kafka-unbounded: what to read.
    #[cfg(feature = "kafka")]
    #[command(flatten)]
    kafka: KafkaSourceArgs,
    /// Draw written and committed records over time, with a mark at each
    /// completed checkpoint, into this SVG file.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// How records are written: lines (the default), or rows (id, ts,
    /// payload) as JSON lines, CSV or Parquet (the `parquet` feature).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Directories by each record's event time: none (the default),
    /// event-hour (`dt=…/hour=…`) or event-day (`dt=…`).
    #[arg(long, value_enum)]
    bucket_by: Option<BucketBy>,
}

impl Args {
    /// True when no flag but the output was given: the write-up's table.
    fn is_table(&self) -> bool {
        self.job.is_table()
            && self.timeline.is_none()
            && self.format.is_none()
            && self.bucket_by.is_none()
    }

    /// The format, refused with another source than the demo's ids.
    fn format(&self, config: &JobConfig) -> anyhow::Result<Format> {
        let format = self.format.unwrap_or_default();
        let rows = format != Format::Lines || self.bucket_by.unwrap_or_default() != BucketBy::None;
        if rows && config.source.is_kafka() {
            bail!(
                "--format and --bucket-by apply to the demo's generated ids; with --source kafka                  each message's value is written as a line"
            );
        }
        Ok(format)
    }
}

/// The output directory when --out is not given.
const DEFAULT_OUT: &str = "./demo-out";

/// What one run gives.
struct Outcome {
    samples: Vec<Sample>,
    report: JobReport,
    committed_records: u64,
    finished_files: usize,
    wall: Duration,
}

/// Runs the job `config` describes: the ids `0..records` as the demo's
/// lines, or (`--source kafka`) each message's value as a line.
async fn run(config: &JobConfig, args: &Args, show_progress: bool) -> anyhow::Result<Outcome> {
    if config.source.is_kafka() {
        return run_kafka(config, args, show_progress).await;
    }
    let format = args.format(config)?;
    let encoder = demo_row::encoder(format, config.record_size)?;
    let buckets = demo_row::bucket_assigner(args.bucket_by.unwrap_or_default());
    let output = (encoder, buckets, format.suffix());
    run_job(config, config.sequence_source()?, output, show_progress).await
}

#[cfg(feature = "kafka")]
async fn run_kafka(
    config: &JobConfig,
    args: &Args,
    show_progress: bool,
) -> anyhow::Result<Outcome> {
    let source = args.kafka.source(!config.source.is_unbounded()).await?;
    let buckets = Box::new(sinks_file::BasePathBucketAssigner);
    let outcome = run_job(config, source, (ValueLine, buckets, ".txt"), show_progress).await?;
    check_kafka_output(config, args).await?;
    Ok(outcome)
}

/// The end check of a run that read Kafka (`examples::kafka_check`): the
/// finished files hold, as its lines, each record of the input below the
/// job's positions once, and besides only records past them, once each.
/// Counts what the output lacks, read back, whatever the job reported.
#[cfg(feature = "kafka")]
async fn check_kafka_output(config: &JobConfig, args: &Args) -> anyhow::Result<()> {
    // A record is its value and a newline (ValueLine): its lines are the
    // value's pieces between newlines, and a file's are its own without
    // the last newline.
    fn value_lines(value: &[u8]) -> impl Iterator<Item = &[u8]> {
        value.split(|b| *b == b'\n')
    }
    fn file_lines(content: &[u8]) -> impl Iterator<Item = &[u8]> {
        value_lines(content.strip_suffix(b"\n").unwrap_or(content))
    }
    let sink = location::file_sink_builder(&config.out, ValueLine, &config.options)?.build()?;
    let positions = args.kafka.job_positions(&sink).await?;
    let files = location::finished_contents(&config.out, &config.options).await?;
    let input = args.kafka.input_at(&positions).await?;
    let output = files
        .iter()
        .filter(|content| !content.is_empty())
        .flat_map(|content| file_lines(content));
    input
        .compare(|m| value_lines(m.value_bytes()), output)
        .check(&config.out.to_string(), &input.topic, "each value's lines")
}

#[cfg(not(feature = "kafka"))]
async fn run_kafka(_: &JobConfig, _: &Args, _: bool) -> anyhow::Result<Outcome> {
    bail!(
        "this build of file-sink-demo reads no Kafka: build it with --features kafka (cargo run \
         -p examples --features kafka --bin file-sink-demo -- --source kafka --brokers … \
         --topic … --group …)"
    )
}

/// Runs `source` into the file sink through `encoder`, into the buckets
/// `buckets` gives, part names ending with `suffix`, as `config` says.
async fn run_job<Src, E>(
    config: &JobConfig,
    source: Src,
    (encoder, buckets, suffix): (E, Box<dyn BucketAssigner<Src::Record>>, &str),
    show_progress: bool,
) -> anyhow::Result<Outcome>
where
    Src: Source,
    Src::Record: Send + Sync + Clone + serde::Serialize + serde::de::DeserializeOwned,
    E: Encoder<Src::Record>,
{
    let sink = location::file_sink_builder(&config.out, encoder, &config.options)?
        .bucket_assigner(buckets)
        // Every checkpoint commits everything written before it (parts also
        // roll at 128 MiB): committed output lags by one checkpoint at most.
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(128 * 1024 * 1024),
            ..RollingPolicy::on_checkpoint()
        })
        .part_suffix(suffix)
        .build()?;
    let stats: std::sync::Arc<FileSinkStats> = sink.stats();
    let storage = demo_job::open_state(config).await?;
    let mut builder = Job::builder("file-sink-demo", source, sink)
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
    let bar = demo_job::progress_bar(show_progress);
    let deadline = config
        .source
        .is_unbounded()
        .then(|| started + config.run_for);
    let mut samples = Vec::new();
    let report = loop {
        let metrics = handle.metrics();
        samples.push(Sample {
            at_s: started.elapsed().as_secs_f64(),
            written: metrics.records_written,
            committed: stats.snapshot().committed_records,
            checkpoints: metrics.checkpoints_completed,
        });
        if let Some(bar) = &bar {
            bar.set_message(format!(
                "written {:>10}   committed {:>10}   checkpoints {}",
                metrics.records_written,
                stats.snapshot().committed_records,
                metrics.checkpoints_completed
            ));
        }
        if handle.is_finished() {
            break handle.join().await?;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            handle.cancel();
            break handle.join().await?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let metrics = &report.metrics;
    samples.push(Sample {
        at_s: started.elapsed().as_secs_f64(),
        written: metrics.records_written,
        committed: stats.snapshot().committed_records,
        checkpoints: metrics.checkpoints_completed,
    });
    Ok(Outcome {
        samples,
        committed_records: stats.snapshot().committed_records,
        finished_files: location::finished_count(&config.out, &config.options).await?,
        wall: started.elapsed(),
        report,
    })
}

async fn table(args: &Args) -> anyhow::Result<()> {
    let out = args
        .job
        .out
        .clone()
        .unwrap_or(Location::Local(DEFAULT_OUT.into()));
    // The modes write to directories of their own: they run side by side
    // (the two unbounded ones each for --run-for), and their rows are
    // printed in the write-up's order.
    let [unbounded, nockpt_unbounded, nockpt] = Preset::ALL;
    let (unbounded, nockpt_unbounded, nockpt) = tokio::join!(
        rows(unbounded, &out, args),
        rows(nockpt_unbounded, &out, args),
        rows(nockpt, &out, args),
    );
    println!(
        "{:<27} {:<26} {:<11} {:>8} {:>10} {:>15} {:>6}",
        "mode", "source", "checkpoint", "received", "committed", "prepare_commit", "files"
    );
    let mut notes = Vec::new();
    for (lines, note) in [unbounded?, nockpt_unbounded?, nockpt?] {
        for line in lines {
            println!("{line}");
        }
        notes.extend(note);
    }
    for note in notes {
        println!("\n{note}");
    }
    println!("\nFinished files are under {out}; hidden files (a leading dot) are not committed.");
    Ok(())
}

/// Runs the mode `preset` of the table: its row, or for a mode refused at
/// build time, a row saying so, the row of the same job forced to run, and
/// the refusal's note.
async fn rows(
    (label, preset): (&'static str, Preset),
    out: &Location,
    args: &Args,
) -> anyhow::Result<(Vec<String>, Option<String>)> {
    let mut config = JobConfig::table_row(label, preset, out, args.job.endpoint.as_deref())?;
    let (source, checkpoint) = (config.source_text(), config.checkpoint_text());
    match run(&config, args, false).await {
        Ok(outcome) => {
            sink_cli::flags::fail_if_output_lost(&outcome.report)?;
            Ok((vec![row(label, &source, &checkpoint, &outcome)], None))
        }
        Err(error) if error.downcast_ref::<BuildError>().is_some() => {
            let refused = format!(
                "{label:<27} {source:<26} {checkpoint:<11} {:>8} {:>10} {:>15} {:>6}",
                "-", "refused", "-", "-"
            );
            let note = format!("{label}: refused at build time: {error}");
            config.allow_uncommitted = true;
            let forced = run(&config, args, false).await?;
            let forced = row(&format!("{label} (forced)"), &source, &checkpoint, &forced);
            Ok((vec![refused, forced], Some(note)))
        }
        Err(error) => Err(error),
    }
}

/// One row of the table.
fn row(label: &str, source: &str, checkpoint: &str, outcome: &Outcome) -> String {
    let m = &outcome.report.metrics;
    format!(
        "{label:<27} {source:<26} {checkpoint:<11} {:>8} {:>10} {:>15} {:>6}",
        m.records_written,
        outcome.committed_records,
        m.prepare_commit_calls,
        outcome.finished_files
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    if args.is_table() {
        return table(&args).await;
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
    let m = &outcome.report.metrics;
    if let Some(path) = &args.timeline {
        let title = format!(
            "file-sink-demo: {} records, parallelism {}, checkpoints {}",
            config.records,
            config.parallelism,
            config
                .checkpoint_interval
                .map_or("off".into(), |i| format!("every {i:?}"))
        );
        std::fs::write(path, render(&title, &outcome.samples))
            .with_context(|| format!("writing the timeline {}", path.display()))?;
    }
    if outcome.report.status == JobStatus::AlreadyFinished {
        eprintln!(
            "the job in {} has finished already; nothing was written (pass --fresh to start over)",
            config.out
        );
    }
    let wall_s = outcome.wall.as_secs_f64();
    if args.job.json {
        let summary = serde_json::json!({
            "mode": label,
            "status": format!("{:?}", outcome.report.status),
            "records": config.records,
            "parallelism": config.parallelism,
            "written": m.records_written,
            "committed": outcome.committed_records,
            "prepare_commit_calls": m.prepare_commit_calls,
            "commit_calls": m.commit_calls,
            "checkpoints_completed": m.checkpoints_completed,
            "finished_files": outcome.finished_files,
            "wall_s": wall_s,
            "records_per_s": if wall_s > 0.0 { m.records_written as f64 / wall_s } else { 0.0 },
            "group_wait_ms": examples::demo_job::group_wait_ms(&outcome.report.metrics),
            "losses": sink_cli::flags::losses_json(&outcome.report),
            "counters": sink_cli::flags::counters_json(&outcome.report),
        });
        println!("{summary}");
    } else {
        println!(
            "{label}: {:?}; written {}, committed {} in {} finished files, {} prepare_commit calls, \
             {} checkpoints, {:.2} s",
            outcome.report.status,
            m.records_written,
            outcome.committed_records,
            outcome.finished_files,
            m.prepare_commit_calls,
            m.checkpoints_completed,
            wall_s
        );
    }
    sink_cli::flags::fail_if_output_lost(&outcome.report)
}
