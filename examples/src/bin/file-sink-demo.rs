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
//! up to `--record-size` bytes, a newline. Finished files are every
//! non-hidden file under `--out`; the checkpoints live in `--out/.state`
//! unless `--state` says where.
//!
//! On S3 or an S3-compatible server (credentials and region from the usual
//! `AWS_*` variables):
//!
//! ```text
//! file-sink-demo --out s3://bucket/demo --state s3://bucket/demo-state --endpoint http://127.0.0.1:9000 --records 100000
//! ```

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use examples::cli::parse_duration;
use examples::demo_line::DemoLine;
use examples::location::{self, Location, Storage};
use examples::timeline::{render, Sample};
use indicatif::{ProgressBar, ProgressStyle};
use sink_runtime::storage::StorageError;
use sink_runtime::{
    BuildError, CheckpointConfig, Job, JobReport, JobStatus, LocalCheckpointStorage, RuntimeMode,
    SequenceSource,
};
use sinks_file::{FileSinkStats, RollingPolicy};

/// The write-up's three rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Preset {
    /// Unbounded source, 1 s checkpoints, cancelled after --run-for.
    Unbounded,
    /// Unbounded source, checkpointing off: refused unless --allow-uncommitted.
    UnboundedNockpt,
    /// Bounded source, checkpointing off: commits once at end of input.
    Nockpt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SourceKind {
    /// Ends after the last record.
    Bounded,
    /// Waits forever after the last record.
    Unbounded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Streaming,
    Batch,
}

#[derive(Debug, Parser)]
#[command(
    about = "Two-phase-commit file sink demo: the 'no checkpoint, never commits' experiment, with real files"
)]
struct Args {
    /// Output: a directory, or an s3://bucket/prefix URL. Finished files,
    /// and the checkpoints in `.state` unless --state is given.
    #[arg(long, default_value = "./demo-out", value_parser = Location::parse)]
    out: Location,
    /// Where the checkpoints are kept: a directory, or an s3://bucket/prefix
    /// URL. Default: `.state` inside --out.
    #[arg(long, value_parser = Location::parse)]
    state: Option<Location>,
    /// The S3 endpoint, for S3-compatible servers (default: AWS_ENDPOINT_URL,
    /// else AWS itself).
    #[arg(long)]
    endpoint: Option<String>,
    /// One of the write-up's rows (160 records, parallelism 2, 1 s checkpoints where on).
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// Records, with ids 0..N over all subtasks. Default 160.
    #[arg(long)]
    records: Option<u64>,
    /// Subtasks. Default 2.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    parallelism: Option<u64>,
    /// Bounded (default) or unbounded source.
    #[arg(long, value_enum)]
    source: Option<SourceKind>,
    /// Time between checkpoints, such as 1s or 200ms, or `off`. Default 1s.
    #[arg(long)]
    checkpoint_interval: Option<String>,
    /// Streaming (default) or batch.
    #[arg(long, value_enum)]
    runtime_mode: Option<Mode>,
    /// How long an unbounded job runs before it is cancelled. Default 12s.
    #[arg(long, value_parser = parse_duration)]
    run_for: Option<Duration>,
    /// Run an unbounded job without checkpoints although it can never commit.
    #[arg(long)]
    allow_uncommitted: bool,
    /// Bytes per record before the newline (at least 21). Default 100.
    #[arg(long, value_parser = clap::value_parser!(u64).range(21..=1_048_576))]
    record_size: Option<u64>,
    /// Records per second per subtask (0: as fast as possible, the default).
    #[arg(long)]
    rate: Option<u64>,
    /// Print one JSON object with the results on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Start over: delete the job's output and checkpoints in the output
    /// directory first (refused while another instance runs on it).
    #[arg(long)]
    fresh: bool,
    /// Draw written and committed records over time, with a mark at each
    /// completed checkpoint, into this SVG file.
    #[arg(long)]
    timeline: Option<PathBuf>,
}

impl Args {
    /// True when nothing but the output directory was given: run the table.
    fn is_table(&self) -> bool {
        self.preset.is_none()
            && self.records.is_none()
            && self.parallelism.is_none()
            && self.source.is_none()
            && self.checkpoint_interval.is_none()
            && self.runtime_mode.is_none()
            && self.run_for.is_none()
            && !self.allow_uncommitted
            && self.record_size.is_none()
            && self.rate.is_none()
            && !self.json
            && self.timeline.is_none()
    }
}

/// One job to run.
#[derive(Debug, Clone)]
struct Config {
    out: Location,
    state: Location,
    /// The object store client's options (`--endpoint`).
    options: Vec<(String, String)>,
    records: u64,
    parallelism: usize,
    source: SourceKind,
    checkpoint_interval: Option<Duration>,
    mode: Mode,
    run_for: Duration,
    allow_uncommitted: bool,
    record_size: usize,
    rate: u64,
    /// Start over (see [`open_state`]).
    fresh: bool,
}

