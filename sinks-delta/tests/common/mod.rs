//! What the Delta sink's tests share: the record, its schema, and a sink on
//! a location.

#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Serialize;
use sinks_delta::arrow_schema::{DataType, Field, Schema};
use sinks_delta::{DeltaSink, TableLocation};

/// The tests' record: an id, the day it belongs to (the partition column
/// when partitioned), and some text.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub id: i64,
    pub day: String,
    pub payload: String,
}

impl Event {
    /// The event of id `id`: spread over three days.
    pub fn new(id: u64) -> Event {
        Event {
            id: id as i64,
            day: format!("2026-12-0{}", 1 + id % 3),
            payload: format!("event number {id}"),
        }
    }
}

pub fn schema() -> Schema {
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("day", DataType::Utf8, false),
        Field::new("payload", DataType::Utf8, true),
    ])
}

/// A sink of events on `location`, partitioned by day when asked.
pub fn sink(location: &TableLocation, partitioned: bool) -> DeltaSink<Event> {
    let builder = DeltaSink::builder(location.clone(), schema());
    let builder = if partitioned {
        builder.partition_by(["day"])
    } else {
        builder
    };
    builder.build().expect("a valid sink")
}

/// The ids in the table's version `version` (the newest if `None`).
pub async fn ids(location: &TableLocation, version: Option<u64>) -> Vec<i64> {
    sinks_delta::read::int64_column(location, "id", version)
        .await
        .expect("the table reads")
}

/// `Ok` if `ids` holds each of `0..n` exactly once, else what is wrong.
pub fn exactly_once(ids: &[i64], n: u64) -> Result<(), String> {
    let mut counts = BTreeMap::new();
    for id in ids {
        *counts.entry(*id).or_insert(0u32) += 1;
    }
    let missing = (0..n as i64).filter(|i| !counts.contains_key(i)).count();
    let doubled = counts.values().filter(|&&c| c > 1).count();
    let strange = counts.keys().filter(|&&i| i < 0 || i >= n as i64).count();
    if missing + doubled + strange == 0 {
        Ok(())
    } else {
        Err(format!(
            "{} ids read for {n} records: {missing} missing, {doubled} more than once, {strange} \
             unexpected",
            ids.len()
        ))
    }
}

/// The sink the kit certifies: partitioned by day, with compaction after
/// every checkpoint that leaves two small files in a partition. Compaction
/// is what makes a replayed transaction dangerous in Delta: adding the
/// same file twice is harmless, but adding it again after it was merged
/// into another duplicates its rows.
pub fn compacted_sink(location: &TableLocation) -> DeltaSink<Event> {
    DeltaSink::builder(location.clone(), schema())
        .partition_by(["day"])
        .compaction(sinks_delta::Compaction {
            min_files: 2,
            ..sinks_delta::Compaction::default()
        })
        .build()
        .expect("a valid sink")
}

/// A table of its own for one kit scenario (in a temporary directory kept
/// alive with it, or on an object store), read back with the crate's reader.
pub struct TableDestination {
    pub location: TableLocation,
    pub _dir: Option<tempfile::TempDir>,
}

#[sink_api::async_trait]
impl sink_testkit::Destination for TableDestination {
    type Sink = DeltaSink<Event>;

    async fn sink(&self) -> DeltaSink<Event> {
        compacted_sink(&self.location)
    }

    async fn committed_ids(&self) -> Vec<u64> {
        match sinks_delta::read::int64_column(&self.location, "id", None).await {
            Ok(ids) => ids.into_iter().map(|id| id as u64).collect(),
            // No table yet: nothing committed.
            Err(e) if e.to_string().contains("Not a Delta table") => Vec::new(),
            Err(e) => panic!("the table cannot be read: {e}"),
        }
    }

    /// Data files written but named by no version of the table.
    async fn open_transactions(&self) -> Option<usize> {
        match sinks_delta::read::unreferenced_files(&self.location).await {
            Ok(files) => Some(files.len()),
            Err(e) if e.to_string().contains("Not a Delta table") => Some(0),
            Err(e) => panic!("the table cannot be read: {e}"),
        }
    }
}
