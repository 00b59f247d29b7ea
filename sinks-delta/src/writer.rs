//! The writer: records into Parquet data files, closed at every checkpoint.
//!
//! ```text
//! write_batch(rows) ─▶ Arrow record batch (serde → arrow-json's decoder)
//!                   ─▶ delta-rs' RecordBatchWriter: one Parquet file per partition, in memory
//!                   ─▶ a file past the target size: written to the table's location now
//! prepare_commit(n) ─▶ every open file written out ─▶ DataFile committables
//! durability(n)     ─▶ on a local table, those files fsynced with their directories
//! ```
//!
//! A checkpoint recording a file is acknowledged only once the file is on
//! disk (`SinkWriter::durability`): a power cut after the checkpoint
//! completed cannot leave its committable pointing at a file that was still
//! in the page cache (object stores hold what they acknowledged).
//!
//! A Parquet file is finished by its footer and cannot be reopened, so a
//! writer has nothing to resume after a restore: every checkpoint closes
//! its files, and its state type [`NoResume`] has no values. Files written
//! but never committed (a crash before their checkpoint completed) are
//! named by no log entry: readers never see them, and Delta's `VACUUM`
//! removes them.

use std::marker::PhantomData;
use std::sync::Arc;

use arrow_json::reader::Decoder;
use async_trait::async_trait;
use deltalake_core::writer::{DeltaWriter as _, RecordBatchWriter};
use serde::{Deserialize, Serialize};
use sink_api::{
    BadRecord, CheckpointId, Counter, Durability, PositionAdvance, SinkError, SinkWriter,
};

use crate::committable::{CarriedPositions, DataFile, DeltaCommittable};
use crate::derived::Derived;
use crate::errors::delta_error;
use crate::location::TableLocation;

/// The state of a [`DeltaSinkWriter`]: none. A Parquet file cannot be
/// resumed after a restart, so every checkpoint closes the writer's files
/// and hands them out as committables; the writer keeps nothing between
/// checkpoints. This type has no values: a restored writer is always given
/// an empty list of states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoResume {}

/// Counters a writer adds to, registered in the job's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriterCounters {
    pub files: Counter,
    pub rows: Counter,
    pub bytes: Counter,
}

/// Writes one subtask's records into Parquet data files of the table.
///
/// Made by [`DeltaSink::create_writer`](crate::DeltaSink), one per subtask
/// and start; driven by the runtime as [`SinkWriter`] describes.
pub struct DeltaSinkWriter<T> {
    files: RecordBatchWriter,
    rows: Decoder,
    shape: RowShape,
    app_id: String,
    target_file_size: usize,
    finished: Vec<DataFile>,
    /// Where the files are: what makes them durable.
    location: TableLocation,
    /// Files handed out whose durability no checkpoint waited for yet.
    unsynced: Vec<String>,
    /// The source positions the records since the last checkpoint advance.
    advances: Vec<PositionAdvance>,
    counters: WriterCounters,
    _records: PhantomData<fn(T)>,
}

/// What records are decoded into, and what is added to them before they
/// are written: the table's schema, or, with derived partition columns,
/// the table's without them, and how to compute them.
#[derive(Debug, Clone)]
pub(crate) struct RowShape {
    pub records: arrow_schema::SchemaRef,
    pub derived: Option<Arc<Derived>>,
}

impl<T> DeltaSinkWriter<T> {
    pub(crate) fn new(
        files: RecordBatchWriter,
        shape: RowShape,
        app_id: String,
        target_file_size: usize,
        location: TableLocation,
        counters: WriterCounters,
    ) -> Result<DeltaSinkWriter<T>, SinkError> {
        Ok(DeltaSinkWriter {
            files,
            rows: row_decoder(shape.records.clone())?,
            shape,
            app_id,
            target_file_size,
            finished: Vec::new(),
            location,
            unsynced: Vec::new(),
            advances: Vec::new(),
            counters,
            _records: PhantomData,
        })
    }

    /// Writes every open file to the table's location and keeps their
    /// descriptions for the next `prepare_commit`.
    async fn close_files(&mut self) -> Result<(), SinkError> {
        let adds = self
            .files
            .flush()
            .await
            .map_err(|e| delta_error("writing Parquet data files", e))?;
        for add in adds {
            let file = DataFile::from_add(&self.app_id, add)?;
            self.counters.files.add(1);
            self.counters.rows.add(file.rows);
            self.counters.bytes.add(file.size);
            self.finished.push(file);
        }
        Ok(())
    }

    /// A decoder of records into rows of the table's schema.
    fn decoder(&self) -> Result<Decoder, SinkError> {
        row_decoder(self.shape.records.clone())
    }

    /// Adds the rows the decoder holds to the open files.
    async fn write_decoded(&mut self) -> Result<(), SinkError> {
        let unfit = |e| SinkError::other("a record does not fit the table's schema", e).permanent();
        match self.rows.flush().map_err(unfit)? {
            Some(batch) => {
                let rows = self.table_rows(batch)?;
                self.write_rows(rows).await
            }
            None => Ok(()),
        }
    }

    /// The decoded `batch` as rows of the table: with the derived columns
    /// added and the records' times converted, when there are any. Fails
    /// for a value the table cannot hold (a time past microseconds'
    /// range).
    fn table_rows(
        &self,
        batch: arrow_array::RecordBatch,
    ) -> Result<arrow_array::RecordBatch, SinkError> {
        match &self.shape.derived {
            Some(derived) => derived.complete(batch),
            None => Ok(batch),
        }
    }

