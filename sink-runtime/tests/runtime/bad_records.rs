//! Bad records: a record the source's parse step refuses fails the job by
//! default; `skip_bad_records` drops and counts it; `dead_letters` sends
//! it, with its bytes, position and reason, to a second sink, committed
//! exactly once and before the main output of its checkpoint.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sink_api::BadRecord;
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobStatus, SequenceSource};
use sinks_memory::{InjectedCommitFailure, MemoryGlobalCommitter, MemorySink, MemoryStore};

const RECORDS: u64 = 1_000;

/// A dead letter as the test's memory sink keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Letter {
    position: String,
    error: String,
    payload: String,
}

impl From<BadRecord> for Letter {
    fn from(bad: BadRecord) -> Letter {
        Letter {
            position: bad.position().to_string(),
            error: bad.error().to_string(),
            payload: String::from_utf8_lossy(bad.payload_bytes()).into_owned(),
        }
    }
}

/// The numbers as text, parsed back; every multiple of 7 refused.
fn parsed() -> impl Source<Record = u64> {
    SequenceSource::bounded(RECORDS)
        .paced(4_000)
        .map(|n| n.to_string())
        .try_map(|text| match text.parse::<u64>() {
            Ok(n) if n % 7 == 0 => Err(BadRecord::new("a multiple of seven")
                .payload(text.clone())
                .at(format!("numbers@{text}"))),
            Ok(n) => Ok(n),
            Err(e) => Err(BadRecord::new(e).payload(text)),
        })
}

fn good() -> Vec<u64> {
    (0..RECORDS).filter(|n| n % 7 != 0).collect()
}

fn bad() -> Vec<u64> {
    (0..RECORDS).filter(|n| n % 7 == 0).collect()
}

fn sorted(store: &MemoryStore<u64>) -> Vec<u64> {
    let mut committed = store.committed();
    committed.sort_unstable();
    committed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_bad_records_are_counted_and_the_rest_committed() {
    let store = MemoryStore::<u64>::new();
    let report = Job::builder("skip", parsed(), MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .skip_bad_records()
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(sorted(&store), good());
    assert_eq!(
        report.metrics.counter("bad_records_skipped"),
        Some(bad().len() as u64)
    );
    assert_eq!(report.metrics.counter("bad_records_dead_lettered"), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_committed_once_with_their_position_bytes_and_reason() {
    let store = MemoryStore::<u64>::new();
    let letters = MemoryStore::<Letter>::new();
    let report = Job::builder("dead", parsed(), MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .dead_letters(MemorySink::new(letters.clone()))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(sorted(&store), good());
    assert!(store.violations().is_empty(), "{:?}", store.violations());
    assert!(
        letters.violations().is_empty(),
        "{:?}",
        letters.violations()
    );
    let mut dead: Vec<Letter> = letters.committed();
    dead.sort_by_key(|l| l.payload.parse::<u64>().unwrap_or(u64::MAX));
    let expected: Vec<Letter> = bad()
        .into_iter()
        .map(|n| Letter {
            position: format!("numbers@{n}"),
            error: "a multiple of seven".into(),
            payload: n.to_string(),
        })
        .collect();
    assert_eq!(dead, expected);
    assert_eq!(
        report.metrics.counter("bad_records_dead_lettered"),
        Some(bad().len() as u64)
    );
    // The main output's records are counted as written; dead letters not.
    assert_eq!(report.metrics.records_committed, good().len() as u64);
}

/// A checkpoint's main output is committed only after its dead letters:
/// when their commit fails (here, with an unknown outcome, and no
/// restarts), nothing of the main output of that checkpoint is visible.
/// Committed the other way round, a run from the destination's positions
/// could skip dead letters never committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_output_is_committed_after_its_dead_letters() {
    let store = MemoryStore::<u64>::new();
    let letters = MemoryStore::<Letter>::new();
    letters.fail_next_commits(1, InjectedCommitFailure::UnknownReason);
    let failed = Job::builder("dead-first", parsed(), MemorySink::new(store.clone()))
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .dead_letters(MemorySink::new(letters.clone()))
        .build()
        .unwrap()
        .run()
        .await;
    assert!(failed.is_err(), "the dead letters' commit failed the job");
    assert!(letters.committed().is_empty());
    assert!(
        store.committed().is_empty(),
        "main output committed before its dead letters: {:?}",
        store.commits_per_checkpoint()
    );
}

/// While the dead letters' commit is retried, the main output waits, and
/// both end committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_dead_letters_hold_the_main_output_until_they_are_committed() {
    let store = MemoryStore::<u64>::new();
    let letters = MemoryStore::<Letter>::new();
    letters.fail_next_commits(3, InjectedCommitFailure::RetryLater);
    let report = Job::builder("dead-retried", parsed(), MemorySink::new(store.clone()))
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .dead_letters(MemorySink::new(letters.clone()))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(report.metrics.commits_retried >= 3);
    assert_eq!(sorted(&store), good());
    assert_eq!(letters.committed().len(), bad().len());
    assert!(store.violations().is_empty(), "{:?}", store.violations());
    assert!(
        letters.violations().is_empty(),
        "{:?}",
        letters.violations()
    );
}

#[test]
fn a_dead_letter_sink_with_a_global_committer_is_refused() {
    let store = MemoryStore::<u64>::new();
    let letters = MemoryStore::<Letter>::new();
    let error = Job::builder("refused", parsed(), MemorySink::new(store.clone()))
        .global_committer(move || MemoryGlobalCommitter::new(store.clone()))
        .dead_letters(MemorySink::new(letters))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("cannot be combined with dead letters"),
        "{error}"
    );
}
