//! A user's own change of a source's records, written as the docs teach (a
//! `Transform` given to `Source::transform`, and the closures of `filter`,
//! `flat_map`, `try_map`), loses no position: a job stopped half-way and
//! started again on fresh checkpoint storage, so that only the positions
//! committed with the data say where to go on, writes every record it
//! keeps exactly once. A wrapper that dropped the inner reader's advances
//! or its seek to the destination's positions would read the input again
//! from the start, and the store would see duplicates.

use std::time::Duration;

use sink_api::BadRecord;
use sink_runtime::source::{Source, Transform};
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobStatus, MemoryCheckpointStorage, PartitionedSequence,
};
use sinks_memory::{MemorySink, MemoryStore};

/// A user's parser with state of its own: it keeps the numbers that are
/// not multiples of `drop_multiples_of`, and writes each kept number
/// `copies` times, as `n * 10 + copy`.
struct Parser {
    drop_multiples_of: u64,
    copies: u64,
}

impl Transform<u64> for Parser {
    type Out = u64;

    fn apply(&self, n: u64, out: &mut Vec<u64>) -> Result<(), BadRecord> {
        if !n.is_multiple_of(self.drop_multiples_of) {
            out.extend((0..self.copies).map(|copy| n * 10 + copy));
        }
        Ok(())
    }
}

const RECORDS: u64 = 3000;

fn expected() -> Vec<u64> {
    let mut all: Vec<u64> = (0..RECORDS)
        .filter(|n| !n.is_multiple_of(3))
        .flat_map(|n| [n * 10, n * 10 + 1])
        .collect();
    all.sort_unstable();
    all
}

/// The job over `store` on fresh checkpoint storage: 4 partitions whose
/// positions are committed with the data, through the user's transform.
fn job(store: &MemoryStore<u64>) -> Job<impl Source<Record = u64>, MemorySink<u64>> {
    let source = PartitionedSequence::bounded(RECORDS, 4, "input")
        .paced(3000)
        .transform(Parser {
            drop_multiples_of: 3,
            copies: 2,
        });
    Job::builder("user-transform", source, MemorySink::new(store.clone()))
        .parallelism(2)
        .batch_size(16)
        .checkpoint_storage(MemoryCheckpointStorage::default())
        .checkpointing(CheckpointConfig::every(Duration::from_millis(10)))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_transform_loses_no_position_across_a_stop_and_fresh_checkpoint_storage() {
    let store = MemoryStore::<u64>::new();
    // First instance: stopped once some records are committed, far from
    // the end (the input takes about 0.5 s to read at its pace).
    let handle = job(&store).start();
    while store.committed().len() < 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Cancelled);
    let first = store.committed().len();
    assert!(
        first < expected().len(),
        "the first instance read everything: the test shows nothing"
    );

    // Second instance, on fresh checkpoint storage: it goes on from the
    // positions in the destination.
    let report = job(&store).run().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(store.violations().is_empty(), "{:?}", store.violations());
    let mut committed = store.committed();
    committed.sort_unstable();
    assert_eq!(committed.len(), expected().len(), "every kept record once");
    assert_eq!(committed, expected());
    // Every partition's position is at its end: the dropped records were
    // read, and their positions committed with the records around them.
    let positions = store.positions("input");
    assert_eq!(
        positions.into_iter().collect::<Vec<_>>(),
        (0..4).map(|p| (format!("p{p}"), 750)).collect::<Vec<_>>()
    );
}

/// The combinators chained, over the same stop and fresh start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_combinators_lose_no_position_either() {
    let store = MemoryStore::<u64>::new();
    let job = |store: &MemoryStore<u64>| {
        let source = PartitionedSequence::bounded(RECORDS, 4, "input")
            .paced(3000)
            .filter(|n| !n.is_multiple_of(3))
            .flat_map(|n| [n * 10, n * 10 + 1])
            .try_map(Ok::<u64, BadRecord>);
        Job::builder("combinators", source, MemorySink::new(store.clone()))
            .parallelism(2)
            .batch_size(16)
            .checkpointing(CheckpointConfig::every(Duration::from_millis(10)))
            .build()
            .unwrap()
    };
    let handle = job(&store).start();
    while store.committed().len() < 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.cancel();
    handle.join().await.unwrap();
    assert!(store.committed().len() < expected().len());
    job(&store).run().await.unwrap();
    let mut committed = store.committed();
    committed.sort_unstable();
    assert_eq!(committed, expected());
}

/// A record the user's parse step refuses fails the job at once (the
/// default policy), whatever the restart strategy, with its position and
/// reason; what was committed before it stays committed once.
#[tokio::test]
async fn a_refused_record_fails_the_job_permanently_with_its_position_and_reason() {
    let store = MemoryStore::<u64>::new();
    let source = sink_runtime::SequenceSource::bounded(100).try_map(|n| match n {
        42 => Err(BadRecord::new("not a valid amount")
            .payload(n.to_string())
            .at(format!("numbers@{n}"))),
        n => Ok(n),
    });
    let error = Job::builder("refusing", source, MemorySink::new(store.clone()))
        .restart_strategy(sink_runtime::RestartStrategy::FixedDelay {
            attempts: 5,
            delay: Duration::from_millis(1),
        })
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_err();
    match &error {
        JobError::Source { source, .. } => assert!(source.is_permanent(), "{error}"),
        other => panic!("not a source error: {other}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("the record at numbers@42 was refused: not a valid amount"),
        "{message}"
    );
    assert!(store.violations().is_empty(), "{:?}", store.violations());
}
