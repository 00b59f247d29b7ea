//! The file writer: records into in-progress part files, one per bucket.
//!
//! ```text
//!  write_batch ─▶ bucket per record ─▶ encode ─▶ roll if due ─▶ append to the bucket's part
//!  prepare_commit ─▶ roll the parts the policy says (all of them with roll_on_checkpoint,
//!                    or when positions are carried)
//!                 ─▶ every part closed since the last call becomes a committable
//!                    (with positions: all of them one position group)
//!  snapshot_state ─▶ persist the remaining in-progress parts (path + length)
//!  durability     ─▶ waits for the fsyncs of every part closed or persisted (and of
//!                    their directories), each started on a blocking thread when its
//!                    part was closed or persisted, while the writer goes on: the
//!                    checkpoint is acknowledged only once they are done
//!  flush(true)    ─▶ close every part: at end of input everything is committed
//! ```
//!
//! A restored writer turns each in-progress part of its states into a
//! pending file (truncated to its checkpointed length), committed with the
//! next checkpoint; new records go to new parts named with a new writer id.
//! Its states must come from its own output directory (the identity in them
//! is the base directory's), wherever that directory is now.
//!
//! On an object store output a part is a multipart upload (the `upload`
//! module): the same steps, with parts uploaded as they fill, the tail in
//! the state, and the restored tail uploaded as the upload's last part.
//!
//! When the job's source commits its positions with the data
//! (`carry_positions` before each `prepare_commit`),
//! `prepare_commit` rolls every part in progress, so that every record
//! read before the barrier is in the checkpoint's committables (a part
//! spanning the barrier would commit records after their positions), and
//! makes those committables one position group with the advances (the
//! `position_group` module): the committer commits them all at once with
//! the positions, or none of them.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{
    CheckpointId, Clock, Durability, Generation, InitContext, Lineage, PositionAdvance, SinkError,
    SinkWriter,
};

use crate::blocking::{blocking, spawn};
use crate::bucket::{check_bucket_id, BucketAssigner, BucketContext};
use crate::bulk::{BulkFormat, BulkPart};
use crate::config::{FileSinkConfig, Output};
use crate::encoder::Encoder;
use crate::identity::{self, OutputIdentity};
#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;
#[cfg(feature = "object-store")]
use crate::part_buffers::PartBuffers;
use crate::part_file::{part_paths, recover_for_commit, InProgressPart, Unsynced};
use crate::position_group::{PositionGroupId, PositionMember};
use crate::rolling::{PartInfo, RollingPolicy};
use crate::state::{FileCommittable, InProgressState};
#[cfg(feature = "object-store")]
use crate::upload::{self, UploadPart};

/// What a file writer records at a checkpoint: returned by its
/// `snapshot_state`, stored by the runtime, handed back to
/// [`FileSink::create_writer`](crate::FileSink) on a restore (format version
/// 3 of the sink's writer-state serializer; version 2 is read, version 1
/// held absolute paths and is refused).
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

/// Which writer a file writer is: its job's life and start, and the name
/// of its position groups. Made by the sink from the writer's context.
pub(crate) struct WriterStart {
    pub lineage: Lineage,
    pub generation: Generation,
    /// [`PositionGroupId::writer`] of its groups.
    pub groups: String,
    /// Whether the job promises visible commits
    /// ([`InitContext::visible_commits`]).
    pub visible_commits: bool,
}

impl WriterStart {
    /// The start of the writer made with `context`.
    pub(crate) fn of(context: &InitContext) -> WriterStart {
        WriterStart {
            lineage: context.lineage.clone(),
            generation: context.generation,
            groups: PositionGroupId::writer_of(context),
            visible_commits: context.visible_commits,
        }
    }
}

