//! The file sink demo's formats and buckets, chosen by its flags: the
//! record ids as today's lines, or as rows `(id, ts, payload)` in JSON
//! lines, CSV or Parquet (feature `parquet`), in the base path or in
//! Hive-style directories by each row's event time.
//!
//! A row's event time `ts` is 2026-01-01T00:00:00Z plus its id in seconds,
//! so a replayed id lands in the same `dt=…/hour=…` directory whenever it
//! is written. The encoders and assigners are boxed: the demo's job is
//! built once for every choice of flags.

use std::sync::Arc;

use serde::Serialize;
use sink_api::SinkError;
use sinks_file::{
    BasePathBucketAssigner, BucketAssigner, BulkFormat, BulkPart, CsvEncoder, Encoder,
    EventTimeBucketAssigner, JsonLinesEncoder, PartMerger,
};

use crate::demo_line::DemoLine;

/// 2026-01-01T00:00:00Z, in milliseconds since the Unix epoch: the event
/// time of id 0.
pub const START_MS: i64 = 1_767_225_600_000;

/// How the demo writes its records (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Today's lines: the id in 20 digits, a comma, filler.
    #[default]
    Lines,
    /// One JSON document per row.
    Jsonl,
    /// One CSV line per row, no header.
    Csv,
    /// Parquet files (build with --features parquet).
    Parquet,
}

impl Format {
    /// The end of finished part names.
    pub fn suffix(self) -> &'static str {
        match self {
            Format::Lines => ".txt",
            Format::Jsonl => ".jsonl",
            Format::Csv => ".csv",
            Format::Parquet => ".parquet",
        }
    }
}

/// Where the demo puts each record (`--bucket-by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BucketBy {
    /// Everything in the output directory itself.
    #[default]
    None,
    /// `dt=%Y-%m-%d/hour=%H` of the row's event time.
    EventHour,
    /// `dt=%Y-%m-%d` of the row's event time.
    EventDay,
}

/// The event time of `id`, in milliseconds since the Unix epoch.
pub fn event_time_ms(id: u64) -> i64 {
    START_MS.saturating_add(i64::try_from(id).unwrap_or(i64::MAX).saturating_mul(1_000))
}

/// One row of the demo: what the id becomes in JSON lines, CSV and Parquet.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DemoRow {
    /// The record's id.
    pub id: u64,
    /// Its event time, microseconds since the Unix epoch (UTC).
    pub ts: i64,
    /// Filler up to the record size.
    pub payload: &'static str,
}

/// `len` bytes of filler (at most the largest record size, 1 MiB), from
/// one string made at the first call.
fn filler(len: usize) -> &'static str {
    static XS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let xs = XS.get_or_init(|| "x".repeat(1 << 20));
    &xs[..len.min(xs.len())]
}

/// The assigner `bucket_by` names, over record ids.
pub fn bucket_assigner(bucket_by: BucketBy) -> Box<dyn BucketAssigner<u64>> {
    fn time(id: &u64) -> i64 {
        event_time_ms(*id)
    }
    match bucket_by {
        BucketBy::None => Box::new(BasePathBucketAssigner),
        BucketBy::EventHour => Box::new(EventTimeBucketAssigner::hourly(time)),
        BucketBy::EventDay => Box::new(EventTimeBucketAssigner::daily(time)),
    }
}

/// The encoder `format` names, over record ids of `record_size` bytes
/// (the lines' size; rows carry the same filler).
pub fn encoder(format: Format, record_size: usize) -> anyhow::Result<Box<dyn Encoder<u64>>> {
    let rows = |inner| AsRow::new(inner, record_size);
    Ok(match format {
        Format::Lines => Box::new(DemoLine { record_size }),
        Format::Jsonl => Box::new(rows(Arc::new(JsonLinesEncoder))),
        Format::Csv => Box::new(rows(Arc::new(CsvEncoder::default()))),
        Format::Parquet => Box::new(rows(parquet_encoder()?)),
    })
}

