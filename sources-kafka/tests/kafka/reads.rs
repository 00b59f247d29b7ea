//! A group reading a topic into the memory sink: bounded, the positions
//! committed with the data.

use sink_runtime::{JobStatus, MemoryCheckpointStorage};
use sinks_memory::MemoryStore;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_group_reads_every_record_once_and_commits_where_each_partition_ends() {
    let topic = unique("source-bounded");
    fill(&topic, 4, 0, 2000).await;
    let store = MemoryStore::new();
    let job = start(
        &topic,
        &unique("g"),
        true,
        2,
        &store,
        &MemoryCheckpointStorage::default(),
    )
    .await;
    let report = job.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(committed(&store), (0..2000).collect::<Vec<_>>());
}
