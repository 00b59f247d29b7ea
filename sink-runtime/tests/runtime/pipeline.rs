//! The embedded pipeline: tickets resolve after the commit and never
//! before, fail when the commit can no longer happen, and idempotency keys
//! keep repeated sends from being written twice, across restarts and
//! restores (docs/embedding.md).

use std::collections::BTreeMap;
use std::time::Duration;

use sink_runtime::pipeline::{
    Ack, Fingerprint, IdempotencyKey, KeyNamespaces, KeyRetention, Pipeline, PipelineBuilder,
    PipelineError, PipelineState, Refusal, Ticket, TicketError,
};
use sink_runtime::{CheckpointConfig, LocalCheckpointStorage, RestartStrategy, RetryPolicy};
use sinks_memory::{InjectedCommitFailure, MemorySink, MemoryStore};

fn every(ms: u64) -> CheckpointConfig {
    CheckpointConfig::every(Duration::from_millis(ms))
}

fn counts(records: &[String]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        *counts.entry(record.clone()).or_default() += 1;
    }
    counts
}

/// A pipeline named `name` into `store`, checkpointing every `ms`, started.
async fn start_memory(name: &str, store: &MemoryStore<String>, ms: u64) -> Pipeline<String> {
    Pipeline::builder(name, MemorySink::new(store.clone()))
        .checkpointing(every(ms))
        .start()
        .await
        .unwrap_or_else(|e| panic!("starting pipeline {name}: {e}"))
}

