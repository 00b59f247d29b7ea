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

mod memory;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{
    deserialize_versioned, serialize_versioned, CheckpointId, Generation, SerializerError,
    SubtaskIndex, VersionedSerializer,
};

use crate::core::ledger::{CommittableSummary, SubtaskPart};

pub use memory::MemoryCheckpointStorage;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskSnapshot {
    /// The subtask.
    pub subtask: SubtaskIndex,
    /// What its source reader has left to read: a versioned blob of the
    /// source's splits.
    pub source_splits: Vec<u8>,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedCheckpoint {
    /// The checkpoint's id.
    pub checkpoint_id: CheckpointId,
    /// The job's name.
    pub job_name: String,
    /// The start of the job that took it.
    pub generation: Generation,
    /// The job's parallelism when it was taken.
    pub parallelism: usize,
    /// Every subtask's part, by subtask index.
    pub subtasks: Vec<SubtaskSnapshot>,
    /// The global committer's part, when the job has one.
    pub global_committer: Option<GlobalCommitterSnapshot>,
    /// True for the final checkpoint: every subtask's input had ended, so a
    /// job resumed from it only commits what is pending and ends.
    pub is_final: bool,
}

/// A failure to store or read checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O operation on the storage failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Any other failure, in words that say what to do.
    #[error("{0}")]
    Message(String),
}

/// Keeps completed checkpoints.
///
/// Called by the checkpoint coordinator only: [`store`](Self::store) once per
/// checkpoint whose every task acknowledged, in increasing checkpoint order
/// and never concurrently; [`latest`](Self::latest) when a job starts.
///
/// # Guarantees an implementation must give
///
/// - When `store` returns `Ok`, the checkpoint survives whatever the storage
///   is meant to survive (the process for the memory storage; a crash of the
///   machine for durable storage), and `latest` returns it or a newer one.
/// - When `store` returns `Err` or is abandoned, `latest` returns either the
///   previous checkpoint or this one, complete: never a partial one.
/// - Older checkpoints are dropped only after a newer one is stored.
#[async_trait]
pub trait CheckpointStorage: Send + Sync + 'static {
    /// Stores a completed checkpoint.
    async fn store(&self, checkpoint: &CompletedCheckpoint) -> Result<(), StorageError>;

    /// The newest stored checkpoint, if any.
    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError>;
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
