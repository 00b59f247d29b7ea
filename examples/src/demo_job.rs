//! What the file and Delta sink demos share: their flags, the write-up's
//! three presets, the job configuration made from them, and where the
//! checkpoints are kept (with `--fresh`, how a demo starts over).

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use sink_runtime::storage::StorageError;
use sink_runtime::{JobHandle, JobReport, LocalCheckpointStorage, SequenceSource};

use sink_cli::flags::parse_duration;
use sink_cli::location::{self, Location, Storage};

/// The write-up's three rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Unbounded source, 1 s checkpoints, cancelled after --run-for.
    Unbounded,
    /// Unbounded source, checkpointing off: refused unless --allow-uncommitted.
    UnboundedNockpt,
    /// Bounded source, checkpointing off: commits once at end of input.
    Nockpt,
}

impl Preset {
    /// Every preset, in the write-up's order, with its name.
    pub const ALL: [(&'static str, Preset); 3] = [
        ("unbounded", Preset::Unbounded),
        ("unbounded-nockpt", Preset::UnboundedNockpt),
        ("nockpt", Preset::Nockpt),
    ];
}

/// What the job reads, and whether it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    /// The ids `0..records`; ends after the last.
    Bounded,
    /// The ids `0..records`; waits forever after the last.
    Unbounded,
    /// A Kafka topic as a consumer group (--brokers, --topic, --group);
    /// ends at the offsets the topic had at the job's first start.
    Kafka,
    /// A Kafka topic as a consumer group; runs until --run-for is up.
    KafkaUnbounded,
}

impl SourceKind {
    /// Whether the job runs until it is cancelled (after --run-for).
    pub fn is_unbounded(self) -> bool {
        matches!(self, SourceKind::Unbounded | SourceKind::KafkaUnbounded)
    }

    /// Whether it reads Kafka.
    pub fn is_kafka(self) -> bool {
        matches!(self, SourceKind::Kafka | SourceKind::KafkaUnbounded)
    }
}

/// The runtime mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Checkpoints (when on) commit as the job runs.
    Streaming,
    /// One commit at the end.
    Batch,
}

/// The flags of one demo job, flattened into each demo's own flags.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// Output: a directory, or an s3://bucket/prefix URL. The checkpoints
    /// go to `.state` inside it unless --state is given.
    #[arg(long, value_parser = Location::parse)]
    pub out: Option<Location>,
    /// Where the checkpoints are kept: a directory, or an s3://bucket/prefix
    /// URL. Default: `.state` inside --out.
    #[arg(long, value_parser = Location::parse)]
    pub state: Option<Location>,
    /// The S3 endpoint, for S3-compatible servers (default: AWS_ENDPOINT_URL,
    /// else AWS itself).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// One of the write-up's rows (160 records, parallelism 2, 1 s checkpoints where on).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Records, with ids 0..N over all subtasks. Default 160.
    #[arg(long)]
    pub records: Option<u64>,
    /// Subtasks. Default 2.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub parallelism: Option<u64>,
    /// Bounded (default) or unbounded source.
    #[arg(long, value_enum)]
    pub source: Option<SourceKind>,
    /// Time between checkpoints, such as 1s or 200ms, or `off`. Default 1s.
    #[arg(long)]
    pub checkpoint_interval: Option<String>,
    /// Streaming (default) or batch.
    #[arg(long, value_enum)]
    pub runtime_mode: Option<Mode>,
    /// How long an unbounded job runs before it is cancelled. Default 12s.
    #[arg(long, value_parser = parse_duration)]
    pub run_for: Option<Duration>,
    /// Run an unbounded job without checkpoints although it can never commit.
    #[arg(long)]
    pub allow_uncommitted: bool,
    /// Bytes per record (at least 21). Default 100.
    #[arg(long, value_parser = clap::value_parser!(u64).range(21..=1_048_576))]
    pub record_size: Option<u64>,
    /// Records per second per subtask (0: as fast as possible, the default).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Print one JSON object with the results on the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Start over: delete the job's output and checkpoints first (refused
    /// while another instance runs on a local state directory; an instance
    /// on object storage is fenced first).
    #[arg(long)]
    pub fresh: bool,
}

