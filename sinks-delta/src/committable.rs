//! The committables: one finished Parquet data file, described as the
//! Delta log will describe it, plus the job identity the global committer
//! commits it under; and the source positions one subtask's files of one
//! checkpoint advance, committed with them or not at all.

use std::collections::HashMap;

use deltalake_core::kernel::Add;
use serde::{Deserialize, Serialize};
use sink_api::{PositionAdvance, SinkError};

/// What a writer hands out at a checkpoint: its finished data files, and,
/// when the job's source keeps its positions in the table, one
/// [`CarriedPositions`] naming them.
///
/// Made by the writer's `prepare_commit`; stored in checkpoints (format
/// version 2, the `format` module) until committed; passed through the
/// per-subtask committer to the global committer, which adds a
/// checkpoint's files and positions to the table in one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeltaCommittable {
    /// A finished data file.
    File(DataFile),
    /// The source positions the records of the named files advance.
    Positions(CarriedPositions),
}

impl DeltaCommittable {
    /// The job identity it is committed under.
    pub fn app_id(&self) -> &str {
        match self {
            DeltaCommittable::File(file) => &file.app_id,
            DeltaCommittable::Positions(positions) => &positions.app_id,
        }
    }
}

/// The source positions one subtask's records of one checkpoint advance,
/// and the data files holding those records: the global committer adds the
/// files and moves the positions in one transaction if every split is
/// still where [`advances`](Self::advances) expect it, and drops the files
/// otherwise (another owner of a split committed its records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarriedPositions {
    /// As [`DataFile::app_id`].
    pub app_id: String,
    /// The paths of the files of the same subtask and checkpoint (each also
    /// a [`DeltaCommittable::File`]); a split's records may be in any.
    pub files: Vec<String>,
    /// Each split read: from where the table has it to where the records
    /// read end.
    pub advances: Vec<PositionAdvance>,
}

/// One data file a writer finished: written in full to the table's
/// location, named by no log entry yet, so invisible to readers.
///
/// Made by the writer's `prepare_commit`; stored in checkpoints until
/// committed; made durable by the per-subtask committer; added to the table
/// by the global committer, in one transaction with every other file of its
/// checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// The Delta application id the file is committed under: the job's name
    /// and lineage (`<job>/<lineage>`), which no other job and no later run
    /// on fresh checkpoint storage shares.
    pub app_id: String,
    /// The file's path relative to the table's root, as in the log's `add`
    /// action (partition directories first).
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The rows it holds.
    pub rows: u64,
    /// Its partition values (column, value as Delta writes it; `None` for
    /// null), sorted by column.
    pub partition_values: Vec<(String, Option<String>)>,
    /// Delta's per-file statistics (row count, minimum and maximum values,
    /// null counts), as JSON, when the Parquet writer gave them.
    pub stats: Option<String>,
    /// When it was written, in milliseconds since the Unix epoch.
    pub modification_time: i64,
}

impl DataFile {
    /// The file as delta-rs' writer described it, for the application
    /// `app_id`.
    pub(crate) fn from_add(app_id: &str, add: Add) -> Result<DataFile, SinkError> {
        let rows = add
            .get_stats()
            .ok()
            .flatten()
            .map(|stats| stats.num_records)
            .ok_or_else(|| {
                SinkError::msg(format!(
                    "the Parquet writer gave no row count for the data file {}",
                    add.path
                ))
                .permanent()
            })?;
        let mut partition_values: Vec<_> = add.partition_values.into_iter().collect();
        partition_values.sort();
        Ok(DataFile {
            app_id: app_id.to_string(),
            path: add.path,
            size: u64::try_from(add.size).unwrap_or(0),
            rows: u64::try_from(rows).unwrap_or(0),
            partition_values,
            stats: add.stats,
            modification_time: add.modification_time,
        })
    }

    /// The log's `add` action for this file (`dataChange` true: new rows).
    pub(crate) fn to_add(&self) -> Add {
        Add {
            path: self.path.clone(),
            partition_values: self
                .partition_values
                .iter()
                .cloned()
                .collect::<HashMap<_, _>>(),
            size: i64::try_from(self.size).unwrap_or(i64::MAX),
            modification_time: self.modification_time,
            data_change: true,
            stats: self.stats.clone(),
            tags: None,
            deletion_vector: None,
            base_row_id: None,
            default_row_commit_version: None,
            clustering_provider: None,
        }
    }
}
