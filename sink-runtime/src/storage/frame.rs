//! The envelope every stored state file or object is framed in, whatever
//! the storage: a marker, the kind of content, a format version, the
//! payload's length and its checksum.
//!
//! ```text
//! +----------+------+----------+----------------+-------------------+---------------+---------+
//! | "EOSINK" | kind | reserved | version: u32le | payload len: u64le | crc32c: u32le | payload |
//! +----------+------+----------+----------------+-------------------+---------------+---------+
//! ```
//!
//! A frame that is truncated, padded, of another kind, of an unknown version
//! or whose checksum does not match is refused with
//! [`StorageError::Corrupt`] naming where it was read from; the storages
//! never fall back to an older state when the newest cannot be read.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sink_api::{
    encode_bincode_into, BincodeSerializer, CheckpointId, Generation, Lineage, SerializerError,
    VersionedSerializer, MAX_DECODED_PAYLOAD,
};

use super::shared::{CompletedCheckpointWhole, StoredCheckpoint, StoredCheckpointV4};
use super::{FinishedMarker, GlobalCommitterSnapshot, LostOutput, StorageError};

const MAGIC: &[u8; 6] = b"EOSINK";
/// The version of the frame and of the payloads this build writes: 2 since
/// checkpoints carry the job's lineage, 3 since the finished marker keeps
/// what the job lost, 4 since checkpoints store sealed chunks once and
/// name them in later checkpoints (the `shared` module), 5 since
/// checkpoints keep the job counters' totals.
pub(super) const FORMAT_VERSION: u32 = 5;
/// The oldest version this build reads (format 1: checkpoints without a
/// lineage; `tests/data/checkpoints/v1` holds files of it).
const OLDEST_READ_VERSION: u32 = 1;
pub(super) const HEADER_LEN: usize = 6 + 1 + 1 + 4 + 8 + 4;
/// The largest frame this build reads: a header and a payload of at most
/// [`MAX_DECODED_PAYLOAD`] (which the serializer already refuses to write
/// past). A larger state file or object is refused before it is read.
pub(super) const MAX_FRAME_LEN: u64 = (HEADER_LEN + MAX_DECODED_PAYLOAD) as u64;

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// A [`CompletedCheckpoint`].
    Checkpoint = 1,
    /// The last generation started (a local state directory's `GENERATION`).
    Generation = 2,
    /// A [`FinishedMarker`] (a local state directory's `FINISHED`).
    Finished = 3,
    /// The head object of checkpoint storage on an object store: the
    /// claimed generation, the retained checkpoints, the finished marker.
    /// (Its number is kept in builds without object storage: kinds are never
    /// reused.)
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    Head = 4,
    /// The lineage of the starts that restore no checkpoint (a local state
    /// directory's `LINEAGE`, an object store's `LINEAGE` object).
    Lineage = 5,
}

/// Encodes `value` into a frame of kind `kind`, in this build's format.
pub(super) fn encode<T: Serialize + DeserializeOwned>(
    kind: Kind,
    value: &T,
    what: &str,
) -> Result<Vec<u8>, StorageError> {
    frame_with(kind, FORMAT_VERSION, |frame| {
        BincodeSerializer::<T>::new(FORMAT_VERSION).serialize_into(value, frame)
    })
    .map_err(|e| StorageError::Message(format!("encoding {what}: {e}")))
}

/// Encodes `value`, which is only ever written (its stored form is read
/// as another type), into a frame of kind `kind`, in this build's format.
pub(super) fn encode_written<T: Serialize>(
    kind: Kind,
    value: &T,
    what: &str,
) -> Result<Vec<u8>, StorageError> {
    frame_with(kind, FORMAT_VERSION, |frame| {
        encode_bincode_into(value, frame).map(|_| ())
    })
    .map_err(|e| StorageError::Message(format!("encoding {what}: {e}")))
}

/// A frame of format `version` around `value`, as an older build wrote it:
/// for tests that read the older formats.
#[cfg(test)]
pub(super) fn encode_as<T: Serialize + DeserializeOwned>(
    kind: Kind,
    value: &T,
    version: u32,
) -> Vec<u8> {
    frame_with(kind, version, |frame| {
        BincodeSerializer::<T>::new(version).serialize_into(value, frame)
    })
    .expect("a test value encodes")
}

