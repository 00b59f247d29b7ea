//! Hand-overs between instances of one group: partitions that move while
//! both run, an instance that stops, an old owner that comes back from its
//! checkpoint after its partitions were committed further by another.

use sink_runtime::{JobStatus, MemoryCheckpointStorage};
use sinks_memory::MemoryStore;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_two_instances_and_every_record_is_written_once() {
    let topic = unique("source-two");
    let group = unique("g");
    fill(&topic, 6, 0, 3000).await;
    let store = MemoryStore::new();
    let a = start_fresh(&topic, &group, false, 2, &store).await;
    until_committed(&store, 3000).await;
    // B joins: a rebalance; A rejoins only once what it read is committed.
    let b = start_fresh(&topic, &group, false, 2, &store).await;
    fill(&topic, 6, 3000, 6000).await;
    until_committed(&store, 6000).await;
    // A stops: B takes every partition over from the destination's positions.
    a.cancel();
    a.join().await.unwrap();
    fill(&topic, 6, 6000, 9000).await;
    until_committed(&store, 9000).await;
    b.cancel();
    b.join().await.unwrap();
    // A bounded run of the group, on fresh state, drains what is left: nothing.
    let c = start_fresh(&topic, &group, true, 3, &store).await;
    assert_eq!(c.join().await.unwrap().status, JobStatus::Finished);
    assert_eq!(committed(&store), (0..9000).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_owner_back_from_its_checkpoint_commits_nothing_for_partitions_read_further() {
    let topic = unique("source-old-owner");
    let group = unique("g");
    fill(&topic, 4, 0, 4000).await;
    let store = MemoryStore::new();
    // A's commits fail: its checkpoints hold prepared transactions never
    // committed when it stops.
    let a_storage = MemoryCheckpointStorage::default();
    store.fail_next_commit_calls(1_000);
    let a = start(&topic, &group, true, 2, &store, &a_storage).await;
    assert!(a.join().await.is_err(), "its commits fail");
    store.clear_injected_failures();
    assert!(committed(&store).is_empty());
    // B, on fresh state, reads everything.
    let b = start_fresh(&topic, &group, true, 2, &store).await;
    assert_eq!(b.join().await.unwrap().status, JobStatus::Finished);
    assert_eq!(committed(&store), (0..4000).collect::<Vec<_>>());
    // A comes back from its checkpoint: what it prepared is superseded.
    let a = start(&topic, &group, true, 2, &store, &a_storage).await;
    let report = a.join().await.unwrap();
    assert!(
        report.metrics.commits_superseded > 0,
        "{:?}",
        report.metrics
    );
    assert_eq!(committed(&store), (0..4000).collect::<Vec<_>>());
}
