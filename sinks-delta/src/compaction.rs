//! Small-file compaction in the global committer: after a checkpoint's
//! transaction, the partitions it touched are looked at, and once one holds
//! enough small files they are merged into one file in a second transaction
//! that removes them (`dataChange` false: readers of the change feed see no
//! new rows; readers of a version see the same rows either way).
//!
//! ```text
//! checkpoint n committed ─▶ partition p has ≥ min_files files < small_file_size
//!                        ─▶ read them, write one merged file (same rows, same partition)
//!                        ─▶ commit { remove(small)…, add(merged) }   (an OPTIMIZE)
//!                             └─ conflict with a concurrent job's compaction ─▶ skipped, tried after the next checkpoint
//! ```
//!
//! The merged-away files stay on storage, named by older log versions, for
//! time travel, until Delta's `VACUUM` removes them after its retention.

use std::sync::Arc;

use arrow_array::{new_null_array, ArrayRef, RecordBatch, StringArray};
use deltalake_core::kernel::transaction::CommitBuilder;
use deltalake_core::kernel::Action;
use deltalake_core::parquet::arrow::async_reader::{
    ParquetObjectReader, ParquetRecordBatchStreamBuilder,
};
use deltalake_core::protocol::DeltaOperation;
use deltalake_core::writer::{DeltaWriter as _, RecordBatchWriter};
use deltalake_core::DeltaTable;
use futures::TryStreamExt;
use sink_api::SinkError;
use tracing::info;

use crate::app_versions::AppVersions;
use crate::errors::delta_error;
use crate::location::TableLocation;
use crate::table_log::{maintain_log, without_hooks, Owner};

/// Partition values as the committables carry them: sorted pairs.
pub(crate) type Partition = Vec<(String, Option<String>)>;

/// When the global committer merges a partition's small files. Given to
/// [`DeltaSinkBuilder::compaction`](crate::DeltaSinkBuilder::compaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// Files smaller than this many bytes are merged. Default 16 MiB.
    pub small_file_size: u64,
    /// A partition is compacted once it holds at least this many small
    /// files. Default 10.
    pub min_files: usize,
    /// A merge stops taking files once it holds this many bytes of them.
    /// Default 128 MiB.
    pub target_size: u64,
}

impl Default for Compaction {
    fn default() -> Compaction {
        Compaction {
            small_file_size: 16 << 20,
            min_files: 10,
            target_size: 128 << 20,
        }
    }
}

impl Compaction {
    /// Compacts each of `partitions` that needs it, each in a transaction of
    /// its own. Called by the global committer after a checkpoint's
    /// transaction, with the partitions it wrote to.
    pub(crate) async fn run(
        &self,
        table: &mut DeltaTable,
        versions: &mut AppVersions,
        location: &TableLocation,
        owner: &Owner,
        partitions: impl IntoIterator<Item = Partition>,
    ) -> Result<(), SinkError> {
        for partition in partitions {
            self.compact(table, versions, location, owner, &partition)
                .await?;
        }
        Ok(())
    }