/// Writes one subtask's records into part files. Made by
/// [`FileSink`](crate::FileSink) for the runtime.
pub struct FileWriter<T, E, B> {
    config: Arc<FileSinkConfig<E, B>>,
    /// When its parts roll: the configured policy, rolling at every
    /// checkpoint too in a job that promises visible commits.
    rolling: RollingPolicy,
    /// The base directory's identity, put into committables and states.
    output: OutputIdentity,
    /// Unique per writer (subtask and start of the job): part names never
    /// repeat, across subtasks and restarts.
    writer_id: String,
    /// The job's lineage, at the end of hidden part names.
    lineage: Lineage,
    /// This start's generation, in the names of upload markers.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    generation: Generation,
    /// The time for rolling and date-time buckets.
    clock: Arc<dyn Clock>,
    /// The name of this writer's position groups.
    groups: String,
    /// How many position groups it prepared.
    next_group: u64,
    /// The advances `carry_positions` handed over for the coming
    /// `prepare_commit`; `None` when the job's source keeps its positions
    /// in checkpoints.
    advances: Option<Vec<PositionAdvance>>,
    next_counter: u64,
    parts: BTreeMap<String, OpenPart<T>>,
    pending: Vec<FileCommittable>,
    /// The fsyncs of the parts closed or persisted since the last
    /// checkpoint's durability work, started on blocking threads when the
    /// part was closed or persisted; the work waits for them.
    syncing: Vec<Syncing>,
    buffer: Vec<u8>,
    /// On an object store output: the buffers its uploads fill, recycled
    /// from part to part.
    #[cfg(feature = "object-store")]
    part_buffers: PartBuffers,
    _record: PhantomData<fn(T)>,
}

/// A part in progress, with the bulk format's writer of it (`None` for a
/// row format).
pub(crate) struct OpenPart<T> {
    part: Part,
    bulk: Option<Box<dyn BulkPart<T>>>,
}

/// Records of one bucket in a row, written into its part of a bulk format
/// (the format's writer taken out of the part meanwhile).
struct Run<T> {
    bucket: String,
    bulk: Box<dyn BulkPart<T>>,
    /// The records added so far.
    records: u64,
    /// The part's size when the run started.
    size_before: u64,
}

/// Bulk formats hand their bytes to a part in pieces of at most this: an
/// upload then cuts at most one part per piece and waits for room among
/// its parts in flight, rather than holding a whole row group's worth of
/// part buffers at once.
const BULK_PIECE_BYTES: usize = 1024 * 1024;

/// A part in progress: a hidden local file, or a multipart upload.
pub(crate) enum Part {
    File(InProgressPart),
    #[cfg(feature = "object-store")]
    Upload(UploadPart),
}

impl Part {
    fn info(&self) -> &PartInfo {
        match self {
            Part::File(part) => &part.info,
            #[cfg(feature = "object-store")]
            Part::Upload(part) => &part.info,
        }
    }

    /// Appends `bytes` holding `records` more records; an upload starts
    /// sending a part once it holds one.
    async fn write(&mut self, bytes: &[u8], records: u64, now_ms: u64) -> Result<(), SinkError> {
        match self {
            Part::File(part) => part.write(bytes, records, now_ms),
            #[cfg(feature = "object-store")]
            Part::Upload(part) => part.write(bytes, records, now_ms).await,
        }
    }

    /// Appends what a bulk format handed out (`records` more records), in
    /// pieces of at most [`BULK_PIECE_BYTES`].
    async fn write_pieces(
        &mut self,
        bytes: &[u8],
        records: u64,
        now_ms: u64,
    ) -> Result<(), SinkError> {
        let mut pieces = bytes.chunks(BULK_PIECE_BYTES);
        self.write(pieces.next().unwrap_or_default(), records, now_ms)
            .await?;
        for piece in pieces {
            self.write(piece, 0, now_ms).await?;
        }
        Ok(())
    }
}

/// An fsync of a part, started on a blocking thread; the next checkpoint's
/// durability work waits for it. Its file handle is closed when it is done.
type Syncing = tokio::task::JoinHandle<Result<(), SinkError>>;

/// Starts the fsync of `unsynced` on a blocking thread.
fn start_sync(unsynced: Unsynced) -> Syncing {
    spawn(move || unsynced.sync())
}