/// A frame of kind `kind` and format `version` whose payload `payload`
/// appends: the header, then the payload, in one buffer (a checkpoint of
/// many megabytes is not copied into its frame); the payload's length and
/// checksum are filled in once it is written.
fn frame_with(
    kind: Kind,
    version: u32,
    payload: impl FnOnce(&mut Vec<u8>) -> Result<(), SerializerError>,
) -> Result<Vec<u8>, SerializerError> {
    let mut frame = Vec::with_capacity(HEADER_LEN);
    frame.extend_from_slice(MAGIC);
    frame.push(kind as u8);
    frame.push(0);
    frame.extend_from_slice(&version.to_le_bytes());
    frame.resize(HEADER_LEN, 0);
    payload(&mut frame)?;
    let len = (frame.len() - HEADER_LEN) as u64;
    let crc = crc32c::crc32c(&frame[HEADER_LEN..]);
    frame[HEADER_LEN - 12..HEADER_LEN - 4].copy_from_slice(&len.to_le_bytes());
    frame[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

/// Checks what can be checked of a frame of `size` bytes at `location`
/// before its payload is read: not larger than [`MAX_FRAME_LEN`], and, when
/// `header` (its first bytes) is whole, the marker, the kind, a known
/// version and a payload length that accounts for exactly `size`. The
/// storages call it before they read a state file's payload, so a damaged
/// or foreign file of any size costs a header's read, never its size in
/// memory.
pub(super) fn check_header(
    header: &[u8],
    size: u64,
    kind: Kind,
    location: &str,
) -> Result<(), StorageError> {
    let corrupt = |problem: String| StorageError::Corrupt {
        path: location.into(),
        problem,
    };
    if size > MAX_FRAME_LEN {
        return Err(corrupt(format!(
            "it is {size} bytes, more than the {MAX_FRAME_LEN} a state file may hold; \
             it was not read"
        )));
    }
    if size < HEADER_LEN as u64 || header.len() < HEADER_LEN {
        return Err(corrupt(format!(
            "it is truncated: {size} bytes, shorter than the {HEADER_LEN}-byte header"
        )));
    }
    if &header[..6] != MAGIC {
        return Err(corrupt(
            "it does not start with the state file marker \"EOSINK\"".into(),
        ));
    }
    if header[6] != kind as u8 {
        return Err(corrupt(format!(
            "it holds data of kind {}, expected {}",
            header[6], kind as u8
        )));
    }
    let version = le_u32(header, 8);
    if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(corrupt(format!(
            "its format version {version} is unknown to this build, which reads versions \
             {OLDEST_READ_VERSION} to {FORMAT_VERSION}; run the build that wrote it, or a newer one"
        )));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&header[12..20]);
    let length = u64::from_le_bytes(length);
    let holds = size - HEADER_LEN as u64;
    if length != holds {
        return Err(corrupt(format!(
            "it is truncated or padded: the header announces {length} bytes of payload, the file holds {holds}"
        )));
    }
    Ok(())
}

/// The little-endian `u32` at `at` in a whole header.
fn le_u32(header: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
}

/// Checks the frame `bytes`, read from `location` (named in errors), and
/// decodes its payload.
pub(super) fn decode<T: Framed>(
    bytes: &[u8],
    kind: Kind,
    location: &str,
) -> Result<T, StorageError> {
    check_header(bytes, bytes.len() as u64, kind, location)?;
    let (header, payload) = bytes.split_at(HEADER_LEN);
    let expected = le_u32(header, 20);
    let actual = crc32c::crc32c(payload);
    if expected != actual {
        return Err(StorageError::Corrupt {
            path: location.into(),
            problem: format!(
                "its checksum does not match (stored {expected:#010x}, computed {actual:#010x})"
            ),
        });
    }
    let version = le_u32(header, 8);
    T::decode(version, payload).map_err(|e| StorageError::Corrupt {
        path: location.into(),
        problem: format!("its payload does not decode: {e}"),
    })
}

/// Decodes a checkpoint frame read from `location` and checks that it is
/// checkpoint `id`, as its name says. Its chunk references are the
/// storage's to resolve.
pub(super) fn decode_checkpoint(
    bytes: &[u8],
    id: CheckpointId,
    location: &str,
) -> Result<StoredCheckpoint, StorageError> {
    let checkpoint: StoredCheckpoint = decode(bytes, Kind::Checkpoint, location)?;
    if checkpoint.checkpoint_id() != id {
        return Err(StorageError::Corrupt {
            path: location.into(),
            problem: format!(
                "its name says checkpoint {id}, its content checkpoint {}",
                checkpoint.checkpoint_id()
            ),
        });
    }
    Ok(checkpoint)
}

/// A value kept in a frame, read in every format version this build knows.
/// The default reads the same payload in every version.
pub(super) trait Framed: DeserializeOwned {
    fn decode(version: u32, payload: &[u8]) -> Result<Self, SerializerError>;
}

/// The payload read the same way in every version.
fn same_in_every_version<T: Serialize + DeserializeOwned>(
    version: u32,
    payload: &[u8],
) -> Result<T, SerializerError> {
    BincodeSerializer::<T>::new(version).deserialize(version, payload)
}

impl Framed for u64 {
    fn decode(version: u32, payload: &[u8]) -> Result<Self, SerializerError> {
        same_in_every_version(version, payload)
    }
}

impl Framed for FinishedMarker {
    fn decode(version: u32, payload: &[u8]) -> Result<Self, SerializerError> {
        match version {
            1 | 2 => BincodeSerializer::<FinishedMarkerV2>::new(version)
                .deserialize(version, payload)
                .map(FinishedMarker::from),
            _ => same_in_every_version(version, payload),
        }
    }
}

/// A finished marker of formats 1 and 2: without what the job lost.
#[derive(Serialize, Deserialize)]
pub(super) struct FinishedMarkerV2 {
    generation: Generation,
    last_checkpoint: Option<CheckpointId>,
}

impl FinishedMarkerV2 {
    /// A marker of format 2, for tests of the formats that embed one.
    #[cfg(test)]
    pub(super) fn new(
        generation: Generation,
        last_checkpoint: Option<CheckpointId>,
    ) -> FinishedMarkerV2 {
        FinishedMarkerV2 {
            generation,
            last_checkpoint,
        }
    }
}

impl From<FinishedMarkerV2> for FinishedMarker {
    fn from(old: FinishedMarkerV2) -> FinishedMarker {
        FinishedMarker {
            generation: old.generation,
            last_checkpoint: old.last_checkpoint,
            lost: LostOutput::default(),
        }
    }
}

impl Framed for Lineage {
    fn decode(version: u32, payload: &[u8]) -> Result<Self, SerializerError> {
        same_in_every_version(version, payload)
    }
}

impl Framed for StoredCheckpoint {
    fn decode(version: u32, payload: &[u8]) -> Result<Self, SerializerError> {
        match version {
            1 => decode_read_only::<CheckpointV1>(version, payload)
                .map(|old| StoredCheckpoint::whole(old.0, None)),
            2 | 3 => decode_read_only::<CheckpointV3>(version, payload).map(|old| {
                let lineage = old.lineage.clone();
                StoredCheckpoint::whole(old.checkpoint(), lineage)
            }),
            4 => decode_read_only::<StoredCheckpointV4>(version, payload).map(Into::into),
            _ => decode_read_only(version, payload),
        }
    }
}

/// Decodes a payload of `version` into a type that is only ever read (its
/// stored form is written as another type), bounded like every decode.
fn decode_read_only<T: DeserializeOwned>(
    version: u32,
    payload: &[u8],
) -> Result<T, SerializerError> {
    let what = std::any::type_name::<T>();
    let error = |message| SerializerError::Decode {
        what,
        version,
        message,
    };
    let (value, read) = sink_api::decode_bincode_bounded(payload).map_err(error)?;
    if read != payload.len() {
        return Err(error(format!(
            "{} trailing bytes after the value",
            payload.len() - read
        )));
    }
    Ok(value)
}

/// A checkpoint of format 1: without a lineage.
#[derive(Deserialize)]
#[serde(transparent)]
struct CheckpointV1(CompletedCheckpointWhole);

/// A checkpoint of formats 2 and 3: with a lineage, splits stored whole.
#[derive(Deserialize)]
struct CheckpointV3 {
    checkpoint_id: CheckpointId,
    job_name: String,
    generation: Generation,
    lineage: Option<Lineage>,
    parallelism: usize,
    subtasks: Vec<super::shared::SubtaskSnapshotWhole>,
    global_committer: Option<GlobalCommitterSnapshot>,
    is_final: bool,
}

impl CheckpointV3 {
    fn checkpoint(self) -> CompletedCheckpointWhole {
        CompletedCheckpointWhole {
            checkpoint_id: self.checkpoint_id,
            job_name: self.job_name,
            generation: self.generation,
            parallelism: self.parallelism,
            subtasks: self.subtasks,
            global_committer: self.global_committer,
            is_final: self.is_final,
        }
    }
}
