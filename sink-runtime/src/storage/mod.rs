//! Checkpoint storage: where completed checkpoints are kept.
//!
//! A checkpoint is complete when the coordinator has stored it through a
//! [`CheckpointStorage`]; only then are tasks told to commit. This module
//! defines what a checkpoint holds ([`CompletedCheckpoint`]) and the storage
//! trait; [`MemoryCheckpointStorage`] keeps them in memory. Durable storage in
//! a local state directory implements the same trait.
//!
//! Everything a sink or a source produced is stored as versioned blobs
//! (see `sink_api::serialize_versioned`), so the checkpoint itself stays
//! readable when a sink's own format changes.

mod frame;
mod local;
mod memory;
#[cfg(feature = "object-store")]
mod object;
mod shared;

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{
    deserialize_versioned, serialize_versioned, CheckpointId, Generation, Lineage, SerializerError,
    SubtaskIndex, VersionedSerializer,
};

use crate::core::ledger::SubtaskPart;
use crate::metrics::KnownCommitFailure;

pub use crate::core::ledger::CommittableSummary;

pub use local::{CheckpointFile, LocalCheckpointStorage, StateDirectory};
pub use memory::MemoryCheckpointStorage;
#[cfg(feature = "object-store")]
pub use object::ObjectCheckpointStorage;
pub use shared::{Chunk, ChunkId, Piece, StateBytes};

/// Committables of one (checkpoint, subtask) that were not committed when the
/// checkpoint was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCommittables {
    /// The summary they were announced with.
    pub summary: CommittableSummary,
    /// The committables, each a versioned blob of the sink's committable
    /// serializer.
    pub committables: Vec<Vec<u8>>,
}

/// What one subtask contributed to a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskSnapshot {
    /// The subtask.
    pub subtask: SubtaskIndex,
    /// What its source reader has left to read: its splits as the source's
    /// [`SplitCodec`](crate::source::SplitCodec) stored them, in pieces
    /// of which the sealed chunks are stored once for every checkpoint
    /// that holds them.
    pub source_splits: StateBytes,
    /// Its writer's states, each a versioned blob of the sink's writer-state
    /// serializer.
    pub writer_states: Vec<Vec<u8>>,
    /// Its committer's committables not yet committed.
    pub pending: Vec<PendingCommittables>,
    /// Whether its input had ended.
    pub end_of_input: bool,
}

/// What the global committer contributed to a checkpoint: the committed
/// committables it had received but not yet acted on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GlobalCommitterSnapshot {
    /// Received committables per (checkpoint, subtask), not yet acted on.
    pub pending: Vec<PendingCommittables>,
}

/// A completed checkpoint: everything needed to resume the job from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedCheckpoint {
    /// The checkpoint's id.
    pub checkpoint_id: CheckpointId,
    /// The job's name.
    pub job_name: String,
    /// The start of the job that took it.
    pub generation: Generation,
    /// The life of the job it belongs to, drawn at the fresh start and kept
    /// by every restore. `None` only in checkpoints of format 1, written
    /// before lineages existed: a restore from one draws a new lineage.
    pub lineage: Option<Lineage>,
    /// The job's parallelism when it was taken.
    pub parallelism: usize,
    /// Every subtask's part, by subtask index.
    pub subtasks: Vec<SubtaskSnapshot>,
    /// The global committer's part, when the job has one.
    pub global_committer: Option<GlobalCommitterSnapshot>,
    /// True for the final checkpoint: every subtask's input had ended, so a
    /// job resumed from it only commits what is pending and ends.
    pub is_final: bool,
    /// The job counters' totals as of this checkpoint
    /// ([`JobCounter`](crate::JobCounter)), by name: a restore starts them
    /// from here. Empty in checkpoints of formats 1 to 4.
    pub counters: BTreeMap<String, u64>,
}

