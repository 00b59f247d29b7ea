//! The Iceberg sink demo: a job writing an Apache Iceberg table through an
//! SQL catalog on SQLite or a REST catalog, which survives being killed.
//!
//! Run it again after a crash (even SIGKILL) and it resumes from its last
//! completed checkpoint; every id reaches the table once, in at most one
//! snapshot per checkpoint.
//!
//! ```text
//! cargo run --release -p examples --features iceberg --bin iceberg-sink-demo
//! iceberg-sink-demo --warehouse ./wh --catalog sqlite:./wh/catalog.db --table demo.events --records 1000000 --json
//! iceberg-sink-demo --warehouse s3://bucket/wh --catalog sqlite:./catalog.db --endpoint http://127.0.0.1:9000
//! iceberg-sink-demo --catalog rest:http://127.0.0.1:8181 --catalog-property credential=id:secret \
//!     --catalog-property warehouse=s3://warehouse --catalog-property s3.endpoint=http://127.0.0.1:9000 …
//! ```
//!
//! Each record is one row `(id long, ts timestamptz, payload string)`: the
//! id, its event time (2026-01-01T00:00:00Z plus the id in seconds, so that
//! a run spans days), and filler up to `--record-size` bytes. The table is
//! created when missing (in `<warehouse>/<namespace>/<name>`, a directory
//! or an `s3://` prefix), partitioned as `--partition-by` says
//! (`day(ts)`, `day(ts),bucket(4,id)`, …; unpartitioned without it). The SQL catalog is the one
//! named `default`, which PyIceberg reads as `SqlCatalog("default",
//! uri="sqlite:////abs/path/catalog.db")`; it is a local file, also for a
//! warehouse on S3. A REST catalog (`--catalog rest:URL`, with its
//! properties as PyIceberg names them) places the table itself. The
//! checkpoints live in `<warehouse>/<namespace>/.<name>.state` (with a REST
//! catalog, `./iceberg-demo-state/<table>/.state`) unless `--state` says
//! where; each job writing the table needs its own. The summary counts the rows
//! this job committed from the table's snapshots (those its lineage made,
//! so other writers of the table are not counted), and, when only this job
//! writes there, checks the table's ids: each once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::demo_job::{self, JobArgs, JobConfig, Mode};
use serde::Serialize;
use sink_api::Lineage;
use sink_cli::location::Location;
use sink_runtime::{BuildError, CheckpointConfig, Job, JobReport, JobStatus, RuntimeMode};
use sinks_iceberg::iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use sinks_iceberg::iceberg::TableIdent;
use sinks_iceberg::{
    parse_partition_spec, parse_table_name, read, IcebergCatalog, IcebergSink, PartitionBy,
};

