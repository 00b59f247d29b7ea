//! Source positions committed with the rows: jobs of two names reading one
//! scope at once, a split moved by another owner (superseded when the
//! writer prepares), a transaction continuing one that was rolled back
//! (superseded at its commit), and the holders of a split's next step: a
//! dead instance's prepared transaction (rolled back at once), a live one's
//! (superseded at once, rolled back only past the hold limit), another
//! application's (never rolled back). Each test has its own table, job
//! names and scope.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, CommittedPositions, Committer, Generation,
    InitContext, Lineage, PositionAdvance, Sink, SinkWriter, SplitKey,
};
use sink_runtime::source::Source;
use sink_runtime::{
    CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage, PartitionedSequence, RestartStrategy,
};
use sinks_postgres::{
    PgCommittable, PostgresCommitter, PostgresSink, PostgresWriter, POSITIONS_TABLE,
};
use tokio_postgres::Client;

/// The sink into `table`, its connections named after the table.
async fn sink_into(table: &str) -> PostgresSink<Row> {
    PostgresSink::connect(&url_for(table), table, 2)
        .await
        .unwrap_or_else(|e| panic!("connecting the sink: {e}"))
}

/// A fresh `table`, and the sink's own tables (a sink connecting creates
/// them when missing).
async fn fresh_with_sink_tables(db: &Client, table: &str) {
    fresh_table(db, table).await;
    drop(sink_into(table).await);
}

/// A writer and a committer of subtask 0 of `job`, generation 1.
async fn writer_and_committer(
    sink: &PostgresSink<Row>,
    job: &str,
) -> (PostgresWriter<Row>, PostgresCommitter) {
    let context = InitContext::new(
        job.to_string(),
        Lineage::new("positions-test"),
        Generation(1),
        0,
        1,
    );
    let writer = sink.create_writer(&context, Vec::new()).await.unwrap();
    let committer = sink.create_committer(&context).await.unwrap();
    (writer, committer)
}

fn advance(scope: &str, split: &str, from: Option<u64>, to: u64) -> PositionAdvance {
    PositionAdvance {
        key: SplitKey::new(scope, split),
        from,
        to,
    }
}

/// Writes `ids`, carries `advances` and prepares checkpoint `n`.
async fn prepare(
    writer: &mut PostgresWriter<Row>,
    ids: std::ops::Range<u64>,
    advances: Vec<PositionAdvance>,
    n: u64,
) -> PgCommittable {
    writer
        .write_batch(ids.map(Row::with_id).collect())
        .await
        .unwrap();
    writer.flush(false).await.unwrap();
    writer.carry_positions(advances).unwrap();
    let mut committables = writer.prepare_commit(CheckpointId(n)).await.unwrap();
    assert_eq!(committables.len(), 1, "one transaction per checkpoint");
    committables.remove(0)
}

async fn commit(committer: &mut PostgresCommitter, committable: &PgCommittable) -> CommitOutcome {
    let mut requests = vec![CommitRequest::new(committable.clone(), CheckpointId(1), 0)];
    committer.commit(&mut requests).await.unwrap();
    requests[0].outcome().clone()
}

fn superseded(outcome: &CommitOutcome) -> bool {
    matches!(outcome, CommitOutcome::Superseded(_))
}

/// A committed first step of `split` in `scope`: the split at `position`.
async fn commit_start(db: &Client, scope: &str, split: &str, position: i64) {
    db.execute(
        &format!(
            "INSERT INTO {POSITIONS_TABLE} (scope, split, from_position, to_position) \
             VALUES ($1, $2, -1, $3)"
        ),
        &[&scope, &split, &position],
    )
    .await
    .unwrap();
}

/// A prepared transaction `gid` that adds a row and takes `split`'s step
/// from `from`, as another instance's writer leaves it.
async fn prepare_holder(db: &Client, table: &str, scope: &str, split: &str, from: i64, gid: &str) {
    db.batch_execute(&format!(
        "BEGIN; INSERT INTO {table} VALUES (-1, 'held'); \
         INSERT INTO {POSITIONS_TABLE} (scope, split, from_position, to_position) \
           VALUES ('{scope}', '{split}', {from}, {}); \
         PREPARE TRANSACTION '{gid}'",
        from + 100
    ))
    .await
    .unwrap();
}

