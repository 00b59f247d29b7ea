//! Prints what a job's state directory holds: the generation, whether the job
//! finished, and each retained checkpoint with its size and the committables
//! still pending in it per checkpoint and subtask.
//!
//! `cargo run -p sink-cli --bin sink-inspect -- STATE_DIR [--json]`
//! `cargo run -p sink-cli --bin sink-inspect -- s3://bucket/state [--endpoint URL] [--json]`
//! (or, installed with `cargo install --path sink-cli`, `sink-inspect ...`)
//!
//! `sink-inspect STATE_DIR --set-generation N` repairs a damaged
//! `GENERATION` file (the job's error says which N is safe).
//!
//! It reads without taking the directory's lock (nor claiming an object
//! store's), so it can look at the state of a running job; an unreadable
//! checkpoint is reported, not fatal.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};
use sink_cli::location::{self, Location};
use sink_runtime::storage::{CompletedCheckpoint, PendingCommittables};

#[derive(Debug, Parser)]
#[command(about = "Inspects the checkpoints in a job's state directory")]
struct Args {
    /// The state directory, or the checkpoint storage's s3://bucket/prefix URL.
    #[arg(value_parser = Location::parse)]
    state_dir: Location,
    /// The S3 endpoint, for S3-compatible servers (default: AWS_ENDPOINT_URL,
    /// else AWS itself).
    #[arg(long)]
    endpoint: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Repair a damaged GENERATION file of a local state directory: set it
    /// to N, above every generation in use (the job's error names what the
    /// directory records), so the next start gets N + 1. Takes the
    /// directory's lock: stop the job first.
    #[arg(long, value_name = "N")]
    set_generation: Option<u64>,
}

/// `--set-generation`: writes the generation of the local state directory
/// `location` under its lock.
fn set_generation(location: &Location, generation: u64) -> anyhow::Result<()> {
    let Some(dir) = location.local().filter(|dir| dir.is_dir()) else {
        anyhow::bail!(
            "--set-generation repairs the GENERATION file of an existing local state directory; \
             {location} is not one"
        );
    };
    let storage = sink_runtime::LocalCheckpointStorage::open(dir)
        .with_context(|| format!("opening {} to set its generation", dir.display()))?;
    storage
        .set_generation(sink_api::Generation(generation))
        .with_context(|| format!("setting the generation of {}", dir.display()))?;
    println!(
        "generation of {} set to {generation}: the next start gets {}",
        dir.display(),
        generation.saturating_add(1)
    );
    Ok(())
}

/// Pending committables per (checkpoint, origin subtask).
fn pending_counts(parts: &[PendingCommittables]) -> BTreeMap<(u64, usize), usize> {
    parts
        .iter()
        .map(|p| {
            (
                (p.summary.checkpoint_id.0, p.summary.subtask),
                p.committables.len(),
            )
        })
        .collect()
}

fn describe(checkpoint: &CompletedCheckpoint) -> Value {
    let pending: Vec<Value> = checkpoint
        .subtasks
        .iter()
        .flat_map(|s| pending_counts(&s.pending).into_iter().map(move |k| (s.subtask, k)))
        .map(|(holder, ((id, origin), count))| {
            json!({"checkpoint": id, "subtask": origin, "held_by": holder, "committables": count})
        })
        .collect();
    let global: Option<Vec<Value>> = checkpoint.global_committer.as_ref().map(|g| {
        pending_counts(&g.pending)
            .into_iter()
            .map(|((id, origin), count)| json!({"checkpoint": id, "subtask": origin, "committables": count}))
            .collect()
    });
    json!({
        "checkpoint": checkpoint.checkpoint_id.0,
        "job": checkpoint.job_name,
        "generation": checkpoint.generation.0,
        "lineage": checkpoint.lineage.as_ref().map(|l| l.to_string()),
        "parallelism": checkpoint.parallelism,
        "final": checkpoint.is_final,
        "end_of_input": checkpoint.subtasks.iter().filter(|s| s.end_of_input).count(),
        "pending": pending,
        "global_committer_pending": global,
    })
}

