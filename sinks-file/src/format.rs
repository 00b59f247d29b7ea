//! The format of the file sink's committables and writer states in
//! checkpoints, and the older formats still read.
//!
//! | version | what changed |
//! |---|---|
//! | 1 | absolute paths (refused: a restore could not tell which directory they meant) |
//! | 2 | paths relative to the base directory, with the output's identity |
//! | 3 | object store outputs: a committable may name a multipart upload, an in-progress part its upload and tail |
//! | 4 | committables only: the position group a committable belongs to (`positions`), with a source whose positions are committed with the data |
//!
//! Committables are written in version 4 and writer states in version 3
//! (which version 4 left as it was). Older blobs are read as the current
//! values without what they lacked (no upload, no position group), so that
//! checkpoints taken before an upgrade resume after it.

use std::marker::PhantomData;
use std::path::PathBuf;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sink_api::{BincodeSerializer, SerializerError, VersionedSerializer};

use crate::state::{FileCommittable, InProgressState, Upload};
use crate::writer::FileWriterState;

/// Writes the current version of `T`, reads the older ones it knows.
pub(crate) struct FileFormat<T>(PhantomData<fn() -> T>);

impl<T> FileFormat<T> {
    pub(crate) fn new() -> FileFormat<T> {
        FileFormat(PhantomData)
    }
}

/// A value stored in checkpoints, with its versions.
pub(crate) trait Stored: Serialize + DeserializeOwned {
    /// The version written.
    const VERSION: u32;

    /// Decodes `bytes` of `version`, older than [`VERSION`](Self::VERSION).
    fn read_older(version: u32, bytes: &[u8]) -> Result<Self, SerializerError>;
}

impl<T: Stored> VersionedSerializer<T> for FileFormat<T> {
    fn version(&self) -> u32 {
        T::VERSION
    }

    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerializerError> {
        BincodeSerializer::<T>::new(T::VERSION).serialize(value)
    }

    /// Straight into `out`: a writer state holds the tails of its uploads,
    /// up to a part each.
    fn serialize_into(&self, value: &T, out: &mut Vec<u8>) -> Result<(), SerializerError> {
        BincodeSerializer::<T>::new(T::VERSION).serialize_into(value, out)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<T, SerializerError> {
        match version < T::VERSION {
            true => T::read_older(version, bytes),
            false => BincodeSerializer::<T>::new(T::VERSION).deserialize(version, bytes),
        }
    }
}

/// Decodes `bytes` as version `version` of `Old`, made a `T`.
fn read_as<Old: DeserializeOwned + Serialize + Into<T>, T>(
    version: u32,
    bytes: &[u8],
) -> Result<T, SerializerError> {
    BincodeSerializer::<Old>::new(version)
        .deserialize(version, bytes)
        .map(Into::into)
}

/// The refusal of `version`, which no build of this sink reads.
fn unsupported<T: Stored>(version: u32, bytes: &[u8]) -> Result<T, SerializerError> {
    // Refuses it with `UnsupportedVersion`, naming the version read.
    BincodeSerializer::<T>::new(T::VERSION).deserialize(version, bytes)
}

impl Stored for FileCommittable {
    const VERSION: u32 = 4;

    fn read_older(version: u32, bytes: &[u8]) -> Result<FileCommittable, SerializerError> {
        match version {
            2 => read_as::<CommittableV2, _>(2, bytes),
            3 => read_as::<CommittableV3, _>(3, bytes),
            _ => unsupported(version, bytes),
        }
    }
}

impl Stored for FileWriterState {
    const VERSION: u32 = 3;

