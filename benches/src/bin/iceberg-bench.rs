//! The Iceberg sink against iceberg-rust's own writer, on the same rows, in
//! one run, as a ratio.
//!
//! ```text
//! cargo run --profile bench -p sink-benches --features iceberg --bin iceberg-bench -- --json
//! ```
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | throughput | the demo's rows (an id and 79 bytes of payload) through the Iceberg sink, parallelism 2, 1 s checkpoints on local disk, files rolled at 128 MiB, one fast append per checkpoint, every file and metadata file fsynced | two tasks writing the same rows with iceberg-rust's data file writer (files rolled at 128 MiB) through its own local storage (no fsync), then one fast append |
//! | peak RSS | the job, alone in its process | the baseline, alone in its process |
//!
//! Both turn rows into Arrow batches the same way (serde through
//! arrow-json's decoder, 4096 rows at a time), write Parquet with Snappy
//! and row groups of 128 Ki rows, and commit through an SQL catalog on
//! SQLite. Each measurement runs in a child process of its own (this
//! binary with `--child`); they alternate `--runs` times and the medians
//! are compared. Every row is counted in the table afterwards.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use iceberg::io::LocalFsStorageFactory;
use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{
    SqlBindStyle, SqlCatalogBuilder, SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI,
    SQL_CATALOG_PROP_WAREHOUSE,
};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde::Serialize;
use serde_json::{json, Value};
use sink_benches::{alternate_children, peak_rss_bytes, table_summary};
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage, SequenceSource};
use sinks_iceberg::{read, IcebergSink, SqliteCatalog};

#[derive(Debug, Parser)]
#[command(about = "Benchmarks the Iceberg sink against iceberg-rust's own writer on the same rows")]
struct Args {
    /// Rows per measurement. At 10 M rows a run takes under a second, and
    /// the sink's fixed costs (the catalog prepared, the table claimed, the
    /// end of input recorded: about 0.2 s) are a fifth of it.
    #[arg(long, default_value_t = 50_000_000)]
    rows: u64,
    /// Measurements of each kind; the medians are compared.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the warehouses go (a directory; emptied after each
    /// measurement). Default: a temporary directory.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Internal: run one measurement ("sink" or "plain") into this
    /// warehouse.
    #[arg(long, hide = true, num_args = 2, value_names = ["WHAT", "WAREHOUSE"])]
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

fn schema() -> anyhow::Result<Schema> {
    Ok(Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::required(2, "payload", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()?)
}

fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(128 * 1024))
        .build()
}

fn table_name() -> anyhow::Result<TableIdent> {
    Ok(TableIdent::from_strs(["bench", "rows"])?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting tokio")
}

/// The rows of the table, counted by this project's reader.
async fn count(warehouse: &std::path::Path) -> anyhow::Result<u64> {
    let catalog = SqliteCatalog::new(&warehouse.join("catalog.db"), warehouse)?;
    let opened = catalog.open().await?;
    let table = read::table(opened.as_ref(), &table_name()?)
        .await?
        .context("no table")?;
    Ok(read::int64_column(&table, "id").await?.len() as u64)
}

/// The rows through the Iceberg sink under the runtime.
async fn sink_job(warehouse: &std::path::Path, rows: u64) -> anyhow::Result<Value> {
    let catalog = SqliteCatalog::new(&warehouse.join("catalog.db"), warehouse)?;
    let sink = IcebergSink::<Row>::builder(catalog, table_name()?, schema()?)
        .roll_files_at_checkpoints_and_at_size(FILE_BYTES)
        .build()?;
    let state = tempfile::tempdir()?;
    let started = Instant::now();
    let report = Job::builder(
        "iceberg-bench",
        SequenceSource::bounded(rows).map(row),
        sink,
    )
    .parallelism(WRITERS as usize)
    .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
    .checkpoint_storage(LocalCheckpointStorage::open(state.path())?)
    .build()?
    .run()
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    let committed = count(warehouse).await?;
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

/// The same rows written by iceberg-rust's data file writer in two tasks,
/// appended once, through its own local storage.
async fn plain(warehouse: &std::path::Path, rows: u64) -> anyhow::Result<Value> {
    std::fs::create_dir_all(warehouse)?;
    let warehouse = warehouse.canonicalize()?;
    let started = Instant::now();
    let props = HashMap::from([
        (
            SQL_CATALOG_PROP_URI.to_string(),
            format!(
                "sqlite://{}?mode=rwc",
                warehouse.join("catalog.db").display()
            ),
        ),
        (
            SQL_CATALOG_PROP_WAREHOUSE.to_string(),
            format!("file://{}", warehouse.display()),
        ),
        (
            SQL_CATALOG_PROP_BIND_STYLE.to_string(),
            SqlBindStyle::QMark.to_string(),
        ),
    ]);
    let catalog = SqlCatalogBuilder::default()
        .with_storage_factory(Arc::new(LocalFsStorageFactory))
        .load("default", props)
        .await?;
    let namespace = NamespaceIdent::new("bench".to_string());
    catalog.create_namespace(&namespace, HashMap::new()).await?;
    let creation = TableCreation::builder()
        .name("rows".to_string())
        .schema(schema()?)
        .build();
    let table = catalog.create_table(&namespace, creation).await?;
    let metadata = table.metadata();
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(
        metadata.current_schema(),
    )?);
    let per_task = rows / WRITERS;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|task| {
            let rolling = RollingFileWriterBuilder::new(
                ParquetWriterBuilder::new(properties(), metadata.current_schema().clone()),
                FILE_BYTES,
                table.file_io().clone(),
                DefaultLocationGenerator::new(metadata)?,
                DefaultFileNameGenerator::new(
                    format!("plain-{task}"),
                    None,
                    DataFileFormat::Parquet,
                ),
            );
            let builder = DataFileWriterBuilder::new(rolling);
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
                let mut writer = builder.build(None).await?;
                let mut decoder = arrow_json::ReaderBuilder::new(arrow).build_decoder()?;
                let mut id = from;
                while id < to {
                    let end = (id + BATCH_ROWS).min(to);
                    let batch: Vec<Row> = (id..end).map(row).collect();
                    decoder.serialize(&batch)?;
                    if let Some(batch) = decoder.flush()? {
                        writer.write(batch).await?;
                    }
                    id = end;
                }
                Ok::<_, anyhow::Error>(writer.close().await?)
            }))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut files = Vec::new();
    for task in tasks {
        files.extend(task.await??);
    }
    let transaction = Transaction::new(&table);
    let transaction = transaction
        .fast_append()
        .add_data_files(files)
        .apply(transaction)?;
    transaction.commit(&catalog).await?;
    let seconds = started.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    let committed = count(&warehouse).await?;
    if committed != rows {
        bail!("the baseline committed {committed} of {rows} rows");
    }
    Ok(json!({ "seconds": seconds, "rows": rows, "peak_rss_bytes": peak }))
}

fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    if let Some(child) = &args.child {
        let warehouse = std::path::Path::new(&child[1]);
        let result = match child[0].as_str() {
            "sink" => runtime()?.block_on(sink_job(warehouse, args.rows))?,
            "plain" => runtime()?.block_on(plain(warehouse, args.rows))?,
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
            "Iceberg sink: {sink_rate:.0} rows/s; iceberg-rust's data file writer: {plain_rate:.0} rows/s; ratio {:.3}",
            sink_rate / plain_rate
        );
        println!(
            "peak RSS: Iceberg sink {:.0} MiB, iceberg-rust's writer {:.0} MiB",
            summary["sink_peak_rss_mib"].as_f64().unwrap_or(0.0),
            summary["plain_peak_rss_mib"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
