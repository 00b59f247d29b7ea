//! What the file committer does on an object store, driven directly: a
//! commit completes the part's upload; a replay is recognised from the
//! object; an upload and object both gone, or an object of another size, is
//! a known failure naming the object, with its records counted as lost;
//! a restored writer uploads its tail and loses nothing.

use object_store::ObjectStoreExt;
use std::sync::Arc;

use object_store::multipart::MultipartStore;
use object_store::path::Path;
use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Sink,
    SinkWriter,
};
use sinks_file::{
    FileCommittable, FileSink, LineEncoder, MemoryObjectStore, ObjectOutput, RollingPolicy,
};

fn context() -> InitContext {
    InitContext::new(
        "objects",
        sink_api::Lineage::new("test-lineage"),
        Generation(1),
        0,
        1,
    )
}

fn sink(store: &Arc<MemoryObjectStore>) -> FileSink<u64, LineEncoder> {
    let output = ObjectOutput::new(store.clone(), Path::from("out"), "memory://out");
    FileSink::object_store_builder(output, LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .part_suffix(".txt")
        // "0\n".."9\n": 20 bytes in parts of 8, 8 and 4.
        .part_size(8)
        .build()
        .expect("a valid sink")
}

/// Records 0..10, one line each (20 bytes), in one upload of three parts.
async fn one_upload(sink: &FileSink<u64, LineEncoder>) -> FileCommittable {
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..10).collect()).await.unwrap();
    let mut committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    assert_eq!(committables.len(), 1);
    let committable = committables.remove(0);
    assert_eq!((committable.size_bytes, committable.records), (20, 10));
    let upload = committable.upload.as_ref().expect("an upload");
    let sizes: Vec<u64> = upload.parts.iter().map(|p| p.size_bytes).collect();
    assert_eq!(sizes, vec![8, 8, 4]);
    committable
}

/// A sink whose parts are kept across checkpoints (parts of 8 bytes), so
/// that writer states carry uploads in progress with their tails.
fn kept_across_checkpoints(store: &Arc<MemoryObjectStore>) -> FileSink<u64, LineEncoder> {
    let output = ObjectOutput::new(store.clone(), Path::from("out"), "memory://out");
    FileSink::object_store_builder(output, LineEncoder)
        .rolling_policy(RollingPolicy {
            roll_on_checkpoint: false,
            ..RollingPolicy::on_checkpoint()
        })
        .part_size(8)
        .build()
        .unwrap()
}

async fn commit_one(
    sink: &FileSink<u64, LineEncoder>,
    committable: &FileCommittable,
) -> (CommitOutcome, Option<u64>) {
    commit_retry(sink, committable, 0).await
}

/// Commits one committable on its `retry`-th retry.
async fn commit_retry(
    sink: &FileSink<u64, LineEncoder>,
    committable: &FileCommittable,
    retry: u32,
) -> (CommitOutcome, Option<u64>) {
    let mut committer = sink.create_committer(&context()).await.unwrap();
    let mut requests = vec![CommitRequest::new(
        committable.clone(),
        CheckpointId(1),
        retry,
    )];
    committer.commit(&mut requests).await.unwrap();
    let request = requests.remove(0);
    let lost = request.records_lost();
    (request.into_parts().1, lost)
}

fn target(c: &FileCommittable) -> Path {
    Path::from(format!("out/{}", c.target.display()))
}

async fn content(store: &MemoryObjectStore, path: &Path) -> String {
    let bytes = store.get(path).await.unwrap().bytes().await.unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn a_commit_completes_the_upload_and_a_replay_is_already_committed() {
    let store = Arc::new(MemoryObjectStore::new());
    let sink = sink(&store);
    let c = one_upload(&sink).await;
    assert!(
        sinks_file::finished_objects(&ObjectOutput::new(
            store.clone(),
            Path::from("out"),
            "memory://out"
        ))
        .await
        .unwrap()
        .is_empty(),
        "nothing visible before the commit"
    );
    assert_eq!(
        commit_one(&sink, &c).await,
        (CommitOutcome::Committed, None)
    );
    let expected: String = (0..10).map(|i| format!("{i}\n")).collect();
    assert_eq!(content(&store, &target(&c)).await, expected);
    assert_eq!(store.uploads_in_progress(), 0);
    assert_eq!(
        commit_one(&sink, &c).await,
        (CommitOutcome::AlreadyCommitted, None),
        "a replay, recognised from the object"
    );
    let stats = sink.stats().snapshot();
    assert_eq!((stats.committed_files, stats.replayed), (1, 1));
}

#[tokio::test]
async fn an_upload_and_object_both_gone_is_a_known_loss_never_a_success() {
    let store = Arc::new(MemoryObjectStore::new());
    let sink = sink(&store);
    let c = one_upload(&sink).await;
    let upload = c.upload.as_ref().unwrap();
    store
        .abort_multipart(&target(&c), &upload.upload_id)
        .await
        .unwrap();
    // An earlier completion may still be assembling the object: retried
    // three times before the data is declared lost.
    for retry in 0..3 {
        let (outcome, lost) = commit_retry(&sink, &c, retry).await;
        assert_eq!((outcome, lost), (CommitOutcome::RetryLater, None));
    }
    let (outcome, lost) = commit_retry(&sink, &c, 3).await;
    let CommitOutcome::FailedWithKnownReason(reason) = outcome else {
        panic!("an aborted upload must not pass as committed: {outcome:?}");
    };
    assert!(reason.contains(&upload.upload_id), "{reason}");
    assert!(reason.contains("10 records are lost"), "{reason}");
    assert_eq!(lost, Some(10));
}

#[tokio::test]
async fn an_object_of_another_size_at_the_key_is_not_overwritten() {
    let store = Arc::new(MemoryObjectStore::new());
    let sink = sink(&store);
    let c = one_upload(&sink).await;
    store
        .put(&target(&c), b"someone else's".to_vec().into())
        .await
        .unwrap();
    let (outcome, lost) = commit_one(&sink, &c).await;
    let CommitOutcome::FailedWithKnownReason(reason) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        reason.contains("holds 14 bytes instead of the 20"),
        "{reason}"
    );
    assert_eq!(lost, Some(10));
    assert_eq!(content(&store, &target(&c)).await, "someone else's");
}