#[derive(Debug, Parser)]
#[command(about = "Two-phase-commit Apache Iceberg sink demo: a job that survives kill -9")]
struct Args {
    #[command(flatten)]
    job: JobArgs,
    /// Where an SQL catalog's new tables go: a directory, or an
    /// s3://bucket/prefix URL (credentials and region from the AWS_*
    /// variables; --endpoint for S3-compatible servers). Default
    /// ./iceberg-demo-warehouse. A REST catalog places its tables itself.
    #[arg(long, value_parser = Location::parse)]
    warehouse: Option<Location>,
    /// The catalog: `sqlite:PATH` (a local SQLite database, created when
    /// missing) or `rest:URL` (a catalog speaking the Iceberg REST
    /// protocol, such as rest:http://127.0.0.1:8181). Default:
    /// `sqlite:<warehouse>/catalog.db` for a local warehouse.
    #[arg(long)]
    catalog: Option<String>,
    /// A property of the REST catalog, as KEY=VALUE (repeatable), named as
    /// PyIceberg and iceberg-rust name them: credential, token, warehouse,
    /// s3.endpoint, s3.access-key-id, s3.secret-access-key, s3.region,
    /// s3.path-style-access, … Secrets are never printed.
    #[arg(long = "catalog-property", value_name = "KEY=VALUE", value_parser = sink_cli::flags::parse_property)]
    catalog_properties: Vec<(String, String)>,
    /// The table, as NAMESPACE.NAME.
    #[arg(long, default_value = "demo.events", value_parser = parse_table)]
    table: TableIdent,
    /// The table's partition spec, used when the table is created (an
    /// existing table must have it): transforms separated by commas, such as
    /// day(ts) or day(ts),bucket(4,id); identity(col), year, month, day,
    /// hour, bucket(N,col) and truncate(W,col) are known. Default: the
    /// table's own spec, or unpartitioned for a new table.
    #[arg(long, value_name = "SPEC", value_parser = parse_partitioning)]
    partition_by: Option<Partitioning>,
    /// Commit once per N completed checkpoints (their files in one
    /// snapshot) instead of at every checkpoint: with 1s checkpoints, 60
    /// makes a snapshot a minute. Everything is committed at the end.
    #[arg(long, value_name = "N", default_value = "1")]
    commit_every: std::num::NonZeroU32,
    /// The first id: the records are ids `first-id..first-id+records`, so
    /// that two jobs writing one table can write rows apart.
    #[arg(long, default_value_t = 0)]
    first_id: u64,
}

fn parse_table(text: &str) -> Result<TableIdent, String> {
    parse_table_name(text).map_err(|e| e.to_string())
}

/// `--partition-by`'s fields (one flag value holding a list).
#[derive(Debug, Clone)]
struct Partitioning(Vec<PartitionBy>);

fn parse_partitioning(text: &str) -> Result<Partitioning, String> {
    parse_partition_spec(text)
        .map(Partitioning)
        .map_err(|e| e.to_string())
}

/// The event time of id 0, 2026-01-01T00:00:00Z, in seconds since the
/// epoch: id `n` happened `n` seconds later.
const FIRST_EVENT_S: i64 = 1_767_225_600;

/// One row of the demo.
#[derive(Debug, Serialize)]
struct DemoRow {
    id: i64,
    /// Microseconds since the epoch (Iceberg's timestamptz).
    ts: i64,
    payload: String,
}

impl DemoRow {
    fn new(id: u64, record_size: usize) -> DemoRow {
        let id = i64::try_from(id).unwrap_or(i64::MAX);
        DemoRow {
            id,
            ts: FIRST_EVENT_S.saturating_add(id).saturating_mul(1_000_000),
            payload: "x".repeat(record_size.saturating_sub(29)),
        }
    }
}

