//! A source whose positions are committed with the data: the job's build
//! needs a sink that can, every start reads each split from where the
//! destination's data of it ends, and each barrier's advances reach the
//! writer.

use sink_api::{async_trait, InitContext, Sink, SinkError};
use sink_runtime::source::Source;
use sink_runtime::{
    CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage, PartitionedSequence,
};
use sinks_memory::{
    MemoryCommitter, MemoryGlobalCommitter, MemorySink, MemoryStore, MemoryWriter,
    MemoryWriterState,
};
use std::time::Duration;

/// The memory sink, saying it keeps no positions.
struct NoPositions(MemorySink<u64>);

#[async_trait]
impl Sink for NoPositions {
    type Writer = MemoryWriter<u64>;
    type Committer = MemoryCommitter<u64>;

    async fn create_writer(
        &self,
        context: &InitContext,
        states: Vec<MemoryWriterState<u64>>,
    ) -> Result<MemoryWriter<u64>, SinkError> {
        self.0.create_writer(context, states).await
    }

    async fn create_committer(
        &self,
        context: &InitContext,
    ) -> Result<MemoryCommitter<u64>, SinkError> {
        self.0.create_committer(context).await
    }
}

#[test]
fn a_source_committing_positions_is_refused_with_a_sink_that_cannot() {
    let store = MemoryStore::<u64>::new();
    let source = PartitionedSequence::bounded(10, 2, "input");
    let error = Job::builder("job", source, NoPositions(MemorySink::new(store)))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("Sink::commits_positions"), "{error}");

    let store = MemoryStore::<u64>::new();
    let source = PartitionedSequence::bounded(10, 2, "input");
    let error = Job::builder("job", source, MemorySink::new(store.clone()))
        .global_committer(move || MemoryGlobalCommitter::new(store.clone()))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("JobBuilder::global_committer"), "{error}");
}

/// Runs the numbers `0..records` in 4 partitions under `scope` into
/// `store`, on checkpoint storage `storage`.
async fn run(store: &MemoryStore<u64>, storage: &MemoryCheckpointStorage, records: u64) {
    let source = PartitionedSequence::bounded(records, 4, "input").map(|id| id);
    let report = Job::builder("job", source, MemorySink::new(store.clone()))
        .parallelism(3)
        .batch_size(7)
        .checkpoint_storage(storage.clone())
        .checkpointing(CheckpointConfig::every(Duration::from_millis(5)))
        .build()
        .unwrap()
        .start()
        .join()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(store.violations().is_empty(), "{:?}", store.violations());
}

#[tokio::test]
async fn positions_are_committed_with_the_data_and_a_new_instance_starts_where_they_end() {
    let store = MemoryStore::<u64>::new();
    run(&store, &MemoryCheckpointStorage::default(), 1000).await;
    let mut committed = store.committed();
    committed.sort_unstable();
    assert_eq!(committed, (0..1000).collect::<Vec<_>>());
    // Partition p holds p, p + 4, …: 250 numbers each.
    let positions = store.positions("input");
    assert_eq!(
        positions.into_iter().collect::<Vec<_>>(),
        (0..4).map(|p| (format!("p{p}"), 250)).collect::<Vec<_>>()
    );

    // The same job on fresh checkpoint storage (another machine, or its
    // state lost): every split starts where the destination's data ends,
    // so nothing is written again. With positions kept only in the
    // checkpoint it would read everything again.
    run(&store, &MemoryCheckpointStorage::default(), 1000).await;
    assert_eq!(store.committed().len(), 1000);
}

/// Two instances reading one scope at once, with the default restart
/// strategy (none): each commit that finds its splits moved by the other
/// is superseded, and the job restarts at once from the destination's
/// positions instead of failing, outside its strategy. Both finish, every
/// record once. Fails when a superseded commit fails the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseded_commits_restart_the_job_whatever_its_strategy() {
    let store = MemoryStore::<u64>::new();
    let job = |name: &str| {
        let source = PartitionedSequence::bounded(4000, 4, "input")
            .paced(8000)
            .map(|id| id);
        Job::builder(name, source, MemorySink::new(store.clone()))
            .parallelism(2)
            .checkpointing(CheckpointConfig::every(Duration::from_millis(5)))
            .build()
            .unwrap()
            .run()
    };
    let (a, b) = tokio::join!(job("a"), job("b"));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.status, JobStatus::Finished);
    assert_eq!(b.status, JobStatus::Finished);
    let superseded = a.metrics.commits_superseded + b.metrics.commits_superseded;
    let restarts = a.metrics.restarts + b.metrics.restarts;
    assert!(
        restarts > 0,
        "the two instances never met: the test shows nothing ({superseded} superseded)"
    );
    let mut committed = store.committed();
    committed.sort_unstable();
    assert_eq!(committed, (0..4000).collect::<Vec<_>>());
    assert!(store.violations().is_empty(), "{:?}", store.violations());
}
