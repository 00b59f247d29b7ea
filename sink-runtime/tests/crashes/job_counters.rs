//! Job counters count each record once across crashes: a counter bumped
//! in a source's `filter` closure ends at exactly the number of records it
//! counted, although the records after the last checkpoint were read (and
//! the closure called) again after each crash, in the same process (the
//! restart strategy) and in a new one (a new job on the same state
//! directory).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobCounter, LocalCheckpointStorage, RestartStrategy};
use sinks_memory::{MemorySink, MemoryStore};

use crate::common::ThrottledSource;
use crate::crash_twice::crashed_twice_then_finished;

const RECORDS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_in_a_filter_counts_each_record_once_across_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<u64>::new();
    // Every call of the closure, replays included.
    let calls = Arc::new(AtomicU64::new(0));
    let job = |restarts: bool| {
        let odd = JobCounter::new("odd_dropped", "Odd numbers dropped.");
        let (counter, calls) = (odd.clone(), calls.clone());
        let source =
            ThrottledSource::bounded(RECORDS, 20, Duration::from_millis(10)).filter(move |n| {
                calls.fetch_add(1, Ordering::Relaxed);
                let odd = n % 2 == 1;
                if odd {
                    counter.add(1);
                }
                !odd
            });
        let builder = Job::builder("counted", source, MemorySink::new(store.clone()))
            .parallelism(2)
            .batch_size(20)
            .counter(&odd)
            .checkpointing(CheckpointConfig::every(Duration::from_millis(10)))
            .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap());
        match restarts {
            true => builder.restart_strategy(RestartStrategy::FixedDelay {
                attempts: 5,
                delay: Duration::from_millis(1),
            }),
            false => builder,
        }
        .build()
        .unwrap()
    };

    let report = crashed_twice_then_finished(job, Duration::from_millis(250)).await;
    let mut committed = store.committed();
    committed.sort_unstable();
    let evens: Vec<u64> = (0..RECORDS).filter(|n| n % 2 == 0).collect();
    assert!(
        committed == evens,
        "not every even number once: {} committed",
        committed.len()
    );
    assert!(
        calls.load(Ordering::Relaxed) > RECORDS,
        "nothing was read twice: the test shows nothing"
    );
    assert_eq!(report.metrics.counter("odd_dropped"), Some(RECORDS / 2));
}
