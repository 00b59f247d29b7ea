//! Source positions committed with the data, through the sink's public
//! API: a writer given positions makes each checkpoint one group (every
//! part rolled), the committer commits the group with its positions through
//! the output's position log or not at all, and `committed_positions`
//! reads the log back (docs/semantics.md, "Source positions, committed with
//! the data").

use crate::common;

use std::path::Path;

use common::{visible_files, visible_numbers};
use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Lineage,
    PositionAdvance, Sink, SinkWriter, SplitKey,
};
use sinks_file::{
    CompactionPolicy, FileCommittable, FileSink, FnBucketAssigner, LineEncoder, RollingPolicy,
};

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

/// Puts records in a bucket of their own.
type Buckets = FnBucketAssigner<fn(&u64) -> String>;

/// Even and odd numbers in two buckets; parts roll only at 1 MiB, so that
/// only the positions make them roll at a checkpoint.
fn sink(dir: &Path) -> FileSink<u64, LineEncoder, Buckets> {
    fn bucket(n: &u64) -> String {
        format!("b{}", n % 2)
    }
    FileSink::builder(dir, LineEncoder)
        .bucket_assigner(FnBucketAssigner(bucket as fn(&u64) -> String))
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(1 << 20),
            ..RollingPolicy::default()
        })
        .build()
        .expect("a valid sink")
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

#[tokio::test]
async fn a_checkpoint_is_one_group_committed_with_its_positions() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    assert!(sink.commits_positions());
    assert!(sink.committed_positions("input").await.unwrap().is_empty());
    let mut writer = sink.create_writer(&context("l"), Vec::new()).await.unwrap();
    writer.write_batch((0..10).collect()).await.unwrap();
    writer.flush(false).await.unwrap();
    writer
        .carry_positions(vec![advance("p0", None, 6), advance("p1", None, 4)])
        .unwrap();
    let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    // Both buckets' parts rolled, though not due: one group of two.
    assert_eq!(committables.len(), 2);
    let member = committables[0].positions.clone().expect("a group");
    assert_eq!(member.members, 2);
    assert!(committables
        .iter()
        .all(|c| c.positions.as_ref() == Some(&member)));
    let state = writer.snapshot_state(CheckpointId(1)).await.unwrap();
    assert!(state[0].in_progress.is_empty(), "no part spans the barrier");
    if let Some(durability) = writer.durability(CheckpointId(1)) {
        durability.await.unwrap();
    }
    assert!(visible_files(dir.path()).is_empty());

    let mut committer = sink.create_committer(&context("l")).await.unwrap();
    assert_eq!(
        commit(&mut committer, &committables).await,
        vec![CommitOutcome::Committed; 2]
    );
    assert_eq!(visible_numbers(dir.path()), (0..10).collect::<Vec<_>>());
    let positions = sink.committed_positions("input").await.unwrap();
    assert_eq!(
        positions.into_iter().collect::<Vec<_>>(),
        vec![("p0".to_string(), 6), ("p1".to_string(), 4)]
    );
    assert!(sink.committed_positions("other").await.unwrap().is_empty());
    // A replay, by a committer of another start: nothing twice.
    let mut again = sink.create_committer(&context("l")).await.unwrap();
    assert_eq!(
        commit(&mut again, &committables).await,
        vec![CommitOutcome::AlreadyCommitted; 2]
    );
    assert_eq!(visible_numbers(dir.path()), (0..10).collect::<Vec<_>>());

    // The next checkpoint goes on from there; its group is the next one.
    writer.write_batch(vec![10, 11]).await.unwrap();
    writer
        .carry_positions(vec![advance("p0", Some(6), 8)])
        .unwrap();
    let next = writer.prepare_commit(CheckpointId(2)).await.unwrap();
    let next_member = next[0].positions.clone().expect("a group");
    assert_eq!(next_member.group.number, member.group.number + 1);
    assert_eq!(
        commit(&mut committer, &next).await,
        vec![CommitOutcome::Committed; next.len()]
    );
    assert_eq!(sink.committed_positions("input").await.unwrap()["p0"], 8);
}

#[tokio::test]
async fn an_old_owner_is_superseded_and_its_parts_removed() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    // Two owners of split p0, both from its start: B commits first.
    let mut prepared = Vec::new();
    for (lineage, records) in [("a", 0..4u64), ("b", 100..106u64)] {
        let mut writer = sink
            .create_writer(&context(lineage), Vec::new())
            .await
            .unwrap();
        writer.write_batch(records.clone().collect()).await.unwrap();
        writer
            .carry_positions(vec![advance("p0", None, records.end)])
            .unwrap();
        prepared.push(writer.prepare_commit(CheckpointId(1)).await.unwrap());
    }
    let mut b = sink.create_committer(&context("b")).await.unwrap();
    assert!(commit(&mut b, &prepared[1])
        .await
        .iter()
        .all(|o| *o == CommitOutcome::Committed));
    let mut a = sink.create_committer(&context("a")).await.unwrap();
    let outcomes = commit(&mut a, &prepared[0]).await;
    for outcome in &outcomes {
        match outcome {
            CommitOutcome::Superseded(why) => assert!(why.contains("p0"), "{why}"),
            other => panic!("the old owner's commit must be superseded: {other:?}"),
        }
    }
    assert_eq!(visible_numbers(dir.path()), (100..106).collect::<Vec<_>>());
    for c in &prepared[0] {
        assert!(
            !dir.path().join(&c.pending).exists(),
            "nothing will commit it"
        );
    }
    // Asked again (a restore's re-commit): superseded again.
    assert!(matches!(
        commit(&mut a, &prepared[0]).await[0],
        CommitOutcome::Superseded(_)
    ));
    assert_eq!(sink.committed_positions("input").await.unwrap()["p0"], 106);
}

