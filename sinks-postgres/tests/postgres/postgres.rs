//! The PostgreSQL sink against a real server (`scripts/with-postgres`
//! provides it; `cargo test -p sinks-postgres --features postgres-tests`):
//! the write-up's three modes, start-up refusals, replayed and lost commits,
//! lingering prepared transactions, lost connections. Rows are counted with
//! SQL. Each test has its own table and job name, so they run in parallel.

use crate::common;

use std::time::Duration;

use common::*;
use sink_api::{CheckpointId, CommitOutcome, CommitRequest, Committer, InitContext, Sink};
use sink_runtime::source::Source;
use sink_runtime::{
    BuildError, CheckpointConfig, Job, JobStatus, LocalCheckpointStorage, RestartStrategy,
    SequenceSource,
};
use sinks_postgres::{ConnectError, PgCommittable, PostgresSink};

/// The sink into `table`, its connections named after the table.
async fn connect_sink(table: &str, parallelism: usize) -> PostgresSink<Row> {
    PostgresSink::connect(&url_for(table), table, parallelism)
        .await
        .unwrap_or_else(|e| panic!("connecting the sink: {e}"))
}

/// A client, a fresh `table`, and a sink into it.
async fn fresh_table_and_sink(
    table: &str,
    parallelism: usize,
) -> (tokio_postgres::Client, PostgresSink<Row>) {
    let db = client(&url()).await;
    fresh_table(&db, table).await;
    (db, connect_sink(table, parallelism).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_up_unbounded_with_checkpoints_commits_every_row_once() {
    let (db, sink) = fresh_table_and_sink("wu_unbounded", 2).await;
    let stats = sink.stats_handle();
    let handle = Job::builder(
        "wu-unbounded",
        SequenceSource::unbounded(160).map(Row::with_id),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(100)))
    .build()
    .unwrap()
    .start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handle.metrics().records_committed < 160 {
        assert!(
            std::time::Instant::now() < deadline,
            "160 rows not committed in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.metrics.records_committed, 160);
    assert_exactly_once(&db, "wu_unbounded", 160, "unbounded with checkpoints").await;
    assert!(
        prepared_of(&db, "wu-unbounded").await.is_empty(),
        "prepared transactions left"
    );
    assert_eq!(open_transactions(&db, "wu_unbounded").await, 0);
    assert!(stats().transactions_committed >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_up_unbounded_without_checkpoints_is_refused_and_when_forced_commits_nothing() {
    let db = client(&url()).await;
    fresh_table(&db, "wu_nockpt").await;
    let source = || SequenceSource::unbounded(160).map(Row::with_id);
    let refused = Job::builder("wu-nockpt", source(), connect_sink("wu_nockpt", 2).await)
        .parallelism(2)
        .build()
        .unwrap_err();
    assert!(
        matches!(refused, BuildError::UnboundedWithoutCheckpointing { .. }),
        "{refused}"
    );
    let sink = connect_sink("wu_nockpt", 2).await;
    let stats = sink.stats_handle();
    let handle = Job::builder("wu-nockpt", source(), sink)
        .parallelism(2)
        .allow_uncommitted_output()
        .build()
        .unwrap()
        .start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handle.metrics().records_written < 160 {
        assert!(
            std::time::Instant::now() < deadline,
            "160 rows not written in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.cancel();
    let report = handle.join().await.unwrap();
    assert_eq!(report.metrics.records_written, 160);
    assert_eq!(report.metrics.records_committed, 0);
    assert_eq!(report.metrics.prepare_commit_calls, 0);
    // Written inside transactions that were never prepared, and rolled back
    // when the writers closed: nothing visible, nothing left open.
    assert!(id_counts(&db, "wu_nockpt").await.is_empty());
    assert_eq!(stats().rows_written, 160);
    assert_eq!(stats().transactions_prepared, 0);
    assert_eq!(open_transactions(&db, "wu_nockpt").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_up_bounded_without_checkpoints_commits_everything_at_the_end() {
    let (db, sink) = fresh_table_and_sink("wu_bounded", 2).await;
    let stats = sink.stats_handle();
    let report = Job::builder(
        "wu-bounded",
        SequenceSource::bounded(160).map(Row::with_id),
        sink,
    )
    .parallelism(2)
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.prepare_commit_calls, 2);
    assert_exactly_once(&db, "wu_bounded", 160, "bounded without checkpoints").await;
    assert_eq!(stats().transactions_prepared, 2);
    assert_eq!(stats().transactions_committed, 2);
    assert!(prepared_of(&db, "wu-bounded").await.is_empty());
    assert_eq!(
        open_transactions(&db, "wu_bounded").await,
        0,
        "a writer left a transaction open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_prepared_transactions_is_refused_with_the_setting_to_change() {
    let error = PostgresSink::<Row>::connect(&url_without_prepared_transactions(), "t", 2)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ConnectError::PreparedTransactionsOff { needed: 4 }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("max_prepared_transactions = 0"),
        "{message}"
    );
    assert!(
        message.contains("set max_prepared_transactions to at least 4"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_a_missing_column_and_a_type_mismatch_are_refused_at_connect() {
    let db = client(&url()).await;
    db.batch_execute("DROP TABLE IF EXISTS no_such_table")
        .await
        .unwrap();
    let missing = PostgresSink::<Row>::connect(&url(), "no_such_table", 1)
        .await
        .unwrap_err();
    let message = missing.to_string();
    assert!(
        message.contains("table no_such_table does not exist"),
        "{message}"
    );
    assert!(
        message.contains("CREATE TABLE no_such_table (id int8, payload text)"),
        "{message}"
    );

    db.batch_execute(
        "DROP TABLE IF EXISTS wrong_type; CREATE TABLE wrong_type (id text, payload text)",
    )
    .await
    .unwrap();
    let mismatch = PostgresSink::<Row>::connect(&url(), "wrong_type", 1)
        .await
        .unwrap_err();
    let message = mismatch.to_string();
    assert!(
        message.contains("column id is text, but the records give int8"),
        "{message}"
    );

    db.batch_execute("DROP TABLE IF EXISTS no_payload; CREATE TABLE no_payload (id bigint)")
        .await
        .unwrap();
    let no_column = PostgresSink::<Row>::connect(&url(), "no_payload", 1)
        .await
        .unwrap_err();
    assert!(
        no_column.to_string().contains("it has no column payload"),
        "{no_column}"
    );

    let bad = PostgresSink::<Row>::connect("host=127.0.0.1 port=notaport", "t", 1)
        .await
        .unwrap_err();
    assert!(
        matches!(bad, ConnectError::BadConnectionString { .. }),
        "{bad}"
    );
}

fn context(job: &str) -> InitContext {
    InitContext::new(
        job.to_string(),
        sink_api::Lineage::new("test-lineage"),
        sink_api::Generation(1),
        0,
        1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_commit_is_recognised_and_a_lost_one_is_a_known_failure() {
    let (db, sink) = fresh_table_and_sink("replay", 1).await;
    let report = Job::builder(
        "replay",
        SequenceSource::bounded(10).map(Row::with_id),
        sink,
    )
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.metrics.records_committed, 10);
    let gid: String = db
        .query_one(
            &format!(
                "SELECT gid FROM {} WHERE gid LIKE 'eo1/replay/%'",
                sinks_postgres::MARKER_TABLE
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The same committable again, as after a crash between the commit and
    // the checkpoint that would have recorded it; and one the server never saw.
    let sink = connect_sink("replay", 1).await;
    let mut committer = sink.create_committer(&context("replay")).await.unwrap();
    let mut requests = vec![
        CommitRequest::new(
            PgCommittable {
                gid: gid.clone(),
                rows: 10,
                advances: Vec::new(),
                superseded: None,
                chained_on: Vec::new(),
            },
            CheckpointId(1),
            0,
        ),
        CommitRequest::new(
            PgCommittable {
                gid: "eo1/replay/feed/9/0/99".into(),
                rows: 5,
                advances: Vec::new(),
                superseded: None,
                chained_on: Vec::new(),
            },
            CheckpointId(99),
            0,
        ),
    ];
    committer.commit(&mut requests).await.unwrap();
    assert_eq!(requests[0].outcome(), &CommitOutcome::AlreadyCommitted);
    assert!(
        matches!(requests[1].outcome(), CommitOutcome::FailedWithKnownReason(reason) if reason.contains("neither prepared nor committed")),
        "{:?}",
        requests[1].outcome()
    );
    let stats = sink.stats();
    assert_eq!((stats.already_committed, stats.lost), (1, 1));
    assert_exactly_once(&db, "replay", 10, "after the replay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_prepared_transactions_of_the_job_are_rolled_back_at_start() {
    let db = client(&url()).await;
    fresh_table(&db, "linger").await;
    // What a crashed start leaves: prepared transactions of checkpoints that
    // never completed, holding rows that must never become visible.
    let left = client(&url()).await;
    for gid in [
        "eo1/linger/aaaa/1/0/3",
        "eo1/linger/bbbb/1/1/3",
        "eo1/other-job/cccc/1/0/3",
    ] {
        left.batch_execute(&format!(
            "BEGIN; INSERT INTO linger VALUES (-1, 'from a crashed start'); PREPARE TRANSACTION '{gid}'"
        ))
        .await
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let sink = connect_sink("linger", 2).await;
    let stats = sink.stats_handle();
    let report = Job::builder(
        "linger",
        SequenceSource::bounded(100).map(Row::with_id),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
    .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(stats().rolled_back_at_start, 2);
    // The same counter, registered in the job's metrics.
    let rolled_back = report
        .metrics
        .sink
        .iter()
        .find(|c| c.name == "postgres_sink_rolled_back_at_start");
    assert_eq!(
        rolled_back.map(|c| c.value),
        Some(2),
        "{:?}",
        report.metrics.sink
    );
    assert!(
        prepared_of(&db, "linger").await.is_empty(),
        "lingering transactions left"
    );
    assert_eq!(
        prepared_of(&db, "other-job").await,
        vec!["eo1/other-job/cccc/1/0/3".to_string()]
    );
    db.batch_execute("ROLLBACK PREPARED 'eo1/other-job/cccc/1/0/3'")
        .await
        .unwrap();
    assert_exactly_once(&db, "linger", 100, "after the rollback").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connections_are_survived_by_restarts_and_commit_retries() {
    let db = client(&url()).await;
    fresh_table(&db, "lost_conn").await;
    let dir = tempfile::tempdir().unwrap();
    let sink = connect_sink("lost_conn", 2).await;
    let stats = sink.stats_handle();
    let handle = Job::builder(
        "lost-conn",
        SequenceSource::bounded(4_000)
            .paced(2_000)
            .map(Row::with_id),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
    .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
    .restart_strategy(RestartStrategy::FixedDelay {
        attempts: 20,
        delay: Duration::from_millis(50),
    })
    .build()
    .unwrap()
    .start();
    // Cut every other connection of the database a few times while it runs.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        db.batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'lost_conn'",
        )
        .await
        .unwrap();
    }
    let report = tokio::time::timeout(Duration::from_secs(60), handle.join())
        .await
        .expect("the job ends")
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(
        report.metrics.restarts >= 1,
        "no connection was cut while in use"
    );
    assert_exactly_once(&db, "lost_conn", 4_000, "after lost connections").await;
    assert!(prepared_of(&db, "lost-conn").await.is_empty());
    let _ = stats();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_started_again_on_new_checkpoint_storage_does_not_meet_its_old_transaction_ids() {
    let db = client(&url()).await;
    fresh_table(&db, "reset").await;
    // Each run counts generations and checkpoints from 1 again; the
    // transaction ids must still be new, or the commit markers collide (and
    // a lost transaction could pass for a committed one).
    for run in 1..=2u64 {
        let dir = tempfile::tempdir().unwrap();
        let report = Job::builder(
            "reset",
            SequenceSource::bounded(50).map(Row::with_id),
            connect_sink("reset", 1).await,
        )
        .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
        .build()
        .unwrap()
        .run()
        .await
        .unwrap_or_else(|e| panic!("run {run}: {e}"));
        assert_eq!(report.metrics.records_committed, 50, "run {run}");
    }
    let counts = id_counts(&db, "reset").await;
    assert_eq!(counts.len(), 50);
    assert!(
        counts.values().all(|&n| n == 2),
        "each run's rows once: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_instance_of_a_job_is_refused() {
    let db = client(&url()).await;
    fresh_table(&db, "twice").await;
    let source = || SequenceSource::unbounded(10).map(Row::with_id);
    let first = Job::builder("twice", source(), connect_sink("twice", 1).await)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .unwrap()
        .start();
    // Let the first instance take the job's lock.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while first.metrics().records_committed < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first instance did not commit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another instance of the same job (its own checkpoint storage) would
    // roll back the first one's prepared transactions at its start.
    let second = Job::builder("twice", source(), connect_sink("twice", 1).await)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .unwrap()
        .run();
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second instance was refused, not left running")
        .unwrap_err();
    assert!(
        second
            .to_string()
            .contains("another live instance of job 'twice'"),
        "{second}"
    );
    first.cancel();
    first.join().await.unwrap();
    assert_exactly_once(&db, "twice", 10, "after the refused second instance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_whose_connection_was_cut_commits_on_a_new_one() {
    let (db, sink) = fresh_table_and_sink("recommit_conn", 1).await;
    let mut committer = sink
        .create_committer(&context("recommit_conn"))
        .await
        .unwrap();
    // Two transactions prepared as a writer would, with their markers.
    let prepare = |gid: &'static str, id: i64| {
        let url = url();
        async move {
            let writer = client(&url).await;
            writer
                .batch_execute(&format!(
                    "BEGIN; INSERT INTO recommit_conn VALUES ({id}, 'p'); \
                     INSERT INTO {} (gid, rows) VALUES ('{gid}', 1); PREPARE TRANSACTION '{gid}'",
                    sinks_postgres::MARKER_TABLE
                ))
                .await
                .unwrap();
        }
    };
    prepare("eo1/recommit-conn/l/1/0/1", 0).await;
    prepare("eo1/recommit-conn/l/1/0/2", 1).await;
    let request = |gid: &str, n| {
        CommitRequest::new(
            PgCommittable {
                gid: gid.into(),
                rows: 1,
                advances: Vec::new(),
                superseded: None,
                chained_on: Vec::new(),
            },
            CheckpointId(n),
            0,
        )
    };
    let mut first = vec![request("eo1/recommit-conn/l/1/0/1", 1)];
    committer.commit(&mut first).await.unwrap();
    assert_eq!(first[0].outcome(), &CommitOutcome::Committed);
    // Cut the committer's connection, as a server restart or a network
    // failure would.
    let cut: i64 = db
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'recommit_conn'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(cut >= 1, "the committer's connection was not found");
    // The next commit is retried later or made on a new connection; either
    // way it ends committed, within a few tries.
    let mut outcome = CommitOutcome::RetryLater;
    for attempt in 0..5 {
        let mut second = vec![request("eo1/recommit-conn/l/1/0/2", 2)];
        committer.commit(&mut second).await.unwrap();
        outcome = second[0].outcome().clone();
        if outcome == CommitOutcome::Committed {
            break;
        }
        assert_eq!(outcome, CommitOutcome::RetryLater, "attempt {attempt}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(outcome, CommitOutcome::Committed);
    assert_exactly_once(&db, "recommit_conn", 2, "after the cut connection").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_that_cannot_connect_are_retried_then_fail_the_job() {
    // A database of its own, whose new connections can be refused without
    // touching the other tests.
    let admin = client(&url()).await;
    admin
        .batch_execute("DROP DATABASE IF EXISTS unreachable_commits WITH (FORCE)")
        .await
        .unwrap();
    admin
        .batch_execute("CREATE DATABASE unreachable_commits")
        .await
        .unwrap();
    let db_url = format!("{} dbname=unreachable_commits", url());
    let db = client(&db_url).await;
    fresh_table(&db, "rows").await;
    let sink = PostgresSink::<Row>::connect(&db_url, "rows", 1)
        .await
        .unwrap();
    let stats = sink.stats_handle();
    let handle = Job::builder(
        "unreachable",
        SequenceSource::bounded(1_000).paced(200).map(Row::with_id),
        sink,
    )
    .checkpointing(CheckpointConfig::every(Duration::from_millis(500)))
    .commit_retry(sink_runtime::RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(50),
    })
    .build()
    .unwrap()
    .start();
    // The writer is connected and writing; the committer connects at its
    // first commit, after the first checkpoint: refuse it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handle.metrics().records_written == 0 {
        assert!(std::time::Instant::now() < deadline, "nothing written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    admin
        .batch_execute("ALTER DATABASE unreachable_commits ALLOW_CONNECTIONS false")
        .await
        .unwrap();
    let error = tokio::time::timeout(Duration::from_secs(60), handle.join())
        .await
        .expect("the job ends")
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("still asked to be retried after 3 retries"),
        "{error}"
    );
    assert!(stats().commit_retries >= 4, "{:?}", stats());
    admin
        .batch_execute("ALTER DATABASE unreachable_commits ALLOW_CONNECTIONS true")
        .await
        .unwrap();
    // Nothing was lost: the prepared transactions wait, in the last
    // checkpoint, for a restart to commit them. Here they are thrown away.
    let left = prepared_of(&client(&db_url).await, "unreachable").await;
    assert!(!left.is_empty(), "the uncommitted transactions vanished");
    for gid in left {
        db.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .await
            .unwrap();
    }
    admin
        .batch_execute("DROP DATABASE unreachable_commits WITH (FORCE)")
        .await
        .unwrap();
}
