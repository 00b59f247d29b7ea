//! The Parquet path of the file sink against arrow-rs' `ArrowWriter`.
//!
//! | figure | job | baseline |
//! |---|---|---|
//! | Parquet | the demo's rows `(id, ts, payload)` (100-byte records) through `file-sink-demo`'s Parquet encoder (serde records through `serde_arrow`, zstd), parallelism 2, 1 s checkpoints | two threads turning the same rows into Arrow arrays the same way (`serde_arrow`'s `ArrayBuilder`, batches of 1 024) and writing them with `ArrowWriter` (the same properties), one file per second, synced, as a careful plain writer would |
//! | (beside it) | - | the same, its arrays built with arrow's own builders instead of `serde_arrow`: what the conversion from serde records costs |
//! | memory by buckets | the same job with its records spread over N buckets (`id % N`), each bucket a part in progress per subtask | - |

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use arrow_array::builder::{StringBuilder, TimestampMicrosecondBuilder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use examples::demo_row::{self, event_time_ms, Format};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use serde_json::{json, Value};
use sink_benches::peak_rss_bytes;
use sink_runtime::{CheckpointConfig, Job, SequenceSource};
use sinks_file::{BucketAssigner, FileSink, FnBucketAssigner, ParquetEncoder, RollingPolicy};

use crate::runtime;

/// The demo's record size: the payload is 79 bytes of filler.
const RECORD_SIZE: usize = 100;

/// The file sink writing the demo's Parquet rows into `buckets` buckets
/// (`id % buckets`; one bucket: the base path), 1 s checkpoints.
pub fn job(records: u64, dir: &Path, buckets: u64) -> anyhow::Result<Value> {
    let out = dir.join(format!("parquet-job-{buckets}"));
    let _ = std::fs::remove_dir_all(&out);
    let encoder = demo_row::encoder(Format::Parquet, RECORD_SIZE)?;
    let assigner: Box<dyn BucketAssigner<u64>> = match buckets {
        0 | 1 => Box::new(sinks_file::BasePathBucketAssigner),
        n => Box::new(FnBucketAssigner(move |id: &u64| format!("b{}", id % n))),
    };
    let sink = FileSink::builder(&out, encoder)
        .bucket_assigner(assigner)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(128 * 1024 * 1024),
            ..RollingPolicy::on_checkpoint()
        })
        .part_suffix(".parquet")
        .build()?;
    let stats = sink.stats();
    let builder = Job::builder("bench-parquet", SequenceSource::bounded(records), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_secs(1)));
    let started = Instant::now();
    let report = runtime()?.block_on(builder.build()?.run())?;
    let seconds = started.elapsed().as_secs_f64();
    let committed = stats.snapshot();
    if committed.committed_records != records {
        bail!(
            "the Parquet job committed {} of {records} records",
            committed.committed_records
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(json!({
        "seconds": seconds,
        "bytes": committed.committed_bytes,
        "files": committed.committed_files,
        "checkpoints": report.metrics.checkpoints_completed,
        "peak_rss_bytes": peak_rss_bytes(),
    }))
}

/// The demo rows' schema, as `file-sink-demo` writes them.
fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::UInt64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("payload", DataType::Utf8, false),
    ]))
}

/// The file sink's own writer properties (zstd, statistics per page, row
/// groups by size only), taken from its encoder: the baseline writes the
/// same files.
fn properties() -> anyhow::Result<WriterProperties> {
    let encoder = ParquetEncoder::<demo_row::DemoRow>::new(schema())?;
    Ok(encoder.writer_properties().clone())
}

/// How the baseline turns rows into Arrow arrays.
#[derive(Debug, Clone, Copy)]
pub enum Arrays {
    /// `serde_arrow`'s `ArrayBuilder`, a row at a time, as the sink does.
    Serde,
    /// arrow's own builders, a column at a time.
    Builders,
}