    /// Adds `batch` (rows of the table's schema) to the open files, and
    /// writes them out once they reach the target size.
    async fn write_rows(&mut self, batch: arrow_array::RecordBatch) -> Result<(), SinkError> {
        self.files
            .write(batch)
            .await
            .map_err(|e| delta_error("encoding records into Parquet", e))?;
        if self.files.buffer_len() >= self.target_file_size {
            self.close_files().await?;
        }
        Ok(())
    }
}

/// A decoder of records (through serde) into rows of `schema`. Strict: a
/// field the table has no column for is an error, not silently dropped.
/// Called by the sink for each writer, and by a writer that starts afresh
/// after a refused record.
pub(crate) fn row_decoder(schema: arrow_schema::SchemaRef) -> Result<Decoder, SinkError> {
    arrow_json::ReaderBuilder::new(schema)
        .with_strict_mode(true)
        .build_decoder()
        .map_err(|e| SinkError::other("preparing the record encoder", e).permanent())
}

#[async_trait]
impl<T> SinkWriter for DeltaSinkWriter<T>
where
    T: Serialize + Send + Sync + 'static,
{
    type Input = T;
    type Committable = DeltaCommittable;
    type State = NoResume;

    async fn write(&mut self, record: T) -> Result<(), SinkError> {
        self.write_batch(vec![record]).await
    }

    /// Encodes the batch into Arrow, adds it to the open files, and writes
    /// the files out once they reach the target size. A record the table's
    /// schema cannot hold is a permanent error that names the column.
    async fn write_batch(&mut self, records: Vec<T>) -> Result<(), SinkError> {
        if records.is_empty() {
            return Ok(());
        }
        let unfit = |e| SinkError::other("a record does not fit the table's schema", e).permanent();
        self.rows.serialize(&records).map_err(unfit)?;
        self.write_decoded().await
    }

    /// The records that do not fit the table's schema are refused, each
    /// with the reason and its JSON form; the others are written as
    /// [`write_batch`](Self::write_batch) writes them. A batch that fits
    /// costs what `write_batch` costs; one with a refusal is checked a
    /// record at a time in a decoder of its own, so that the writer's
    /// never holds a part of a refused record.
    async fn write_batch_refusing(&mut self, records: Vec<T>) -> Result<Vec<BadRecord>, SinkError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        // Rows are built when the decoder is flushed, and completed for the
        // table after: that is where refusals show (a null in a required
        // column, a value of another type, a time out of the table's
        // range), so a record fits once it is decoded and completed.
        let decoded = self
            .rows
            .serialize(&records)
            .and_then(|()| self.rows.flush());
        if let Ok(Some(batch)) = decoded {
            if let Ok(rows) = self.table_rows(batch) {
                return self.write_rows(rows).await.map(|()| Vec::new());
            }
        }
        // The decoder may hold a part of the refused record: start afresh.
        self.rows = self.decoder()?;
        let mut check = self.decoder()?;
        let (mut fit, mut refused) = (Vec::with_capacity(records.len()), Vec::new());
        for record in records {
            let one = std::slice::from_ref(&record);
            let checked = match check.serialize(one).and_then(|()| check.flush()) {
                Ok(Some(batch)) => self.table_rows(batch).map(drop).map_err(|e| e.to_string()),
                Ok(None) => Ok(()),
                Err(error) => Err(error.to_string()),
            };
            match checked {
                Ok(()) => fit.push(record),
                Err(error) => {
                    let json = serde_json::to_vec(&record).unwrap_or_default();
                    refused.push(
                        BadRecord::new(format!("it does not fit the table's schema: {error}"))
                            .payload(json),
                    );
                    check = self.decoder()?;
                }
            }
        }
        if !fit.is_empty() {
            let unfit =
                |e| SinkError::other("a record does not fit the table's schema", e).permanent();
            self.rows.serialize(&fit).map_err(unfit)?;
            self.write_decoded().await?;
        }
        Ok(refused)
    }

    /// Kept for the next `prepare_commit`, which hands them out with the
    /// files holding their records.
    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        self.advances.extend(advances);
        Ok(())
    }

    /// Closes every open file (a Parquet file cannot be resumed) and hands
    /// out every file finished since the last call, and the positions
    /// carried since, naming those files.
    async fn prepare_commit(
        &mut self,
        _: CheckpointId,
    ) -> Result<Vec<DeltaCommittable>, SinkError> {
        self.close_files().await?;
        let finished = std::mem::take(&mut self.finished);
        self.unsynced
            .extend(finished.iter().map(|file| file.path.clone()));
        let positions = (!self.advances.is_empty()).then(|| CarriedPositions {
            app_id: self.app_id.clone(),
            files: finished.iter().map(|file| file.path.clone()).collect(),
            advances: std::mem::take(&mut self.advances),
        });
        Ok(finished
            .into_iter()
            .map(DeltaCommittable::File)
            .chain(positions.map(DeltaCommittable::Positions))
            .collect())
    }

    /// Fsyncs the files handed out since the last checkpoint, with their
    /// directories, on a blocking thread (a local table; nothing to do on
    /// an object store): the checkpoint that records them is acknowledged
    /// once they are on disk.
    fn durability(&mut self, _: CheckpointId) -> Option<Durability> {
        if self.unsynced.is_empty() || self.location.local_dir().is_none() {
            self.unsynced.clear();
            return None;
        }
        let (location, paths) = (self.location.clone(), std::mem::take(&mut self.unsynced));
        Some(Box::pin(async move {
            location
                .make_durable(paths)
                .await
                .map_err(|e| SinkError::io("making data files durable", e))
        }))
    }

    /// Drops what was not handed out; files already written stay unnamed by
    /// the log, invisible, until `VACUUM` removes them.
    async fn close(&mut self) -> Result<(), SinkError> {
        self.files.reset();
        self.finished.clear();
        self.advances.clear();
        Ok(())
    }
}
