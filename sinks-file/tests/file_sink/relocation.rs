//! A stopped job's output directory moved or copied, and a state that belongs
//! to another output directory: checkpoints refer to files relative to the
//! sink's base directory, and the base directory's identity marker decides
//! whether a state belongs to it.
//!
//! Each test stops a writer the way a killed process stops: a checkpoint
//! holds a committable not yet committed and an in-progress part, and more
//! was written after it. The checkpoint's blobs are encoded with the sink's
//! own serializers, as the runtime stores them.

use crate::common;

use std::path::{Path, PathBuf};

use common::{exactly_once_problem, visible_numbers};
use sink_api::{
    deserialize_versioned, serialize_versioned, BincodeSerializer, CheckpointId, CommitOutcome,
    CommitRequest, Committer, Generation, InitContext, SerializerError, Sink, SinkWriter,
};
use sinks_file::{FileCommittable, FileSink, FileWriterState, LineEncoder, RollingPolicy};

fn context(restored: Option<u64>) -> InitContext {
    InitContext::new(
        "files",
        sink_api::Lineage::new("test-lineage"),
        Generation(restored.map_or(1, |_| 2)),
        0,
        1,
    )
    .restored_from(restored.map(CheckpointId))
}

/// Parts roll at 100 bytes, never on time: records 0..50 give one closed
/// part (0..36, 98 bytes) and one in progress (36..50).
fn sink(dir: &Path) -> FileSink<u64, LineEncoder> {
    FileSink::builder(dir, LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(100),
            rollover_interval: None,
            inactivity_interval: None,
            roll_on_checkpoint: false,
        })
        .build()
        .expect("a valid sink")
}

/// What checkpoint 1 of a stopped job holds, as stored.
struct Stored {
    committables: Vec<Vec<u8>>,
    writer_states: Vec<Vec<u8>>,
}

/// Writes 0..50, takes checkpoint 1 (one committable, one in-progress part),
/// writes 50..60 after it, and stops without committing anything.
async fn stop_with_uncommitted_parts(dir: &Path) -> Stored {
    let sink = sink(dir);
    let mut writer = sink
        .create_writer(&context(None), Vec::new())
        .await
        .unwrap();
    writer.write_batch((0..50).collect()).await.unwrap();
    let committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    let states = writer.snapshot_state(CheckpointId(1)).await.unwrap();
    assert_eq!(committables.len(), 1, "one closed part");
    assert_eq!(states[0].in_progress.len(), 1, "one part in progress");
    writer.write_batch((50..60).collect()).await.unwrap();
    writer.flush(false).await.unwrap();
    drop(writer);
    let committable_serializer = sink.committable_serializer();
    let state_serializer = sink.writer_state_serializer();
    Stored {
        committables: committables
            .iter()
            .map(|c| serialize_versioned(committable_serializer.as_ref(), c).unwrap())
            .collect(),
        writer_states: states
            .iter()
            .map(|s| serialize_versioned(state_serializer.as_ref(), s).unwrap())
            .collect(),
    }
}

/// Resumes the stored checkpoint with a sink on `dir`, as a restarted job
/// would: a writer from the states, the checkpoint's committables committed,
/// then what the writer recovered committed with the next checkpoint.
async fn resume(dir: &Path, stored: &Stored) -> Result<Vec<CommitOutcome>, String> {
    let sink = sink(dir);
    let committables: Vec<FileCommittable> = stored
        .committables
        .iter()
        .map(|blob| deserialize_versioned(sink.committable_serializer().as_ref(), blob))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let states: Vec<FileWriterState> = stored
        .writer_states
        .iter()
        .map(|blob| deserialize_versioned(sink.writer_state_serializer().as_ref(), blob))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut writer = sink
        .create_writer(&context(Some(1)), states)
        .await
        .map_err(|e| e.to_string())?;
    let mut committer = sink
        .create_committer(&context(Some(1)))
        .await
        .map_err(|e| e.to_string())?;
    let mut outcomes = commit(&mut committer, committables).await?;
    let recovered = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .map_err(|e| e.to_string())?;
    outcomes.extend(commit(&mut committer, recovered).await?);
    Ok(outcomes)
}

async fn commit(
    committer: &mut impl Committer<Committable = FileCommittable>,
    committables: Vec<FileCommittable>,
) -> Result<Vec<CommitOutcome>, String> {
    let mut requests: Vec<_> = committables
        .into_iter()
        .map(|c| CommitRequest::new(c, CheckpointId(1), 0))
        .collect();
    committer
        .commit(&mut requests)
        .await
        .map_err(|e| e.to_string())?;
    Ok(requests.into_iter().map(|r| r.into_parts().1).collect())
}

