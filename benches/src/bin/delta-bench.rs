//! The Delta sink against delta-rs' own writer, on the same rows, in one
//! run, as a ratio.
//!
//! ```text
//! cargo run --profile bench -p sink-benches --features delta --bin delta-bench -- --rows 10000000 --json
//! ```
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | throughput | the demo's rows (an id and 79 bytes of payload) through the Delta sink, parallelism 2, 1 s checkpoints on local disk, files rolled at 128 MiB, one Delta transaction per checkpoint | two tasks writing the same rows with delta-rs' `RecordBatchWriter` (files rolled at 128 MiB), then one commit |
//! | peak RSS | the job, alone in its process | the baseline, alone in its process |
//!
//! Both turn rows into Arrow batches the same way (serde through
//! arrow-json's decoder, 4096 rows at a time), write Parquet with Snappy,
//! and write to a local directory. Each measurement runs in a child
//! process of its own (this binary with `--child`); they alternate `--runs`
//! times and the medians are compared. Every row is counted in the table
//! afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use deltalake_core::kernel::engine::arrow_conversion::TryFromArrow;
use deltalake_core::kernel::StructType;
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::parquet::basic::Compression;
use deltalake_core::parquet::file::properties::WriterProperties;
use deltalake_core::writer::{DeltaWriter, RecordBatchWriter};
use serde::Serialize;
use serde_json::{json, Value};
use sink_benches::{alternate_children, peak_rss_bytes, table_summary};
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage, SequenceSource};
use sinks_delta::arrow_schema::{DataType, Field, Schema};
use sinks_delta::{DeltaSink, TableLocation};

#[derive(Debug, Parser)]
#[command(about = "Benchmarks the Delta sink against delta-rs' own writer on the same rows")]
struct Args {
    /// Rows per measurement.
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    /// Measurements of each kind; the medians are compared.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the tables go (a directory; emptied after each measurement).
    /// Default: a temporary directory.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Internal: run one measurement ("sink" or "plain") into this table.
    #[arg(long, hide = true, num_args = 2, value_names = ["WHAT", "TABLE"])]
    child: Option<Vec<String>>,
}

/// Files roll at this size on both sides.
const FILE_BYTES: usize = 128 << 20;
/// Rows per Arrow batch on both sides (the runtime's batch size).
const BATCH_ROWS: u64 = 4096;
/// Subtasks of the job, tasks of the baseline.
const WRITERS: u64 = 2;

/// The demo's row: an id and filler up to 100 bytes.
#[derive(Debug, Serialize)]
struct Row {
    id: i64,
    payload: &'static str,
}

const PAYLOAD: &str =
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

fn row(id: u64) -> Row {
    Row {
        id: id as i64,
        payload: PAYLOAD,
    }
}

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, false),
    ])
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")
}

/// The rows through the Delta sink under the runtime.
async fn sink_job(table: &std::path::Path, rows: u64) -> anyhow::Result<Value> {
    let location = TableLocation::local(table)?;
    let sink = DeltaSink::<Row>::builder(location.clone(), schema())
        .roll_files_at_checkpoints_and_at_size(FILE_BYTES)
        .build()?;
    let state = tempfile::tempdir()?;
    let started = Instant::now();
    let report = Job::builder("delta-bench", SequenceSource::bounded(rows).map(row), sink)
        .parallelism(WRITERS as usize)
        .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
        .checkpoint_storage(LocalCheckpointStorage::open(state.path())?)
        .build()?
        .run()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    let committed = sinks_delta::read::int64_column(&location, "id", None)
        .await?
        .len() as u64;
    if committed != rows {
        bail!("the job committed {committed} of {rows} rows");
    }
    Ok(json!({
        "seconds": seconds,
        "rows": rows,
        "checkpoints": report.metrics.checkpoints_completed,
        "peak_rss_bytes": peak,
    }))
}