    fn read_older(version: u32, bytes: &[u8]) -> Result<FileWriterState, SerializerError> {
        match version {
            2 => read_as::<WriterStateV2, _>(2, bytes),
            _ => unsupported(version, bytes),
        }
    }
}

/// A committable of version 2.
#[derive(Serialize, Deserialize)]
pub(crate) struct CommittableV2 {
    output_id: String,
    output_dir: PathBuf,
    pending: PathBuf,
    target: PathBuf,
    size_bytes: u64,
    records: u64,
}

impl From<CommittableV2> for FileCommittable {
    fn from(old: CommittableV2) -> FileCommittable {
        FileCommittable {
            output_id: old.output_id,
            output_dir: old.output_dir,
            pending: old.pending,
            target: old.target,
            size_bytes: old.size_bytes,
            records: old.records,
            upload: None,
            positions: None,
        }
    }
}

/// A committable of version 3: before position groups.
#[derive(Serialize, Deserialize)]
pub(crate) struct CommittableV3 {
    output_id: String,
    output_dir: PathBuf,
    pending: PathBuf,
    target: PathBuf,
    size_bytes: u64,
    records: u64,
    upload: Option<Upload>,
}

impl From<CommittableV3> for FileCommittable {
    fn from(old: CommittableV3) -> FileCommittable {
        FileCommittable {
            output_id: old.output_id,
            output_dir: old.output_dir,
            pending: old.pending,
            target: old.target,
            size_bytes: old.size_bytes,
            records: old.records,
            upload: old.upload,
            positions: None,
        }
    }
}

/// A writer state of version 2.
#[derive(Serialize, Deserialize)]
pub(crate) struct WriterStateV2 {
    output_id: String,
    output_dir: PathBuf,
    in_progress: Vec<InProgressV2>,
}

#[derive(Serialize, Deserialize)]
struct InProgressV2 {
    path: PathBuf,
    target: PathBuf,
    length: u64,
    records: u64,
}

impl From<WriterStateV2> for FileWriterState {
    fn from(old: WriterStateV2) -> FileWriterState {
        FileWriterState {
            output_id: old.output_id,
            output_dir: old.output_dir,
            in_progress: old
                .in_progress
                .into_iter()
                .map(|part| InProgressState {
                    path: part.path,
                    target: part.target,
                    length: part.length,
                    records: part.records,
                    upload: None,
                    tail: Vec::new(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_2_blobs_are_read_without_uploads_and_version_1_is_refused() {
        let old = CommittableV2 {
            output_id: "id".into(),
            output_dir: "/out".into(),
            pending: ".part-w-0.inprogress.l".into(),
            target: "part-w-0".into(),
            size_bytes: 7,
            records: 1,
        };
        let bytes = BincodeSerializer::<CommittableV2>::new(2)
            .serialize(&old)
            .unwrap();
        let format = FileFormat::<FileCommittable>::new();
        let read = format.deserialize(2, &bytes).unwrap();
        assert_eq!((read.size_bytes, &read.upload), (7, &None));
        let again = format
            .deserialize(4, &format.serialize(&read).unwrap())
            .unwrap();
        assert_eq!(again, read);
        assert!(matches!(
            format.deserialize(1, &bytes),
            Err(SerializerError::UnsupportedVersion { found: 1, .. })
        ));
        let state = WriterStateV2 {
            output_id: "id".into(),
            output_dir: "/out".into(),
            in_progress: vec![InProgressV2 {
                path: ".p".into(),
                target: "p".into(),
                length: 3,
                records: 1,
            }],
        };
        let bytes = BincodeSerializer::<WriterStateV2>::new(2)
            .serialize(&state)
            .unwrap();
        let read = FileFormat::<FileWriterState>::new()
            .deserialize(2, &bytes)
            .unwrap();
        assert_eq!(read.in_progress[0].length, 3);
        assert!(read.in_progress[0].upload.is_none());
    }

    #[test]
    fn version_3_committables_are_read_without_a_group_and_version_4_keeps_it() {
        let old = CommittableV3 {
            output_id: "id".into(),
            output_dir: "/out".into(),
            pending: ".part-w-0.inprogress.l".into(),
            target: "part-w-0".into(),
            size_bytes: 7,
            records: 1,
            upload: None,
        };
        let bytes = BincodeSerializer::<CommittableV3>::new(3)
            .serialize(&old)
            .unwrap();
        let format = FileFormat::<FileCommittable>::new();
        assert_eq!(format.version(), 4);
        let mut read = format.deserialize(3, &bytes).unwrap();
        assert_eq!((read.size_bytes, &read.positions), (7, &None));
        read.positions = Some(crate::position_group::PositionMember {
            group: crate::position_group::PositionGroupId {
                writer: "job-l-g1-s0".into(),
                number: 2,
                checkpoint: 5,
            },
            members: 1,
            advances: vec![sink_api::PositionAdvance {
                key: sink_api::SplitKey::new("scope", "p0"),
                from: Some(3),
                to: 9,
            }],
        });
        let again = format
            .deserialize(4, &format.serialize(&read).unwrap())
            .unwrap();
        assert_eq!(again, read);
        // A version 4 blob is not a version 3 one, and no later version is read.
        assert!(format
            .deserialize(3, &format.serialize(&read).unwrap())
            .is_err());
        assert!(matches!(
            format.deserialize(5, &bytes),
            Err(SerializerError::UnsupportedVersion {
                found: 5,
                supported: 4,
                ..
            })
        ));
        // Writer states stay at version 3.
        let states = FileFormat::<FileWriterState>::new();
        assert_eq!(states.version(), 3);
        assert!(matches!(
            states.deserialize(4, &bytes),
            Err(SerializerError::UnsupportedVersion {
                found: 4,
                supported: 3,
                ..
            })
        ));
    }
}
