//! State shared between checkpoints: bytes in pieces, some of them sealed
//! chunks that a storage writes once and later checkpoints reference.
//!
//! A checkpoint's state mostly repeats the one before: an idempotency-key
//! table gains the keys of one checkpoint and loses its oldest. Whoever
//! makes such state (a source's [`SplitCodec`](crate::source::SplitCodec))
//! seals what will not change into a [`Chunk`] and hands the state over as
//! [`StateBytes`]: inline pieces and chunks, which read one after the other
//! are the state's bytes. A storage writes a chunk once, in the first
//! checkpoint that holds it, and every later checkpoint that holds it again
//! names it by its [`ChunkId`] and that checkpoint: a checkpoint costs what
//! changed, not what it holds.
//!
//! # The stored form (format 4)
//!
//! A stored checkpoint (this module's [`StoredCheckpoint`]) is the
//! checkpoint with each subtask's splits as a list of pieces, each inline
//! bytes or a chunk reference `(holder, index)`, then the holders it names
//! and the chunks it stores first: `(chunk id, bytes)`. A holder is the
//! checkpoint that stored a chunk, `(checkpoint id, generation)`: the name
//! of its file or object; a reference names it by its place in the list of
//! holders, and the chunk by its place among that holder's chunks, so a
//! reference takes a few bytes whatever the ids. A storage keeps every checkpoint that holds a chunk a retained
//! checkpoint names ([`ChunkBook`]), and removes it once none does.
//! Formats 1 to 3 stored the splits whole, and are read as one inline
//! piece.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_bytes::{ByteBuf, Bytes};
use sink_api::{CheckpointId, Generation, Lineage, SubtaskIndex};

use super::{
    CompletedCheckpoint, GlobalCommitterSnapshot, PendingCommittables, StorageError,
    SubtaskSnapshot,
};

/// The name of a sealed [`Chunk`]: 128 random bits drawn when it is sealed,
/// so no two chunks share one, in any process or storage.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChunkId(u128);

impl ChunkId {
    /// A new id, never drawn before.
    fn draw() -> ChunkId {
        ChunkId(uuid::Uuid::new_v4().as_u128())
    }
}

impl fmt::Display for ChunkId {
    /// 32 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({self})")
    }
}

/// Immutable bytes of a checkpoint's state, written once by a storage and
/// named by later checkpoints that hold them again.
///
/// Sealed by a [`SplitCodec`](crate::source::SplitCodec) (the pipeline's
/// key table seals the keys of each checkpoint) and cheap to clone: clones
/// share the bytes. Two chunks with the same id hold the same bytes: a
/// chunk restored from a storage keeps the id it was stored under, so a
/// codec that hands it back to the storage costs nothing to store again.
#[derive(Clone)]
pub struct Chunk {
    id: ChunkId,
    bytes: Arc<[u8]>,
}

impl Chunk {
    /// Seals `bytes` under a new id.
    pub fn seal(bytes: Vec<u8>) -> Chunk {
        Chunk {
            id: ChunkId::draw(),
            bytes: bytes.into(),
        }
    }

    /// A chunk read back from a storage, under the id it was stored with.
    pub(crate) fn restored(id: ChunkId, bytes: Vec<u8>) -> Chunk {
        Chunk {
            id,
            bytes: bytes.into(),
        }
    }

    /// Its id.
    pub fn id(&self) -> ChunkId {
        self.id
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl PartialEq for Chunk {
    /// The same id: two chunks with one id hold the same bytes.
    fn eq(&self, other: &Chunk) -> bool {
        self.id == other.id
    }
}

impl Eq for Chunk {}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chunk({}, {} bytes)", self.id, self.bytes.len())
    }
}

/// One piece of [`StateBytes`].
#[derive(Debug, Clone)]
pub enum Piece {
    /// Bytes stored with the checkpoint itself.
    Inline(Vec<u8>),
    /// A sealed chunk, stored once for every checkpoint that holds it.
    Chunk(Chunk),
}