impl Config {
    fn from_args(args: &Args, out: Location, state: Location) -> anyhow::Result<Config> {
        let preset = args.preset;
        let checkpoint_interval = match args.checkpoint_interval.as_deref() {
            Some("off") => None,
            Some(text) => Some(parse_duration(text).map_err(anyhow::Error::msg)?),
            None if matches!(preset, Some(Preset::UnboundedNockpt | Preset::Nockpt)) => None,
            None => Some(Duration::from_secs(1)),
        };
        let source = args.source.unwrap_or(match preset {
            Some(Preset::Unbounded | Preset::UnboundedNockpt) => SourceKind::Unbounded,
            _ => SourceKind::Bounded,
        });
        Ok(Config {
            out,
            state,
            options: location::s3_options(args.endpoint.as_deref()),
            records: args.records.unwrap_or(160),
            parallelism: args.parallelism.unwrap_or(2) as usize,
            source,
            checkpoint_interval,
            mode: args.runtime_mode.unwrap_or(Mode::Streaming),
            run_for: args.run_for.unwrap_or(Duration::from_secs(12)),
            allow_uncommitted: args.allow_uncommitted,
            record_size: args.record_size.unwrap_or(100) as usize,
            rate: args.rate.unwrap_or(0),
            fresh: args.fresh,
        })
    }
}

/// The state directory's name inside the output, when `--state` is not
/// given.
const STATE_DIR: &str = ".state";

/// What one run gives.
struct Outcome {
    samples: Vec<Sample>,
    report: JobReport,
    committed_records: u64,
    finished_files: usize,
    wall: Duration,
}