/// A failure to store or read checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O operation on the storage failed.
    #[error("{context}: {source}{hint}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
        /// What the user can do, from the error's kind (may be empty).
        hint: &'static str,
    },
    /// A stored checkpoint cannot be read back.
    #[error(
        "checkpoint file {path} is unusable: {problem}. The job stops rather than resume from an older \
         checkpoint, which could write again output that was committed after it. Restore the file from a \
         backup; or, accepting that output committed after the previous checkpoint may be written twice, \
         move the file out of the state directory to resume from the previous checkpoint"
    )]
    Corrupt {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A local state directory's `GENERATION` cannot be read. It holds the
    /// number of the job's last start, which keeps the names the job writes
    /// from repeating; no start can take a new one until the file is set
    /// again above every generation in use
    /// ([`LocalCheckpointStorage::set_generation`](crate::LocalCheckpointStorage::set_generation),
    /// `sink-inspect --set-generation`). Never a reason to resume from an
    /// older checkpoint, unlike [`Corrupt`](Self::Corrupt).
    #[error(
        "the generation file {path} is damaged: {problem}. It holds the number of the job's last start, \
         which keeps the names the job writes (part files, uploads, transactions) from repeating, so no \
         start can take a new one until it is set again above every generation in use. The checkpoints \
         and the finished marker here record generations up to {highest_recorded}; starts after the \
         newest checkpoint may have used higher ones, and the destination may show them (an object store \
         output's .uploads/<lineage>/<generation>/ markers, a Delta table's owner transaction). Generations \
         only have to grow, so a wide margin is safe: `sink-inspect {} --set-generation {}` leaves room for \
         a million starts since the newest checkpoint. Do not delete the file: the next start would reuse \
         generation 1",
        .path.parent().unwrap_or(std::path::Path::new(".")).display(),
        .highest_recorded.saturating_add(1_000_000)
    )]
    DamagedGeneration {
        /// The `GENERATION` file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        problem: String,
        /// The highest generation the state directory still records (its
        /// readable checkpoints and finished marker), 0 for none.
        highest_recorded: u64,
    },
    /// Another live instance holds the state directory.
    #[error(
        "the state directory {path} is in use by another running instance of the job (its lock file is held); \
         stop that instance first, or give this one its own state directory"
    )]
    Locked {
        /// The state directory.
        path: std::path::PathBuf,
    },
    /// A request to an object store failed (after the client's own
    /// retries).
    #[error("{context}: {source}{hint}")]
    Remote {
        /// What was being done, with the object's URL.
        context: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// What the user can do, from the error (may be empty).
        hint: &'static str,
        /// Whether no retry can help (a missing bucket, refused
        /// credentials): the job is then not restarted.
        permanent: bool,
    },
    /// A newer instance of the job started on the same checkpoint storage:
    /// this one may no longer store checkpoints (nor, therefore, commit).
    /// Never restarted: a restart would take the storage back.
    #[error(
        "this instance (generation {generation}) was fenced off the checkpoint storage {location}: a newer \
         instance started there (generation {newer}), so this one stores no checkpoint and commits nothing \
         more, and stops. Run one instance of a job at a time; the newer one resumes from the last \
         checkpoint stored"
    )]
    Fenced {
        /// The storage.
        location: String,
        /// This instance's generation.
        generation: Generation,
        /// The generation of the instance that took over.
        newer: Generation,
    },
    /// Any other failure, in words that say what to do.
    #[error("{0}")]
    Message(String),
}

impl StorageError {
    /// Whether no retry or restart can help: a corrupt checkpoint, a state
    /// directory held by another instance, an instance fenced by a newer
    /// one, a missing bucket or refused credentials. The runtime stops the
    /// job on such an error, at once and without restarts, also when a
    /// checkpoint's store meets it.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            StorageError::Corrupt { .. }
                | StorageError::DamagedGeneration { .. }
                | StorageError::Locked { .. }
                | StorageError::Fenced { .. }
                | StorageError::Remote {
                    permanent: true,
                    ..
                }
        )
    }

    /// An I/O failure while doing `context`, with a hint chosen from the
    /// error's kind (a full disk, a read-only or missing directory).
    pub fn io(context: impl Into<String>, source: std::io::Error) -> StorageError {
        let hint = match source.kind() {
            std::io::ErrorKind::StorageFull => "; the disk is full: free space on it and start the job again",
            std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied => {
                "; the state directory must be writable by this process"
            }
            std::io::ErrorKind::NotFound => {
                "; the state directory or a file in it is missing: was it removed while the job ran?"
            }
            _ => "",
        };
        StorageError::Io {
            context: context.into(),
            source,
            hint,
        }
    }
}