/// A checkpoint's stored state in pieces: read one after the other, they
/// are its bytes. Made by a [`SplitCodec`](crate::source::SplitCodec) at
/// every checkpoint, read back by it at a restore.
///
/// Equality compares the bytes, not how they are cut into pieces.
#[derive(Clone, Default)]
pub struct StateBytes {
    pieces: Vec<Piece>,
}

impl StateBytes {
    /// No bytes.
    pub fn new() -> StateBytes {
        StateBytes::default()
    }

    /// Appends `bytes` inline (to the last piece, when it is inline too).
    pub fn push_inline(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self.pieces.last_mut() {
            Some(Piece::Inline(last)) => last.extend_from_slice(bytes),
            _ => self.pieces.push(Piece::Inline(bytes.to_vec())),
        }
    }

    /// Appends a sealed chunk.
    pub fn push_chunk(&mut self, chunk: Chunk) {
        self.pieces.push(Piece::Chunk(chunk));
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The chunks among the pieces, in order.
    pub fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Chunk(chunk) => Some(chunk),
            Piece::Inline(_) => None,
        })
    }

    /// How many bytes the pieces hold in all.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(piece_len).sum()
    }

    /// Whether they hold none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many of those bytes are inline.
    pub fn inline_len(&self) -> usize {
        self.pieces
            .iter()
            .filter(|piece| matches!(piece, Piece::Inline(_)))
            .map(piece_len)
            .sum()
    }

    /// The bytes, in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.len());
        for piece in &self.pieces {
            bytes.extend_from_slice(piece_bytes(piece));
        }
        bytes
    }
}

fn piece_bytes(piece: &Piece) -> &[u8] {
    match piece {
        Piece::Inline(bytes) => bytes,
        Piece::Chunk(chunk) => chunk.bytes(),
    }
}

fn piece_len(piece: &Piece) -> usize {
    piece_bytes(piece).len()
}

impl From<Vec<u8>> for StateBytes {
    /// One inline piece.
    fn from(bytes: Vec<u8>) -> StateBytes {
        let mut state = StateBytes::new();
        if !bytes.is_empty() {
            state.pieces.push(Piece::Inline(bytes));
        }
        state
    }
}

impl PartialEq for StateBytes {
    fn eq(&self, other: &StateBytes) -> bool {
        self.len() == other.len()
            && self
                .pieces
                .iter()
                .flat_map(|p| piece_bytes(p).iter())
                .eq(other.pieces.iter().flat_map(|p| piece_bytes(p).iter()))
    }
}

impl Eq for StateBytes {}

impl fmt::Debug for StateBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StateBytes({} bytes, {} inline, {} chunks)",
            self.len(),
            self.inline_len(),
            self.chunks().count()
        )
    }
}

/// The checkpoint that stored a chunk first, which names its file or
/// object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub checkpoint: CheckpointId,
    pub generation: Generation,
}

/// Where a chunk is stored: the checkpoint that holds it, and its place
/// among that checkpoint's chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub holder: Holder,
    pub index: u32,
}

/// A piece as stored: a chunk is named by the place of its holder in the
/// checkpoint's list of holders, and its place among the holder's chunks.
#[derive(Debug, Deserialize)]
enum StoredPiece {
    Inline(ByteBuf),
    Chunk { holder: u32, index: u32 },
}

/// A piece to store (the same encoding as [`StoredPiece`]).
#[derive(Serialize)]
enum StoredPieceRef<'a> {
    Inline(&'a Bytes),
    Chunk { holder: u32, index: u32 },
}

#[derive(Debug, Deserialize)]
struct StoredSubtask {
    subtask: SubtaskIndex,
    source_splits: Vec<StoredPiece>,
    #[serde(deserialize_with = "byte_strings::deserialize")]
    writer_states: Vec<Vec<u8>>,
    pending: Vec<PendingCommittables>,
    end_of_input: bool,
}