#[cfg(feature = "parquet")]
fn parquet_encoder() -> anyhow::Result<Arc<dyn Encoder<DemoRow>>> {
    use arrow_schema::{DataType, Field, Schema, TimeUnit};
    let schema = Schema::new(vec![
        Field::new("id", DataType::UInt64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("payload", DataType::Utf8, false),
    ]);
    Ok(Arc::new(sinks_file::ParquetEncoder::new(Arc::new(schema))?))
}

#[cfg(not(feature = "parquet"))]
fn parquet_encoder() -> anyhow::Result<Arc<dyn Encoder<DemoRow>>> {
    anyhow::bail!(
        "this build of file-sink-demo writes no Parquet: build it with --features parquet \
         (cargo run --release -p examples --features parquet --bin file-sink-demo -- --format \
         parquet …)"
    )
}

/// Writes record ids as [`DemoRow`]s through an encoder of rows, row by
/// row or in bulk as the inner encoder does.
struct AsRow {
    inner: Arc<dyn Encoder<DemoRow>>,
    /// The rows' payload.
    filler: &'static str,
}

impl AsRow {
    fn new(inner: Arc<dyn Encoder<DemoRow>>, record_size: usize) -> AsRow {
        AsRow {
            inner,
            filler: filler(record_size.saturating_sub(21)),
        }
    }
}

/// The row of `id`, its payload `filler`.
fn row_of(id: u64, filler: &'static str) -> DemoRow {
    DemoRow {
        id,
        ts: event_time_ms(id).saturating_mul(1_000),
        payload: filler,
    }
}

impl Encoder<u64> for AsRow {
    fn encode(&self, id: &u64, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.inner.encode(&row_of(*id, self.filler), out)
    }

    fn bulk(&self) -> Option<&dyn BulkFormat<u64>> {
        self.inner.bulk().map(|_| self as &dyn BulkFormat<u64>)
    }
}

impl BulkFormat<u64> for AsRow {
    fn open_part(&self) -> Result<Box<dyn BulkPart<u64>>, SinkError> {
        let bulk = self
            .inner
            .bulk()
            .ok_or_else(|| SinkError::msg("a row format asked for a bulk part"))?;
        Ok(Box::new(RowPart {
            part: bulk.open_part()?,
            filler: self.filler,
        }))
    }

    fn merger(&self) -> Option<Arc<dyn PartMerger>> {
        self.inner.bulk().and_then(|bulk| bulk.merger())
    }
}

/// A bulk part of rows, taking ids.
struct RowPart {
    part: Box<dyn BulkPart<DemoRow>>,
    filler: &'static str,
}

impl BulkPart<u64> for RowPart {
    fn add(&mut self, id: &u64, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.part.add(&row_of(*id, self.filler), out)
    }

    fn buffered_bytes(&self) -> u64 {
        self.part.buffered_bytes()
    }

    fn finish(self: Box<Self>, out: &mut Vec<u8>) -> Result<(), SinkError> {
        self.part.finish(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinks_file::BucketContext;

    #[test]
    fn rows_carry_the_event_time_their_bucket_is_named_after() {
        let context = BucketContext { now_ms: 0 };
        let hourly = bucket_assigner(BucketBy::EventHour);
        // Id 3 600 is one hour after the start.
        assert_eq!(hourly.bucket_id(&3_599, &context), "dt=2026-01-01/hour=00");
        assert_eq!(hourly.bucket_id(&3_600, &context), "dt=2026-01-01/hour=01");
        assert_eq!(
            bucket_assigner(BucketBy::EventDay).bucket_id(&86_400, &context),
            "dt=2026-01-02"
        );
        assert_eq!(bucket_assigner(BucketBy::None).bucket_id(&1, &context), "");
        let mut out = Vec::new();
        encoder(Format::Jsonl, 24)
            .unwrap()
            .encode(&3_600, &mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"id\":3600,\"ts\":1767229200000000,\"payload\":\"xxx\"}\n"
        );
        let mut out = Vec::new();
        encoder(Format::Csv, 21)
            .unwrap()
            .encode(&7, &mut out)
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "7,1767225607000000,\n");
    }
}