fn progress_bar(enabled: bool) -> Option<ProgressBar> {
    if !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

async fn run(config: &Config, show_progress: bool) -> anyhow::Result<Outcome> {
    let sink = location::file_sink_builder(
        &config.out,
        DemoLine {
            record_size: config.record_size,
        },
        &config.options,
    )?
    // Every checkpoint commits everything written before it (parts also roll
    // at 128 MiB): committed output lags by one checkpoint at most.
    .rolling_policy(RollingPolicy {
        max_part_size_bytes: Some(128 * 1024 * 1024),
        ..RollingPolicy::on_checkpoint()
    })
    .part_suffix(".txt")
    .build()?;
    let stats: std::sync::Arc<FileSinkStats> = sink.stats();
    let source = match config.source {
        SourceKind::Bounded => SequenceSource::bounded(config.records),
        SourceKind::Unbounded => SequenceSource::unbounded(config.records),
    }
    .paced(config.rate);
    let storage = open_state(config).await?;
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
    let job = builder.build()?;
    let started = Instant::now();
    let handle = job.start();
    let bar = progress_bar(show_progress);
    let deadline = (config.source == SourceKind::Unbounded).then(|| started + config.run_for);
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

/// Opens the job's checkpoint storage (`out/.state` unless `--state` says
/// otherwise). With `fresh`, starts over: the output is cleared first, then
/// the checkpoints (see [`open_local_state`] and [`start_over_object`]).
async fn open_state(config: &Config) -> anyhow::Result<Storage> {
    match (&config.out, &config.state) {
        (Location::Local(out), Location::Local(state)) => {
            let storage = open_local_state(out, state, config.fresh)?;
            Ok(Storage::Local(storage))
        }
        (out, state) => {
            let storage = Storage::open(state, &config.options)
                .with_context(|| format!("opening the checkpoint storage {state}"))?;
            if config.fresh {
                start_over_object(out, state, &storage, &config.options).await?;
            }
            Ok(storage)
        }
    }
}

/// Starts over with an object store on either side. There is no lock on an
/// object store: an instance still running is first fenced (a new
/// generation claimed, the checkpoints kept), so that it can neither store
/// a checkpoint nor commit; then the output is cleared (every finished
/// object removed, every upload aborted, outside the state's prefix); then
/// the checkpoints go. A crash part-way leaves checkpoints whose output is
/// gone, which a resume refuses, never old output beside a fresh job.
async fn start_over_object(
    out: &Location,
    state: &Location,
    storage: &Storage,
    options: &[(String, String)],
) -> anyhow::Result<()> {
    if let Storage::Object(storage) = storage {
        storage
            .fence()
            .await
            .with_context(|| format!("fencing {state} for --fresh"))?;
    }
    match out {
        Location::Local(dir) => {
            if dir.exists() {
                std::fs::remove_dir_all(dir)
                    .with_context(|| format!("removing {} for --fresh", dir.display()))?;
            }
        }
        Location::S3(url) => {
            let keep = match state {
                Location::S3(state) => state.strip_prefix(&format!("{url}/")).map(str::to_string),
                Location::Local(_) => None,
            };
            sinks_file::clear_object_output(
                &location::object_output(url, options)?,
                keep.as_deref(),
            )
            .await
            .with_context(|| format!("clearing {url} for --fresh"))?;
        }
    }
    storage
        .start_over()
        .await
        .with_context(|| format!("starting over in {state} for --fresh"))
}

/// Opens the local state directory `state`, taking its lock before
/// anything in `out` is touched. With `fresh`, and only once the lock is
/// held, starts over: everything in `out` but the state directory is
/// deleted (finished files, hidden parts, the file sink's identity marker),
/// then the checkpoints and the finished marker
/// ([`LocalCheckpointStorage::start_over`], which keeps the generation, so
/// part and transaction names never repeat). While another instance holds
/// the lock, `--fresh` is refused and nothing is deleted.
///
/// The output goes before the checkpoints: a crash in between leaves
/// checkpoints without their output, which a resume refuses (the output
/// directory has no identity marker), never a fresh job writing again
/// beside old output.
fn open_local_state(
    out: &std::path::Path,
    state: &std::path::Path,
    fresh: bool,
) -> anyhow::Result<LocalCheckpointStorage> {
    let storage = match LocalCheckpointStorage::open(state) {
        Ok(storage) => storage,
        Err(error @ StorageError::Locked { .. }) if fresh => {
            bail!("--fresh refused, nothing was deleted: {error}")
        }
        Err(error) => {
            return Err(error)
                .with_context(|| format!("opening the state directory {}", state.display()))
        }
    };
    if fresh {
        let entries = match std::fs::read_dir(out) {
            Ok(entries) => entries.collect::<Vec<_>>(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => {
                return Err(error).with_context(|| format!("listing {} for --fresh", out.display()))
            }
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {} for --fresh", out.display()))?;
            let path = entry.path();
            if path == state {
                continue;
            }
            let removed = match entry.file_type() {
                Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
            removed.with_context(|| format!("removing {} for --fresh", path.display()))?;
        }
        storage
            .start_over()
            .with_context(|| format!("starting over in {} for --fresh", state.display()))?;
    }
    Ok(storage)
}

async fn table(args: &Args) -> anyhow::Result<()> {
    println!(
        "{:<27} {:<26} {:<11} {:>8} {:>10} {:>15} {:>6}",
        "mode", "source", "checkpoint", "received", "committed", "prepare_commit", "files"
    );
    let mut notes = Vec::new();
    for label in ["unbounded", "unbounded-nockpt", "nockpt"] {
        let preset_args = Args::parse_from(["file-sink-demo", "--preset", label]);
        let out = args.out.join(label);
        let state = out.join(STATE_DIR);
        let mut config = Config::from_args(&preset_args, out, state)?;
        config.options = location::s3_options(args.endpoint.as_deref());
        config.run_for = Duration::from_secs(3);
        config.fresh = true;
        let source = match config.source {
            SourceKind::Bounded => "bounded, ends by itself".to_string(),
            SourceKind::Unbounded => {
                format!("unbounded, {}s then cancel", config.run_for.as_secs())
            }
        };
        let checkpoint = config
            .checkpoint_interval
            .map_or("off".into(), |i| format!("{:?}", i));
        match run(&config, false).await {
            Ok(outcome) => {
                print_row(label, &source, &checkpoint, &outcome);
                examples::cli::fail_if_output_lost(&outcome.report)?;
            }
            Err(error) if error.downcast_ref::<BuildError>().is_some() => {
                println!(
                    "{label:<27} {source:<26} {checkpoint:<11} {:>8} {:>10} {:>15} {:>6}",
                    "-", "refused", "-", "-"
                );
                notes.push(format!("{label}: refused at build time: {error}"));
                config.allow_uncommitted = true;
                let forced = run(&config, false).await?;
                print_row("unbounded-nockpt (forced)", &source, &checkpoint, &forced);
            }
            Err(error) => return Err(error),
        }
    }
    for note in notes {
        println!("\n{note}");
    }
    println!(
        "\nFinished files are under {}; hidden files (a leading dot) are not committed.",
        args.out
    );
    Ok(())
}

fn print_row(label: &str, source: &str, checkpoint: &str, outcome: &Outcome) {
    let m = &outcome.report.metrics;
    println!(
        "{label:<27} {source:<26} {checkpoint:<11} {:>8} {:>10} {:>15} {:>6}",
        m.records_written,
        outcome.committed_records,
        m.prepare_commit_calls,
        outcome.finished_files
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::cli::init_tracing();
    let args = Args::parse();
    if args.is_table() {
        return table(&args).await;
    }
    let label = match args.preset {
        Some(Preset::Unbounded) => "unbounded",
        Some(Preset::UnboundedNockpt) => "unbounded-nockpt",
        Some(Preset::Nockpt) => "nockpt",
        None => "custom",
    };
    let state = args
        .state
        .clone()
        .unwrap_or_else(|| args.out.join(STATE_DIR));
    let config = Config::from_args(&args, args.out.clone(), state)?;
    let outcome = match run(&config, !args.json).await {
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
    if args.json {
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
            "losses": examples::cli::losses_json(&outcome.report),
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
    examples::cli::fail_if_output_lost(&outcome.report)
}