#[derive(Serialize)]
struct StoredSubtaskRef<'a> {
    subtask: SubtaskIndex,
    source_splits: Vec<StoredPieceRef<'a>>,
    #[serde(serialize_with = "byte_strings::serialize")]
    writer_states: &'a Vec<Vec<u8>>,
    pending: &'a Vec<PendingCommittables>,
    end_of_input: bool,
}

/// Writer states as byte strings: in bincode the same bytes as a sequence
/// of `u8` (a length, then the bytes), written and read in one piece
/// rather than a byte at a time (a file sink's state holds its tails, up
/// to a part each).
mod byte_strings {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub(super) fn serialize<S: Serializer>(
        states: &&Vec<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(states.iter().map(|state| Bytes::new(state)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Vec<u8>>, D::Error> {
        let states = Vec::<ByteBuf>::deserialize(deserializer)?;
        Ok(states.into_iter().map(ByteBuf::into_vec).collect())
    }
}

#[derive(Debug, Deserialize)]
struct StoredChunk {
    id: ChunkId,
    bytes: ByteBuf,
}

#[derive(Serialize)]
struct StoredChunkRef<'a> {
    id: ChunkId,
    bytes: &'a Bytes,
}

/// A checkpoint as a storage reads it (format 5; format 4 is read into it
/// without counters, older formats with their splits inline too): its
/// pieces name chunks that other stored checkpoints may hold.
#[derive(Debug, Deserialize)]
pub(crate) struct StoredCheckpoint {
    checkpoint_id: CheckpointId,
    job_name: String,
    generation: Generation,
    lineage: Option<Lineage>,
    parallelism: usize,
    subtasks: Vec<StoredSubtask>,
    global_committer: Option<GlobalCommitterSnapshot>,
    is_final: bool,
    /// The checkpoints whose chunks the pieces name.
    holders: Vec<Holder>,
    /// The chunks this checkpoint stored first.
    chunks: Vec<StoredChunk>,
    /// The job counters' totals (format 5).
    counters: BTreeMap<String, u64>,
}

/// A checkpoint as format 4 stored it: without the job counters.
#[derive(Debug, Deserialize)]
pub(crate) struct StoredCheckpointV4 {
    checkpoint_id: CheckpointId,
    job_name: String,
    generation: Generation,
    lineage: Option<Lineage>,
    parallelism: usize,
    subtasks: Vec<StoredSubtask>,
    global_committer: Option<GlobalCommitterSnapshot>,
    is_final: bool,
    holders: Vec<Holder>,
    chunks: Vec<StoredChunk>,
}

impl From<StoredCheckpointV4> for StoredCheckpoint {
    fn from(old: StoredCheckpointV4) -> StoredCheckpoint {
        StoredCheckpoint {
            checkpoint_id: old.checkpoint_id,
            job_name: old.job_name,
            generation: old.generation,
            lineage: old.lineage,
            parallelism: old.parallelism,
            subtasks: old.subtasks,
            global_committer: old.global_committer,
            is_final: old.is_final,
            holders: old.holders,
            chunks: old.chunks,
            counters: BTreeMap::new(),
        }
    }
}

/// A checkpoint to store (the same encoding as [`StoredCheckpoint`]).
#[derive(Serialize)]
pub(crate) struct StoredCheckpointRef<'a> {
    checkpoint_id: CheckpointId,
    job_name: &'a str,
    generation: Generation,
    lineage: &'a Option<Lineage>,
    parallelism: usize,
    subtasks: Vec<StoredSubtaskRef<'a>>,
    global_committer: &'a Option<GlobalCommitterSnapshot>,
    is_final: bool,
    holders: Vec<Holder>,
    chunks: Vec<StoredChunkRef<'a>>,
    counters: &'a BTreeMap<String, u64>,
}

impl StoredCheckpointRef<'_> {
    /// What it names, stored as `this`: for [`ChunkBook::read`] once it is
    /// durable.
    pub(crate) fn references(&self, this: Holder) -> References {
        References::of_own(&self.holders, self.chunks.iter().map(|c| c.id), this)
    }
}

