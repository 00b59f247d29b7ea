//! The file writer: records into in-progress part files, one per bucket.
//!
//! ```text
//!  write_batch ─▶ bucket per record ─▶ encode ─▶ roll if due ─▶ append to the bucket's part
//!  prepare_commit ─▶ roll the parts the policy says (all of them with roll_on_checkpoint)
//!                 ─▶ every part closed since the last call becomes a committable
//!  snapshot_state ─▶ persist the remaining in-progress parts (fsync, path + length)
//!  flush(true)    ─▶ close every part: at end of input everything is committed
//! ```
//!
//! A restored writer turns each in-progress part of its states into a
//! pending file (truncated to its checkpointed length), committed with the
//! next checkpoint; new records go to new parts named with a new writer id.
//! Its states must come from its own output directory (the identity in them
//! is the base directory's), wherever that directory is now.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, Clock, Lineage, SinkError, SinkWriter};

use crate::blocking::blocking;
use crate::bucket::{check_bucket_id, BucketAssigner, BucketContext};
use crate::config::FileSinkConfig;
use crate::encoder::Encoder;
use crate::identity::{self, OutputIdentity};
use crate::part_file::{
    part_paths, recover_for_commit, FileCommittable, InProgressPart, InProgressState,
};

/// What a file writer records at a checkpoint: returned by its
/// `snapshot_state`, stored by the runtime, handed back to
/// [`FileSink::create_writer`](crate::FileSink) on a restore (format version
/// 2 of the sink's writer-state serializer; version 1 held absolute paths
/// and is refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWriterState {
    /// The identity (the `.file-sink-id` marker) of the output directory the
    /// writer wrote in. A restore into a base directory of another identity
    /// is refused.
    pub output_id: String,
    /// Where that output directory was: for error messages only.
    pub output_dir: std::path::PathBuf,
    /// The in-progress parts, persisted, with paths relative to the base
    /// directory.
    pub in_progress: Vec<InProgressState>,
}

/// Writes one subtask's records into part files. Made by
/// [`FileSink`](crate::FileSink) for the runtime.
pub struct FileWriter<T, E, B> {
    config: Arc<FileSinkConfig<E, B>>,
    /// The base directory's identity, put into committables and states.
    output: OutputIdentity,
    /// Unique per writer (subtask and start of the job): part names never
    /// repeat, across subtasks and restarts.
    writer_id: String,
    /// The job's lineage, at the end of hidden part names.
    lineage: Lineage,
    /// The time for rolling and date-time buckets.
    clock: Arc<dyn Clock>,
    next_counter: u64,
    parts: BTreeMap<String, InProgressPart>,
    pending: Vec<FileCommittable>,
    buffer: Vec<u8>,
    _record: PhantomData<fn(T)>,
}

