//! What a pipeline checkpoint writes, against the idempotency keys it adds
//! and the keys it retains.
//!
//! ```text
//! cargo run --profile bench -p sink-benches --bin key-checkpoint-bench -- --json
//! cargo run --profile bench -p sink-benches --bin key-checkpoint-bench -- --retained 10000 --rounds 20
//! ```
//!
//! For each retained count (10 000, 100 000 and 1 000 000 by default) a
//! pipeline (memory sink, parallelism 2, checkpoints on demand, a local
//! state directory) is filled with that many keyed sends, then, for each
//! count of keys added (10, 100 and 1 000), runs rounds that send that many
//! new keys at once and wait for their acknowledgement. Each round's
//! checkpoint files are new files of the state directory: their bytes, over
//! the checkpoints of the round, are the bytes a checkpoint wrote. The
//! figure beside it: what the same checkpoints would have written had every
//! checkpoint stored every retained key (format 3, the format before
//! chunks), measured by encoding the newest checkpoint's keys that way.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};
use sink_runtime::pipeline::{KeyPartition, KeyRetention, Pipeline};
use sink_runtime::source::{BincodeSplits, SplitCodec};
use sink_runtime::storage::CheckpointStorage;
use sink_runtime::{CheckpointConfig, LocalCheckpointStorage};
use sinks_memory::{MemorySink, MemoryStore};

#[derive(Debug, Parser)]
#[command(about = "Bytes a pipeline checkpoint writes against the keys it adds and retains")]
struct Args {
    /// Retained keys to measure at (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [10_000u64, 100_000, 1_000_000])]
    retained: Vec<u64>,
    /// Keys added per round (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [10u64, 100, 1_000])]
    added: Vec<u64>,
    /// Rounds per count of keys added.
    #[arg(long, default_value_t = 200)]
    rounds: u64,
    /// Print one JSON object with every figure on the last line of stdout.
    #[arg(long)]
    json: bool,
}

/// The checkpoint files of `dir`, with their sizes.
fn checkpoint_files(dir: &Path) -> anyhow::Result<BTreeSet<(String, u64)>> {
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(dir).context("listing the state directory")? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("checkpoint-") && name.ends_with(".ckpt") {
            files.insert((name, entry.metadata()?.len()));
        }
    }
    Ok(files)
}

/// Sends `keys` keyed sends of one record each, numbered from `first`,
/// and waits until every one is acknowledged.
async fn send_keys(pipeline: &Pipeline<String>, first: u64, keys: u64) -> anyhow::Result<()> {
    let mut tickets = Vec::with_capacity(keys as usize);
    for n in first..first + keys {
        let key = format!("request-{n:012}");
        let ticket = pipeline
            .send(vec![format!("event {n}")], Some(key))
            .await
            .map_err(|e| anyhow::anyhow!("send {n}: {e}"))?;
        tickets.push(ticket);
    }
    for ticket in tickets {
        ticket
            .await
            .map_err(|e| anyhow::anyhow!("a send failed: {e}"))?;
    }
    Ok(())
}

/// What format 3 stores for `retained` keys, every checkpoint: that many
/// times the mean size of a stored key in the newest checkpoint, encoded
/// that way (the segments may still hold keys that expired, so the
/// newest checkpoint's keys are counted, not taken whole).
async fn whole_table_bytes(storage: &LocalCheckpointStorage, retained: u64) -> anyhow::Result<u64> {
    let latest = storage.latest().await?.context("no checkpoint stored")?;
    let (mut bytes, mut keys) = (0u64, 0u64);
    for subtask in &latest.subtasks {
        let partitions = KeyPartition::codec().decode(&subtask.source_splits)?;
        let empty: Vec<KeyPartition> = Vec::new();
        let overhead = BincodeSplits::<KeyPartition>::default()
            .encode(&empty)?
            .len() as u64;
        for partition in &partitions {
            let alone = BincodeSplits::<KeyPartition>::default()
                .encode(std::slice::from_ref(partition))?
                .len() as u64;
            bytes += alone.saturating_sub(overhead);
            keys += partition.key_count() as u64;
        }
    }
    Ok(retained * bytes / keys.max(1))
}

async fn measure(retained: u64, args: &Args) -> anyhow::Result<Vec<Value>> {
    let dir = tempfile::tempdir()?;
    let storage = LocalCheckpointStorage::open(dir.path())?;
    let pipeline = Pipeline::builder("keys", MemorySink::new(MemoryStore::<String>::new()))
        .parallelism(2)
        .checkpointing(CheckpointConfig::on_demand(
            Duration::ZERO,
            Duration::from_secs(3600),
        ))
        .key_retention(KeyRetention {
            max_keys: retained as usize,
            max_age: Duration::from_secs(24 * 3600),
        })
        .checkpoint_storage(storage.clone())
        .start()
        .await?;
    let mut next = 0;
    // Fill in rounds of 1 000 (a checkpoint or two each), as clients would.
    while next < retained {
        let keys = (retained - next).min(1_000);
        send_keys(&pipeline, next, keys).await?;
        next += keys;
    }
    let mut rows = Vec::new();
    for &added in &args.added {
        let (mut written, mut checkpoints, mut largest) = (0u64, 0u64, 0u64);
        let mut sizes = Vec::new();
        for _ in 0..args.rounds {
            let before = checkpoint_files(dir.path())?;
            send_keys(&pipeline, next, added).await?;
            next += added;
            let after = checkpoint_files(dir.path())?;
            for (_, size) in after.difference(&before) {
                written += size;
                checkpoints += 1;
                largest = largest.max(*size);
                sizes.push(*size);
            }
        }
        let whole = whole_table_bytes(&storage, retained).await?;
        sizes.sort_unstable();
        let median = sizes.get(sizes.len() / 2).copied().unwrap_or(0);
        let per_checkpoint = written as f64 / checkpoints.max(1) as f64;
        let keys_per_checkpoint = (added * args.rounds) as f64 / checkpoints.max(1) as f64;
        rows.push(json!({
            "retained_keys": retained,
            "keys_added_per_round": added,
            "checkpoints": checkpoints,
            "keys_added_per_checkpoint": keys_per_checkpoint,
            "bytes_per_checkpoint": per_checkpoint,
            "bytes_per_key_added": per_checkpoint / keys_per_checkpoint.max(f64::MIN_POSITIVE),
            "largest_checkpoint_bytes": largest,
            "median_checkpoint_bytes": median,
            "whole_table_bytes": whole,
        }));
    }
    pipeline.shutdown().await?;
    Ok(rows)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rows = Vec::new();
    for &retained in &args.retained {
        rows.extend(measure(retained, &args).await?);
    }
    println!(
        "| retained keys | keys added per checkpoint | bytes per checkpoint (mean) | bytes per key added | median checkpoint | largest checkpoint | every key, as format 3 stored them |"
    );
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {:.1} | {:.0} | {:.0} | {} | {} | {} |",
            row["retained_keys"],
            row["keys_added_per_checkpoint"].as_f64().unwrap_or(0.0),
            row["bytes_per_checkpoint"].as_f64().unwrap_or(0.0),
            row["bytes_per_key_added"].as_f64().unwrap_or(0.0),
            row["median_checkpoint_bytes"],
            row["largest_checkpoint_bytes"],
            row["whole_table_bytes"],
        );
    }
    if args.json {
        println!("{}", json!({ "rows": rows }));
    }
    Ok(())
}