impl StoredCheckpoint {
    /// A checkpoint of format 1 to 3, whose splits are stored whole.
    pub(crate) fn whole(
        checkpoint: CompletedCheckpointWhole,
        lineage: Option<Lineage>,
    ) -> StoredCheckpoint {
        StoredCheckpoint {
            checkpoint_id: checkpoint.checkpoint_id,
            job_name: checkpoint.job_name,
            generation: checkpoint.generation,
            lineage,
            parallelism: checkpoint.parallelism,
            subtasks: (checkpoint.subtasks.into_iter())
                .map(|s| StoredSubtask {
                    subtask: s.subtask,
                    source_splits: vec![StoredPiece::Inline(ByteBuf::from(s.source_splits))],
                    writer_states: s.writer_states,
                    pending: s.pending,
                    end_of_input: s.end_of_input,
                })
                .collect(),
            global_committer: checkpoint.global_committer,
            is_final: checkpoint.is_final,
            holders: Vec::new(),
            chunks: Vec::new(),
            counters: BTreeMap::new(),
        }
    }

    /// Its id.
    pub(crate) fn checkpoint_id(&self) -> CheckpointId {
        self.checkpoint_id
    }

    /// The generation that stored it.
    pub(crate) fn generation(&self) -> Generation {
        self.generation
    }

    /// What it names: the holders, and the chunks it holds itself (for a
    /// read without the other holders'; [`resolve`](Self::resolve) gives
    /// every chunk's place).
    pub(crate) fn references(&self, this: Holder) -> References {
        References::of_own(&self.holders, self.chunks.iter().map(|c| c.id), this)
    }

    /// The holders it names other than itself, whose chunks
    /// [`resolve`](Self::resolve) needs.
    pub(crate) fn other_holders(&self, this: Holder) -> Vec<Holder> {
        (self.holders.iter().copied())
            .filter(|holder| *holder != this)
            .collect()
    }

    /// The chunks it stored first, in their order.
    pub(crate) fn into_chunks(self) -> Vec<Chunk> {
        (self.chunks.into_iter())
            .map(|c| Chunk::restored(c.id, c.bytes.into_vec()))
            .collect()
    }

    /// The checkpoint, its chunk references resolved, and what it names:
    /// `this` is where it is stored, `held` the chunks of each other
    /// holder it names ([`other_holders`](Self::other_holders)),
    /// `location` names it in errors.
    pub(crate) fn resolve(
        self,
        this: Holder,
        held: &HashMap<Holder, Vec<Chunk>>,
        location: &str,
    ) -> Result<(CompletedCheckpoint, References), StorageError> {
        let own: Vec<Chunk> = (self.chunks.into_iter())
            .map(|c| Chunk::restored(c.id, c.bytes.into_vec()))
            .collect();
        let corrupt = |problem: String| StorageError::Corrupt {
            path: location.into(),
            problem,
        };
        let mut references = References {
            holders: self.holders.iter().copied().collect(),
            chunks: Vec::new(),
        };
        let mut subtasks = Vec::with_capacity(self.subtasks.len());
        for stored in self.subtasks {
            let mut splits = StateBytes::new();
            for piece in stored.source_splits {
                match piece {
                    StoredPiece::Inline(bytes) => splits.push_inline(&bytes),
                    StoredPiece::Chunk { holder, index } => {
                        let holder = *self.holders.get(holder as usize).ok_or_else(|| {
                            corrupt(format!(
                                "a chunk reference names holder {holder} of its {}",
                                self.holders.len()
                            ))
                        })?;
                        let chunks = if holder == this {
                            Some(&own)
                        } else {
                            held.get(&holder)
                        };
                        let chunk =
                            chunks.and_then(|c| c.get(index as usize)).ok_or_else(|| {
                                corrupt(format!(
                                "it names chunk {index} of checkpoint {} (generation {}), which \
                                 that checkpoint does not hold or which is gone",
                                holder.checkpoint, holder.generation
                            ))
                            })?;
                        references.chunks.push((chunk.id, Place { holder, index }));
                        splits.push_chunk(chunk.clone());
                    }
                }
            }
            subtasks.push(SubtaskSnapshot {
                subtask: stored.subtask,
                source_splits: splits,
                writer_states: stored.writer_states,
                pending: stored.pending,
                end_of_input: stored.end_of_input,
            });
        }
        let checkpoint = CompletedCheckpoint {
            checkpoint_id: self.checkpoint_id,
            job_name: self.job_name,
            generation: self.generation,
            lineage: self.lineage,
            parallelism: self.parallelism,
            subtasks,
            global_committer: self.global_committer,
            is_final: self.is_final,
            counters: self.counters,
        };
        Ok((checkpoint, references))
    }
}