/// Written when a job ended with everything committed, so that running it
/// again does not process its input a second time by accident.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedMarker {
    /// The generation that finished the job.
    pub generation: Generation,
    /// Its last completed checkpoint, if it took any.
    pub last_checkpoint: Option<CheckpointId>,
    /// What the job lost on its way (none in a marker of format 1 or 2,
    /// which did not keep it): a start that finds the job finished reports
    /// it again, so a run killed between the marker and its exit cannot
    /// hide a loss.
    pub lost: LostOutput,
}

/// The output a finished job lost: commits that failed with a known reason.
/// Kept in its [`FinishedMarker`] by the coordinator when the job ends, and
/// reported again by every later start that finds the job finished.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostOutput {
    /// Commits that failed with a known reason.
    pub commits_failed: u64,
    /// Records counted as lost with them.
    pub records_lost: u64,
    /// The failures with their reasons (the first
    /// [`MAX_KEPT_FAILURES`](crate::MAX_KEPT_FAILURES)).
    pub known_failures: Vec<KnownCommitFailure>,
}

/// Keeps completed checkpoints.
///
/// Called by the checkpoint coordinator only. At each start of the job (the
/// first, and every restart): [`begin`](Self::begin), then
/// [`finished`](Self::finished) and [`latest`](Self::latest). While it runs:
/// [`store`](Self::store) once per checkpoint whose every task acknowledged,
/// in increasing checkpoint order and never concurrently. When it ended with
/// everything committed: [`mark_finished`](Self::mark_finished).
///
/// # Guarantees an implementation must give
///
/// - When `store` returns `Ok`, the checkpoint survives whatever the storage
///   is meant to survive (the process for the memory storage; a crash of the
///   machine for durable storage), and `latest` returns it or a newer one.
/// - When `store` returns `Err` or is abandoned, `latest` returns either the
///   previous checkpoint or this one, complete: never a partial one.
/// - Older checkpoints are dropped only after a newer one is stored.
/// - `begin` returns a generation larger than any it returned before, and
///   remembers it as durably as the checkpoints.
/// - `latest` never falls back to an older checkpoint when the newest cannot
///   be read: it returns [`StorageError::Corrupt`].
/// - `lineage`, once it returned a lineage, returns that one at every later
///   call until `store` stores a checkpoint (or keeps none: the default); a
///   lineage a stored checkpoint carried is never returned again.
#[async_trait]
pub trait CheckpointStorage: Send + Sync + 'static {
    /// A job (re)starts on this storage: returns its new generation, one more
    /// than the last.
    async fn begin(&self) -> Result<Generation, StorageError>;

    /// Stores a completed checkpoint.
    async fn store(&self, checkpoint: CompletedCheckpoint) -> Result<(), StorageError>;

    /// The newest stored checkpoint, if any.
    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError>;

    /// Records that the job ended with everything committed.
    async fn mark_finished(&self, marker: FinishedMarker) -> Result<(), StorageError>;

    /// The finished marker, if the job ended before.
    async fn finished(&self) -> Result<Option<FinishedMarker>, StorageError>;

    /// The lineage of the starts on this storage that restore no checkpoint
    /// of a lineage: the one an earlier such start stored, else `fresh`,
    /// stored now. Called by the coordinator at such a start, after
    /// [`begin`](Self::begin) and before any task runs.
    ///
    /// Kept, a lineage lets a start find what earlier starts of the job left
    /// behind even when none of them stored a checkpoint (a job killed
    /// before its first): sinks clean up by lineage in their start hook. It
    /// is kept only while no checkpoint carries it: once one is stored the
    /// checkpoints keep it, and a start that finds none (they were removed)
    /// gets a new one, so a lineage's checkpoint ids never repeat. The
    /// project's storages keep it as durably as the generation and forget
    /// it when they start over. The default keeps nothing and returns
    /// `fresh`: every such start is then a new lineage, and what a start
    /// killed before its first checkpoint left is never recognised as the
    /// job's.
    async fn lineage(&self, fresh: Lineage) -> Result<Lineage, StorageError> {
        Ok(fresh)
    }

    /// [`StorageError::Fenced`] if a newer instance took this storage over
    /// since this instance's [`begin`](Self::begin), else `None`. Called by
    /// the runtime when a job fails for another reason: a newer instance's
    /// start is the likely cause (it aborts what older starts left, such as
    /// uploads in progress), and the job is then reported fenced, and not
    /// restarted. The default: never taken over (a storage that locks).
    async fn fenced(&self) -> Result<Option<StorageError>, StorageError> {
        Ok(None)
    }
}