/// "checkpoint/subtask: count" for each entry of a JSON list of pending parts.
fn pending_list(parts: &Value) -> Vec<String> {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}: {}",
                p["checkpoint"], p["subtask"], p["committables"]
            )
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(generation) = args.set_generation {
        return set_generation(&args.state_dir, generation);
    }
    let options = location::s3_options(args.endpoint.as_deref());
    let state = location::inspect(&args.state_dir, &options)
        .await
        .with_context(|| format!("cannot inspect {}", args.state_dir))?;
    let checkpoints: Vec<Value> = state
        .checkpoints
        .iter()
        .map(|file| {
            let mut value = match &file.content {
                Ok(checkpoint) => describe(checkpoint),
                Err(error) => {
                    json!({"checkpoint": file.checkpoint_id.0, "error": error.to_string()})
                }
            };
            value["file"] = json!(file.path.display().to_string());
            value["size_bytes"] = json!(file.size_bytes);
            value
        })
        .collect();
    let report = json!({
        "state_dir": args.state_dir.to_string(),
        "generation": state.generation.map(|g| g.0),
        "finished": state.finished.as_ref().map(|f| json!({
            "generation": f.generation.0,
            "last_checkpoint": f.last_checkpoint.map(|c| c.0),
            "commits_failed": f.lost.commits_failed,
            "records_lost": f.lost.records_lost,
            "known_failures": f.lost.known_failures.iter().map(|failure| json!({
                "checkpoint": failure.checkpoint_id.0,
                "subtask": failure.subtask,
                "records_lost": failure.records_lost,
                "reason": failure.reason,
            })).collect::<Vec<_>>(),
        })),
        "in_use": state.locked,
        "checkpoints": checkpoints,
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!("state directory  {}", args.state_dir);
    println!(
        "generation       {}",
        state.generation.map_or("none".into(), |g| g.to_string())
    );
    println!(
        "finished         {}",
        match state.finished {
            Some(f) => format!(
                "yes, by generation {} (last checkpoint {}){}",
                f.generation,
                f.last_checkpoint.map_or("none".into(), |c| c.to_string()),
                match f.lost.commits_failed {
                    0 => String::new(),
                    failed => format!(
                        "; it lost output: {failed} commit(s) failed, {} record(s) counted as lost",
                        f.lost.records_lost
                    ),
                }
            ),
            None => "no".into(),
        }
    );
    println!(
        "in use           {}",
        if state.locked {
            "yes, by a running job"
        } else {
            "no"
        }
    );
    println!();
    println!(
        "{:>10} {:>10} {:>5} {:>11} {:>6}  pending committables (checkpoint/subtask: count)",
        "checkpoint", "bytes", "gen", "parallelism", "final"
    );
    for (file, value) in state.checkpoints.iter().zip(&checkpoints) {
        match &file.content {
            Ok(checkpoint) => {
                let pending = pending_list(&value["pending"]);
                let global = pending_list(&value["global_committer_pending"]);
                let mut line = if pending.is_empty() {
                    "none".to_string()
                } else {
                    pending.join(", ")
                };
                if !global.is_empty() {
                    line.push_str(&format!("; global committer: {}", global.join(", ")));
                }
                println!(
                    "{:>10} {:>10} {:>5} {:>11} {:>6}  {line}",
                    checkpoint.checkpoint_id.0,
                    file.size_bytes,
                    checkpoint.generation.0,
                    checkpoint.parallelism,
                    if checkpoint.is_final { "yes" } else { "no" },
                );
            }
            Err(error) => println!(
                "{:>10} {:>10}  UNREADABLE: {error}",
                file.checkpoint_id.0, file.size_bytes
            ),
        }
    }
    if state.checkpoints.is_empty() {
        println!("(no checkpoints)");
    }
    Ok(())
}