    async fn compact(
        &self,
        table: &mut DeltaTable,
        versions: &mut AppVersions,
        location: &TableLocation,
        owner: &Owner,
        partition: &Partition,
    ) -> Result<(), SinkError> {
        let url = location.url();
        let reading = |e| delta_error(format!("listing the files of the Delta table {url}"), e);
        // The newest version, with the previous partition's compaction: a
        // transaction read before it would conflict on the owner's txn.
        table.update_incremental(None).await.map_err(reading)?;
        // A fenced start merges nothing (its merged file would be left
        // unnamed); the check before the commit below still decides.
        owner
            .check(
                table.snapshot().map_err(reading)?,
                table.log_store().as_ref(),
                versions,
                url,
            )
            .await?;
        // (add, remove) of each small file of the partition, oldest first.
        // From the files the snapshot holds in memory: delta-rs' file
        // stream would replay the whole log again.
        let mut small = Vec::new();
        for file in table.snapshot().map_err(reading)?.log_data() {
            // The partition values as strings, as the log writes them; the
            // replacement (typed values) is not yet worth the conversion.
            #[allow(deprecated)]
            let add = file.add_action();
            let mut values: Partition = add.partition_values.clone().into_iter().collect();
            values.sort();
            let size = u64::try_from(add.size).unwrap_or(u64::MAX);
            // A file with a deletion vector has rows deleted that its
            // Parquet still holds: merging it would bring them back.
            if &values == partition && size < self.small_file_size && add.deletion_vector.is_none()
            {
                small.push((add, file.remove_action(false)));
            }
        }
        if small.len() < self.min_files {
            return Ok(());
        }
        small.sort_by_key(|(add, _)| add.modification_time);
        let mut taken = Vec::new();
        let mut bytes = 0u64;
        for file in small {
            if bytes >= self.target_size {
                break;
            }
            bytes += u64::try_from(file.0.size).unwrap_or(0);
            taken.push(file);
        }

        let mut writer = RecordBatchWriter::for_table(table)
            .map_err(|e| delta_error("preparing the compaction writer", e))?;
        let schema = writer.arrow_schema();
        let store = location.table_store();
        for (add, _) in &taken {
            let path = object_store::path::Path::from(add.path.as_str());
            let reader = ParquetObjectReader::new(store.clone(), path.clone());
            let mut batches = ParquetRecordBatchStreamBuilder::new(reader)
                .await
                .and_then(|builder| builder.build())
                .map_err(|e| {
                    SinkError::other(format!("reading the data file {path} to compact it"), e)
                })?;
            while let Some(batch) = batches.try_next().await.map_err(|e| {
                SinkError::other(format!("reading the data file {path} to compact it"), e)
            })? {
                let full = with_partition_columns(&schema, batch, partition)?;
                writer
                    .write(full)
                    .await
                    .map_err(|e| delta_error("writing a compacted data file", e))?;
            }
        }
        let adds = writer
            .flush()
            .await
            .map_err(|e| delta_error("writing a compacted data file", e))?;
        let merged = taken.len();
        // The merged file is on disk before a log entry names it.
        location
            .make_durable(adds.iter().map(|add| add.path.clone()).collect())
            .await
            .map_err(|e| SinkError::io("making the compacted data file durable", e))?;
        let mut actions: Vec<Action> = adds
            .into_iter()
            .map(|mut add| {
                add.data_change = false;
                Action::Add(add)
            })
            .collect();
        actions.extend(taken.into_iter().map(|(_, remove)| Action::Remove(remove)));
        let snapshot = table.snapshot().map_err(reading)?;
        // A fenced start rewrites nothing either; the owner's txn makes
        // delta-rs refuse this one if a newer claim landed since the read.
        owner
            .check(snapshot, table.log_store().as_ref(), versions, url)
            .await?;
        let committed =
            CommitBuilder::from(without_hooks().with_application_transaction(owner.transaction()))
                .with_actions(actions)
                .build(
                    Some(snapshot),
                    table.log_store(),
                    DeltaOperation::Optimize {
                        predicate: None,
                        target_size: i64::try_from(self.target_size).unwrap_or(i64::MAX),
                    },
                )
                .await
                .map_err(|e| delta_error(format!("committing a compaction to {url}"), e))?;
        location
            .make_durable(vec![format!("_delta_log/{:020}.json", committed.version())])
            .await
            .map_err(|e| SinkError::io("making the Delta log entry durable", e))?;
        // The table as the commit left it, instead of reading the entry again.
        table.state = Some(committed.snapshot());
        maintain_log(table, location, committed.version()).await;
        info!(
            files = merged,
            bytes,
            table_version = committed.version(),
            ?partition,
            "small files compacted"
        );
        Ok(())
    }
}

/// `batch` (a data file's columns) with the partition's columns added as
/// constants, in the table's column order.
fn with_partition_columns(
    schema: &arrow_schema::SchemaRef,
    batch: RecordBatch,
    partition: &Partition,
) -> Result<RecordBatch, SinkError> {
    let rows = batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            if let Some((_, value)) = partition.iter().find(|(column, _)| column == name) {
                return match value {
                    None => Ok(new_null_array(field.data_type(), rows)),
                    Some(text) => {
                        let strings: ArrayRef =
                            Arc::new(StringArray::from(vec![text.as_str(); rows]));
                        arrow_cast::cast(&strings, field.data_type()).map_err(|e| {
                            SinkError::other(format!("partition value {text:?} of {name}"), e)
                        })
                    }
                };
            }
            batch.column_by_name(name).cloned().ok_or_else(|| {
                SinkError::msg(format!("a data file to compact has no column {name}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| SinkError::other("assembling a compacted batch", e))
}