fn restart_quickly() -> RestartStrategy {
    RestartStrategy::FixedDelay {
        attempts: 3,
        delay: Duration::from_millis(10),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_resolves_only_once_its_records_are_committed() {
    let store = MemoryStore::<String>::new();
    // Checkpoints far apart: the records are written long before any commit.
    let pipeline = Pipeline::builder("tickets", MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(every(60_000))
        .start()
        .await
        .unwrap();
    let mut ticket = pipeline
        .send(vec!["a".into(), "b".into()], None)
        .await
        .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), &mut ticket).await;
    assert!(
        early.is_err(),
        "a ticket resolved before any checkpoint: {early:?}"
    );
    assert_eq!(
        store.written().len(),
        2,
        "the records are written meanwhile"
    );
    assert!(store.committed().is_empty());
    // Shutdown takes the final checkpoint and commits it: now it resolves.
    let report = tokio::spawn({
        let pipeline = pipeline.clone();
        async move { pipeline.shutdown().await }
    });
    let ack = ticket.await.unwrap();
    assert_eq!(
        counts(&store.committed()).len(),
        2,
        "resolved, so committed"
    );
    assert!(!ack.duplicate);
    let report = report.await.unwrap().unwrap();
    assert_eq!(report.metrics.records_committed, 2);
    assert_eq!(report.last_checkpoint, Some(ack.checkpoint_id));
    assert_eq!(pipeline.state(), PipelineState::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ticket_resolves_after_its_records_are_in_the_committed_output() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("many", MemorySink::new(store.clone()))
        .parallelism(3)
        .checkpointing(every(20))
        .start()
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..200 {
        let records = vec![format!("{i}-a"), format!("{i}-b")];
        let key = (i % 2 == 0).then(|| format!("key-{i}"));
        tickets.push((i, pipeline.send(records, key).await.unwrap()));
    }
    for (i, ticket) in tickets {
        let ack = ticket.await.unwrap();
        let committed = store.committed();
        assert!(
            committed.contains(&format!("{i}-a")) && committed.contains(&format!("{i}-b")),
            "send {i} acknowledged in checkpoint {} before its records were committed",
            ack.checkpoint_id
        );
    }
    pipeline.shutdown().await.unwrap();
    let counts = counts(&store.committed());
    assert_eq!(counts.len(), 400);
    assert!(counts.values().all(|&n| n == 1), "a record committed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_key_is_answered_without_writing_again() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("keys", MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(every(30))
        .start()
        .await
        .unwrap();
    // Both sent before the first is committed: the second waits for the
    // first's commit and is answered with the same checkpoint.
    let first = pipeline
        .send(vec!["x".into()], Some("k1".into()))
        .await
        .unwrap();
    let second = pipeline
        .send(vec!["x".into()], Some("k1".into()))
        .await
        .unwrap();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(!first.duplicate);
    assert_eq!(
        second,
        Ack {
            checkpoint_id: first.checkpoint_id,
            duplicate: true
        }
    );
    // After the commit: answered at once from the key table.
    let third = pipeline
        .send(vec!["x".into()], Some("k1".into()))
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(third, second);
    // Another key with the same records is another send.
    pipeline
        .send(vec!["x".into()], Some("k2".into()))
        .await
        .unwrap()
        .await
        .unwrap();
    pipeline.shutdown().await.unwrap();
    assert_eq!(store.committed(), vec!["x".to_string(), "x".to_string()]);
}

/// `key` with the fingerprint `[byte; 16]`.
fn keyed(key: &str, byte: u8) -> IdempotencyKey {
    IdempotencyKey::new(key).with_fingerprint(Fingerprint::new([byte; 16]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_fingerprint_is_refused_in_flight_and_after_its_commit() {
    let store = MemoryStore::<String>::new();
    // Checkpoints far apart: the first send is still in flight when the
    // others arrive (`committed_in: None` says so).
    let pipeline = Pipeline::builder("reused", MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(every(1000))
        .start()
        .await
        .unwrap();
    let first = pipeline
        .send_keyed(vec!["a1".into(), "a2".into()], keyed("k", 1))
        .await
        .unwrap();
    let reused = pipeline
        .send_keyed(vec!["b1".into()], keyed("k", 2))
        .await
        .unwrap();
    let reused = tokio::time::timeout(Duration::from_millis(400), reused)
        .await
        .expect("a reused key is refused at once, not after the first send's commit");
    assert_eq!(reused, Err(TicketError::KeyReused { committed_in: None }));
    // The same fingerprint in flight is the duplicate it always was.
    let twin = pipeline
        .send_keyed(vec!["a1".into(), "a2".into()], keyed("k", 1))
        .await
        .unwrap();
    let first = first.await.unwrap();
    assert!(!first.duplicate);
    assert_eq!(
        twin.await,
        Ok(Ack {
            checkpoint_id: first.checkpoint_id,
            duplicate: true
        })
    );
    // After the commit: refused with the checkpoint that holds the first.
    let reused = pipeline
        .send_keyed(vec!["b1".into()], keyed("k", 2))
        .await
        .unwrap()
        .await;
    assert_eq!(
        reused,
        Err(TicketError::KeyReused {
            committed_in: Some(first.checkpoint_id)
        })
    );
    let message = reused.unwrap_err().to_string();
    assert!(
        message.contains("different content") && message.contains("new key"),
        "{message}"
    );
    // A plain key (no fingerprint) is matched by the key alone.
    let plain = pipeline
        .send(vec!["c1".into()], Some("k".into()))
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(plain.duplicate);
    let report = pipeline.shutdown().await.unwrap();
    assert_eq!(report.metrics.records_written, 2);
    assert_eq!(
        counts(&store.committed()),
        counts(&["a1".into(), "a2".into()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_fingerprint_is_refused_after_a_restart_from_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<String>::new();
    let start = |parallelism: usize| {
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        Pipeline::builder("reused-durable", MemorySink::new(store.clone()))
            .parallelism(parallelism)
            .checkpointing(every(20))
            .checkpoint_storage(storage)
            .restart_strategy(restart_quickly())
            .start()
    };
    let pipeline = start(2).await.unwrap();
    let mut first = BTreeMap::new();
    for i in 0..10u8 {
        let ack = pipeline
            .send_keyed(vec![format!("e{i}")], keyed(&format!("key-{i}"), i))
            .await
            .unwrap()
            .await
            .unwrap();
        first.insert(i, ack.checkpoint_id);
    }
    pipeline.shutdown().await.unwrap();

    // Restored from the final checkpoint, at another parallelism: the keys
    // came back with their fingerprints.
    let pipeline = start(3).await.unwrap();
    for i in 0..10u8 {
        let key = format!("key-{i}");
        let reused = pipeline
            .send_keyed(vec![format!("other-{i}")], keyed(&key, i + 100))
            .await
            .unwrap()
            .await;
        // Restored keys count as committed once the subtask heard of its
        // first commit after the restore; until then, "not committed yet".
        match reused {
            Err(TicketError::KeyReused { committed_in }) => assert!(
                committed_in.is_none_or(|c| c == first[&i]),
                "{key}: {committed_in:?}"
            ),
            other => panic!("{key}: a reused key was not refused: {other:?}"),
        }
        let retry = pipeline
            .send_keyed(vec![format!("e{i}")], keyed(&key, i))
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(retry.duplicate, "{key}");
        assert_eq!(retry.checkpoint_id, first[&i]);
    }

    // A restart inside the process (the commit of a checkpoint fails, the
    // job restores its last checkpoint): a key written just before is known
    // with its fingerprint too.
    store.fail_next_commits(1, InjectedCommitFailure::UnknownReason);
    let crashed = pipeline
        .send_keyed(vec!["x".into()], keyed("key-x", 1))
        .await
        .unwrap()
        .await;
    assert_eq!(crashed, Err(TicketError::NotCommitted));
    wait_running(&pipeline).await;
    let reused = loop {
        match pipeline
            .send_keyed(vec!["y".into()], keyed("key-x", 2))
            .await
        {
            Ok(ticket) => match ticket.await {
                Err(TicketError::NotCommitted) => wait_running(&pipeline).await,
                other => break other,
            },
            Err(refused) => {
                assert_eq!(refused.refusal, Refusal::Unavailable);
                wait_running(&pipeline).await;
            }
        }
    };
    assert!(
        matches!(reused, Err(TicketError::KeyReused { .. })),
        "{reused:?}"
    );
    let report = pipeline.shutdown().await.unwrap();
    assert!(report.metrics.restarts >= 1);
    let mut expected: Vec<String> = (0..10).map(|i| format!("e{i}")).collect();
    expected.push("x".into());
    assert_eq!(counts(&store.committed()), counts(&expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_fail_when_the_job_fails_before_the_commit_and_a_retry_is_not_duplicated() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("crash", MemorySink::new(store.clone()))
        .checkpointing(every(30))
        .restart_strategy(restart_quickly())
        .start()
        .await
        .unwrap();
    // The commit of the first checkpoint with the records fails for an
    // unknown reason: the job restarts, the records' checkpoint is
    // committed by the restore, but the ticket could not know that.
    store.fail_next_commits(1, InjectedCommitFailure::UnknownReason);
    let ticket = pipeline
        .send(vec!["r1".into()], Some("req-1".into()))
        .await
        .unwrap();
    // Empty checkpoints make no transaction, so the failure hits this one.
    assert_eq!(ticket.await, Err(TicketError::NotCommitted));
    wait_running(&pipeline).await;
    let retry = loop {
        match pipeline.send(vec!["r1".into()], Some("req-1".into())).await {
            Ok(ticket) => match ticket.await {
                Ok(ack) => break ack,
                Err(TicketError::NotCommitted) => wait_running(&pipeline).await,
                Err(other) => panic!("{other}"),
            },
            Err(refused) => {
                assert_eq!(refused.refusal, Refusal::Unavailable);
                wait_running(&pipeline).await;
            }
        }
    };
    assert!(
        retry.duplicate,
        "a send whose records a restore committed was not recognised"
    );
    let report = pipeline.shutdown().await.unwrap();
    assert!(report.metrics.restarts >= 1);
    assert_eq!(store.committed(), vec!["r1".to_string()]);
}

async fn wait_running<R>(pipeline: &Pipeline<R>) {
    for _ in 0..500 {
        if pipeline.state() == PipelineState::Running {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pipeline did not run again: {:?}", pipeline.state());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_of_records_lost_at_commit_fails_and_their_key_is_forgotten() {
    let store = MemoryStore::<String>::new();
    let pipeline = start_memory("lost", &store, 30).await;
    // Let the pipeline settle on empty checkpoints first, then lose the
    // commit of the next one with records.
    pipeline.send(vec![], None).await.unwrap().await.unwrap();
    store.fail_next_commits(1, InjectedCommitFailure::KnownReason);
    let lost = pipeline
        .send(vec!["l".into()], Some("req".into()))
        .await
        .unwrap()
        .await;
    assert!(
        matches!(lost, Err(TicketError::PartlyLost { .. })),
        "{lost:?}"
    );
    assert!(store.committed().is_empty());
    // The key was forgotten: the retry writes the records again.
    let retry = pipeline
        .send(vec!["l".into()], Some("req".into()))
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!retry.duplicate);
    pipeline.shutdown().await.unwrap();
    assert_eq!(store.committed(), vec!["l".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_survive_a_shutdown_and_a_restart_with_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<String>::new();
    let start = |parallelism: usize| {
        let storage = LocalCheckpointStorage::open(dir.path()).unwrap();
        Pipeline::builder("durable", MemorySink::new(store.clone()))
            .parallelism(parallelism)
            .checkpointing(every(20))
            .checkpoint_storage(storage)
            .start()
    };
    let pipeline = start(2).await.unwrap();
    let mut first = BTreeMap::new();
    for i in 0..30 {
        let ack = pipeline
            .send(vec![format!("e{i}")], Some(format!("key-{i}")))
            .await
            .unwrap()
            .await
            .unwrap();
        first.insert(i, ack.checkpoint_id);
    }
    pipeline.shutdown().await.unwrap();

    // Started again on the same storage: not "already finished", and every
    // key is still known, though its partition now lives on another subtask.
    for parallelism in [3, 1] {
        let pipeline = start(parallelism).await.unwrap();
        for i in 0..30 {
            let ack = pipeline
                .send(vec![format!("e{i}")], Some(format!("key-{i}")))
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(
                ack.duplicate,
                "key-{i} forgotten after a restart at parallelism {parallelism}"
            );
            assert_eq!(ack.checkpoint_id, first[&i]);
        }
        pipeline
            .send(vec![format!("new-{parallelism}")], None)
            .await
            .unwrap()
            .await
            .unwrap();
        pipeline.shutdown().await.unwrap();
    }
    let counts = counts(&store.committed());
    assert_eq!(counts.len(), 32);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_keys_are_forgotten_which_is_the_limit_of_the_guarantee() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("expiry", MemorySink::new(store.clone()))
        .checkpointing(every(20))
        .key_partitions(1)
        .key_retention(KeyRetention {
            max_keys: 2,
            max_age: Duration::from_secs(3600),
        })
        .start()
        .await
        .unwrap();
    for key in ["a", "b", "c", "d"] {
        pipeline
            .send(vec![key.into()], Some(key.into()))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // "d" is recent: a repeat is recognised. "a" was pushed out by newer
    // keys: a repeat is written again.
    let d = pipeline
        .send(vec!["d".into()], Some("d".into()))
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(d.duplicate);
    let a = pipeline
        .send(vec!["a".into()], Some("a".into()))
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!a.duplicate);
    pipeline.shutdown().await.unwrap();
    assert_eq!(counts(&store.committed())["a"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_sending_new_keys_fast_does_not_push_out_another_tenants_keys() {
    let store = MemoryStore::<String>::new();
    // Keys `<tenant>/<key>`, budgeted per tenant as ingest-service keeps
    // them: 40 per tenant, so 10 in each of the 4 partitions.
    let pipeline = Pipeline::builder("tenants", MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(every(20))
        .key_partitions(4)
        .key_retention(KeyRetention {
            max_keys: 40,
            max_age: Duration::from_secs(3600),
        })
        .key_namespaces(KeyNamespaces::Prefix { separator: '/' })
        .start()
        .await
        .unwrap();
    // Each send's record is its key; returns its ticket.
    async fn send(pipeline: &Pipeline<String>, key: String) -> Ticket {
        pipeline
            .send_keyed(vec![key.clone()], IdempotencyKey::new(key))
            .await
            .unwrap()
    }
    // The polite tenant's 5 keys: at most 5 in any partition, within its
    // budget.
    let polite: Vec<String> = (0..5).map(|i| format!("polite/{i}")).collect();
    let mut first = BTreeMap::new();
    for key in &polite {
        let ack = send(&pipeline, key.clone()).await.await.unwrap();
        first.insert(key.clone(), ack.checkpoint_id);
    }
    // The greedy one sends 400 new keys (about 100 a partition, ten times
    // its budget), every one committed before the retries below.
    let mut tickets = Vec::new();
    for i in 0..400 {
        tickets.push(send(&pipeline, format!("greedy/{i}")).await);
    }
    for ticket in tickets {
        assert!(!ticket.await.unwrap().duplicate);
    }
    // The polite tenant's retries are recognised: answered with the first
    // checkpoint, not written again.
    for key in &polite {
        let ack = send(&pipeline, key.clone()).await.await.unwrap();
        assert!(
            ack.duplicate,
            "{key} was pushed out by another tenant's new keys"
        );
        assert_eq!(ack.checkpoint_id, first[key], "{key}");
    }
    // The greedy tenant's own oldest keys went: past its budget, a retry of
    // its first key is written again.
    let again = send(&pipeline, "greedy/0".to_string()).await.await.unwrap();
    assert!(
        !again.duplicate,
        "the greedy tenant kept more than its budget"
    );
    pipeline.shutdown().await.unwrap();
    let counts = counts(&store.committed());
    for key in &polite {
        assert_eq!(counts[key], 1, "{key}");
    }
    assert_eq!(counts["greedy/0"], 2);
    assert_eq!(counts.len(), 405);
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_channel_refuses_try_send_and_hands_the_records_back() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("full", MemorySink::new(store.clone()))
        .capacity(2)
        .checkpointing(every(20))
        .start()
        .await
        .unwrap();
    // On one thread the reader cannot run between these calls.
    let t1 = pipeline.try_send(vec!["1".into()], None).unwrap();
    let t2 = pipeline.try_send(vec!["2".into()], None).unwrap();
    assert_eq!(pipeline.queued(), 2);
    let refused = pipeline.try_send(vec!["3".into()], None).unwrap_err();
    assert_eq!(refused.refusal, Refusal::Full);
    assert_eq!(refused.records, vec!["3".to_string()]);
    // `send` waits for room instead.
    let t3 = pipeline.send(refused.records, None).await.unwrap();
    for ticket in [t1, t2, t3] {
        ticket.await.unwrap();
    }
    pipeline.shutdown().await.unwrap();
    assert_eq!(store.committed().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_after_shutdown_are_refused_and_a_second_shutdown_is_an_error() {
    let store = MemoryStore::<String>::new();
    let pipeline = start_memory("closed", &store, 20).await;
    pipeline.shutdown().await.unwrap();
    let refused = pipeline.send(vec!["late".into()], None).await.unwrap_err();
    assert_eq!(refused.refusal, Refusal::Closed);
    assert_eq!(refused.records, vec!["late".to_string()]);
    assert!(matches!(
        pipeline.shutdown().await,
        Err(PipelineError::AlreadyShutDown { .. })
    ));
    assert!(store.written().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_without_checkpointing_is_refused_with_the_fix() {
    let error = Pipeline::builder("nockpt", MemorySink::new(MemoryStore::<String>::new()))
        .start()
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("needs checkpointing"), "{message}");
    assert!(message.contains(".checkpointing("), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_fail_when_the_job_fails_for_good() {
    let store = MemoryStore::<String>::new();
    let pipeline = start_memory("fails", &store, 60_000).await;
    store.panic_next_writes(1);
    let ticket = pipeline.send(vec!["boom".into()], None).await.unwrap();
    assert_eq!(ticket.await, Err(TicketError::NotCommitted));
    // The job is gone: later sends are refused, shutdown reports the failure.
    for _ in 0..100 {
        if pipeline.state() == PipelineState::Stopped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pipeline.state(), PipelineState::Stopped);
    let refused = pipeline.send(vec!["after".into()], None).await.unwrap_err();
    assert_eq!(refused.refusal, Refusal::Closed);
    assert!(matches!(
        pipeline.shutdown().await,
        Err(PipelineError::Job(_))
    ));
    assert!(store.committed().is_empty());
}

/// Run 1 at parallelism 1 leaves a completed checkpoint with keyed sends
/// whose commit failed; returns the storage directory and the store.
async fn leave_a_checkpoint_uncommitted(
    name: &'static str,
) -> (tempfile::TempDir, MemoryStore<String>) {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<String>::new();
    store.fail_next_commit_calls(1);
    let pipeline = Pipeline::builder(name, MemorySink::new(store.clone()))
        .checkpointing(every(20))
        .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
        .start()
        .await
        .unwrap();
    let tickets: Vec<_> = (0..10)
        .map(|i| {
            pipeline
                .try_send(vec![format!("e{i}")], Some(format!("key-{i}")))
                .unwrap()
        })
        .collect();
    for ticket in tickets {
        assert_eq!(ticket.await, Err(TicketError::NotCommitted));
    }
    assert!(
        pipeline.shutdown().await.is_err(),
        "the failed commit fails the job"
    );
    assert!(store.committed().is_empty());
    (dir, store)
}

fn restart_at_two(
    name: &'static str,
    dir: &std::path::Path,
    store: &MemoryStore<String>,
) -> PipelineBuilder<MemorySink<String>> {
    Pipeline::builder(name, MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(every(20))
        .checkpoint_storage(LocalCheckpointStorage::open(dir).unwrap())
}

/// After a rescale, a key partition and the committables of its records can
/// land on different subtasks: a repeated key must not be acknowledged
/// before the subtask re-committing its records is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rescale_a_repeated_key_waits_for_the_recommit_of_its_records() {
    let (dir, store) = leave_a_checkpoint_uncommitted("rescale-slow").await;
    // The re-commit is retried for a while (about half a second).
    store.fail_next_commits(8, InjectedCommitFailure::RetryLater);
    let pipeline = restart_at_two("rescale-slow", dir.path(), &store)
        .commit_retry(RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        })
        .start()
        .await
        .unwrap();
    let checks: Vec<_> = (0..10)
        .map(|i| {
            let ticket = pipeline
                .try_send(vec![format!("e{i}")], Some(format!("key-{i}")))
                .unwrap();
            let store = store.clone();
            tokio::spawn(async move {
                let ack = ticket.await.unwrap();
                (i, ack, store.committed().contains(&format!("e{i}")))
            })
        })
        .collect();
    for check in checks {
        let (i, ack, committed) = check.await.unwrap();
        assert!(ack.duplicate, "e{i}: {ack:?}");
        assert!(
            committed,
            "key-{i} acknowledged before its records were committed"
        );
    }
    pipeline.shutdown().await.unwrap();
    assert_eq!(counts(&store.committed()).values().sum::<usize>(), 10);
}

/// After a rescale, a re-commit that loses output makes every subtask forget
/// the keys of that checkpoint, wherever their partitions went: the retries
/// are written, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rescale_a_lost_recommit_forgets_its_keys_on_every_subtask() {
    let (dir, store) = leave_a_checkpoint_uncommitted("rescale-lost").await;
    store.fail_next_commits(1, InjectedCommitFailure::KnownReason);
    let pipeline = restart_at_two("rescale-lost", dir.path(), &store)
        .start()
        .await
        .unwrap();
    for i in 0..10 {
        let key = Some(format!("key-{i}"));
        let ack = loop {
            match pipeline
                .send(vec![format!("e{i}")], key.clone())
                .await
                .unwrap()
                .await
            {
                Ok(ack) => break ack,
                // The send's wait for the lost checkpoint fails; the retry is written.
                Err(TicketError::PartlyLost { .. }) => continue,
                Err(other) => panic!("e{i}: {other}"),
            }
        };
        assert!(
            !ack.duplicate,
            "key-{i} answered from a lost checkpoint: {ack:?}"
        );
    }
    pipeline.shutdown().await.unwrap();
    let counts = counts(&store.committed());
    assert_eq!(counts.len(), 10, "{counts:?}");
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_reader_with_too_many_unanswered_sends_stops_taking_more() {
    let store = MemoryStore::<String>::new();
    // The first checkpoint comes after the sends: nothing is answered
    // meanwhile.
    let pipeline = Pipeline::builder("in-flight", MemorySink::new(store.clone()))
        .capacity(2)
        .max_in_flight(3)
        .checkpointing(every(1_500))
        .start()
        .await
        .unwrap();
    let mut tickets = Vec::new();
    let mut refused = 0;
    for i in 0..20 {
        match pipeline.try_send(vec![format!("{i}")], None) {
            Ok(ticket) => tickets.push(ticket),
            Err(error) => {
                assert_eq!(error.refusal, Refusal::Full);
                refused += 1;
            }
        }
        // Let the reader run between sends.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Three taken in by the reader, two queued in the channel.
    assert_eq!(tickets.len(), 5, "refused {refused}");
    assert_eq!(store.written().len(), 3);
    assert_eq!(pipeline.queued(), 2);
    let report = tokio::spawn({
        let pipeline = pipeline.clone();
        async move { pipeline.shutdown().await }
    });
    for ticket in tickets {
        ticket.await.unwrap();
    }
    report.await.unwrap().unwrap();
    assert_eq!(store.committed().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_returns_once_the_pipeline_failed_for_good() {
    let store = MemoryStore::<String>::new();
    let pipeline = start_memory("stopped", &store, 20).await;
    let watcher = tokio::spawn({
        let pipeline = pipeline.clone();
        async move { pipeline.stopped().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!watcher.is_finished(), "stopped() returned while running");
    store.panic_next_writes(1);
    let _failed = pipeline
        .send(vec!["boom".into()], None)
        .await
        .unwrap()
        .await;
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("stopped() returns after the failure")
        .unwrap();
    assert_eq!(pipeline.state(), PipelineState::Stopped);
}

/// On demand, a send is committed by a checkpoint triggered for it, not one
/// an interval later: on a paused clock with a maximum interval of an hour,
/// every ticket resolves within a second of virtual time, and each send
/// takes a checkpoint of its own.
#[tokio::test(start_paused = true)]
async fn on_demand_a_checkpoint_follows_a_send_without_waiting_for_the_interval() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("on-demand", MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::on_demand(
            Duration::ZERO,
            Duration::from_secs(3600),
        ))
        .start()
        .await
        .unwrap();
    for round in 0..5u32 {
        let started = tokio::time::Instant::now();
        let ticket = pipeline
            .send(vec![format!("r{round}")], None)
            .await
            .unwrap();
        ticket.await.unwrap();
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "send {round} was committed after {waited:?} of virtual time: it waited for the interval"
        );
    }
    let triggered = pipeline.metrics().checkpoints_triggered;
    assert!(
        (5..=6).contains(&triggered),
        "5 sends one after the other should take 5 checkpoints, took {triggered}"
    );
    pipeline.shutdown().await.unwrap();
    assert_eq!(counts(&store.committed()).len(), 5);
}

/// On demand and idle, checkpoints come only on the maximum interval: 10
/// minutes of virtual time at a maximum interval of one minute take 10 of
/// them, not more; then a send is committed by a checkpoint of its own.
#[tokio::test(start_paused = true)]
async fn on_demand_no_checkpoint_while_idle_beyond_the_maximum_interval() {
    let store = MemoryStore::<String>::new();
    let pipeline = Pipeline::builder("on-demand-idle", MemorySink::new(store.clone()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::on_demand(
            Duration::from_millis(5),
            Duration::from_secs(60),
        ))
        .start()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(600) + Duration::from_millis(500)).await;
    let idle = pipeline.metrics().checkpoints_triggered;
    assert_eq!(idle, 10, "10 maximum intervals while idle");
    pipeline
        .send(vec!["late".into()], None)
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(pipeline.metrics().checkpoints_triggered, idle + 1);
    pipeline.shutdown().await.unwrap();
    assert_eq!(store.committed(), vec!["late".to_string()]);
}

/// A minimum pause longer than the maximum interval cannot be kept: refused.
#[tokio::test]
async fn on_demand_with_a_pause_longer_than_the_interval_is_refused() {
    let result = Pipeline::builder(
        "on-demand-bad",
        MemorySink::new(MemoryStore::<String>::new()),
    )
    .checkpointing(CheckpointConfig::on_demand(
        Duration::from_secs(2),
        Duration::from_secs(1),
    ))
    .start()
    .await;
    let Err(error) = result else {
        panic!("a pause longer than the interval was accepted")
    };
    let error = error.to_string();
    assert!(error.contains("minimum pause"), "{error}");
}

/// The memory sink with a global committer that commits a checkpoint only
/// when the test lets it (one permit per checkpoint).
struct GatedGlobal {
    inner: MemorySink<String>,
    store: MemoryStore<String>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

struct GatedCommitter {
    inner: sinks_memory::MemoryGlobalCommitter<String>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

#[sink_api::async_trait]
impl sink_api::GlobalCommitter for GatedCommitter {
    type Committable = sinks_memory::MemoryCommittable;

    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: sink_api::CheckpointId,
        committables: Vec<sinks_memory::MemoryCommittable>,
    ) -> Result<(), sink_api::SinkError> {
        self.gate
            .acquire()
            .await
            .expect("the gate stays open")
            .forget();
        self.inner
            .commit_checkpoint(checkpoint_id, committables)
            .await
    }
}

#[sink_api::async_trait]
impl sink_api::Sink for GatedGlobal {
    type Writer = <MemorySink<String> as sink_api::Sink>::Writer;
    type Committer = <MemorySink<String> as sink_api::Sink>::Committer;

    async fn on_start(
        &self,
        start: &sink_api::JobStart<
            '_,
            sink_api::CommittableOf<MemorySink<String>>,
            sink_api::WriterStateOf<MemorySink<String>>,
        >,
    ) -> Result<(), sink_api::SinkError> {
        self.inner.on_start(start).await
    }

    async fn create_writer(
        &self,
        context: &sink_api::InitContext,
        restored: Vec<sink_api::WriterStateOf<MemorySink<String>>>,
    ) -> Result<Self::Writer, sink_api::SinkError> {
        self.inner.create_writer(context, restored).await
    }

    async fn create_committer(
        &self,
        context: &sink_api::InitContext,
    ) -> Result<Self::Committer, sink_api::SinkError> {
        self.inner.create_committer(context).await
    }

    fn global_committer(
        &self,
    ) -> Option<sink_api::GlobalCommitterFactory<sinks_memory::MemoryCommittable>> {
        let (store, gate) = (self.store.clone(), self.gate.clone());
        Some(Box::new(move |_| {
            Box::new(GatedCommitter {
                inner: sinks_memory::MemoryGlobalCommitter::new(store.clone()),
                gate: gate.clone(),
            })
        }))
    }
}

/// With a global committer, data is visible only once it committed (a
/// Delta table's files): a ticket resolves after the global commit, not
/// after the subtask's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_global_committer_a_ticket_resolves_only_after_the_global_commit() {
    let store = MemoryStore::<String>::new();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let sink = GatedGlobal {
        inner: MemorySink::new(store.clone()),
        store: store.clone(),
        gate: gate.clone(),
    };
    let pipeline = Pipeline::builder("gated", sink)
        .parallelism(2)
        .checkpointing(every(20))
        .start()
        .await
        .unwrap();
    let mut ticket = pipeline
        .send(vec!["a".into(), "b".into()], Some("k".into()))
        .await
        .unwrap();
    // The subtasks commit within a few checkpoints; the global one cannot.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while counts(&store.committed()).len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "never committed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let early = tokio::time::timeout(Duration::from_millis(300), &mut ticket).await;
    assert!(
        early.is_err(),
        "the ticket resolved before the global commit: {early:?}"
    );
    // A retry of the key is not answered as committed either.
    let mut retry = pipeline
        .send(vec!["a".into(), "b".into()], Some("k".into()))
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut retry)
            .await
            .is_err(),
        "a retry was answered before the global commit"
    );
    gate.add_permits(1_000_000);
    let ack = ticket.await.unwrap();
    assert!(!ack.duplicate);
    assert!(retry.await.unwrap().duplicate);
    pipeline.shutdown().await.unwrap();
    assert_eq!(counts(&store.committed()).len(), 2);
    assert!(store.violations().is_empty(), "{:?}", store.violations());
}