/// Closes `parts` for good: a bulk format's part first gets the rest of its
/// file (through `buffer`); then local files by handing their last bytes to
/// the operating system and starting their fsyncs (waited for by the
/// checkpoint's durability work, in `syncing`), uploads by sending their
/// tails.
async fn close_all<T>(
    parts: Vec<OpenPart<T>>,
    output: &OutputIdentity,
    syncing: &mut Vec<Syncing>,
    buffer: &mut Vec<u8>,
) -> Result<Vec<FileCommittable>, SinkError> {
    let mut closed = Vec::new();
    for OpenPart { mut part, bulk } in parts {
        if let Some(bulk) = bulk {
            buffer.clear();
            bulk.finish(buffer)?;
            let at = part.info().last_write_ms;
            part.write_pieces(buffer, 0, at).await?;
        }
        match part {
            Part::File(part) => {
                let (committable, file) = part.close_for_commit(output)?;
                closed.push(committable);
                syncing.push(start_sync(file));
            }
            #[cfg(feature = "object-store")]
            Part::Upload(part) => closed.push(part.close_for_commit(output).await?),
        }
    }
    Ok(closed)
}

impl<T: 'static, E, B> FileWriter<T, E, B>
where
    E: Encoder<T>,
    B: BucketAssigner<T>,
{
    /// A writer in the local base directory whose identity is `output`,
    /// turning the `restored` states' in-progress parts into pending files.
    /// Every state must carry `output`'s id: checked before any file is
    /// touched. Blocking.
    pub(crate) fn new(
        config: Arc<FileSinkConfig<E, B>>,
        base: &Path,
        output: OutputIdentity,
        start: WriterStart,
        clock: Arc<dyn Clock>,
        restored: Vec<FileWriterState>,
    ) -> Result<FileWriter<T, E, B>, SinkError> {
        check_states(base, &output, &restored)?;
        let pending = restored
            .iter()
            .flat_map(|state| &state.in_progress)
            .map(|state| recover_for_commit(base, &output, state))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FileWriter::with_pending(
            config, output, start, clock, pending,
        ))
    }

    /// A writer on the object store output `object`, whose identity is
    /// `output`, turning the `restored` states' uploads in progress into
    /// committables (their tails uploaded as last parts).
    #[cfg(feature = "object-store")]
    pub(crate) async fn on_object_store(
        config: Arc<FileSinkConfig<E, B>>,
        object: &ObjectOutput,
        output: OutputIdentity,
        start: WriterStart,
        clock: Arc<dyn Clock>,
        restored: Vec<FileWriterState>,
    ) -> Result<FileWriter<T, E, B>, SinkError> {
        check_states(Path::new(&object.location), &output, &restored)?;
        let mut pending = Vec::new();
        for state in restored.iter().flat_map(|state| &state.in_progress) {
            let Some(upload) = &state.upload else {
                return Err(SinkError::msg(format!(
                    "the checkpoint holds the local part {} for the object store output {}: the stored \
                     state is corrupt",
                    state.path.display(),
                    object.location
                ))
                .permanent());
            };
            pending.push(upload::recover_for_commit(object, &output, state, upload).await?);
        }
        Ok(FileWriter::with_pending(
            config, output, start, clock, pending,
        ))
    }

    fn with_pending(
        config: Arc<FileSinkConfig<E, B>>,
        output: OutputIdentity,
        start: WriterStart,
        clock: Arc<dyn Clock>,
        pending: Vec<FileCommittable>,
    ) -> FileWriter<T, E, B> {
        FileWriter {
            #[cfg(feature = "object-store")]
            part_buffers: PartBuffers::new(
                config.part_size,
                config.parts_in_flight.saturating_add(1),
            ),
            rolling: config.rolling_for(start.visible_commits),
            config,
            output,
            writer_id: uuid::Uuid::new_v4().to_string(),
            lineage: start.lineage,
            generation: start.generation,
            clock,
            groups: start.groups,
            next_group: 0,
            advances: None,
            next_counter: 0,
            parts: BTreeMap::new(),
            pending,
            syncing: Vec::new(),
            buffer: Vec::new(),
            _record: PhantomData,
        }
    }

    /// Closes the parts `roll` picks (their last bytes handed to the
    /// operating system here, as appends are; their fsyncs started off the
    /// async workers); they become pending.
    async fn roll_where(&mut self, roll: impl Fn(&PartInfo) -> bool) -> Result<(), SinkError> {
        let due: Vec<String> = self
            .parts
            .iter()
            .filter(|(_, open)| roll(open.part.info()))
            .map(|(bucket, _)| bucket.clone())
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let parts: Vec<OpenPart<T>> = due.iter().filter_map(|b| self.parts.remove(b)).collect();
        let closed = close_all(parts, &self.output, &mut self.syncing, &mut self.buffer).await?;
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
    /// Opening a part runs off the async workers, and so does the fsync of
    /// the one it replaces (when the policy rolls it before this record);
    /// appending is buffered.
    async fn write_encoded(&mut self, bucket: String, now_ms: u64) -> Result<(), SinkError> {
        let next_bytes = self.buffer.len() as u64;
        // The common case, in one lookup: the bucket has a part with room.
        // With one bucket open (the base path's, an hour's), its part is
        // found without a search.
        let rolling = self.rolling;
        let part = match self.parts.len() {
            1 => self
                .parts
                .iter_mut()
                .next()
                .filter(|(open, _)| same_bucket(open, &bucket))
                .map(|(_, open)| &mut open.part),
            _ => self.parts.get_mut(&bucket).map(|open| &mut open.part),
        };
        let roll = match part {
            Some(part) if !rolling.should_roll_before_write(part.info(), next_bytes) => {
                return part.write(&self.buffer, 1, now_ms).await;
            }
            Some(_) => true,
            None => false,
        };
        if roll {
            // A row format's part: no bytes to finish it with (the buffer
            // holds the record).
            self.close_part(&bucket, &mut Vec::new()).await?;
        }
        let mut part = self.open_part(&bucket, now_ms).await?;
        part.write(&self.buffer, 1, now_ms).await?;
        self.parts.insert(bucket, OpenPart { part, bulk: None });
        Ok(())
    }

    /// Writes `records` into their buckets' parts of the bulk format
    /// `format`, opening one for a bucket that has none. Records of one
    /// bucket in a row are a run: one lookup of the part, and its bytes
    /// handed to it once. A run ends early, and its part rolls, once the
    /// part's bytes and what the format holds reach the policy's size.
    async fn write_bulk(
        &mut self,
        format: &dyn BulkFormat<T>,
        records: Vec<T>,
        now_ms: u64,
    ) -> Result<(), SinkError> {
        let context = BucketContext { now_ms };
        let mut run: Option<Run<T>> = None;
        for record in records {
            let bucket = self.config.bucket_assigner.bucket_id(&record, &context);
            let same = matches!(&run, Some(run) if same_bucket(&run.bucket, &bucket));
            if !same {
                if let Some(done) = run.take() {
                    self.end_run(done, now_ms).await?;
                }
                run = Some(self.start_run(format, bucket, now_ms).await?);
            }
            let Some(current) = run.as_mut() else {
                continue;
            };
            if let Err(error) = current.bulk.add(&record, &mut self.buffer) {
                // The part is abandoned: the job restarts from its last
                // checkpoint, which never holds a bulk part in progress.
                self.parts.remove(&current.bucket);
                return Err(error);
            }
            current.records += 1;
            let size = current.size_before + self.buffer.len() as u64;
            let size = size + current.bulk.buffered_bytes();
            if (self.rolling.max_part_size_bytes).is_some_and(|limit| size >= limit) {
                if let Some(done) = run.take() {
                    self.end_run(done, now_ms).await?;
                }
            }
        }
        match run {
            Some(done) => self.end_run(done, now_ms).await,
            None => Ok(()),
        }
    }

    /// Starts a run of records into `bucket`: its part (opened if the
    /// bucket has none), with the format's writer taken out of it for the
    /// run.
    async fn start_run(
        &mut self,
        format: &dyn BulkFormat<T>,
        bucket: String,
        now_ms: u64,
    ) -> Result<Run<T>, SinkError> {
        self.buffer.clear();
        if let Some(open) = self.parts.get_mut(&bucket) {
            let Some(bulk) = open.bulk.take() else {
                return Err(SinkError::msg(format!(
                    "the bucket '{bucket}' has a part of a row format open in a writer of a bulk \
                     format"
                )));
            };
            let size_before = open.part.info().size_bytes;
            return Ok(Run {
                bucket,
                bulk,
                records: 0,
                size_before,
            });
        }
        let part = self.open_part(&bucket, now_ms).await?;
        let bulk = format.open_part()?;
        self.parts
            .insert(bucket.clone(), OpenPart { part, bulk: None });
        Ok(Run {
            bucket,
            bulk,
            records: 0,
            size_before: 0,
        })
    }

    /// Ends a run: hands what its records made to the part, puts the
    /// format's writer back, and rolls the part if it reached the policy's
    /// size.
    async fn end_run(&mut self, run: Run<T>, now_ms: u64) -> Result<(), SinkError> {
        let Some(open) = self.parts.get_mut(&run.bucket) else {
            return Err(SinkError::msg(format!(
                "the part of the bucket '{}' vanished during a run of records",
                run.bucket
            )));
        };
        open.part
            .write_pieces(&self.buffer, run.records, now_ms)
            .await?;
        self.buffer.clear();
        let size = open.part.info().size_bytes + run.bulk.buffered_bytes();
        open.bulk = Some(run.bulk);
        if (self.rolling.max_part_size_bytes).is_some_and(|limit| size >= limit) {
            let mut buffer = std::mem::take(&mut self.buffer);
            self.close_part(&run.bucket, &mut buffer).await?;
            self.buffer = buffer;
        }
        Ok(())
    }

    /// Closes `bucket`'s part, if it has one (through `buffer`, for a bulk
    /// format's end); it becomes pending.
    async fn close_part(&mut self, bucket: &str, buffer: &mut Vec<u8>) -> Result<(), SinkError> {
        if let Some(open) = self.parts.remove(bucket) {
            let closed = close_all(vec![open], &self.output, &mut self.syncing, buffer).await?;
            self.pending.extend(closed);
        }
        Ok(())
    }

    /// Opens a new part in `bucket`: a hidden file or a multipart upload,
    /// off the async workers.
    async fn open_part(&mut self, bucket: &str, now_ms: u64) -> Result<Part, SinkError> {
        check_bucket_id(bucket)?;
        let counter = self.next_counter;
        self.next_counter += 1;
        let (path, target) = part_paths(
            Path::new(bucket),
            &self.config.part_prefix,
            &self.writer_id,
            counter,
            &self.config.part_suffix,
            &self.lineage,
        );
        Ok(match &self.config.output {
            Output::Local(base) => {
                let (syncs, base) = (self.config.syncs.clone(), base.clone());
                let part =
                    blocking(move || InProgressPart::create(&base, path, target, now_ms, &syncs))
                        .await?;
                Part::File(part)
            }
            #[cfg(feature = "object-store")]
            Output::Object(object) => {
                let target = target.to_string_lossy().into_owned();
                let marker =
                    upload::marker_path(&self.lineage, self.generation, &self.writer_id, counter);
                Part::Upload(
                    UploadPart::create(
                        object,
                        target,
                        marker,
                        &self.part_buffers,
                        self.config.parts_in_flight,
                        now_ms,
                    )
                    .await?,
                )
            }
        })
    }
}

