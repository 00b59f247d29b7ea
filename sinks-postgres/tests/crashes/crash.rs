//! Crash tests of the PostgreSQL sink: at every crash point of the runtime,
//! and right after a `COMMIT PREPARED` before the runtime hears of it, a job
//! is crashed a few times and started again on the same checkpoint storage,
//! as a new process would be. Counted with SQL: no row is ever visible twice,
//! every row is there exactly once at the end, and no prepared transaction of
//! the job is left on the server. Each crash point is run with a source that
//! keeps its positions in the checkpoints and with one whose positions are
//! committed with the rows (`PartitionedSequence`: every start reads each
//! split from where the destination's steps end).
//!
//! `scripts/with-postgres cargo test -p sinks-postgres --features postgres-crash-tests --test crash`

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use sink_runtime::failpoints::FAILPOINTS;
use sink_runtime::source::Source;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobReport, JobStatus, LocalCheckpointStorage,
    PartitionedSequence, SequenceSource,
};
use sinks_postgres::PostgresSink;
use tokio_postgres::Client;

const ROWS: u64 = 2_000;
const SINK_POINT: &str = "postgres-commit-mid-batch";

/// One run, as one process; also says how many lingering prepared
/// transactions it rolled back when it started.
async fn run_once(
    table: &str,
    state: &Path,
    checkpoints: bool,
    positions: bool,
) -> (Result<JobReport, JobError>, u64) {
    let sink = PostgresSink::connect(&url_for(table), table, 2)
        .await
        .expect("the sink connects");
    let stats = sink.stats_handle();
    let result = match positions {
        true => {
            let source = PartitionedSequence::bounded(ROWS, 6, format!("{table}/input"))
                .paced(20_000)
                .map(Row::with_id);
            run_job(table, state, checkpoints, source, sink).await
        }
        false => {
            let source = SequenceSource::bounded(ROWS)
                .paced(20_000)
                .map(Row::with_id);
            run_job(table, state, checkpoints, source, sink).await
        }
    };
    (result, stats().rolled_back_at_start)
}

async fn run_job<Src: Source<Record = Row>>(
    table: &str,
    state: &Path,
    checkpoints: bool,
    source: Src,
    sink: PostgresSink<Row>,
) -> Result<JobReport, JobError> {
    let builder = Job::builder(table, source, sink)
        .parallelism(2)
        .batch_size(64)
        .checkpoint_storage(LocalCheckpointStorage::open(state)?);
    let builder = match checkpoints {
        true => builder.checkpointing(CheckpointConfig::every(Duration::from_millis(10))),
        false => builder,
    };
    builder.build().expect("a valid job").run().await
}

fn crash_point(error: &JobError) -> Option<&'static str> {
    match error {
        JobError::Crash { failpoint } => Some(failpoint),
        JobError::Sink { source, .. } if source.to_string().contains(SINK_POINT) => {
            Some(SINK_POINT)
        }
        _ => None,
    }
}

async fn no_row_twice(db: &Client, table: &str) -> bool {
    id_counts(db, table).await.values().all(|&count| count == 1)
}

async fn scenario(
    db: &Client,
    point: &'static str,
    checkpoints: bool,
    positions: bool,
    index: usize,
) -> (u32, u64) {
    let table = format!(
        "crash_{index}_{}_{}",
        u8::from(checkpoints),
        u8::from(positions)
    );
    fresh_table(db, &table).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut crashes = 0;
    let mut rolled_back = 0;
    for round in 0.. {
        assert!(round < 12, "{point}: the job did not finish");
        let primed = point == "during-recovery-recommit";
        if primed && round == 0 {
            fail::cfg("after-checkpoint-stored", "1*return->off").expect("a valid failpoint");
        } else if let Some(skip) = [0u32, 2, 1].get(round - usize::from(primed)) {
            fail::cfg(point, &format!("{skip}*off->1*return->off")).expect("a valid failpoint");
        }
        let (result, rolled) = run_once(&table, dir.path(), checkpoints, positions).await;
        rolled_back += rolled;
        fail::remove(point);
        fail::remove("after-checkpoint-stored");
        assert!(
            no_row_twice(db, &table).await,
            "{point}: a row is visible twice after round {round}"
        );
        match result {
            Ok(report) => {
                assert_eq!(report.status, JobStatus::Finished, "{point}");
                break;
            }
            Err(error) if crash_point(&error).is_some() => {
                crashes += u32::from(crash_point(&error) == Some(point));
            }
            Err(error) => {
                panic!(
                    "{point} (checkpoints: {checkpoints}, positions: {positions}): unexpected \
                     failure: {error}"
                )
            }
        }
    }
    let what = format!(
        "{point} (checkpoints: {checkpoints}, positions: {positions}) after {crashes} crashes"
    );
    assert_exactly_once(db, &table, ROWS, &what).await;
    let left = prepared_of(db, &table).await;
    assert!(
        left.is_empty(),
        "{what}: prepared transactions left: {left:?}"
    );
    assert!(crashes >= 1, "{what}: the crash point was never reached");
    if point == "after-prepare-commit" {
        // Prepared at a barrier whose checkpoint never completed: the next
        // start must have rolled it back (and the rows are exactly once).
        assert!(
            rolled_back >= 1,
            "{what}: no lingering transaction was rolled back"
        );
    }
    (crashes, rolled_back)
}

#[test]
fn every_crash_point_leaves_every_row_exactly_once() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let db = client(&url()).await;
        let (mut scenarios, mut crashes, mut rolled_back) = (0, 0, 0);
        for (checkpoints, positions) in [(true, false), (false, false), (true, true), (false, true)]
        {
            for (index, &point) in FAILPOINTS.iter().chain([SINK_POINT].iter()).enumerate() {
                if point == "after-global-commit" {
                    continue; // no global committer
                }
                let (crashed, rolled) = scenario(&db, point, checkpoints, positions, index).await;
                crashes += crashed;
                rolled_back += rolled;
                scenarios += 1;
            }
        }
        println!(
            "postgres sink crash tests: {scenarios} scenarios, {crashes} crashes, \
             {rolled_back} lingering prepared transactions rolled back, every row exactly once \
             (counted with SQL), none left prepared"
        );
    });
}