fn schema() -> anyhow::Result<Schema> {
    Ok(Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::required(2, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::required(3, "payload", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()?)
}

/// The demo's job name: with the lineage, what the table's marks of this
/// job are kept under.
const JOB_NAME: &str = "iceberg-sink-demo";

/// The catalog `--catalog` and `--catalog-property` name, over `--warehouse`
/// for an SQL catalog.
fn catalog(args: &Args) -> anyhow::Result<IcebergCatalog> {
    if let Some(rest) = args.catalog.as_deref().filter(|c| c.starts_with("rest:")) {
        if args.warehouse.is_some() {
            bail!(
                "--warehouse goes with an SQL catalog: a REST catalog places its tables (give \
                 it --catalog-property warehouse=… if it needs one)"
            );
        }
        return Ok(IcebergCatalog::from_flags(
            rest,
            &args.catalog_properties,
            None,
            &[],
        )?);
    }
    let warehouse = args
        .warehouse
        .clone()
        .unwrap_or_else(|| Location::Local(PathBuf::from("./iceberg-demo-warehouse")));
    let (flag, place) = match (&args.catalog, &warehouse) {
        (Some(flag), Location::Local(dir)) => (flag.clone(), dir.display().to_string()),
        (None, Location::Local(dir)) => (
            format!("sqlite:{}", dir.join("catalog.db").display()),
            dir.display().to_string(),
        ),
        (Some(flag), Location::S3(url)) => (flag.clone(), url.clone()),
        (None, Location::S3(_)) => bail!(
            "--warehouse s3://… needs --catalog sqlite:PATH: the SQL catalog is a local SQLite \
             database"
        ),
    };
    Ok(IcebergCatalog::from_flags(
        &flag,
        &args.catalog_properties,
        Some(&place),
        &sink_cli::location::s3_options(args.job.endpoint.as_deref()),
    )?)
}

/// What the table holds after a run, read back from it.
#[derive(Debug, Default)]
struct TableCount {
    /// Rows this job's snapshots added (its lineage's), however many other
    /// writers the table has.
    rows: u64,
    /// Rows in the table, every writer's.
    table_rows: u64,
    /// Distinct ids in the table; `None` when other writers' rows are in it
    /// too (their ids may equal this job's without a duplicate).
    distinct_ids: Option<u64>,
    /// This job's snapshots that added files (one per checkpoint with
    /// data).
    appends: usize,
    /// Checkpoints that have more than one snapshot of this job adding
    /// files (always 0: each is appended once).
    checkpoints_appended_twice: usize,
    /// Snapshots of the table, every writer's.
    snapshots: usize,
    /// Data files in the current snapshot.
    data_files: usize,
}

/// The table after a run of the job in `lineage`.
async fn count(
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    lineage: Option<&Lineage>,
) -> anyhow::Result<TableCount> {
    let opened = catalog.open().await?;
    let Some(table) = read::table(opened.as_ref(), ident).await? else {
        return Ok(TableCount {
            distinct_ids: Some(0),
            ..TableCount::default()
        });
    };
    let app_id = lineage.map(|lineage| format!("{JOB_NAME}/{lineage}"));
    let snapshots = read::snapshots(&table);
    let adding: Vec<_> = snapshots.iter().filter(|s| s.added_files > 0).collect();
    let (ours, others): (Vec<_>, Vec<_>) = adding
        .into_iter()
        .partition(|s| app_id.is_some() && s.lineage == app_id);
    let mut checkpoints: Vec<_> = ours.iter().filter_map(|s| s.checkpoint).collect();
    let appended = checkpoints.len();
    checkpoints.sort_unstable();
    checkpoints.dedup();
    let ids = read::int64_column(&table, "id").await?;
    let distinct = others.is_empty().then(|| {
        let distinct: std::collections::BTreeSet<i64> = ids.iter().copied().collect();
        distinct.len() as u64
    });
    Ok(TableCount {
        rows: ours.iter().map(|s| s.added_rows).sum(),
        table_rows: ids.len() as u64,
        distinct_ids: distinct,
        appends: ours.len(),
        checkpoints_appended_twice: appended - checkpoints.len(),
        snapshots: snapshots.len(),
        data_files: read::live_files(&table).await?.len(),
    })
}

/// Refuses `--fresh` for a table whose location is inside another table's
/// (`ns.x.metadata` is the metadata directory of the table `ns.x`), or
/// holds other tables (`ns.x` when the namespace `ns.x` has tables or
/// namespaces): clearing it would delete their files.
async fn check_fresh_place(
    catalog: &dyn sinks_iceberg::iceberg::Catalog,
    ident: &TableIdent,
) -> anyhow::Result<()> {
    use sinks_iceberg::iceberg::NamespaceIdent;
    let levels: Vec<String> = ident
        .namespace()
        .iter()
        .cloned()
        .chain([ident.name().to_string()])
        .collect();
    for end in 2..levels.len() {
        let outer = TableIdent::from_strs(&levels[..end])?;
        if catalog.table_exists(&outer).await? {
            bail!(
                "--fresh refused, nothing was deleted: the table {ident}'s location is inside \
                 the table {outer}'s, whose files it would delete; give the table another name"
            );
        }
    }
    let inner = NamespaceIdent::from_strs(&levels)?;
    if catalog.namespace_exists(&inner).await? {
        let tables = catalog.list_tables(&inner).await?;
        let namespaces = catalog.list_namespaces(Some(&inner)).await?;
        if !tables.is_empty() || !namespaces.is_empty() {
            bail!(
                "--fresh refused, nothing was deleted: the table {ident}'s location holds the \
                 namespace {inner} ({} tables, {} namespaces), whose files it would delete; \
                 give the table another name",
                tables.len(),
                namespaces.len()
            );
        }
    }
    Ok(())
}

/// What one run gives.
struct Outcome {
    report: JobReport,
    table: TableCount,
    wall: Duration,
}

/// Runs the job `config` describes into the table.
async fn run(
    config: &JobConfig,
    catalog: &IcebergCatalog,
    ident: &TableIdent,
    partition_by: Option<&[PartitionBy]>,
    commit_every: std::num::NonZeroU32,
    first_id: u64,
    show_progress: bool,
) -> anyhow::Result<Outcome> {
    let record_size = config.record_size;
    let source = config.sequence_source()?;
    let source = sink_runtime::source::Source::map(source, move |id| {
        DemoRow::new(first_id.saturating_add(id), record_size)
    });
    if let (true, IcebergCatalog::Sqlite(catalog)) = (config.fresh, catalog) {
        // --fresh removes the files where the flags place the table: a
        // table the catalog has elsewhere (made under another --warehouse)
        // is refused, not orphaned; so is a place inside another table's
        // or holding other tables. (A REST catalog's table is dropped from
        // the catalog, its files left to the catalog.)
        let opened = catalog.open().await?;
        check_fresh_place(opened.as_ref(), ident).await?;
        if opened.table_exists(ident).await? {
            if let Ok(table) = opened.load_table(ident).await {
                let (found, placed) = (table.metadata().location(), catalog.table_location(ident));
                if found.trim_end_matches('/') != placed {
                    bail!(
                        "--fresh refused, nothing was deleted: the catalog has {ident} at {found}, \
                         not at {placed} where --warehouse puts it; give the --warehouse it was \
                         made under"
                    );
                }
            }
        }
    }
    let storage = demo_job::open_state(config).await?;
    if config.fresh {
        // The table's files went with the output; its catalog entry goes
        // now (a crash before this leaves an entry whose files are gone:
        // the next --fresh run drops it).
        let opened = catalog.open().await?;
        if opened.table_exists(ident).await? {
            opened
                .drop_table(ident)
                .await
                .with_context(|| format!("dropping {ident} for --fresh"))?;
        }
    }
    let mut sink = IcebergSink::<DemoRow>::builder(catalog.clone(), ident.clone(), schema()?)
        .commit_every(commit_every);
    if let Some(fields) = partition_by {
        sink = sink.partition_by(fields.to_vec());
    }
    let sink = sink.build()?;
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
    let job = builder.build()?;
    let started = Instant::now();
    let handle = job.start();
    let report = demo_job::wait_for(handle, config, started, show_progress).await?;
    let wall = started.elapsed();
    let table = count(catalog, ident, report.lineage.as_ref())
        .await
        .with_context(|| format!("reading the table {ident} back"))?;
    // Only this job writes there: each of its rows once, and, once it has
    // finished, each of its ids. Read from the rows themselves: the job's
    // snapshots, and the counts in their summaries, go when table
    // maintenance expires them.
    if let Some(distinct) = table.distinct_ids {
        let finished = matches!(
            report.status,
            JobStatus::Finished | JobStatus::AlreadyFinished
        );
        let expected = finished.then_some(config.records);
        if table.table_rows != distinct || expected.is_some_and(|records| distinct != records) {
            bail!(
                "the table {ident} holds {} rows, {distinct} distinct ids{}",
                table.table_rows,
                expected.map_or(String::new(), |records| format!(
                    ", for the job's {records} ids each once"
                ))
            );
        }
    }
    Ok(Outcome {
        report,
        table,
        wall,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let mut args = Args::parse();
    if args.job.out.is_some() {
        bail!("iceberg-sink-demo writes a table of a catalog: give --warehouse, --catalog and --table, not --out");
    }
    let catalog = catalog(&args)?;
    // The table's location is the job's output (what --fresh clears); its
    // checkpoints go beside it, under a name readers skip. A REST catalog
    // places the table: the checkpoints go in a local directory of their
    // own.
    let sqlite = match &catalog {
        IcebergCatalog::Sqlite(sqlite) => Some(sqlite),
        _ => None,
    };
    let (out, state) = match sqlite.map(|sqlite| (sqlite, sqlite.table_dir(&args.table))) {
        None => {
            let dir = PathBuf::from("iceberg-demo-state").join(args.table.to_string());
            (
                Location::Local(dir.clone()),
                Location::Local(dir.join(".state")),
            )
        }
        Some((_, Some(dir))) => {
            let parent = dir.parent().map(PathBuf::from).unwrap_or_default();
            let state = Location::Local(parent.join(format!(".{}.state", args.table.name())));
            (Location::Local(dir), state)
        }
        Some((sqlite, None)) => {
            let location = sqlite.table_location(&args.table);
            let parent = location.rsplit_once('/').map_or("", |(parent, _)| parent);
            let state = Location::S3(format!("{parent}/.{}.state", args.table.name()));
            (Location::S3(location), state)
        }
    };
    args.job.state = Some(args.job.state.clone().unwrap_or(state));
    args.job.out = Some(out);
    let label = args.job.label();
    let config = JobConfig::from_args(&args.job, "unused")?;
    let outcome = match run(
        &config,
        &catalog,
        &args.table,
        args.partition_by.as_ref().map(|p| p.0.as_slice()),
        args.commit_every,
        args.first_id,
        !args.job.json,
    )
    .await
    {
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
            "the job writing {} has finished already; nothing was written (pass --fresh to start \
             over)",
            args.table
        );
    }
    let m = &outcome.report.metrics;
    let t = &outcome.table;
    let wall_s = outcome.wall.as_secs_f64();
    if args.job.json {
        let summary = serde_json::json!({
            "mode": label,
            "status": format!("{:?}", outcome.report.status),
            "records": config.records,
            "parallelism": config.parallelism,
            "written": m.records_written,
            "committed": t.rows,
            "table_rows": t.table_rows,
            "distinct_ids": t.distinct_ids,
            "prepare_commit_calls": m.prepare_commit_calls,
            "commit_calls": m.commit_calls,
            "checkpoints_completed": m.checkpoints_completed,
            "iceberg_appends": t.appends,
            "checkpoints_appended_twice": t.checkpoints_appended_twice,
            "snapshots": t.snapshots,
            "data_files": t.data_files,
            "lineage": outcome.report.lineage.as_ref().map(|l| l.to_string()),
            "wall_s": wall_s,
            "records_per_s": if wall_s > 0.0 { m.records_written as f64 / wall_s } else { 0.0 },
            "losses": sink_cli::flags::losses_json(&outcome.report),
            "counters": sink_cli::flags::counters_json(&outcome.report),
        });
        println!("{summary}");
    } else {
        println!(
            "{label}: {:?}; written {}, {} rows committed by this job, {} in the table {} ({}), \
             {} checkpoints, {} appends, {} snapshots, {} data files, {:.2} s",
            outcome.report.status,
            m.records_written,
            t.rows,
            t.table_rows,
            args.table,
            match t.distinct_ids {
                Some(distinct) => format!("{distinct} distinct ids"),
                None => "other writers' rows too".to_string(),
            },
            m.checkpoints_completed,
            t.appends,
            t.snapshots,
            t.data_files,
            wall_s
        );
    }
    sink_cli::flags::fail_if_output_lost(&outcome.report)
}
