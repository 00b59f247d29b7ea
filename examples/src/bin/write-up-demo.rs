//! The write-up's experiment, "no checkpoint, never commits", reproduced with
//! the in-memory sink: 160 records, parallelism 2, in the three modes of its
//! table. The SDK refuses the pitfall (an unbounded job without checkpoints)
//! at build time; forced with `allow_uncommitted_output`, it shows the
//! pitfall's numbers.
//!
//! Run it with `cargo run --release -p examples --bin write-up-demo`; see
//! `--help` for the flags.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use sink_runtime::{CheckpointConfig, Job, JobReport, SequenceSource};
use sinks_memory::{MemorySink, MemoryStore};

/// The write-up's three rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Preset {
    /// Unbounded source, 1 s checkpoints, cancelled after --run-for.
    Unbounded,
    /// Unbounded source, checkpointing off: refused, then forced.
    UnboundedNockpt,
    /// Bounded source, checkpointing off: commits once at end of input.
    Nockpt,
}

#[derive(Debug, Parser)]
#[command(about = "Reproduces the 'no checkpoint, never commits' table with the in-memory sink")]
struct Args {
    /// Run one preset instead of all three.
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// Records produced by the source.
    #[arg(long, default_value_t = 160)]
    records: u64,
    /// Subtasks.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    parallelism: u64,
    /// How long the unbounded modes run before they are cancelled, e.g. 3s, 500ms.
    #[arg(long, default_value = "3s", value_parser = sink_cli::flags::parse_duration)]
    run_for: Duration,
}

struct Row {
    mode: &'static str,
    source: String,
    checkpointing: &'static str,
    outcome: Result<(JobReport, MemoryStore<u64>), String>,
}

async fn run(args: &Args, preset: Preset) -> anyhow::Result<Vec<Row>> {
    let parallelism = args.parallelism as usize;
    let store = MemoryStore::<u64>::new();
    let sink = || MemorySink::new(store.clone());
    let run_for = args.run_for;
    let unbounded = || SequenceSource::unbounded(args.records);
    let cancel_after = |handle: sink_runtime::JobHandle| async move {
        tokio::time::sleep(run_for).await;
        handle.cancel();
        handle.join().await
    };
    let source_text = format!("unbounded, cancelled after {run_for:?}");
    Ok(match preset {
        Preset::Unbounded => {
            let job = Job::builder("unbounded", unbounded(), sink())
                .parallelism(parallelism)
                .checkpointing(CheckpointConfig::every(Duration::from_secs(1)))
                .build()?;
            let report = cancel_after(job.start()).await?;
            vec![Row {
                mode: "unbounded",
                source: source_text,
                checkpointing: "on (1 s)",
                outcome: Ok((report, store.clone())),
            }]
        }
        Preset::UnboundedNockpt => {
            let refused = Job::builder("unbounded-nockpt", unbounded(), sink())
                .parallelism(parallelism)
                .build()
                .err()
                .context("the SDK should have refused an unbounded job without checkpointing")?;
            let forced = Job::builder("unbounded-nockpt", unbounded(), sink())
                .parallelism(parallelism)
                .allow_uncommitted_output()
                .build()?;
            let report = cancel_after(forced.start()).await?;
            vec![
                Row {
                    mode: "unbounded-nockpt",
                    source: source_text.clone(),
                    checkpointing: "off",
                    outcome: Err(format!("refused at build time: {refused}")),
                },
                Row {
                    mode: "unbounded-nockpt (forced)",
                    source: source_text,
                    checkpointing: "off",
                    outcome: Ok((report, store.clone())),
                },
            ]
        }
        Preset::Nockpt => {
            let report = Job::builder("nockpt", SequenceSource::bounded(args.records), sink())
                .parallelism(parallelism)
                .build()?
                .run()
                .await?;
            vec![Row {
                mode: "nockpt",
                source: "bounded, ends by itself".into(),
                checkpointing: "off",
                outcome: Ok((report, store.clone())),
            }]
        }
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    let presets = match args.preset {
        Some(preset) => vec![preset],
        None => vec![Preset::Unbounded, Preset::UnboundedNockpt, Preset::Nockpt],
    };
    let started = Instant::now();
    let mut rows = Vec::new();
    for preset in presets {
        rows.extend(run(&args, preset).await?);
    }
    println!(
        "{:<27} {:<36} {:<13} {:>8} {:>10} {:>15}",
        "mode", "source", "checkpoint", "written", "committed", "prepare_commit"
    );
    let mut refusals = Vec::new();
    for row in &rows {
        match &row.outcome {
            Ok((report, store)) => println!(
                "{:<27} {:<36} {:<13} {:>8} {:>10} {:>15}",
                row.mode,
                row.source,
                row.checkpointing,
                store.written().len(),
                store.committed().len(),
                report.metrics.prepare_commit_calls
            ),
            Err(refusal) => {
                println!(
                    "{:<27} {:<36} {:<13} {:>8} {:>10} {:>15}",
                    row.mode, row.source, row.checkpointing, "-", "refused", "-"
                );
                refusals.push(refusal);
            }
        }
    }
    for refusal in refusals {
        println!("\n{refusal}");
    }
    println!("\n(done in {:.1} s)", started.elapsed().as_secs_f64());
    for row in &rows {
        if let Ok((report, _)) = &row.outcome {
            sink_cli::flags::fail_if_output_lost(report)?;
        }
    }
    Ok(())
}