/// Every file under `dir` (hidden ones too) with its size and content.
fn listing(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    found.sort();
    found
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test]
async fn a_moved_output_directory_resumes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (first, moved) = (dir.path().join("first"), dir.path().join("moved"));
    let stored = stop_with_uncommitted_parts(&first).await;
    std::fs::rename(&first, &moved).unwrap();

    let outcomes = resume(&moved, &stored)
        .await
        .expect("resumes in the new place");
    assert_eq!(outcomes, vec![CommitOutcome::Committed; 2], "{outcomes:?}");
    assert_eq!(
        exactly_once_problem(&visible_numbers(&moved), 50),
        None,
        "every record before the checkpoint, once"
    );
    assert!(!first.exists(), "nothing recreated in the old place");
}

#[tokio::test]
async fn a_copied_output_directory_commits_in_the_copy_and_leaves_the_original_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (original, copy) = (dir.path().join("original"), dir.path().join("copy"));
    let stored = stop_with_uncommitted_parts(&original).await;
    copy_dir(&original, &copy);
    let before = listing(&original);

    let outcomes = resume(&copy, &stored).await.expect("resumes in the copy");
    assert_eq!(outcomes, vec![CommitOutcome::Committed; 2], "{outcomes:?}");
    assert_eq!(exactly_once_problem(&visible_numbers(&copy), 50), None);
    assert_eq!(listing(&original), before, "the original is not touched");
    assert!(visible_numbers(&original).is_empty());
}

#[tokio::test]
async fn a_state_of_another_output_directory_is_refused_with_both_named() {
    let dir = tempfile::tempdir().unwrap();
    let (owner, other) = (dir.path().join("owner"), dir.path().join("other"));
    let stored = stop_with_uncommitted_parts(&owner).await;
    // Another job's output directory, with output of its own.
    stop_with_uncommitted_parts(&other).await;
    let owner_before = listing(&owner);
    let other_before = listing(&other);

    let error = resume(&other, &stored)
        .await
        .expect_err("a state of another output directory must be refused");
    for name in ["owner", "other"] {
        let path = dir.path().join(name).display().to_string();
        assert!(error.contains(&path), "names {path}: {error}");
    }
    assert!(error.contains(".file-sink-id"), "names the marker: {error}");
    assert_eq!(listing(&owner), owner_before, "nothing changed");
    assert_eq!(listing(&other), other_before, "nothing changed");

    // The committables alone (a committer whose writer was not restored, as
    // after a rescale) are refused too.
    let sink = sink(&other);
    sink.create_writer(&context(None), Vec::new())
        .await
        .expect("a fresh writer in its own directory");
    let committables: Vec<FileCommittable> = stored
        .committables
        .iter()
        .map(|blob| deserialize_versioned(sink.committable_serializer().as_ref(), blob).unwrap())
        .collect();
    let mut committer = sink.create_committer(&context(Some(1))).await.unwrap();
    let error = commit(&mut committer, committables)
        .await
        .expect_err("a committable of another output directory must be refused");
    assert!(
        error.contains(&owner.display().to_string())
            && error.contains(&other.display().to_string()),
        "{error}"
    );
    assert_eq!(listing(&owner), owner_before, "nothing committed");

    // An output directory without a marker (emptied, or the wrong path) is
    // refused as well, before anything is created in it.
    let empty = dir.path().join("empty");
    let error = resume(&empty, &stored)
        .await
        .expect_err("a state used with an empty output directory must be refused");
    assert!(error.contains(&empty.display().to_string()), "{error}");
    assert!(visible_numbers(&empty).is_empty());
}

/// The layout of a committable before relative paths: absolute paths, no
/// identity. A blob of it must not be read as a current committable.
#[derive(serde::Serialize, serde::Deserialize)]
struct CommittableV1 {
    pending: PathBuf,
    target: PathBuf,
    size_bytes: u64,
    records: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WriterStateV1 {
    in_progress: Vec<CommittableV1>,
}

#[test]
fn a_blob_of_the_old_format_is_refused_not_misread() {
    let sink = sink(Path::new("/nonexistent/out"));
    let old = CommittableV1 {
        pending: "/old/out/.part-x-0.inprogress.y".into(),
        target: "/old/out/part-x-0".into(),
        size_bytes: 10,
        records: 5,
    };
    let blob = serialize_versioned(&BincodeSerializer::new(1), &old).unwrap();
    let error = deserialize_versioned(sink.committable_serializer().as_ref(), &blob)
        .expect_err("an old committable must not decode");
    assert!(
        matches!(error, SerializerError::UnsupportedVersion { found: 1, .. }),
        "{error}"
    );
    let state = WriterStateV1 {
        in_progress: vec![old],
    };
    let blob = serialize_versioned(&BincodeSerializer::new(1), &state).unwrap();
    let error = deserialize_versioned(sink.writer_state_serializer().as_ref(), &blob)
        .expect_err("an old writer state must not decode");
    assert!(
        matches!(error, SerializerError::UnsupportedVersion { found: 1, .. }),
        "{error}"
    );
}