async fn is_prepared(db: &Client, gid: &str) -> bool {
    db.query_opt("SELECT 1 FROM pg_prepared_xacts WHERE gid = $1", &[&gid])
        .await
        .unwrap()
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_reading_one_scope_at_once_write_every_record_once() {
    const RECORDS: u64 = 3_000;
    const PARTITIONS: u32 = 6;
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_two_jobs").await;
    let scope = "pos-two-jobs/input";
    let start = |job: &'static str, parallelism: usize| async move {
        let source = PartitionedSequence::bounded(RECORDS, PARTITIONS, scope)
            .paced(600)
            .map(Row::with_id);
        Job::builder(job, source, sink_into("pos_two_jobs").await)
            .parallelism(parallelism)
            .batch_size(16)
            .checkpoint_storage(MemoryCheckpointStorage::default())
            .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
            .restart_strategy(RestartStrategy::FixedDelay {
                attempts: 1_000,
                delay: Duration::from_millis(2),
            })
            .build()
            .unwrap()
            .start()
    };
    // Two job names: each its own advisory lock, both live at once, the
    // positions table between them.
    let a = start("pos-two-jobs-a", 2).await;
    let b = start("pos-two-jobs-b", 3).await;
    let (a, b) = tokio::join!(a.join(), b.join());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        (a.status, b.status),
        (JobStatus::Finished, JobStatus::Finished)
    );
    assert_exactly_once(&db, "pos_two_jobs", RECORDS, "two jobs reading one scope").await;
    println!(
        "superseded: {} (a) + {} (b); restarts: {} + {}",
        a.metrics.commits_superseded,
        b.metrics.commits_superseded,
        a.metrics.restarts,
        b.metrics.restarts
    );
    assert!(
        a.metrics.commits_superseded + b.metrics.commits_superseded > 0,
        "the two jobs never met on a split: the test did not test hand-overs"
    );
    // Each split ends after its last record.
    let positions = sink_into("pos_two_jobs")
        .await
        .committed_positions(scope)
        .await
        .unwrap();
    let expected: CommittedPositions = (0..u64::from(PARTITIONS))
        .map(|p| {
            let count = (RECORDS - p).div_ceil(u64::from(PARTITIONS));
            (format!("p{p}"), count)
        })
        .collect();
    assert_eq!(positions, expected);
    assert!(prepared_of(&db, "pos-two-jobs-a").await.is_empty());
    assert!(prepared_of(&db, "pos-two-jobs-b").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_not_where_the_advances_expect_supersedes_the_transaction_at_prepare() {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_at_prepare").await;
    let scope = "pos-at-prepare/input";
    commit_start(&db, scope, "p0", 5).await;
    let sink = sink_into("pos_at_prepare").await;
    let stats = sink.stats_handle();
    let (mut writer, mut committer) = writer_and_committer(&sink, "pos-at-prepare").await;

    // Another owner moved p0 to 5; this writer read from 3.
    let stale = prepare(&mut writer, 0..4, vec![advance(scope, "p0", Some(3), 7)], 1).await;
    assert!(stale.superseded.is_some(), "{stale:?}");
    assert!(!is_prepared(&db, &stale.gid).await, "nothing prepared");
    assert!(
        id_counts(&db, "pos_at_prepare").await.is_empty(),
        "its rows rolled back"
    );
    let outcome = commit(&mut committer, &stale).await;
    assert!(superseded(&outcome), "{outcome:?}");
    // A split this writer takes from its start that another owner started.
    let restarted = prepare(&mut writer, 0..2, vec![advance(scope, "p0", None, 2)], 2).await;
    assert!(restarted.superseded.is_some(), "{restarted:?}");

    // From where the destination has it: committed, with its position.
    let current = prepare(
        &mut writer,
        10..14,
        vec![advance(scope, "p0", Some(5), 9)],
        3,
    )
    .await;
    assert_eq!(current.superseded, None);
    assert_eq!(
        commit(&mut committer, &current).await,
        CommitOutcome::Committed
    );
    assert_eq!(
        sink.committed_positions(scope).await.unwrap(),
        CommittedPositions::from([("p0".to_string(), 9)])
    );
    assert_eq!(id_counts(&db, "pos_at_prepare").await.len(), 4);
    // A replay is recognised, not superseded.
    assert_eq!(
        commit(&mut committer, &current).await,
        CommitOutcome::AlreadyCommitted
    );
    let stats = stats();
    assert_eq!((stats.superseded_at_prepare, stats.superseded), (2, 1));
    writer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_continuing_one_that_was_rolled_back_is_superseded_at_its_commit() {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_chain").await;
    let scope = "pos-chain/input";
    let sink = sink_into("pos_chain").await;
    let (mut writer, mut committer) = writer_and_committer(&sink, "pos-chain").await;

    // Checkpoint 2 is prepared before checkpoint 1 commits (its barrier
    // came first): it continues 1's step without waiting for it.
    let first = prepare(&mut writer, 0..3, vec![advance(scope, "p0", None, 3)], 1).await;
    let second = prepare(&mut writer, 3..5, vec![advance(scope, "p0", Some(3), 5)], 2).await;
    assert_eq!(second.chained_on, vec![first.gid.clone()]);
    // Committed out of order, the second waits for the first.
    assert_eq!(
        commit(&mut committer, &second).await,
        CommitOutcome::RetryLater
    );
    assert_eq!(
        commit(&mut committer, &first).await,
        CommitOutcome::Committed
    );
    assert_eq!(
        commit(&mut committer, &second).await,
        CommitOutcome::Committed
    );
    assert_eq!(
        sink.committed_positions(scope).await.unwrap(),
        CommittedPositions::from([("p0".to_string(), 5)])
    );

    // Now the earlier one is rolled back (a later start of the job, or
    // another owner's writer, did): both are superseded, nothing applied.
    let third = prepare(&mut writer, 5..8, vec![advance(scope, "p0", Some(5), 8)], 3).await;
    let fourth = prepare(&mut writer, 8..9, vec![advance(scope, "p0", Some(8), 9)], 4).await;
    db.batch_execute(&format!("ROLLBACK PREPARED '{}'", third.gid))
        .await
        .unwrap();
    let outcome = commit(&mut committer, &third).await;
    assert!(superseded(&outcome), "{outcome:?}");
    let outcome = commit(&mut committer, &fourth).await;
    assert!(superseded(&outcome), "{outcome:?}");
    assert!(
        !is_prepared(&db, &fourth.gid).await,
        "rolled back by its commit"
    );
    assert_exactly_once(&db, "pos_chain", 5, "after the broken chain").await;
    assert_eq!(
        sink.committed_positions(scope).await.unwrap(),
        CommittedPositions::from([("p0".to_string(), 5)])
    );
    // Going on from where the destination has it; each commit deletes the
    // steps before the one it continues, but the split's first.
    let fifth = prepare(&mut writer, 5..7, vec![advance(scope, "p0", Some(5), 7)], 5).await;
    let sixth = prepare(&mut writer, 7..9, vec![advance(scope, "p0", Some(7), 9)], 6).await;
    assert_eq!(
        commit(&mut committer, &fifth).await,
        CommitOutcome::Committed
    );
    assert_eq!(
        commit(&mut committer, &sixth).await,
        CommitOutcome::Committed
    );
    assert_exactly_once(&db, "pos_chain", 9, "after going on").await;
    let steps: Vec<(i64, i64)> = db
        .query(
            &format!(
                "SELECT from_position, to_position FROM {POSITIONS_TABLE} WHERE scope = $1 \
                 ORDER BY from_position"
            ),
            &[&scope],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(steps, vec![(-1, 3), (5, 7), (7, 9)]);
    // A replay of a commit whose step was deleted since is still recognised.
    assert_eq!(
        commit(&mut committer, &second).await,
        CommitOutcome::AlreadyCommitted
    );
    writer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_prepared_transaction_holding_a_split_is_rolled_back_by_the_next_owner() {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_dead").await;
    let scope = "pos-dead/input";
    commit_start(&db, scope, "p0", 5).await;
    commit_start(&db, scope, "p1", 5).await;
    // Killed right after it prepared: no instance of `pos-dead-old` runs
    // (its advisory lock is free), and one of this very job's earlier
    // lineage (this start holds the job's lock, so it is dead too).
    let other_job = "eo1/pos-dead-old/0a0a/1/0/7";
    let same_job = "eo1/pos-dead-new/0b0b/1/0/7";
    prepare_holder(&db, "pos_dead", scope, "p0", 5, other_job).await;
    prepare_holder(&db, "pos_dead", scope, "p1", 5, same_job).await;
    let sink = sink_into("pos_dead").await;
    let stats = sink.stats_handle();
    let (mut writer, mut committer) = writer_and_committer(&sink, "pos-dead-new").await;

    let started = Instant::now();
    let taken = prepare(
        &mut writer,
        0..4,
        vec![
            advance(scope, "p0", Some(5), 7),
            advance(scope, "p1", Some(5), 6),
        ],
        1,
    )
    .await;
    assert_eq!(taken.superseded, None, "{taken:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}: dead holders go at once, not after the hold limit",
        started.elapsed()
    );
    assert!(!is_prepared(&db, other_job).await && !is_prepared(&db, same_job).await);
    assert_eq!(stats().position_holders_rolled_back, 2);
    assert_eq!(
        commit(&mut committer, &taken).await,
        CommitOutcome::Committed
    );
    assert_eq!(
        sink.committed_positions(scope).await.unwrap(),
        CommittedPositions::from([("p0".to_string(), 7), ("p1".to_string(), 6)])
    );
    // The dead holders' rows were rolled back with them.
    assert_exactly_once(&db, "pos_dead", 4, "after the dead holders").await;
    writer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_owner_taking_the_same_step_supersedes_at_once_and_is_rolled_back_past_the_hold_limit(
) {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_live").await;
    let scope = "pos-live/input";
    commit_start(&db, scope, "p0", 5).await;
    // A live instance of `pos-live-other`: it holds its job's lock, and
    // has prepared p0's step from 5.
    let live = client(&url()).await;
    live.execute(
        "SELECT pg_advisory_lock(hashtextextended($1, 0))",
        &[&"pos-live-other"],
    )
    .await
    .unwrap();
    let holder = "eo1/pos-live-other/0c0c/1/0/3";
    prepare_holder(&db, "pos_live", scope, "p0", 5, holder).await;

    // Not waited for: its checkpoint may need a barrier of a subtask that
    // waits for this one's, so this writer is superseded at once.
    let sink = sink_into("pos_live").await;
    let stats = sink.stats_handle();
    let (mut writer, mut committer) = writer_and_committer(&sink, "pos-live").await;
    let started = Instant::now();
    let lost = prepare(&mut writer, 0..2, vec![advance(scope, "p0", Some(5), 7)], 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited {:?} for a live owner",
        started.elapsed()
    );
    let reason = lost.superseded.clone().expect("superseded");
    assert!(reason.contains(holder), "{reason}");
    assert!(
        is_prepared(&db, holder).await,
        "a live owner's transaction is kept"
    );
    assert!(superseded(&commit(&mut committer, &lost).await));
    assert_eq!(stats().position_holders_rolled_back, 0);
    writer.close().await.unwrap();

    // Held past the hold limit: rolled back, whoever holds it.
    let limit = Duration::from_secs(1);
    tokio::time::sleep(limit + Duration::from_millis(200)).await;
    let sink = sink_into("pos_live").await.position_hold_limit(limit);
    let stats = sink.stats_handle();
    let (mut writer, mut committer) = writer_and_committer(&sink, "pos-live").await;
    let taken = prepare(&mut writer, 0..2, vec![advance(scope, "p0", Some(5), 7)], 2).await;
    assert_eq!(taken.superseded, None, "{taken:?}");
    assert!(!is_prepared(&db, holder).await);
    assert_eq!(stats().position_holders_rolled_back, 1);
    assert_eq!(
        commit(&mut committer, &taken).await,
        CommitOutcome::Committed
    );
    assert_exactly_once(&db, "pos_live", 2, "after the live holder").await;
    writer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_applications_transaction_is_never_rolled_back() {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_foreign").await;
    let scope = "pos-foreign/input";
    commit_start(&db, scope, "p0", 5).await;
    let holder = "pos-foreign-someone-else";
    prepare_holder(&db, "pos_foreign", scope, "p0", 5, holder).await;
    let sink = sink_into("pos_foreign")
        .await
        .position_hold_limit(Duration::from_secs(2));
    let (mut writer, _committer) = writer_and_committer(&sink, "pos-foreign").await;
    writer.write(Row::with_id(1)).await.unwrap();
    writer
        .carry_positions(vec![advance(scope, "p0", Some(5), 6)])
        .unwrap();
    let error = writer
        .prepare_commit(CheckpointId(1))
        .await
        .expect_err("it waits, then fails the checkpoint");
    let message = error.to_string();
    assert!(
        message.contains("another application") && message.contains(holder),
        "{message}"
    );
    assert!(is_prepared(&db, holder).await, "never rolled back");
    db.batch_execute(&format!("ROLLBACK PREPARED '{holder}'"))
        .await
        .unwrap();
    writer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_of_another_database_user_is_waited_for_not_a_failure_of_the_job() {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_user").await;
    let scope = "pos-user/input";
    commit_start(&db, scope, "p0", 5).await;
    // Two roles that are not superusers: the holder's, and the sink's.
    for role in ["eo_pos_holder", "eo_pos_sink"] {
        let created = db.batch_execute(&format!("CREATE ROLE {role} LOGIN")).await;
        if let Err(error) = created {
            assert_eq!(
                error.code(),
                Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT),
                "{error}"
            );
        }
        db.batch_execute(&format!(
            "GRANT ALL ON SCHEMA public TO {role}; \
             GRANT ALL ON pos_user, {POSITIONS_TABLE}, {} TO {role}",
            sinks_postgres::MARKER_TABLE
        ))
        .await
        .unwrap();
    }
    // A dead instance's transaction (its job's lock is free), prepared by
    // the holder's role: the sink's role may not roll it back.
    let holder = "eo1/pos-user-old/0d0d/1/0/3";
    db.batch_execute(&format!(
        "BEGIN; SET LOCAL ROLE eo_pos_holder; \
         INSERT INTO {POSITIONS_TABLE} (scope, split, from_position, to_position) \
           VALUES ('{scope}', 'p0', 5, 9); \
         PREPARE TRANSACTION '{holder}'"
    ))
    .await
    .unwrap();
    let sink = PostgresSink::<Row>::connect(
        &format!("{} user=eo_pos_sink", url_for("pos_user")),
        "pos_user",
        1,
    )
    .await
    .unwrap_or_else(|e| panic!("connecting as eo_pos_sink: {e}"))
    .position_hold_limit(Duration::from_secs(1));
    let (mut writer, _committer) = writer_and_committer(&sink, "pos-user").await;
    writer.write(Row::with_id(1)).await.unwrap();
    writer
        .carry_positions(vec![advance(scope, "p0", Some(5), 6)])
        .unwrap();
    let error = writer
        .prepare_commit(CheckpointId(1))
        .await
        .expect_err("it waits, then fails the checkpoint");
    assert!(
        !error.is_permanent(),
        "a transient failure, not the job's end: {error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("another database user") && message.contains(holder),
        "{message}"
    );
    assert!(is_prepared(&db, holder).await);
    db.batch_execute(&format!("ROLLBACK PREPARED '{holder}'"))
        .await
        .unwrap();
    writer.close().await.unwrap();
}

/// Steps a split's later commits pruned free their keys: a stale owner's
/// step from a pruned position must still be superseded (it continued the
/// split's first step, which is kept for good, and forked the chain:
/// found by review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_step_from_a_pruned_position_is_superseded() {
    let db = client(&url()).await;
    fresh_with_sink_tables(&db, "pos_pruned").await;
    let scope = "pos-pruned/input";
    commit_start(&db, scope, "p0", 100).await;
    let sink = sink_into("pos_pruned").await;
    let (mut writer, mut committer) = writer_and_committer(&sink, "pos-pruned").await;
    for (n, from) in [(1, 100), (2, 200), (3, 300)] {
        let step = prepare(
            &mut writer,
            from..from + 100,
            vec![advance(scope, "p0", Some(from), from + 100)],
            n,
        )
        .await;
        assert_eq!(step.superseded, None, "{step:?}");
        assert_eq!(
            commit(&mut committer, &step).await,
            CommitOutcome::Committed
        );
    }
    // An owner that read p0 from 100 and stalled since.
    let (mut stale_writer, mut stale_committer) =
        writer_and_committer(&sink_into("pos_pruned").await, "pos-pruned-stale").await;
    let stale = prepare(
        &mut stale_writer,
        100..150,
        vec![advance(scope, "p0", Some(100), 150)],
        1,
    )
    .await;
    let outcome = commit(&mut stale_committer, &stale).await;
    assert!(superseded(&outcome), "{outcome:?} {stale:?}");
    let counts = id_counts(&db, "pos_pruned").await;
    assert!(
        counts.len() == 300 && counts.values().all(|c| *c == 1),
        "every row of 100..400 once, nothing of the stale step: {counts:?}"
    );
    assert_eq!(
        sink.committed_positions(scope).await.unwrap(),
        CommittedPositions::from([("p0".to_string(), 400)])
    );
    writer.close().await.unwrap();
    stale_writer.close().await.unwrap();
}