/// A checkpoint as formats 1 to 3 stored it (format 1 without the lineage,
/// which its reader passes apart): the splits one byte string.
#[derive(Debug, Deserialize)]
pub(crate) struct CompletedCheckpointWhole {
    pub checkpoint_id: CheckpointId,
    pub job_name: String,
    pub generation: Generation,
    pub parallelism: usize,
    pub subtasks: Vec<SubtaskSnapshotWhole>,
    pub global_committer: Option<GlobalCommitterSnapshot>,
    pub is_final: bool,
}

/// A subtask's part as formats 1 to 3 stored it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SubtaskSnapshotWhole {
    pub subtask: SubtaskIndex,
    #[serde(with = "serde_bytes")]
    pub source_splits: Vec<u8>,
    pub writer_states: Vec<Vec<u8>>,
    pub pending: Vec<PendingCommittables>,
    pub end_of_input: bool,
}

/// What a stored checkpoint names ([`StoredCheckpoint::references`]), for
/// [`ChunkBook::read`].
#[derive(Debug)]
pub(crate) struct References {
    holders: BTreeSet<Holder>,
    chunks: Vec<(ChunkId, Place)>,
}

impl References {
    /// A checkpoint stored as `this` that names `holders` and holds the
    /// chunks `own`, in their order.
    fn of_own(holders: &[Holder], own: impl Iterator<Item = ChunkId>, this: Holder) -> References {
        References {
            holders: holders.iter().copied().collect(),
            chunks: (own.enumerate())
                .map(|(index, id)| {
                    let place = Place {
                        holder: this,
                        index: index as u32,
                    };
                    (id, place)
                })
                .collect(),
        }
    }
}

/// What a storage knows of the chunks it stored or read: where each is
/// held, and which holders each retained checkpoint names. Kept by the
/// local and the object storage under their lock, one per storage.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChunkBook {
    /// Every chunk a kept checkpoint holds, and where.
    held_by: HashMap<ChunkId, Place>,
    /// The holders each known checkpoint names.
    holders_of: BTreeMap<Holder, BTreeSet<Holder>>,
}

