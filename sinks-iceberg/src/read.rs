//! Reading a table back: a column of its rows, and the history of the
//! sink's appends.
//!
//! Used by the demos' summaries and the tests (the kit reads committed ids
//! through [`int64_column`]); readers no one here wrote (PyIceberg) check
//! the same tables in the test command. Nothing in the sink decides from
//! these: its commits read the table's marks (the `marks` module).

use std::collections::HashSet;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use futures::TryStreamExt as _;
use iceberg::spec::{DataContentType, DataFile};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use sink_api::SinkError;

use crate::errors::iceberg_error;
use crate::marks;

/// One snapshot of the table, as its summary describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// The snapshot's id.
    pub id: i64,
    /// The job lineage (`<job>/<lineage>`) whose append made it, if the
    /// sink made it.
    pub lineage: Option<String>,
    /// The checkpoint it committed, if the sink made it for one.
    pub checkpoint: Option<u64>,
    /// The rows it added (the summary's `added-records`).
    pub added_rows: u64,
    /// The data files it added (the summary's `added-data-files`).
    pub added_files: u64,
}

/// The table `ident`, or `None` if the catalog has no such table.
///
/// # Errors
/// The catalog's errors, classed as the sink classes them.
pub async fn table(catalog: &dyn Catalog, ident: &TableIdent) -> Result<Option<Table>, SinkError> {
    let reading = || format!("reading the Iceberg table {ident}");
    if !catalog
        .table_exists(ident)
        .await
        .map_err(|e| iceberg_error(reading(), e))?
    {
        return Ok(None);
    }
    catalog
        .load_table(ident)
        .await
        .map(Some)
        .map_err(|e| iceberg_error(reading(), e))
}

/// Every value of the `long` column `column` in the table's current
/// snapshot (none before the first append). A null is an error.
///
/// # Errors
/// The column is missing or not a `long`, a data file cannot be read, or
/// a value is null.
pub async fn int64_column(table: &Table, column: &str) -> Result<Vec<i64>, SinkError> {
    let mut values = Vec::new();
    for batch in column_batches(table, column).await? {
        let array = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| SinkError::msg(format!("the column {column} is not a long")))?;
        if array.null_count() > 0 {
            return Err(SinkError::msg(format!("the column {column} holds nulls")));
        }
        values.extend(array.values().iter().copied());
    }
    Ok(values)
}

/// Every value of the `string` column `column` in the table's current
/// snapshot (none before the first append). A null is an error.
///
/// # Errors
/// The column is missing or not a `string`, a data file cannot be read, or
/// a value is null.
pub async fn string_column(table: &Table, column: &str) -> Result<Vec<String>, SinkError> {
    let mut values = Vec::new();
    for batch in column_batches(table, column).await? {
        let array = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| SinkError::msg(format!("the column {column} is not a string")))?;
        if array.null_count() > 0 {
            return Err(SinkError::msg(format!("the column {column} holds nulls")));
        }
        values.extend(array.iter().flatten().map(str::to_string));
    }
    Ok(values)
}

/// The record batches of the column `column` in the table's current
/// snapshot.
async fn column_batches(table: &Table, column: &str) -> Result<Vec<RecordBatch>, SinkError> {
    let reading = || format!("reading the column {column} of {}", table.identifier());
    if table.metadata().current_snapshot().is_none() {
        return Ok(Vec::new());
    }
    table
        .scan()
        .select([column])
        .build()
        .map_err(|e| iceberg_error(reading(), e))?
        .to_arrow()
        .await
        .map_err(|e| iceberg_error(reading(), e))?
        .try_collect()
        .await
        .map_err(|e| iceberg_error(reading(), e))
}

/// The table's snapshots, oldest first (those still in its metadata:
/// expired ones are gone), on every branch.
pub fn snapshots(table: &Table) -> Vec<SnapshotEntry> {
    let mut entries: Vec<_> = table
        .metadata()
        .snapshots()
        .map(|snapshot| {
            let summary = &snapshot.summary().additional_properties;
            let number = |key: &str| summary.get(key).and_then(|v| v.parse::<u64>().ok());
            SnapshotEntry {
                id: snapshot.snapshot_id(),
                lineage: summary.get(marks::SUMMARY_LINEAGE).cloned(),
                checkpoint: number(marks::SUMMARY_CHECKPOINT),
                added_rows: number("added-records").unwrap_or(0),
                added_files: number("added-data-files").unwrap_or(0),
            }
        })
        .collect();
    entries.sort_by_key(|entry| {
        table
            .metadata()
            .snapshot_by_id(entry.id)
            .map(|s| (s.sequence_number(), s.timestamp_ms()))
    });
    entries
}

/// The data files of the table's current snapshot (not its delete files),
/// as its manifests describe them (statistics included).
///
/// # Errors
/// A manifest cannot be read.
pub async fn data_files(table: &Table) -> Result<Vec<DataFile>, SinkError> {
    let reading = || format!("reading the manifests of {}", table.identifier());
    let mut files = Vec::new();
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return Ok(files);
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(|e| iceberg_error(reading(), e))?;
    for manifest in list.entries() {
        let manifest = manifest
            .load_manifest(table.file_io())
            .await
            .map_err(|e| iceberg_error(reading(), e))?;
        files.extend(
            manifest
                .entries()
                .iter()
                .filter(|entry| {
                    entry.is_alive() && entry.data_file().content_type() == DataContentType::Data
                })
                .map(|entry| entry.data_file().clone()),
        );
    }
    Ok(files)
}

/// The locations of the data files of the table's current snapshot.
///
/// # Errors
/// A manifest cannot be read.
pub async fn live_files(table: &Table) -> Result<HashSet<String>, SinkError> {
    Ok(data_files(table)
        .await?
        .into_iter()
        .map(|file| file.file_path().to_string())
        .collect())
}