impl JobArgs {
    /// True when nothing but the output location (and endpoint) was given:
    /// the demo runs the write-up's table.
    pub fn is_table(&self) -> bool {
        self.state.is_none()
            && self.preset.is_none()
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
    }

    /// The preset's name, or `custom`.
    pub fn label(&self) -> &'static str {
        Preset::ALL
            .iter()
            .find(|(_, preset)| Some(*preset) == self.preset)
            .map_or("custom", |(name, _)| name)
    }
}

/// One job to run, made from the flags.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Where the output goes.
    pub out: Location,
    /// Where the checkpoints go.
    pub state: Location,
    /// The object store client's options (`--endpoint`).
    pub options: Vec<(String, String)>,
    /// Records, ids `0..records`.
    pub records: u64,
    /// Subtasks.
    pub parallelism: usize,
    /// Bounded or not.
    pub source: SourceKind,
    /// Time between checkpoints, or none.
    pub checkpoint_interval: Option<Duration>,
    /// Streaming or batch.
    pub mode: Mode,
    /// How long an unbounded job runs.
    pub run_for: Duration,
    /// Whether an unbounded job may run without checkpoints.
    pub allow_uncommitted: bool,
    /// Bytes per record.
    pub record_size: usize,
    /// Records per second per subtask, 0 for no limit.
    pub rate: u64,
    /// Start over (see [`open_state`]).
    pub fresh: bool,
}

/// The state directory's name inside the output, when `--state` is not
/// given.
pub const STATE_DIR: &str = ".state";