/// Encodes a ledger's pending parts for a snapshot.
pub(crate) fn encode_pending<'a, C: 'a>(
    parts: impl Iterator<Item = &'a SubtaskPart<C>>,
    serializer: &dyn VersionedSerializer<C>,
) -> Result<Vec<PendingCommittables>, SerializerError> {
    parts
        .map(|part| {
            Ok(PendingCommittables {
                summary: part.summary,
                committables: part
                    .committables
                    .iter()
                    .map(|c| serialize_versioned(serializer, c))
                    .collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

/// Decodes pending parts stored by [`encode_pending`].
pub(crate) fn decode_pending<C>(
    pending: &[PendingCommittables],
    serializer: &dyn VersionedSerializer<C>,
) -> Result<Vec<SubtaskPart<C>>, SerializerError> {
    pending
        .iter()
        .map(|part| {
            Ok(SubtaskPart {
                summary: part.summary,
                committables: part
                    .committables
                    .iter()
                    .map(|blob| deserialize_versioned(serializer, blob))
                    .collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small checkpoint of one subtask, for the storages' tests.
    pub(crate) fn sample_checkpoint(id: u64) -> CompletedCheckpoint {
        CompletedCheckpoint {
            checkpoint_id: CheckpointId(id),
            job_name: "job".into(),
            generation: Generation(1),
            lineage: Some(sink_api::Lineage::new("lineage")),
            parallelism: 1,
            subtasks: vec![SubtaskSnapshot {
                subtask: 0,
                source_splits: StateBytes::from(vec![1, 2, 3]),
                writer_states: vec![vec![4]],
                pending: Vec::new(),
                end_of_input: false,
            }],
            global_committer: None,
            is_final: false,
            counters: BTreeMap::new(),
        }
    }

    /// [`sample_checkpoint`] with `chunks` after its splits' bytes.
    pub(crate) fn checkpoint_with_chunks(id: u64, chunks: &[Chunk]) -> CompletedCheckpoint {
        let mut checkpoint = sample_checkpoint(id);
        let splits = &mut checkpoint.subtasks[0].source_splits;
        for chunk in chunks {
            splits.push_chunk(chunk.clone());
        }
        checkpoint
    }

    /// The ids of the chunks of a checkpoint's first subtask.
    pub(crate) fn chunk_ids(checkpoint: &CompletedCheckpoint) -> Vec<ChunkId> {
        checkpoint.subtasks[0]
            .source_splits
            .chunks()
            .map(Chunk::id)
            .collect()
    }

    /// A subtask's snapshot as it was declared before its splits were a
    /// byte string.
    #[derive(Serialize)]
    struct PlainSnapshot {
        subtask: SubtaskIndex,
        source_splits: Vec<u8>,
        writer_states: Vec<Vec<u8>>,
        pending: Vec<PendingCommittables>,
        end_of_input: bool,
    }

    #[test]
    fn splits_as_a_byte_string_are_the_bytes_stored_before() {
        let splits: Vec<u8> = (0..=255).chain(0..=255).collect();
        let now = shared::SubtaskSnapshotWhole {
            subtask: 3,
            source_splits: splits.clone(),
            writer_states: vec![vec![7, 8]],
            pending: Vec::new(),
            end_of_input: true,
        };
        let before = PlainSnapshot {
            subtask: 3,
            source_splits: splits,
            writer_states: vec![vec![7, 8]],
            pending: Vec::new(),
            end_of_input: true,
        };
        let config = bincode::config::standard();
        assert_eq!(
            bincode::serde::encode_to_vec(&now, config).unwrap(),
            bincode::serde::encode_to_vec(&before, config).unwrap()
        );
    }
}