#[tokio::test]
async fn positions_that_moved_without_records_are_committed_alone() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    let mut writer = sink.create_writer(&context("l"), Vec::new()).await.unwrap();
    // No split moved, nothing written: nothing to commit.
    writer.carry_positions(Vec::new()).unwrap();
    assert!(writer
        .prepare_commit(CheckpointId(1))
        .await
        .unwrap()
        .is_empty());
    // A split moved over offsets that hold no record (transaction markers).
    writer
        .carry_positions(vec![advance("p0", None, 3)])
        .unwrap();
    let committables = writer.prepare_commit(CheckpointId(2)).await.unwrap();
    assert_eq!(committables.len(), 1);
    assert!(committables[0].pending.as_os_str().is_empty());
    assert_eq!(committables[0].records, 0);
    let mut committer = sink.create_committer(&context("l")).await.unwrap();
    assert_eq!(
        commit(&mut committer, &committables).await,
        vec![CommitOutcome::Committed]
    );
    assert_eq!(
        commit(&mut committer, &committables).await,
        vec![CommitOutcome::AlreadyCommitted]
    );
    assert!(visible_files(dir.path()).is_empty());
    assert_eq!(sink.committed_positions("input").await.unwrap()["p0"], 3);
}

#[tokio::test]
async fn a_call_holding_one_member_twice_and_another_not_at_all_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sink = sink(dir.path());
    let mut writer = sink.create_writer(&context("l"), Vec::new()).await.unwrap();
    writer.write_batch((0..10).collect()).await.unwrap();
    writer
        .carry_positions(vec![advance("p0", None, 10)])
        .unwrap();
    let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    assert_eq!(committables.len(), 2, "one part per bucket");
    if let Some(durability) = writer.durability(CheckpointId(1)) {
        durability.await.unwrap();
    }
    let mut committer = sink.create_committer(&context("l")).await.unwrap();
    // Two members counted, but the same one twice: the group is not whole.
    let twice = [committables[0].clone(), committables[0].clone()];
    for outcome in commit(&mut committer, &twice).await {
        match outcome {
            CommitOutcome::FailedWithUnknownReason(why) => {
                assert!(why.contains("more than once"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(visible_files(dir.path()).is_empty(), "nothing committed");
    assert!(sink.committed_positions("input").await.unwrap().is_empty());
    // The whole group, each member once, commits.
    assert_eq!(
        commit(&mut committer, &committables).await,
        vec![CommitOutcome::Committed; 2]
    );
    assert_eq!(visible_numbers(dir.path()), (0..10).collect::<Vec<_>>());
    assert_eq!(sink.committed_positions("input").await.unwrap()["p0"], 10);
}

#[tokio::test]
async fn a_group_merged_by_compaction_is_a_replay_and_nothing_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .compaction(
            CompactionPolicy::every(std::time::Duration::ZERO).retention(std::time::Duration::ZERO),
        )
        .build()
        .unwrap();
    // The committers commit the positions; the compactor only merges.
    assert!(sink.commits_positions());
    let context = context("l");
    let mut writer = sink.create_writer(&context, Vec::new()).await.unwrap();
    let mut committer = sink.create_committer(&context).await.unwrap();
    let mut prepared = Vec::new();
    for checkpoint in 1..=3u64 {
        let records: Vec<u64> = ((checkpoint - 1) * 5..checkpoint * 5).collect();
        writer.write_batch(records).await.unwrap();
        let from = (checkpoint > 1).then(|| (checkpoint - 1) * 5);
        writer
            .carry_positions(vec![advance("p0", from, checkpoint * 5)])
            .unwrap();
        let committables = writer
            .prepare_commit(CheckpointId(checkpoint))
            .await
            .unwrap();
        assert_eq!(
            commit(&mut committer, &committables).await,
            vec![CommitOutcome::Committed; committables.len()]
        );
        prepared.push(committables);
    }
    // The compactor merges the segment: three files become one.
    let mut compactor = (sink.global_committer().expect("a compactor"))(&context);
    compactor.end_of_input().await.unwrap();
    assert_eq!(visible_files(dir.path()).len(), 1, "merged");
    // Rolling forward brings no merged part back; replays find them merged.
    assert_eq!(sink.committed_positions("input").await.unwrap()["p0"], 15);
    for committables in &prepared {
        assert_eq!(
            commit(&mut committer, committables).await,
            vec![CommitOutcome::AlreadyCommitted; committables.len()]
        );
    }
    assert_eq!(visible_numbers(dir.path()), (0..15).collect::<Vec<_>>());
    assert_eq!(visible_files(dir.path()).len(), 1);
}
