//! Pipelines under crashes: for every crash point, a pipeline fed by
//! concurrent clients crashes there (and restarts in place from its durable
//! checkpoints), the clients send again every send whose ticket failed, with
//! the same idempotency key, until it is acknowledged; after a shutdown every
//! record is committed exactly once. This is the end-to-end promise of
//! docs/embedding.md: a 200 means committed, and a retry with the key never
//! duplicates.
//!
//! Needs the `crash-tests` feature (`cargo test -p sink-runtime --features
//! crash-tests --test pipeline_crashes`). `fail`'s configuration is
//! process-wide, so the scenarios run one after another in one test.

use std::collections::BTreeMap;
use std::time::Duration;

use sink_runtime::failpoints::{hits, FAILPOINTS};
use sink_runtime::pipeline::{Pipeline, Refusal, TicketError};
use sink_runtime::{CheckpointConfig, JobStatus, LocalCheckpointStorage, RestartStrategy};
use sinks_memory::{MemorySink, MemoryStore};

const CLIENTS: usize = 4;
const SENDS: usize = 25;
const RECORDS_PER_SEND: usize = 3;

/// Sends one batch with its key until it is acknowledged.
async fn send_until_acknowledged(pipeline: &Pipeline<String>, key: String, records: Vec<String>) {
    for _attempt in 0..1_000 {
        match pipeline.send(records.clone(), Some(key.clone())).await {
            Ok(ticket) => match ticket.await {
                Ok(_) => return,
                Err(TicketError::NotCommitted | TicketError::Refused(_)) => {}
                Err(other) => panic!("{key}: {other}"),
            },
            Err(refused) if refused.refusal == Refusal::Unavailable => {}
            Err(refused) => panic!("{key}: {refused}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{key} was never acknowledged");
}

async fn scenario(failpoint: &'static str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = MemoryStore::<String>::new();
    if failpoint == "during-recovery-recommit" {
        // Reached only by a restore with something to commit again.
        fail::cfg("after-checkpoint-stored", "2*off->1*return->off").expect("valid failpoint");
        fail::cfg(failpoint, "1*return->off").expect("valid failpoint");
    } else if failpoint.starts_with("during-") {
        // Reached once per subtask, at shutdown.
        fail::cfg(failpoint, "1*return->off").expect("valid failpoint");
    } else {
        fail::cfg(failpoint, "2*off->1*return->off").expect("valid failpoint");
    }
    let hits_before = hits(failpoint);
    let pipeline = Pipeline::builder(
        "pipeline-crashes",
        MemorySink::new(store.clone()).roll_every(7),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(15)))
    .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).expect("a state directory"))
    .restart_strategy(RestartStrategy::FixedDelay {
        attempts: 10,
        delay: Duration::from_millis(5),
    })
    .start()
    .await
    .expect("the pipeline starts");
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let pipeline = pipeline.clone();
            tokio::spawn(async move {
                for send in 0..SENDS {
                    let records = (0..RECORDS_PER_SEND)
                        .map(|r| format!("c{client}-s{send}-r{r}"))
                        .collect();
                    send_until_acknowledged(&pipeline, format!("c{client}-s{send}"), records).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a client ran to its end");
    }
    let report = pipeline.shutdown().await.expect("the pipeline shuts down");
    fail::remove(failpoint);
    fail::remove("after-checkpoint-stored");
    assert_eq!(report.status, JobStatus::Finished, "{failpoint}");
    assert!(
        // The memory sink's point is not counted by the runtime's `hits`.
        (hits(failpoint) > hits_before || failpoint == "memory-commit-mid-batch")
            && report.metrics.restarts >= 1,
        "{failpoint}: the crash point was never reached (restarts {})",
        report.metrics.restarts
    );
    let mut counts = BTreeMap::<String, usize>::new();
    for record in store.committed() {
        *counts.entry(record).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "{failpoint}: committed more than once: {twice:?}"
    );
    assert_eq!(
        counts.len(),
        CLIENTS * SENDS * RECORDS_PER_SEND,
        "{failpoint}: acknowledged records are missing"
    );
    let violations = store.violations();
    assert!(violations.is_empty(), "{failpoint}: {violations:#?}");
}

#[test]
fn every_crash_point_leaves_every_acknowledged_send_exactly_once() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let points = FAILPOINTS
        .iter()
        .copied()
        // No global committer in a pipeline.
        .filter(|&point| point != "after-global-commit")
        .chain(["memory-commit-mid-batch"]);
    let mut scenarios = 0;
    for point in points {
        runtime.block_on(scenario(point));
        scenarios += 1;
    }
    println!(
        "pipeline crash tests: {scenarios} crash points, every acknowledged send exactly once"
    );
}
