//! Reading a table back: the values of an integer column in a given
//! version, and a summary of each log entry. For tests, tools and demos
//! that check what the sink committed; not a query engine.

use deltalake_core::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use deltalake_core::{DeltaTable, DeltaTableConfig};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use sink_api::SinkError;

use crate::errors::{delta_error, store_error};
use crate::location::TableLocation;

/// One entry of the table's log, summarised. Read by [`log_entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The table version it made.
    pub version: u64,
    /// Its operation (`CREATE TABLE`, `STREAMING UPDATE`, `OPTIMIZE`, …).
    pub operation: String,
    /// For a streaming update: the query (the sink's application id).
    pub query_id: Option<String>,
    /// For a streaming update: its epoch (the sink's checkpoint id).
    pub epoch: Option<i64>,
    /// Files it added.
    pub added: usize,
    /// Rows in the files it added that change the data (`dataChange`; not
    /// a compaction's rewrites), from the files' statistics.
    pub rows_added: u64,
    /// Files it removed.
    pub removed: usize,
    /// The application transactions (`txn`: application id, version) it set.
    pub transactions: Vec<(String, i64)>,
}

/// Every log entry still in the table's `_delta_log` as JSON, oldest first.
pub async fn log_entries(location: &TableLocation) -> Result<Vec<LogEntry>, SinkError> {
    let store = location.table_store();
    let listing = || format!("listing the log of the Delta table {}", location.url());
    let mut names: Vec<(u64, Path)> = store
        .list(Some(&Path::from("_delta_log")))
        .map_ok(|meta| meta.location)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| store_error(listing(), e))?
        .into_iter()
        .filter_map(|path| {
            let name = path.filename()?.strip_suffix(".json")?.to_string();
            Some((name.parse().ok()?, path))
        })
        .collect();
    names.sort();
    let mut entries = Vec::with_capacity(names.len());
    for (version, path) in names {
        let reading = |e| store_error(format!("reading the log entry {path}"), e);
        let bytes = store
            .get(&path)
            .await
            .map_err(reading)?
            .bytes()
            .await
            .map_err(reading)?;
        entries.push(summarise(version, &bytes).map_err(|e| {
            SinkError::other(format!("the log entry {path} is not valid JSON"), e).permanent()
        })?);
    }
    Ok(entries)
}

/// Checks, from the log alone, that no start committed after a newer start
/// of the same job claimed the table: along the log, the generations under
/// each `<app id>/owner` never go down. `Err` names the first entry that
/// breaks it. For tests of fencing (a zombie reconnected after its
/// successor started).
pub fn check_owners_in_order(entries: &[LogEntry]) -> Result<(), String> {
    let mut owners: std::collections::BTreeMap<&str, (i64, u64)> = Default::default();
    for entry in entries {
        for (app, generation) in &entry.transactions {
            if !app.ends_with("/owner") {
                continue;
            }
            if let Some(&(newest, at)) = owners.get(app.as_str()) {
                if *generation < newest {
                    return Err(format!(
                        "table version {} was committed by generation {generation} of {app}, \
                         after generation {newest} claimed the table at version {at}",
                        entry.version
                    ));
                }
            }
            owners.insert(app, (*generation, entry.version));
        }
    }
    Ok(())
}

fn summarise(version: u64, bytes: &[u8]) -> Result<LogEntry, serde_json::Error> {
    let mut entry = LogEntry {
        version,
        operation: String::new(),
        query_id: None,
        epoch: None,
        added: 0,
        rows_added: 0,
        removed: 0,
        transactions: Vec::new(),
    };
    for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let action: serde_json::Value = serde_json::from_slice(line)?;
        if let Some(info) = action.get("commitInfo") {
            entry.operation = info["operation"].as_str().unwrap_or_default().to_string();
            let parameters = &info["operationParameters"];
            entry.query_id = parameters["queryId"].as_str().map(str::to_string);
            entry.epoch = number(&parameters["epochId"]);
        } else if let Some(add) = action.get("add") {
            entry.added += 1;
            if add["dataChange"].as_bool() != Some(false) {
                // The statistics are a JSON document in a string.
                let stats: serde_json::Value =
                    serde_json::from_str(add["stats"].as_str().unwrap_or("{}"))?;
                entry.rows_added += stats["numRecords"].as_u64().unwrap_or(0);
            }
        } else if action.get("remove").is_some() {
            entry.removed += 1;
        } else if let Some(txn) = action.get("txn") {
            if let (Some(app), Some(v)) = (txn["appId"].as_str(), number(&txn["version"])) {
                entry.transactions.push((app.to_string(), v));
            }
        }
    }
    Ok(entry)
}

/// A JSON number, or a string holding one (Delta writes operation
/// parameters as strings).
fn number(value: &serde_json::Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_str()
            .and_then(|s| s.trim_matches('"').parse().ok())
    })
}

