//! What the file committer checks before it makes a pending file visible:
//! its size against the size recorded in the committable. A pending file
//! changed by something else than the sink (truncated: a torn last record;
//! appended to: a duplicate) is never committed; the request is settled as a
//! known failure naming the file, and its records are counted as lost.

use crate::common;

use std::io::Write;
use std::path::Path;

use common::visible_files;
use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Sink,
    SinkWriter,
};
use sinks_file::{FileCommittable, FileSink, LineEncoder, RollingPolicy};

fn context() -> InitContext {
    InitContext::new(
        "files",
        sink_api::Lineage::new("test-lineage"),
        Generation(1),
        0,
        1,
    )
}

fn sink(dir: &Path) -> FileSink<u64, LineEncoder> {
    FileSink::builder(dir, LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .part_suffix(".txt")
        .build()
        .expect("a valid sink")
}

/// Records 0..10, one line each ("0\n".."9\n": 20 bytes), in one pending part.
async fn one_pending_part(sink: &FileSink<u64, LineEncoder>) -> FileCommittable {
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..10).collect()).await.unwrap();
    let mut committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    assert_eq!(committables.len(), 1);
    let committable = committables.remove(0);
    assert_eq!((committable.size_bytes, committable.records), (20, 10));
    committable
}

/// Commits one committable; its outcome and the records it said were lost.
async fn commit_one(
    sink: &FileSink<u64, LineEncoder>,
    committable: &FileCommittable,
) -> (CommitOutcome, Option<u64>) {
    let mut committer = sink.create_committer(&context()).await.unwrap();
    let mut requests = vec![CommitRequest::new(committable.clone(), CheckpointId(1), 0)];
    committer.commit(&mut requests).await.unwrap();
    let request = requests.remove(0);
    let lost = request.records_lost();
    (request.into_parts().1, lost)
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// Checks a refused commit: a known failure whose reason names the pending
/// file, both sizes and the records; nothing visible; the pending file left.
fn assert_refused(
    dir: &Path,
    sink: &FileSink<u64, LineEncoder>,
    c: &FileCommittable,
    outcome: (CommitOutcome, Option<u64>),
    found_size: u64,
) {
    let reason = match &outcome.0 {
        CommitOutcome::FailedWithKnownReason(reason) => reason.clone(),
        other => panic!("a changed pending file must not be committed: {other:?}"),
    };
    assert!(
        reason.contains(&file_name(&c.pending)),
        "names the file: {reason}"
    );
    assert!(
        reason.contains(&format!("{found_size} bytes")) && reason.contains("20 bytes"),
        "names both sizes: {reason}"
    );
    assert!(reason.contains("10 records"), "names the records: {reason}");
    assert_eq!(outcome.1, Some(10), "the records are counted as lost");
    assert!(visible_files(dir).is_empty(), "nothing was made visible");
    assert!(
        dir.join(&c.pending).exists(),
        "the pending file is left for inspection"
    );
    let stats = sink.stats().snapshot();
    assert_eq!((stats.committed_files, stats.failed), (0, 1));
}

#[tokio::test]
async fn a_truncated_pending_file_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    let c = one_pending_part(&sink).await;
    // A torn last line: "9" without its newline.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(&c.pending))
        .unwrap();
    file.set_len(19).unwrap();
    let outcome = commit_one(&sink, &c).await;
    assert_refused(dir.path(), &sink, &c, outcome, 19);
}

#[tokio::test]
async fn a_pending_file_appended_to_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    let c = one_pending_part(&sink).await;
    // A line that would be a duplicate.
    std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join(&c.pending))
        .unwrap()
        .write_all(b"9\n")
        .unwrap();
    let outcome = commit_one(&sink, &c).await;
    assert_refused(dir.path(), &sink, &c, outcome, 22);
}

#[tokio::test]
async fn a_pending_file_of_the_recorded_size_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    let c = one_pending_part(&sink).await;
    assert_eq!(
        commit_one(&sink, &c).await,
        (CommitOutcome::Committed, None)
    );
    let files = visible_files(dir.path());
    assert_eq!(files.len(), 1);
    assert_eq!(std::fs::metadata(&files[0]).unwrap().len(), 20);
    assert_eq!(
        commit_one(&sink, &c).await,
        (CommitOutcome::AlreadyCommitted, None),
        "a replay"
    );
}

/// The committer's other "data is lost" cases count the records too.
#[tokio::test]
async fn lost_and_altered_finished_files_count_their_records_as_lost() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    let c = one_pending_part(&sink).await;
    assert_eq!(commit_one(&sink, &c).await.0, CommitOutcome::Committed);
    let target = dir.path().join(&c.target);

    std::fs::write(&target, "changed\n").unwrap();
    let (outcome, lost) = commit_one(&sink, &c).await;
    assert!(
        matches!(&outcome, CommitOutcome::FailedWithKnownReason(r) if r.contains(&file_name(&c.target))),
        "{outcome:?}"
    );
    assert_eq!(lost, Some(10), "a finished file of another size");

    std::fs::remove_file(&target).unwrap();
    let (outcome, lost) = commit_one(&sink, &c).await;
    assert!(
        matches!(&outcome, CommitOutcome::FailedWithKnownReason(r) if r.contains("lost")),
        "{outcome:?}"
    );
    assert_eq!(lost, Some(10), "neither the pending file nor the target");
    assert_eq!(sink.stats().snapshot().failed, 2);
}