impl<T, E, B> FileWriter<T, E, B>
where
    E: Encoder<T>,
    B: BucketAssigner<T>,
{
    /// A writer in the base directory whose identity is `output`, turning
    /// the `restored` states' in-progress parts into pending files. Every
    /// state must carry `output`'s id: checked before any file is touched.
    pub(crate) fn new(
        config: Arc<FileSinkConfig<E, B>>,
        output: OutputIdentity,
        lineage: Lineage,
        clock: Arc<dyn Clock>,
        restored: Vec<FileWriterState>,
    ) -> Result<FileWriter<T, E, B>, SinkError> {
        let base = &config.base_path;
        for state in &restored {
            identity::check(
                base,
                Some(&output),
                "a writer state",
                &state.output_id,
                &state.output_dir,
            )?;
        }
        let pending = restored
            .iter()
            .flat_map(|state| &state.in_progress)
            .map(|state| recover_for_commit(base, &output, state))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FileWriter {
            config,
            output,
            writer_id: uuid::Uuid::new_v4().to_string(),
            lineage,
            clock,
            next_counter: 0,
            parts: BTreeMap::new(),
            pending,
            buffer: Vec::new(),
            _record: PhantomData,
        })
    }

    /// Closes the parts `roll` picks, off the async workers; they become
    /// pending.
    async fn roll_where(
        &mut self,
        roll: impl Fn(&InProgressPart) -> bool,
    ) -> Result<(), SinkError> {
        let due: Vec<String> = self
            .parts
            .iter()
            .filter(|(_, part)| roll(part))
            .map(|(bucket, _)| bucket.clone())
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let parts: Vec<InProgressPart> = due.iter().filter_map(|b| self.parts.remove(b)).collect();
        let output = self.output.clone();
        let closed = blocking(move || {
            parts
                .into_iter()
                .map(|part| part.close_for_commit(&output))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
        self.pending.extend(closed);
        Ok(())
    }

    /// Encodes `record` into the buffer; returns its bucket.
    fn encode(&mut self, record: &T, now_ms: u64) -> Result<String, SinkError> {
        let context = BucketContext { now_ms };
        let bucket = self.config.bucket_assigner.bucket_id(record, &context);
        self.buffer.clear();
        self.config.encoder.encode(record, &mut self.buffer)?;
        Ok(bucket)
    }

    /// Writes the encoded record in the buffer into `bucket`'s part.
    /// Opening a part (and closing the one it replaces, when the policy
    /// rolls it before this record) runs off the async workers; appending
    /// is buffered.
    async fn write_encoded(&mut self, bucket: String, now_ms: u64) -> Result<(), SinkError> {
        let next_bytes = self.buffer.len() as u64;
        // The common case, in one lookup: the bucket has a part with room.
        let rolling = self.config.rolling;
        let roll = match self.parts.get_mut(&bucket) {
            Some(part) if !rolling.should_roll_before_write(&part.info, next_bytes) => {
                return part.write_record(&self.buffer, now_ms);
            }
            Some(_) => true,
            None => false,
        };
        let replaced = match roll {
            true => self.parts.remove(&bucket),
            false => None,
        };
        check_bucket_id(&bucket)?;
        let (path, target) = part_paths(
            std::path::Path::new(&bucket),
            &self.config.part_prefix,
            &self.writer_id,
            self.next_counter,
            &self.config.part_suffix,
            &self.lineage,
        );
        self.next_counter += 1;
        let (config, output) = (self.config.clone(), self.output.clone());
        let (closed, mut part) = blocking(move || {
            let closed = replaced
                .map(|part| part.close_for_commit(&output))
                .transpose()?;
            let part =
                InProgressPart::create(&config.base_path, path, target, now_ms, &config.syncs)?;
            Ok((closed, part))
        })
        .await?;
        self.pending.extend(closed);
        part.write_record(&self.buffer, now_ms)?;
        self.parts.insert(bucket, part);
        Ok(())
    }
}

#[async_trait]
impl<T, E, B> SinkWriter for FileWriter<T, E, B>
where
    T: Send + 'static,
    E: Encoder<T>,
    B: BucketAssigner<T>,
{
    type Input = T;
    type Committable = FileCommittable;
    type State = FileWriterState;

    async fn write(&mut self, record: T) -> Result<(), SinkError> {
        self.write_batch(vec![record]).await
    }

    /// Rolls parts due by time once per batch, then writes each record.
    async fn write_batch(&mut self, records: Vec<T>) -> Result<(), SinkError> {
        let now_ms = self.clock.now_ms();
        let rolling = self.config.rolling;
        self.roll_where(|part| rolling.should_roll_on_time(&part.info, now_ms))
            .await?;
        for record in records {
            let bucket = self.encode(&record, now_ms)?;
            drop(record);
            self.write_encoded(bucket, now_ms).await?;
        }
        Ok(())
    }

    /// Hands buffered bytes to the OS; at end of input closes every part, so
    /// that the end-of-input `prepare_commit` commits everything.
    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        if end_of_input {
            return self.roll_where(|_| true).await;
        }
        for part in self.parts.values_mut() {
            part.flush()?;
        }
        Ok(())
    }

    async fn prepare_commit(
        &mut self,
        _checkpoint_id: sink_api::CheckpointId,
    ) -> Result<Vec<FileCommittable>, SinkError> {
        let now_ms = self.clock.now_ms();
        let rolling = self.config.rolling;
        self.roll_where(|part| rolling.should_roll_on_checkpoint(&part.info, now_ms))
            .await?;
        Ok(std::mem::take(&mut self.pending))
    }

    /// Persists every in-progress part (flush and fsync), off the async
    /// workers.
    async fn snapshot_state(
        &mut self,
        _checkpoint_id: CheckpointId,
    ) -> Result<Vec<FileWriterState>, SinkError> {
        let mut parts = std::mem::take(&mut self.parts);
        let (parts, in_progress) = blocking(move || {
            let states = parts
                .values_mut()
                .map(InProgressPart::persist)
                .collect::<Result<Vec<_>, _>>();
            Ok((parts, states))
        })
        .await?;
        self.parts = parts;
        Ok(vec![FileWriterState {
            output_id: self.output.id.clone(),
            output_dir: self.output.dir.clone(),
            in_progress: in_progress?,
        }])
    }

    /// Drops the open files. Hidden files stay: an in-progress file recorded
    /// in the last checkpoint is needed by a restore.
    async fn close(&mut self) -> Result<(), SinkError> {
        for part in self.parts.values_mut() {
            // Best effort: the data matters only if a checkpoint recorded it,
            // and then it was already persisted.
            let _ = part.flush();
        }
        self.parts.clear();
        Ok(())
    }
}