/// Whether two bucket ids are the same; the empty one (the base path's, the
/// most common) without a byte comparison.
fn same_bucket(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// Checks that every restored state belongs to the output `base` (named
/// in errors), whose identity is `output`.
fn check_states(
    base: &Path,
    output: &OutputIdentity,
    restored: &[FileWriterState],
) -> Result<(), SinkError> {
    for state in restored {
        identity::check(
            base,
            Some(output),
            "a writer state",
            &state.output_id,
            &state.output_dir,
        )?;
    }
    Ok(())
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
        let rolling = self.rolling;
        self.roll_where(|part| rolling.should_roll_on_time(part, now_ms))
            .await?;
        let config = self.config.clone();
        match config.encoder.bulk() {
            None => {
                for record in records {
                    let bucket = self.encode(&record, now_ms)?;
                    drop(record);
                    self.write_encoded(bucket, now_ms).await?;
                }
            }
            Some(format) => self.write_bulk(format, records, now_ms).await?,
        }
        Ok(())
    }

    /// Hands buffered bytes to the OS; at end of input closes every part, so
    /// that the end-of-input `prepare_commit` commits everything.
    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        if end_of_input {
            return self.roll_where(|_| true).await;
        }
        for open in self.parts.values_mut() {
            match &mut open.part {
                Part::File(part) => part.flush()?,
                // An upload's bytes leave with its parts.
                #[cfg(feature = "object-store")]
                Part::Upload(_) => {}
            }
        }
        Ok(())
    }

    /// Keeps `advances` for the coming `prepare_commit`, which then rolls
    /// every part and makes its committables one position group.
    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        self.advances = Some(advances);
        Ok(())
    }

    /// Rolls the parts due (every part when positions were carried) and
    /// returns every part closed since the last call; with positions, as
    /// one position group carrying them (a member without a file when the
    /// source moved without records).
    async fn prepare_commit(
        &mut self,
        checkpoint_id: sink_api::CheckpointId,
    ) -> Result<Vec<FileCommittable>, SinkError> {
        let now_ms = self.clock.now_ms();
        let rolling = self.rolling;
        let Some(advances) = self.advances.take() else {
            self.roll_where(|part| rolling.should_roll_on_checkpoint(part, now_ms))
                .await?;
            return Ok(std::mem::take(&mut self.pending));
        };
        self.roll_where(|_| true).await?;
        let mut committables = std::mem::take(&mut self.pending);
        if committables.is_empty() {
            if advances.is_empty() {
                return Ok(committables);
            }
            committables.push(FileCommittable {
                output_id: self.output.id.clone(),
                output_dir: self.output.dir.clone(),
                pending: Default::default(),
                target: Default::default(),
                size_bytes: 0,
                records: 0,
                upload: None,
                positions: None,
            });
        }
        let member = PositionMember {
            group: PositionGroupId {
                writer: self.groups.clone(),
                number: self.next_group,
                checkpoint: checkpoint_id.0,
            },
            members: u32::try_from(committables.len()).map_err(|_| {
                SinkError::msg(format!(
                    "{} parts closed at checkpoint {checkpoint_id}: more than one position group \
                     holds",
                    committables.len()
                ))
            })?,
            advances,
        };
        self.next_group += 1;
        for committable in &mut committables {
            committable.positions = Some(member.clone());
        }
        Ok(committables)
    }

    /// Persists every in-progress part: flushes it, records it, and starts
    /// its fsync (of a second handle, as writing goes on) on a blocking
    /// thread, for the checkpoint's durability work.
    async fn snapshot_state(
        &mut self,
        _checkpoint_id: CheckpointId,
    ) -> Result<Vec<FileWriterState>, SinkError> {
        let mut in_progress = Vec::with_capacity(self.parts.len());
        for (bucket, open) in self.parts.iter_mut() {
            if open.bulk.is_some() {
                // The builder makes bulk formats roll at every checkpoint.
                return Err(SinkError::msg(format!(
                    "the bucket '{bucket}' has a part of a bulk format in progress at a checkpoint: \
                     such parts cannot be resumed, and roll at every checkpoint"
                )));
            }
            match &mut open.part {
                Part::File(part) => {
                    let (state, unsynced) = part.persist()?;
                    in_progress.push(state);
                    self.syncing.push(start_sync(unsynced));
                }
                #[cfg(feature = "object-store")]
                Part::Upload(part) => in_progress.push(part.persist().await?),
            }
        }
        Ok(vec![FileWriterState {
            output_id: self.output.id.clone(),
            output_dir: self.output.dir.clone(),
            in_progress,
        }])
    }

    /// Waits for the fsyncs of the parts closed since the last checkpoint
    /// and of the parts this one persisted (with their directories), each
    /// started on a blocking thread when its part was closed or persisted:
    /// the checkpoint is acknowledged once they are done, while the writer
    /// goes on writing new parts. `None` when nothing waits.
    fn durability(&mut self, _checkpoint_id: CheckpointId) -> Option<Durability> {
        if self.syncing.is_empty() {
            return None;
        }
        let syncing = std::mem::take(&mut self.syncing);
        Some(Box::pin(async move {
            for sync in syncing {
                sync.await.map_err(|e| {
                    SinkError::msg(format!("the fsync of a part file ended abnormally: {e}"))
                })??;
            }
            Ok(())
        }))
    }

    /// Drops the open files. Hidden files stay: an in-progress file recorded
    /// in the last checkpoint is needed by a restore.
    async fn close(&mut self) -> Result<(), SinkError> {
        for open in self.parts.values_mut() {
            // Best effort: the data matters only if a checkpoint recorded it,
            // and then it was already persisted. Parts of uploads still in
            // flight are abandoned (their tasks end with the part).
            match &mut open.part {
                Part::File(part) => drop(part.flush()),
                #[cfg(feature = "object-store")]
                Part::Upload(_) => {}
            }
        }
        self.parts.clear();
        self.syncing.clear();
        Ok(())
    }
}
