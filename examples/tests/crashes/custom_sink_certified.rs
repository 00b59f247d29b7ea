//! The custom sink of the examples, certified exactly-once by the kit.

use examples::table_sink::TableSink;
use sink_api::async_trait;
use sink_testkit::{certify, Destination};

struct Table(TableSink);

#[async_trait]
impl Destination for Table {
    type Sink = TableSink;

    async fn sink(&self) -> TableSink {
        self.0.clone()
    }

    async fn committed_ids(&self) -> Vec<u64> {
        let table = self.0 .0.lock().expect("the table lock");
        table
            .values()
            .flatten()
            .filter_map(|line| line.strip_prefix("line ")?.parse().ok())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_sink_is_exactly_once() {
    let report = certify(
        || async { Table(TableSink::default()) },
        |id| format!("line {id}"),
    )
    .await;
    println!(
        "the README's sink, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    // The table has no transactions to count, and commits one batch per
    // call: no batch can be half-applied.
    report
        .allow_unchecked([
            "contract/no-transaction-after-end-of-input",
            "unknown-outcome/middle-of-batch",
            "unknown-outcome/last-of-batch",
        ])
        .assert_passed();
}

/// The README's pattern run twice under the same job name against the same
/// table, each time on fresh checkpoint storage (the in-memory default):
/// both runs' records are stored. Named by job name and generation alone,
/// the second run's batch ids repeated the first's, its commits were taken
/// for replays, and half of the lines were never stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_run_again_on_fresh_checkpoint_storage_stores_both_runs() {
    use std::time::Duration;

    use sink_runtime::{CheckpointConfig, Job, VecSource};

    let table = TableSink::default();
    for run in 0..2 {
        let lines = (0..100).map(move |i| format!("run {run} line {i}"));
        let report = Job::builder("table", VecSource::from_iter(lines), table.clone())
            .parallelism(2)
            .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
            .build()
            .unwrap()
            .run()
            .await
            .unwrap();
        assert_eq!(report.metrics.commits_already_committed, 0, "run {run}");
    }
    let stored = table.0.lock().unwrap();
    let lines: Vec<&String> = stored.values().flatten().collect();
    assert_eq!(lines.len(), 200, "both runs' lines");
    for run in 0..2 {
        let of_run = lines
            .iter()
            .filter(|l| l.starts_with(&format!("run {run} ")))
            .count();
        assert_eq!(of_run, 100, "run {run}");
    }
}