/// The data files at the table's location that its newest version neither
/// holds nor removed: files written by writers whose checkpoint never
/// completed (or not yet). Readers never see them; `VACUUM` deletes them.
pub async fn unreferenced_files(location: &TableLocation) -> Result<Vec<String>, SinkError> {
    let reading = || format!("reading the Delta table {}", location.url());
    let mut table = DeltaTable::new(location.log_store(), DeltaTableConfig::default());
    table.load().await.map_err(|e| delta_error(reading(), e))?;
    let mut named: std::collections::BTreeSet<String> = table
        .get_files_by_partitions(&[])
        .await
        .map_err(|e| delta_error(reading(), e))?
        .into_iter()
        .map(|p| p.to_string())
        .collect();
    let snapshot = table.snapshot().map_err(|e| delta_error(reading(), e))?;
    let log_store = table.log_store();
    let mut removed = snapshot.all_tombstones(log_store.as_ref());
    while let Some(tombstone) = removed
        .try_next()
        .await
        .map_err(|e| delta_error(reading(), e))?
    {
        named.insert(tombstone.path().into_owned());
    }
    let stored: Vec<String> = location
        .table_store()
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .map_err(|e| store_error(format!("listing {}", location.url()), e))?;
    Ok(stored
        .into_iter()
        .filter(|path| path.ends_with(".parquet") && !path.starts_with("_delta_log/"))
        .filter(|path| !named.contains(path))
        .collect())
}

/// The data files of the table's newest version (paths relative to the
/// table's root).
pub async fn active_files(location: &TableLocation) -> Result<Vec<String>, SinkError> {
    let reading = || format!("reading the Delta table {}", location.url());
    let mut table = DeltaTable::new(location.log_store(), DeltaTableConfig::default());
    table.load().await.map_err(|e| delta_error(reading(), e))?;
    Ok(table
        .get_files_by_partitions(&[])
        .await
        .map_err(|e| delta_error(reading(), e))?
        .into_iter()
        .map(|p| p.to_string())
        .collect())
}

/// The values of the 64-bit integer column `column` in every file of the
/// table's version `version` (the newest if `None`), in no given order.
pub async fn int64_column(
    location: &TableLocation,
    column: &str,
    version: Option<u64>,
) -> Result<Vec<i64>, SinkError> {
    column_values(location, column, version, |array| {
        let ints = array.as_any().downcast_ref::<arrow_array::Int64Array>()?;
        Some(ints.iter().flatten().collect())
    })
    .await
}

/// The values of the 64-bit integer column `column` in each file of the
/// table's newest version, by the file's path in the table (which names its
/// partition: `day=2026-12-01/part-….parquet`), in no given order.
pub async fn int64_column_by_file(
    location: &TableLocation,
    column: &str,
) -> Result<Vec<(String, Vec<i64>)>, SinkError> {
    let store = location.table_store();
    let mut by_file = Vec::new();
    for path in active_files(location).await? {
        let values = file_column(
            store.as_ref(),
            &path,
            column,
            &|array: &dyn arrow_array::Array| {
                let ints = array.as_any().downcast_ref::<arrow_array::Int64Array>()?;
                Some(ints.iter().flatten().collect::<Vec<i64>>())
            },
        )
        .await?;
        by_file.push((path, values));
    }
    Ok(by_file)
}

/// The values of the string column `column` in every file of the table's
/// version `version` (the newest if `None`), in no given order.
pub async fn string_column(
    location: &TableLocation,
    column: &str,
    version: Option<u64>,
) -> Result<Vec<String>, SinkError> {
    column_values(location, column, version, |array| {
        let strings = array.as_any().downcast_ref::<arrow_array::StringArray>()?;
        Some(strings.iter().flatten().map(str::to_string).collect())
    })
    .await
}

/// The values of `column` in every file of the version, each batch's array
/// converted by `values` (`None`: the column is of another type).
async fn column_values<T>(
    location: &TableLocation,
    column: &str,
    version: Option<u64>,
    values: impl Fn(&dyn arrow_array::Array) -> Option<Vec<T>>,
) -> Result<Vec<T>, SinkError> {
    let reading = || format!("reading the Delta table {}", location.url());
    let mut table = DeltaTable::new(location.log_store(), DeltaTableConfig::default());
    match version {
        Some(v) => table.load_version(v).await,
        None => table.load().await,
    }
    .map_err(|e| delta_error(reading(), e))?;
    let paths: Vec<String> = table
        .get_files_by_partitions(&[])
        .await
        .map_err(|e| delta_error(reading(), e))?
        .into_iter()
        .map(|p| p.to_string())
        .collect();
    let store = location.table_store();
    let mut all = Vec::new();
    for path in paths {
        all.extend(file_column(store.as_ref(), &path, column, &values).await?);
    }
    Ok(all)
}

async fn file_column<T>(
    store: &dyn ObjectStore,
    path: &str,
    column: &str,
    values: &impl Fn(&dyn arrow_array::Array) -> Option<Vec<T>>,
) -> Result<Vec<T>, SinkError> {
    let bytes = store
        .get(&Path::from(path))
        .await
        .map_err(|e| store_error(format!("reading the data file {path}"), e))?
        .bytes()
        .await
        .map_err(|e| store_error(format!("reading the data file {path}"), e))?;
    let bad = |e: &dyn std::fmt::Display| {
        SinkError::msg(format!(
            "the data file {path} cannot be read as Parquet: {e}"
        ))
        .permanent()
    };
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| bad(&e))?;
    let mut all = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        let array = batch
            .column_by_name(column)
            .ok_or_else(|| bad(&format!("no column {column}")))?;
        all.extend(
            values(array.as_ref())
                .ok_or_else(|| bad(&format!("column {column} is not of the type asked for")))?,
        );
    }
    Ok(all)
}