impl JobConfig {
    /// The job `args` describe, writing to `args.out` or else `default_out`.
    pub fn from_args(args: &JobArgs, default_out: &str) -> anyhow::Result<JobConfig> {
        let out = match &args.out {
            Some(out) => out.clone(),
            None => Location::parse(default_out).map_err(anyhow::Error::msg)?,
        };
        let state = args.state.clone().unwrap_or_else(|| out.join(STATE_DIR));
        sink_cli::layout::check(&out, &state)?;
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
        Ok(JobConfig {
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

    /// The configuration of one row of the write-up's table: `preset` in
    /// `out/<name>`, fresh, unbounded ones cancelled after 3 s.
    pub fn table_row(
        name: &str,
        preset: Preset,
        out: &Location,
        endpoint: Option<&str>,
    ) -> anyhow::Result<JobConfig> {
        let args = JobArgs {
            out: Some(out.join(name)),
            state: None,
            endpoint: endpoint.map(str::to_string),
            preset: Some(preset),
            records: None,
            parallelism: None,
            source: None,
            checkpoint_interval: None,
            runtime_mode: None,
            run_for: Some(Duration::from_secs(3)),
            allow_uncommitted: false,
            record_size: None,
            rate: None,
            json: false,
            fresh: true,
        };
        JobConfig::from_args(&args, "unused")
    }

    /// The source column of the write-up's table.
    pub fn source_text(&self) -> String {
        match self.source {
            SourceKind::Bounded => "bounded, ends by itself".to_string(),
            SourceKind::Unbounded => format!("unbounded, {}s then cancel", self.run_for.as_secs()),
            SourceKind::Kafka => "Kafka, to the offsets at start".to_string(),
            SourceKind::KafkaUnbounded => {
                format!("Kafka, {}s then cancel", self.run_for.as_secs())
            }
        }
    }

    /// The ids `0..records` at `--rate`, for a demo that reads them; a
    /// Kafka source is refused naming the demo that reads Kafka.
    pub fn sequence_source(&self) -> anyhow::Result<SequenceSource> {
        let source = match self.source {
            SourceKind::Bounded => SequenceSource::bounded(self.records),
            SourceKind::Unbounded => SequenceSource::unbounded(self.records),
            SourceKind::Kafka | SourceKind::KafkaUnbounded => anyhow::bail!(
                "this demo reads no Kafka yet: file-sink-demo, delta-sink-demo, \
                 postgres-sink-demo and kafka-sink-demo do (cargo run -p examples --features kafka --bin file-sink-demo \
                 -- --source kafka --brokers … --topic … --group …)"
            ),
        };
        Ok(source.paced(self.rate))
    }

    /// The checkpoint column of the write-up's table.
    pub fn checkpoint_text(&self) -> String {
        self.checkpoint_interval
            .map_or("off".into(), |i| format!("{i:?}"))
    }
}

/// Waits for the job `handle` started at `started` to end, as the table
/// demos run it: a spinner with the records written and the checkpoints
/// (when `show_progress` and stderr is a terminal), and an unbounded
/// source cancelled after `--run-for`. Called by `delta-sink-demo` and
/// `iceberg-sink-demo`.
pub async fn wait_for(
    handle: JobHandle,
    config: &JobConfig,
    started: Instant,
    show_progress: bool,
) -> anyhow::Result<JobReport> {
    let bar = progress_bar(show_progress);
    let deadline = config
        .source
        .is_unbounded()
        .then(|| started + config.run_for);
    let report = loop {
        if let Some(bar) = &bar {
            let metrics = handle.metrics();
            bar.set_message(format!(
                "written {:>10}   checkpoints {}",
                metrics.records_written, metrics.checkpoints_completed
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
    Ok(report)
}

/// A spinner on stderr when it is a terminal and `enabled`.
pub fn progress_bar(enabled: bool) -> Option<ProgressBar> {
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

/// Opens the job's checkpoint storage (`out/.state` unless `--state` says
/// otherwise). With `fresh`, starts over: the output is cleared first, then
/// the checkpoints (see `open_local_state` and `start_over_object`).
pub async fn open_state(config: &JobConfig) -> anyhow::Result<Storage> {
    match (&config.out, &config.state) {
        (Location::Local(out), Location::Local(state)) => {
            let storage = open_local_state(out, state, config.fresh)?;
            Ok(Storage::Local(storage))
        }
        (out, state) => {
            let storage = Storage::open(state, &config.options)
                .with_context(|| format!("opening the checkpoint storage {state}"))?;
            // Only an S3 build opens checkpoint storage on an object store.
            #[cfg(feature = "s3")]
            if config.fresh {
                start_over_object(out, state, &storage, &config.options).await?;
            }
            #[cfg(not(feature = "s3"))]
            let _ = out;
            Ok(storage)
        }
    }
}

/// Starts over with an object store on either side. There is no lock on an
/// object store: an instance still running is first fenced (a new
/// generation claimed, the checkpoints kept), so that it can neither store
/// a checkpoint nor commit; then the output is cleared (every object
/// removed, every upload aborted, outside the state's prefix); then the
/// checkpoints go. A crash part-way leaves checkpoints whose output is
/// gone, which a resume refuses, never old output beside a fresh job.
#[cfg(feature = "s3")]
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
/// deleted (finished files, hidden parts, the file sink's identity marker,
/// a Delta table's log and data), then the checkpoints and the finished
/// marker ([`LocalCheckpointStorage::start_over`], which keeps the
/// generation, so part and transaction names never repeat). While another
/// instance holds the lock, `--fresh` is refused and nothing is deleted.
///
/// The output goes before the checkpoints: a crash in between leaves
/// checkpoints without their output, which a resume refuses (the output
/// directory has no identity marker), never a fresh job writing again
/// beside old output.
fn open_local_state(
    out: &Path,
    state: &Path,
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
        // The state is recognised by what it is, not by how it was spelled
        // (`./out` and `out/.state`): an entry is kept when the state is it
        // or lies inside it.
        let real_state = std::fs::canonicalize(state)
            .with_context(|| format!("resolving {} for --fresh", state.display()))?;
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
            if std::fs::canonicalize(&path).is_ok_and(|real| real_state.starts_with(real)) {
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

/// How long the job's Kafka source members waited on their consumer group
/// (joining and syncing, rebalances included), in milliseconds, from its
/// metrics: the demos' JSON `group_wait_ms`. Zero without a Kafka source
/// (or in a build without the `kafka` feature).
pub fn group_wait_ms(metrics: &sink_runtime::MetricsSnapshot) -> u64 {
    #[cfg(feature = "kafka")]
    {
        let waited = sources_kafka::KafkaSource::group_wait(metrics);
        u64::try_from(waited.as_millis()).unwrap_or(u64::MAX)
    }
    #[cfg(not(feature = "kafka"))]
    {
        let _ = metrics;
        0
    }
}