/// The stored form of `checkpoint`, to be stored as `this`: the chunks it
/// holds that `held` places are named there, the others stored in it.
pub(crate) fn stored_form<'a>(
    checkpoint: &'a CompletedCheckpoint,
    this: Holder,
    held: &HashMap<ChunkId, Place>,
) -> StoredCheckpointRef<'a> {
    let mut new_chunks: Vec<StoredChunkRef<'a>> = Vec::new();
    let mut added: HashMap<ChunkId, u32> = HashMap::new();
    let mut holders: Vec<Holder> = Vec::new();
    let mut holder_index = |holder: Holder| -> u32 {
        match holders.iter().position(|h| *h == holder) {
            Some(at) => at as u32,
            None => {
                holders.push(holder);
                (holders.len() - 1) as u32
            }
        }
    };
    let subtasks = (checkpoint.subtasks.iter())
        .map(|s| StoredSubtaskRef {
            subtask: s.subtask,
            source_splits: (s.source_splits.pieces().iter())
                .map(|piece| match piece {
                    Piece::Inline(bytes) => StoredPieceRef::Inline(Bytes::new(bytes)),
                    Piece::Chunk(chunk) => {
                        let place = match held.get(&chunk.id) {
                            Some(place) => *place,
                            None => {
                                let index = *added.entry(chunk.id).or_insert_with(|| {
                                    new_chunks.push(StoredChunkRef {
                                        id: chunk.id,
                                        bytes: Bytes::new(chunk.bytes()),
                                    });
                                    (new_chunks.len() - 1) as u32
                                });
                                Place {
                                    holder: this,
                                    index,
                                }
                            }
                        };
                        StoredPieceRef::Chunk {
                            holder: holder_index(place.holder),
                            index: place.index,
                        }
                    }
                })
                .collect(),
            writer_states: &s.writer_states,
            pending: &s.pending,
            end_of_input: s.end_of_input,
        })
        .collect();
    StoredCheckpointRef {
        checkpoint_id: checkpoint.checkpoint_id,
        job_name: &checkpoint.job_name,
        generation: checkpoint.generation,
        lineage: &checkpoint.lineage,
        parallelism: checkpoint.parallelism,
        subtasks,
        global_committer: &checkpoint.global_committer,
        is_final: checkpoint.is_final,
        holders,
        chunks: new_chunks,
        counters: &checkpoint.counters,
    }
}

impl ChunkBook {
    /// Where the chunks of `checkpoint` that a kept checkpoint holds are,
    /// for [`stored_form`].
    pub(crate) fn held(&self, checkpoint: &CompletedCheckpoint) -> HashMap<ChunkId, Place> {
        (checkpoint.subtasks.iter())
            .flat_map(|s| s.source_splits.chunks())
            .filter_map(|chunk| Some((chunk.id, *self.held_by.get(&chunk.id)?)))
            .collect()
    }

    /// The checkpoint stored as `this`, which names `references`, is
    /// durable (stored or read back): the holders it names are kept while
    /// it is retained, and its chunks may be named where it says (a chunk
    /// known already stays where it was known: that holder is kept too).
    pub(crate) fn read(&mut self, this: Holder, references: References) {
        for (id, place) in references.chunks {
            self.held_by.entry(id).or_insert(place);
        }
        self.holders_of.insert(this, references.holders);
    }

    /// Whether the holders `checkpoint` names are known (it was stored or
    /// read by this storage).
    #[cfg_attr(not(any(test, feature = "object-store")), allow(dead_code))]
    pub(crate) fn knows(&self, checkpoint: Holder) -> bool {
        self.holders_of.contains_key(&checkpoint)
    }

    /// The checkpoints whose holders are known.
    pub(crate) fn known(&self) -> impl Iterator<Item = &Holder> {
        self.holders_of.keys()
    }

    /// The checkpoints to keep when `retained` are: those and every holder
    /// they name. Forgets everything else: the chunks of other holders are
    /// stored again if a later checkpoint holds them. `None`, forgetting
    /// nothing, when a retained checkpoint is not [known](Self::knows):
    /// what it names is unknown, so nothing may be removed.
    pub(crate) fn keep(&mut self, retained: &[Holder]) -> Option<BTreeSet<Holder>> {
        let mut keep: BTreeSet<Holder> = retained.iter().copied().collect();
        for checkpoint in retained {
            keep.extend(self.holders_of.get(checkpoint)?.iter().copied());
        }
        self.holders_of
            .retain(|checkpoint, _| retained.contains(checkpoint));
        self.held_by.retain(|_, place| keep.contains(&place.holder));
        Some(keep)
    }