/// Rows `from..to` as one batch, built with `serde_arrow` from the demo's
/// rows.
fn serde_batch(
    builder: &mut serde_arrow::ArrayBuilder,
    from: u64,
    to: u64,
    filler: &'static str,
) -> anyhow::Result<RecordBatch> {
    for id in from..to {
        builder.push(demo_row::DemoRow {
            id,
            ts: event_time_ms(id) * 1_000,
            payload: filler,
        })?;
    }
    let batch = builder.to_record_batch()?;
    RecordBatch::try_new(schema(), batch.columns().to_vec()).context("a batch of rows")
}

/// Rows `from..to` as one batch, built with arrow's builders.
fn batch(from: u64, to: u64, filler: &str) -> anyhow::Result<RecordBatch> {
    let rows = (to - from) as usize;
    let mut ids = UInt64Builder::with_capacity(rows);
    let mut times = TimestampMicrosecondBuilder::with_capacity(rows).with_timezone("UTC");
    let mut payloads = StringBuilder::with_capacity(rows, rows * filler.len());
    for id in from..to {
        ids.append_value(id);
        times.append_value(event_time_ms(id) * 1_000);
        payloads.append_value(filler);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(times.finish()),
        Arc::new(payloads.finish()),
    ];
    RecordBatch::try_new(schema(), columns).context("a batch of rows")
}

/// Two threads writing the same rows with `ArrowWriter`, batches of 1 024
/// rows as the sink converts them (arrays made as `arrays` says), one file
/// per `interval`, each closed, synced and renamed to its final name.
pub fn plain(
    records: u64,
    dir: &Path,
    interval: Duration,
    arrays: Arrays,
) -> anyhow::Result<Value> {
    let dir = dir.join("parquet-plain");
    std::fs::create_dir_all(&dir)?;
    let filler: &'static str = Box::leak("x".repeat(RECORD_SIZE - 21).into_boxed_str());
    // Made once, outside the measured loop, as the sink makes them once.
    let (schema, properties) = (schema(), properties()?);
    let started = Instant::now();
    let bytes = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let halves = [(0, records / 2), (records / 2, records)];
        let workers: Vec<_> = halves
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| {
                let (dir, schema, properties) = (dir.clone(), &schema, &properties);
                scope.spawn(move || -> anyhow::Result<u64> {
                    let (mut bytes, mut part) = (0u64, 0u64);
                    let hidden = |part: u64| dir.join(format!(".plain-{i}-{part}"));
                    let open = |part: u64| -> anyhow::Result<ArrowWriter<std::fs::File>> {
                        let file = std::fs::File::create(hidden(part))?;
                        Ok(ArrowWriter::try_new(
                            file,
                            schema.clone(),
                            Some(properties.clone()),
                        )?)
                    };
                    let mut seal = |writer: ArrowWriter<std::fs::File>, part: u64| {
                        let file = writer.into_inner()?;
                        file.sync_data()?;
                        bytes += file.metadata()?.len();
                        std::fs::rename(hidden(part), dir.join(format!("plain-{i}-{part}")))?;
                        anyhow::Ok(())
                    };
                    let mut writer = open(part)?;
                    let mut next_seal = Instant::now() + interval;
                    let mut next = from;
                    let fields: Vec<_> = schema.fields().iter().cloned().collect();
                    let mut builder = serde_arrow::ArrayBuilder::from_arrow(&fields)?;
                    while next < to {
                        let end = (next + 1_024).min(to);
                        let batch = match arrays {
                            Arrays::Serde => serde_batch(&mut builder, next, end, filler)?,
                            Arrays::Builders => batch(next, end, filler)?,
                        };
                        writer.write(&batch)?;
                        next = end;
                        if Instant::now() >= next_seal {
                            seal(writer, part)?;
                            part += 1;
                            writer = open(part)?;
                            next_seal = Instant::now() + interval;
                        }
                    }
                    seal(writer, part)?;
                    Ok(bytes)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a writer thread panicked")))
            })
            .sum()
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(json!({"seconds": seconds, "bytes": bytes}))
}
