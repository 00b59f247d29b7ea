//! Dead letters are committed exactly once across crashes: a job whose
//! parse step refuses every multiple of seven, crashed twice (once
//! surviving in its process, once not) and started again on its state
//! directory, ends with every good record in the main store once, every
//! refused one in the dead-letter store once, and its counter at the
//! number refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sink_api::BadRecord;
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage, RestartStrategy};
use sinks_memory::{MemorySink, MemoryStore};

use crate::common::ThrottledSource;
use crate::crash_twice::crashed_twice_then_finished;

const RECORDS: u64 = 2_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Letter(String);

impl From<BadRecord> for Letter {
    fn from(bad: BadRecord) -> Letter {
        Letter(bad.position().to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_committed_once_across_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<u64>::new();
    let letters = MemoryStore::<Letter>::new();
    let job = |restarts: bool| {
        let source = ThrottledSource::bounded(RECORDS, 20, Duration::from_millis(5)).try_map(|n| {
            match n % 7 {
                0 => Err(BadRecord::new("a multiple of seven").at(n.to_string())),
                _ => Ok(n),
            }
        });
        let builder = Job::builder("dead-crashes", source, MemorySink::new(store.clone()))
            .parallelism(2)
            .batch_size(20)
            .checkpointing(CheckpointConfig::every(Duration::from_millis(10)))
            .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap());
        let builder = match restarts {
            true => builder.restart_strategy(RestartStrategy::FixedDelay {
                attempts: 5,
                delay: Duration::from_millis(1),
            }),
            false => builder,
        };
        builder
            .dead_letters(MemorySink::new(letters.clone()).roll_every(3))
            .build()
            .unwrap()
    };
    let report = crashed_twice_then_finished(job, Duration::from_millis(150)).await;

    assert!(store.violations().is_empty(), "{:?}", store.violations());
    assert!(
        letters.violations().is_empty(),
        "{:?}",
        letters.violations()
    );
    let mut good = store.committed();
    good.sort_unstable();
    assert!(good == (0..RECORDS).filter(|n| n % 7 != 0).collect::<Vec<_>>());
    let mut dead: Vec<u64> = (letters.committed().iter())
        .map(|l| l.0.parse().unwrap())
        .collect();
    dead.sort_unstable();
    let refused: Vec<u64> = (0..RECORDS).filter(|n| n % 7 == 0).collect();
    assert_eq!(dead, refused, "every refused record once");
    assert_eq!(
        report.metrics.counter("bad_records_dead_lettered"),
        Some(refused.len() as u64)
    );
}
