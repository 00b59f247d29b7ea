//! A custom two-phase-commit sink (`examples::table_sink`), run by the
//! runtime.
//!
//! The sink commits batches of lines into a shared table keyed by a batch id
//! that is unique per job, generation, subtask and checkpoint. Writing buffers
//! lines; `prepare_commit` turns the buffer into a batch (the committable,
//! stored in the checkpoint until committed); `commit` inserts the batch unless
//! its id is already there, which makes a replayed commit harmless.
//!
//! Run it with `cargo run -p examples --bin custom-sink`.

use std::time::Duration;

use anyhow::Context;
use examples::table_sink::TableSink;
use sink_runtime::{CheckpointConfig, Job, VecSource};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let table = TableSink::default();
    let lines = (0..1_000).map(|i| format!("line {i}"));
    let report = Job::builder("table", VecSource::from_iter(lines), table.clone())
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()?
        .run()
        .await
        .context("the table job failed")?;
    let table = table
        .0
        .lock()
        .map_err(|_| anyhow::anyhow!("the table lock is poisoned"))?;
    let committed: usize = table.values().map(Vec::len).sum();
    println!(
        "{committed} lines committed in {} batches; {} checkpoints completed",
        table.len(),
        report.metrics.checkpoints_completed
    );
    anyhow::ensure!(
        committed == 1_000,
        "expected 1000 committed lines, found {committed}"
    );
    Ok(())
}
