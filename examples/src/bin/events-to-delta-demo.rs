//! Kafka JSON events into a Delta table partitioned by day, with the bad
//! messages in a dead-letter topic: the record struct is declared once,
//! and there is no wrapper type.
//!
//! `cargo run -p examples --features delta,kafka --bin events-to-delta-demo -- --brokers B
//! --topic T --dead-letters D --table DIR --state DIR [--bounded]` reads `T` as the
//! consumer group `T-to-delta`.
//!
//! A message that is not an event's JSON, or whose time the table cannot
//! hold, goes to `--dead-letters` with the reason and its position in
//! headers; every other event is in the table once, across kill -9.
//! Ctrl-C commits what was read and stops; the next start goes on.

use clap::Parser;
use serde::{Deserialize, Serialize};
use sink_api::BadRecord;
use sink_cli::flags::counters_json;
use sink_runtime::{source::Source as _, CheckpointConfig, Job, LocalCheckpointStorage};
use sinks_delta::{DeltaSink, TableLocation, TimeUnit};
use sinks_kafka::KafkaSink;
use sources_kafka::KafkaSource;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    brokers: String,
    #[arg(long)]
    topic: String,
    #[arg(long)]
    dead_letters: String,
    #[arg(long)]
    table: String,
    #[arg(long)]
    state: String,
    /// Read to the topic's end as the first start saw it, then finish.
    #[arg(long)]
    bounded: bool,
    #[arg(long, value_parser = sink_cli::flags::parse_duration, default_value = "1s")]
    checkpoint_interval: std::time::Duration,
}

/// An event as the topic carries it, and as the table's row.
#[derive(Serialize, Deserialize)]
struct Event {
    id: i64,
    /// Milliseconds since the epoch: the table's `ts`, and its `day`.
    ts: i64,
    amount: Option<f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    let group = format!("{}-to-delta", args.topic);
    let mut source = KafkaSource::builder(args.brokers.as_str(), &args.topic, group);
    if args.bounded {
        source = source.bounded();
    }
    let events = source.build().await?.try_map(|message| {
        serde_json::from_slice::<Event>(message.value_bytes()).map_err(|error| {
            let at = format!("{}@{}", message.partition, message.offset);
            BadRecord::new(error).payload(message.value_bytes()).at(at)
        })
    });
    let table = DeltaSink::<Event>::builder_from_type(TableLocation::local(&args.table)?)
        .timestamp("ts", TimeUnit::Millisecond)
        .partition_by_day("day", "ts")
        .build()?;
    let dead_letters = KafkaSink::builder(args.brokers.as_str(), &args.dead_letters);
    let job = Job::builder("events-to-delta", events, table)
        .dead_letters(dead_letters.connect().await?)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(args.checkpoint_interval))
        .checkpoint_storage(LocalCheckpointStorage::open(&args.state)?)
        .build()?
        .start();
    let control = job.control();
    // Ctrl-C: end the input, commit what was read, return `Stopped`.
    tokio::spawn(async move { tokio::signal::ctrl_c().await.map(|()| control.stop()) });
    let report = job.join().await?;
    let (status, counters) = (format!("{:?}", report.status), counters_json(&report));
    let summary = serde_json::json!({ "status": status, "counters": counters });
    println!("{summary}");
    sink_cli::flags::fail_if_output_lost(&report)
}