    /// Forgets everything (the storage started over).
    pub(crate) fn clear(&mut self) {
        *self = ChunkBook::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(checkpoint: u64) -> Holder {
        Holder {
            checkpoint: CheckpointId(checkpoint),
            generation: Generation(1),
        }
    }

    fn checkpoint(id: u64, splits: StateBytes) -> CompletedCheckpoint {
        let mut checkpoint = super::super::tests::sample_checkpoint(id);
        checkpoint.subtasks[0].source_splits = splits;
        checkpoint
    }

    fn encode(stored: &StoredCheckpointRef<'_>) -> Vec<u8> {
        bincode::serde::encode_to_vec(stored, bincode::config::standard()).unwrap()
    }

    fn decode(bytes: &[u8]) -> StoredCheckpoint {
        sink_api::decode_bincode_bounded(bytes).unwrap().0
    }

    /// Writer states written as byte strings are the very bytes format 4
    /// wrote as sequences of numbers, and read back as they were.
    #[test]
    fn writer_states_as_byte_strings_keep_the_stored_bytes() {
        #[derive(Serialize)]
        struct AsBytes<'a> {
            #[serde(serialize_with = "byte_strings::serialize")]
            states: &'a Vec<Vec<u8>>,
        }
        #[derive(Serialize)]
        struct AsNumbers<'a> {
            states: &'a Vec<Vec<u8>>,
        }
        #[derive(Deserialize)]
        struct Read {
            #[serde(deserialize_with = "byte_strings::deserialize")]
            states: Vec<Vec<u8>>,
        }
        let states = vec![
            Vec::new(),
            vec![1, 2, 3],
            (0..=255).collect(),
            vec![7; 70_000],
        ];
        let config = bincode::config::standard();
        let as_bytes = bincode::serde::encode_to_vec(AsBytes { states: &states }, config).unwrap();
        let as_numbers =
            bincode::serde::encode_to_vec(AsNumbers { states: &states }, config).unwrap();
        assert_eq!(as_bytes, as_numbers);
        let read: Read = sink_api::decode_bincode_bounded(&as_numbers).unwrap().0;
        assert_eq!(read.states, states);
    }

    /// Stores `checkpoint` as `this` in `book`'s view: its bytes.
    fn store_in(book: &mut ChunkBook, checkpoint: &CompletedCheckpoint, this: Holder) -> Vec<u8> {
        let form = stored_form(checkpoint, this, &book.held(checkpoint));
        let bytes = encode(&form);
        book.read(this, form.references(this));
        bytes
    }

    fn holders_of(stored: &StoredCheckpoint) -> BTreeSet<Holder> {
        stored.holders.iter().copied().collect()
    }

    #[test]
    fn state_bytes_compare_their_bytes_however_cut() {
        let chunk = Chunk::seal(b"cd".to_vec());
        let mut cut = StateBytes::new();
        cut.push_inline(b"ab");
        cut.push_chunk(chunk.clone());
        cut.push_inline(b"e");
        cut.push_inline(b"f");
        assert_eq!(cut, StateBytes::from(b"abcdef".to_vec()));
        assert_ne!(cut, StateBytes::from(b"abcdeg".to_vec()));
        assert_eq!(
            cut.pieces().len(),
            3,
            "inline bytes join the last inline piece"
        );
        assert_eq!((cut.len(), cut.inline_len()), (6, 4));
        assert_eq!(
            cut.chunks().map(Chunk::id).collect::<Vec<_>>(),
            [chunk.id()]
        );
        assert_ne!(Chunk::seal(Vec::new()).id(), Chunk::seal(Vec::new()).id());
    }

    /// A chunk is stored in the first checkpoint that holds it; the next
    /// names it there, and reads back the same bytes under the same id.
    #[test]
    fn a_chunk_is_stored_once_and_named_by_later_checkpoints() {
        let old = Chunk::seal(vec![7; 1000]);
        let mut book = ChunkBook::default();
        let mut first_splits = StateBytes::from(b"head".to_vec());
        first_splits.push_chunk(old.clone());
        let first = checkpoint(1, first_splits);
        let first_bytes = store_in(&mut book, &first, holder(1));
        assert!(first_bytes.len() > 1000);

        let new = Chunk::seal(vec![8; 10]);
        let mut second_splits = StateBytes::from(b"head".to_vec());
        second_splits.push_chunk(old.clone());
        second_splits.push_chunk(new.clone());
        // A chunk twice in one checkpoint is stored once.
        second_splits.push_chunk(new.clone());
        let second = checkpoint(2, second_splits);
        let second_bytes = store_in(&mut book, &second, holder(2));
        assert!(second_bytes.len() < 200, "{}", second_bytes.len());

        let stored = decode(&second_bytes);
        assert_eq!(holders_of(&stored), [holder(1), holder(2)].into());
        assert_eq!(stored.other_holders(holder(2)), [holder(1)]);
        let held = HashMap::from([(holder(1), decode(&first_bytes).into_chunks())]);
        let (read, _) = stored.resolve(holder(2), &held, "here").unwrap();
        assert_eq!(read, second);
        let ids: Vec<ChunkId> = read.subtasks[0]
            .source_splits
            .chunks()
            .map(Chunk::id)
            .collect();
        assert_eq!(ids, [old.id(), new.id(), new.id()]);

        // Without its holder, it is corrupt, naming the holder.
        let error = decode(&second_bytes)
            .resolve(holder(2), &HashMap::new(), "here")
            .unwrap_err();
        assert!(
            error.to_string().contains("chunk 0 of checkpoint 1"),
            "{error}"
        );
    }

    /// Holders stay while a retained checkpoint names them; chunks of
    /// forgotten holders are stored again.
    #[test]
    fn holders_are_kept_while_a_retained_checkpoint_names_them() {
        let old = Chunk::seal(vec![1; 10]);
        let mut book = ChunkBook::default();
        let store = |book: &mut ChunkBook, id: u64, with_old: bool| {
            let mut splits = StateBytes::new();
            if with_old {
                splits.push_chunk(old.clone());
            }
            splits.push_chunk(Chunk::seal(vec![id as u8]));
            let checkpoint = checkpoint(id, splits);
            holders_of(&decode(&store_in(book, &checkpoint, holder(id))))
        };
        assert_eq!(store(&mut book, 1, true), [holder(1)].into());
        assert_eq!(store(&mut book, 2, true), [holder(1), holder(2)].into());
        assert_eq!(
            book.keep(&[holder(1), holder(2)]),
            Some([holder(1), holder(2)].into())
        );
        assert_eq!(store(&mut book, 3, false), [holder(3)].into());
        // Retained 2 and 3: 2 names checkpoint 1's chunk.
        let kept = book.keep(&[holder(2), holder(3)]);
        assert_eq!(kept, Some([holder(1), holder(2), holder(3)].into()));
        assert_eq!(store(&mut book, 4, true), [holder(1), holder(4)].into());
        assert_eq!(
            book.keep(&[holder(3), holder(4)]),
            Some([holder(1), holder(3), holder(4)].into())
        );
        assert_eq!(store(&mut book, 5, false), [holder(5)].into());
        assert_eq!(store(&mut book, 6, false), [holder(6)].into());
        // Neither 5 nor 6 names checkpoint 1: it goes, and `old` with it,
        // so the next checkpoint that holds it stores it again.
        assert_eq!(
            book.keep(&[holder(5), holder(6)]),
            Some([holder(5), holder(6)].into())
        );
        assert_eq!(store(&mut book, 7, true), [holder(7)].into());
        assert!(book.knows(holder(7)) && !book.knows(holder(1)));
        // A retained checkpoint whose references are unknown keeps all.
        assert_eq!(book.keep(&[holder(1), holder(7)]), None);
        assert!(book.knows(holder(7)));
    }
}
