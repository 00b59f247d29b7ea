//! Source positions on an object store output: a group's uploads and
//! positions committed through the position log's objects, and a group
//! whose entry a crash left with its uploads open completed by the next
//! reader of the log (crash points are process-wide: this executable).

use object_store::ObjectStoreExt;
use std::sync::Arc;

use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Lineage,
    PositionAdvance, Sink, SinkWriter, SplitKey,
};
use sinks_file::{FileCommittable, FileSink, LineEncoder, MemoryObjectStore, ObjectOutput};

fn context(lineage: &str) -> InitContext {
    InitContext::new("positions", Lineage::new(lineage), Generation(1), 0, 1)
}

fn advance(split: &str, from: Option<u64>, to: u64) -> PositionAdvance {
    PositionAdvance {
        key: SplitKey::new("input", split),
        from,
        to,
    }
}

/// Commits `committables` in one call; their outcomes.
async fn commit<K: Committer<Committable = FileCommittable>>(
    committer: &mut K,
    committables: &[FileCommittable],
) -> Vec<CommitOutcome> {
    let mut requests: Vec<_> = committables
        .iter()
        .map(|c| CommitRequest::new(c.clone(), CheckpointId(1), 0))
        .collect();
    committer
        .commit(&mut requests)
        .await
        .expect("a commit call");
    requests.into_iter().map(|r| r.into_parts().1).collect()
}

/// The records of an object store output: every line of every object
/// under `out/` that is not hidden, as numbers.
async fn object_numbers(store: &MemoryObjectStore) -> Vec<u64> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let objects: Vec<_> = store
        .list(Some(&object_store::path::Path::from("out")))
        .try_collect()
        .await
        .unwrap();
    let mut numbers = Vec::new();
    for meta in objects {
        if meta.location.parts().any(|p| p.as_ref().starts_with('.')) {
            continue;
        }
        let bytes = store
            .get(&meta.location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        numbers.extend(
            String::from_utf8(bytes.to_vec())
                .unwrap()
                .lines()
                .map(|line| line.parse::<u64>().unwrap()),
        );
    }
    numbers.sort_unstable();
    numbers
}

/// On an object store output, a group's uploads and positions are
/// committed through the position log's objects: a replay is recognised,
/// an old owner's group that finds the split moved is superseded with
/// nothing of it visible, and a group whose entry is logged but whose
/// uploads were never completed (a crash between the two) is completed by
/// the next reader of the positions.
#[tokio::test]
async fn an_object_store_output_commits_positions_through_its_log() {
    let store = Arc::new(MemoryObjectStore::new());
    let sink = || {
        let output = ObjectOutput::new(
            store.clone(),
            object_store::path::Path::from("out"),
            "memory://out",
        )
        .with_upload_listing(store.clone());
        FileSink::<u64, _>::object_store_builder(output, LineEncoder)
            .build()
            .unwrap()
    };
    let (a, b) = (sink(), sink());
    assert!(a.commits_positions());
    assert!(a.committed_positions("input").await.unwrap().is_empty());
    let prepare = |sink: FileSink<u64, LineEncoder>,
                   lineage: &'static str,
                   checkpoint: u64,
                   records: Vec<u64>,
                   advances| async move {
        let mut writer = sink
            .create_writer(&context(lineage), Vec::new())
            .await
            .unwrap();
        writer.write_batch(records).await.unwrap();
        writer.flush(false).await.unwrap();
        writer.carry_positions(advances).unwrap();
        let committables = writer
            .prepare_commit(CheckpointId(checkpoint))
            .await
            .unwrap();
        writer
            .snapshot_state(CheckpointId(checkpoint))
            .await
            .unwrap();
        committables
    };
    // Two owners read p0 from its start: A to 5, B to 3.
    let from_a = prepare(
        sink(),
        "a",
        1,
        (0..5).collect(),
        vec![advance("p0", None, 5)],
    )
    .await;
    let from_b = prepare(
        sink(),
        "b",
        1,
        (0..3).collect(),
        vec![advance("p0", None, 3)],
    )
    .await;
    assert!(from_a
        .iter()
        .all(|c| c.upload.is_some() && c.positions.is_some()));

    let mut committer = a.create_committer(&context("a")).await.unwrap();
    assert_eq!(
        commit(&mut committer, &from_a).await,
        vec![CommitOutcome::Committed; from_a.len()]
    );
    assert_eq!(object_numbers(&store).await, (0..5).collect::<Vec<_>>());
    assert_eq!(b.committed_positions("input").await.unwrap()["p0"], 5);
    let mut again = a.create_committer(&context("a")).await.unwrap();
    assert_eq!(
        commit(&mut again, &from_a).await,
        vec![CommitOutcome::AlreadyCommitted; from_a.len()],
        "a replay"
    );
    let mut committer_b = b.create_committer(&context("b")).await.unwrap();
    let outcomes = commit(&mut committer_b, &from_b).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, CommitOutcome::Superseded(_))),
        "{outcomes:?}"
    );
    assert_eq!(
        object_numbers(&store).await,
        (0..5).collect::<Vec<_>>(),
        "nothing of B"
    );

    // A crash between the entry and the completions (the failpoint's
    // effect, by hand): the entry is in the log, the upload still open.
    let next = prepare(sink(), "a", 2, vec![5, 6], vec![advance("p0", Some(5), 7)]).await;
    fail::cfg("file-positions-after-entry", "1*return->off").unwrap();
    let mut crashing = a.create_committer(&context("a")).await.unwrap();
    let mut requests: Vec<_> = next
        .iter()
        .map(|c| CommitRequest::new(c.clone(), CheckpointId(2), 0))
        .collect();
    assert!(crashing.commit(&mut requests).await.is_err(), "the crash");
    fail::remove("file-positions-after-entry");
    assert_eq!(object_numbers(&store).await, (0..5).collect::<Vec<_>>());
    assert_eq!(
        b.committed_positions("input").await.unwrap()["p0"],
        7,
        "the log says 7, and its reader completes the upload"
    );
    assert_eq!(object_numbers(&store).await, (0..7).collect::<Vec<_>>());

    // An upload aborted before its group's commit (a lifecycle rule, by
    // hand): nothing of the group is committed, the positions stay, and
    // its records are read again.
    let lost = prepare(sink(), "a", 3, vec![7, 8], vec![advance("p0", Some(7), 9)]).await;
    for c in &lost {
        let upload = c.upload.as_ref().expect("an upload");
        let path = object_store::path::Path::from(format!("out/{}", c.target.to_string_lossy()));
        object_store::multipart::MultipartStore::abort_multipart(
            store.as_ref(),
            &path,
            &upload.upload_id,
        )
        .await
        .unwrap();
    }
    let outcomes = commit(&mut committer, &lost).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, CommitOutcome::Superseded(_))),
        "{outcomes:?}"
    );
    assert_eq!(b.committed_positions("input").await.unwrap()["p0"], 7);
    assert_eq!(object_numbers(&store).await, (0..7).collect::<Vec<_>>());
}