/// The same rows written by delta-rs' `RecordBatchWriter` in two tasks,
/// committed once.
async fn plain(table: &std::path::Path, rows: u64) -> anyhow::Result<Value> {
    std::fs::create_dir_all(table)?;
    let url = url::Url::from_directory_path(table.canonicalize()?)
        .map_err(|()| anyhow::anyhow!("{} is not absolute", table.display()))?;
    let columns = StructType::try_from_arrow(&schema())?;
    let started = Instant::now();
    let mut created = CreateBuilder::new()
        .with_location(url.as_str())
        .with_columns(columns.fields().cloned())
        .await?;
    let arrow = Arc::new(schema());
    let per_task = rows / WRITERS;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|task| {
            let mut writer = RecordBatchWriter::for_table(&created)?.with_writer_properties(
                WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .set_max_row_group_row_count(Some(128 * 1024))
                    .build(),
            );
            let arrow = arrow.clone();
            let (from, to) = (
                task * per_task,
                if task + 1 == WRITERS {
                    rows
                } else {
                    (task + 1) * per_task
                },
            );
            Ok(tokio::spawn(async move {
                let mut decoder = arrow_json::ReaderBuilder::new(arrow).build_decoder()?;
                let mut adds = Vec::new();
                let mut id = from;
                while id < to {
                    let end = (id + BATCH_ROWS).min(to);
                    let batch: Vec<Row> = (id..end).map(row).collect();
                    decoder.serialize(&batch)?;
                    if let Some(batch) = decoder.flush()? {
                        writer.write(batch).await?;
                    }
                    if writer.buffer_len() >= FILE_BYTES {
                        adds.extend(writer.flush().await?);
                    }
                    id = end;
                }
                adds.extend(writer.flush().await?);
                Ok::<_, anyhow::Error>(adds)
            }))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut adds = Vec::new();
    for task in tasks {
        adds.extend(task.await??);
    }
    let actions = adds
        .into_iter()
        .map(deltalake_core::kernel::Action::Add)
        .collect();
    let snapshot = created.snapshot()?;
    deltalake_core::kernel::transaction::CommitBuilder::default()
        .with_actions(actions)
        .build(
            Some(snapshot),
            created.log_store(),
            deltalake_core::protocol::DeltaOperation::Write {
                mode: deltalake_core::protocol::SaveMode::Append,
                partition_by: None,
                predicate: None,
            },
        )
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    created.update_state().await?;
    let location = TableLocation::local(table)?;
    let committed = sinks_delta::read::int64_column(&location, "id", None)
        .await?
        .len() as u64;
    if committed != rows {
        bail!("the baseline committed {committed} of {rows} rows");
    }
    Ok(json!({ "seconds": seconds, "rows": rows, "peak_rss_bytes": peak }))
}

fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    if let Some(child) = &args.child {
        let table = std::path::Path::new(&child[1]);
        let result = match child[0].as_str() {
            "sink" => runtime()?.block_on(sink_job(table, args.rows))?,
            "plain" => runtime()?.block_on(plain(table, args.rows))?,
            other => bail!("unknown measurement '{other}'"),
        };
        println!("{result}");
        return Ok(());
    }
    let scratch = tempfile::tempdir()?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| scratch.path().to_path_buf());
    let (sink, plain) = alternate_children(args.runs, args.rows, &dir)?;
    let summary = table_summary(args.rows, args.runs, sink, plain);
    let (sink_rate, plain_rate) = (
        summary["sink_rows_per_s"].as_f64().unwrap_or(f64::NAN),
        summary["plain_rows_per_s"].as_f64().unwrap_or(f64::NAN),
    );
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "Delta sink: {sink_rate:.0} rows/s; delta-rs' RecordBatchWriter: {plain_rate:.0} rows/s; ratio {:.3}",
            sink_rate / plain_rate
        );
        println!(
            "peak RSS: Delta sink {:.0} MiB, delta-rs' writer {:.0} MiB",
            summary["sink_peak_rss_mib"].as_f64().unwrap_or(0.0),
            summary["plain_peak_rss_mib"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
