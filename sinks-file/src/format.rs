//! The format of the file sink's committables and writer states in
//! checkpoints, and the older formats still read.
//!
//! | version | what changed |
//! |---|---|
//! | 1 | absolute paths (refused: a restore could not tell which directory they meant) |
//! | 2 | paths relative to the base directory, with the output's identity |
//! | 3 | object store outputs: a committable may name a multipart upload, an in-progress part its upload and tail |
//!
//! Version 2 blobs are read as version 3 values without an upload, so that
//! checkpoints taken before an upgrade resume after it.

use std::marker::PhantomData;
use std::path::PathBuf;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sink_api::{BincodeSerializer, SerializerError, VersionedSerializer};

use crate::state::{FileCommittable, InProgressState};
use crate::writer::FileWriterState;

/// The version written.
pub(crate) const FORMAT_VERSION: u32 = 3;

/// Writes version 3 of `T`, reads versions 2 and 3.
pub(crate) struct FileFormat<T>(PhantomData<fn() -> T>);

impl<T> FileFormat<T> {
    pub(crate) fn new() -> FileFormat<T> {
        FileFormat(PhantomData)
    }
}

/// A value with a version 2 form.
pub(crate) trait HasV2: Serialize + DeserializeOwned {
    /// Its version 2 form.
    type V2: Serialize + DeserializeOwned + Into<Self>;
}

impl<T: HasV2> VersionedSerializer<T> for FileFormat<T> {
    fn version(&self) -> u32 {
        FORMAT_VERSION
    }

    fn serialize(&self, value: &T) -> Result<Vec<u8>, SerializerError> {
        BincodeSerializer::<T>::new(FORMAT_VERSION).serialize(value)
    }

    fn deserialize(&self, version: u32, bytes: &[u8]) -> Result<T, SerializerError> {
        match version {
            2 => BincodeSerializer::<T::V2>::new(2)
                .deserialize(2, bytes)
                .map(Into::into),
            _ => BincodeSerializer::<T>::new(FORMAT_VERSION).deserialize(version, bytes),
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
        }
    }
}

impl HasV2 for FileCommittable {
    type V2 = CommittableV2;
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

impl HasV2 for FileWriterState {
    type V2 = WriterStateV2;
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
            .deserialize(3, &format.serialize(&read).unwrap())
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
}
