//! What the file sink keeps in checkpoints about its parts: a pending part
//! waiting for its commit ([`FileCommittable`]), a part in progress at a
//! checkpoint ([`InProgressState`]), and, on an object store output, the
//! multipart upload that holds either ([`Upload`]). Made by the part files
//! and the uploads, read back by the committer and by a restored writer;
//! their stored formats are in the `format` module.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::position_group::PositionMember;

/// A complete, durable, hidden part file waiting to be made visible: what
/// the file writer's `prepare_commit` returns, the runtime keeps in
/// checkpoints until it is committed, and the file committer renames.
///
/// Its paths are relative to the sink's base directory and resolved against
/// the base directory of the committer that commits it, which must hold the
/// identity `output_id` (format version 4 of the sink's committable
/// serializer; versions 2 and 3 are read, version 1 held absolute paths and
/// is refused).
///
/// When the job's source commits its positions with the data, every
/// committable of one writer's checkpoint carries the same
/// [`PositionMember`]: the committer commits them as one group, with the
/// positions. A member whose `pending` is empty holds no file, only the
/// group's positions (the source moved without a record to write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCommittable {
    /// The identity (the `.file-sink-id` marker) of the output directory the
    /// file was written in.
    pub output_id: String,
    /// Where that output directory was when the file was written: for error
    /// messages only, never used to find the file.
    pub output_dir: PathBuf,
    /// The hidden file holding the data, relative to the base directory.
    pub pending: PathBuf,
    /// The visible name it is renamed to when committed, relative to the
    /// base directory.
    pub target: PathBuf,
    /// Its size in bytes, checked before the commit.
    pub size_bytes: u64,
    /// The records in it.
    pub records: u64,
    /// On an object store output: the multipart upload that holds the
    /// data, completed by the commit (`pending` is then the upload's marker,
    /// `target` the object's path under the prefix). `None` on a local
    /// output.
    pub upload: Option<Upload>,
    /// With a source whose positions are committed with the data: the
    /// group of committables this one is committed with, and the positions
    /// they advance. `None` otherwise.
    pub positions: Option<PositionMember>,
}

/// An in-progress part as recorded in a checkpoint, in a
/// [`FileWriterState`](crate::FileWriterState) (which carries the output
/// directory's identity). Paths are relative to the base directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InProgressState {
    /// The hidden file, relative to the base directory.
    pub path: PathBuf,
    /// Its visible name once committed, relative to the base directory.
    pub target: PathBuf,
    /// Its length when the checkpoint was taken.
    pub length: u64,
    /// The records in those bytes.
    pub records: u64,
    /// On an object store output: the multipart upload so far (`path` is
    /// then the upload's marker, `target` the object's path under the
    /// prefix). `None` on a local output.
    pub upload: Option<Upload>,
    /// On an object store output: the bytes written after the last
    /// uploaded part (less than a part), kept here rather than in a side
    /// object. Empty on a local output.
    #[serde(with = "serde_bytes")]
    pub tail: Vec<u8>,
}

/// A multipart upload as recorded in committables and writer states: the
/// upload's id and the parts uploaded, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Upload {
    /// The store's id of the multipart upload.
    pub upload_id: String,
    /// The parts uploaded so far, in order (part `i` was uploaded as index
    /// `i`).
    pub parts: Vec<UploadedPart>,
    /// For an upload resumed by a restored writer: the bytes of its last
    /// part (the checkpoint's tail), kept so that the committer can upload
    /// them again if that part was replaced meanwhile (by an older instance
    /// still running, which uploads its next part under the same number).
    /// Empty otherwise.
    #[serde(with = "serde_bytes")]
    pub last_part: Vec<u8>,
}

/// One uploaded part of a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct UploadedPart {
    /// What the store answered for it (S3: its ETag); completing the upload
    /// names every part by it.
    pub content_id: String,
    /// Its size in bytes.
    pub size_bytes: u64,
}