/// A checkpoint taken with records in the tail; the writer crashes and
/// writes more (a part after the checkpoint); the restored writer uploads
/// the recorded tail in that part's place, and the object holds exactly the
/// records of the checkpoint.
#[tokio::test]
async fn a_restored_tail_replaces_what_was_uploaded_after_the_checkpoint() {
    let store = Arc::new(MemoryObjectStore::new());
    let sink = kept_across_checkpoints(&store);
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..7).collect()).await.unwrap(); // 14 bytes: a part and a tail of 6
    assert!(writer
        .prepare_commit(CheckpointId(1))
        .await
        .unwrap()
        .is_empty());
    let states = writer.snapshot_state(CheckpointId(1)).await.unwrap();
    let part = &states[0].in_progress[0];
    assert_eq!((part.length, part.tail.len()), (14, 6));
    // After the checkpoint: more records, another part uploaded.
    writer.write_batch((7..20).collect()).await.unwrap();
    writer.flush(false).await.unwrap();
    drop(writer);

    let restored = sink.create_writer(&context(), states).await.unwrap();
    let mut restored = restored;
    let committables = restored.prepare_commit(CheckpointId(2)).await.unwrap();
    assert_eq!(committables.len(), 1);
    assert_eq!(
        commit_one(&sink, &committables[0]).await.0,
        CommitOutcome::Committed
    );
    let expected: String = (0..7).map(|i| format!("{i}\n")).collect();
    assert_eq!(content(&store, &target(&committables[0])).await, expected);
}

/// An older instance still running uploads its next part under the number
/// the restored writer gave the checkpoint's tail: the completion is
/// refused (`InvalidPart`), the committer uploads the tail again from the
/// committable and completes with it.
#[tokio::test]
async fn a_restored_tail_replaced_by_an_older_instance_is_uploaded_again() {
    let store = Arc::new(MemoryObjectStore::new());
    let sink = kept_across_checkpoints(&store);
    let mut older = sink.create_writer(&context(), Vec::new()).await.unwrap();
    older.write_batch((0..7).collect()).await.unwrap(); // a part of 8, a tail of 6
    let states = older.snapshot_state(CheckpointId(1)).await.unwrap();
    let mut newer = sink.create_writer(&context(), states).await.unwrap();
    let committables = newer.prepare_commit(CheckpointId(2)).await.unwrap();
    // The older instance goes on: its next part lands under number 1 too.
    older.write_batch((7..20).collect()).await.unwrap();
    older.snapshot_state(CheckpointId(2)).await.unwrap(); // its parts landed
    let c = &committables[0];
    assert_eq!(c.upload.as_ref().unwrap().last_part.len(), 6);
    assert_eq!(commit_one(&sink, c).await.0, CommitOutcome::Committed);
    let expected: String = (0..7).map(|i| format!("{i}\n")).collect();
    assert_eq!(content(&store, &target(c)).await, expected);
}

/// Buckets are prefixes of objects, as they are directories of files.
#[tokio::test]
async fn buckets_are_prefixes_of_the_objects() {
    let store = Arc::new(MemoryObjectStore::new());
    let output = ObjectOutput::new(store.clone(), Path::from("out"), "memory://out");
    let sink = FileSink::object_store_builder(output.clone(), LineEncoder)
        .bucket_assigner(sinks_file::FnBucketAssigner(|n: &u64| {
            if n.is_multiple_of(2) {
                "even/day-1"
            } else {
                "odd"
            }
            .to_string()
        }))
        .rolling_policy(RollingPolicy::on_checkpoint())
        .part_size(8)
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..10).collect()).await.unwrap();
    let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    let mut committer = sink.create_committer(&context()).await.unwrap();
    let mut requests: Vec<_> = committables
        .into_iter()
        .map(|c| CommitRequest::new(c, CheckpointId(1), 0))
        .collect();
    committer.commit(&mut requests).await.unwrap();
    let objects = sinks_file::finished_objects(&output).await.unwrap();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert!(objects[0].starts_with("even/day-1/part-"), "{objects:?}");
    assert!(objects[1].starts_with("odd/part-"), "{objects:?}");
    let even = sinks_file::read_object(&output, &objects[0]).await.unwrap();
    assert_eq!(&even[..], b"0\n2\n4\n6\n8\n");
}

/// S3 takes at most 10 000 parts an upload: without a size limit in the
/// rolling policy, a part rolls when it reaches 10 000 uploaded parts.
#[tokio::test]
async fn a_part_rolls_at_ten_thousand_uploaded_parts() {
    let store = Arc::new(MemoryObjectStore::new());
    let output = ObjectOutput::new(store.clone(), Path::from("out"), "memory://out");
    let sink = FileSink::object_store_builder(output, LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .part_size(2)
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    // "1\n": one part a record.
    writer.write_batch(vec![1; 10_001]).await.unwrap();
    let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    let parts: Vec<usize> = committables
        .iter()
        .map(|c| c.upload.as_ref().unwrap().parts.len())
        .collect();
    assert_eq!(parts, vec![10_000, 1]);
}
