//! An HTTP service on the file sink: `POST /events` (a JSON array of
//! events, and optionally an `Idempotency-Key` header) is answered 200 once
//! the events are committed, and then they are in the output's finished
//! JSON-lines files: a reader finds them at once. A retry with the same key
//! is answered again without writing twice, across crashes.
//!
//! `cargo run -p examples --features http --bin events-service-demo -- --out OUT --state STATE`
//! prints `listening on ADDR` and serves until Ctrl-C, which commits what
//! was taken and stops.

use std::time::Duration;

use axum::{extract::State, http::HeaderMap, http::StatusCode, routing::post, Router};
use clap::Parser;
use sha2::{Digest, Sha256};
use sink_runtime::pipeline::{Fingerprint, IdempotencyKey, Refusal, TicketError};
use sink_runtime::{CheckpointConfig, LocalCheckpointStorage, Pipeline};
use sinks_file::{FileSink, JsonLinesEncoder};

#[derive(Parser)]
struct Args {
    /// Where the finished JSON-lines files go.
    #[arg(long)]
    out: String,
    /// The checkpoint directory: a restart resumes from it.
    #[arg(long)]
    state: String,
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    #[arg(long, value_parser = sink_cli::flags::parse_duration, default_value = "50ms")]
    checkpoint_interval: Duration,
}

type Events = Pipeline<serde_json::Value>;

async fn post_events(
    State(pipeline): State<Events>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String) {
    let Ok(events) = serde_json::from_slice::<Vec<serde_json::Value>>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "the body is not a JSON array\n".into(),
        );
    };
    let digest: [u8; 32] = Sha256::digest(&body).into();
    let fingerprint = Fingerprint::new(digest[..16].try_into().expect("16 bytes"));
    let sent = match headers.get("idempotency-key").and_then(|k| k.to_str().ok()) {
        Some(key) => pipeline.try_send_keyed(
            events,
            IdempotencyKey::new(key).with_fingerprint(fingerprint),
        ),
        None => pipeline.try_send(events, None),
    };
    let ticket = match sent {
        Ok(ticket) => ticket,
        Err(refused) if refused.refusal == Refusal::Closed => {
            return (StatusCode::SERVICE_UNAVAILABLE, "stopping\n".into())
        }
        Err(_) => return (StatusCode::SERVICE_UNAVAILABLE, "busy: retry\n".into()),
    };
    match ticket.await {
        Ok(ack) => (
            StatusCode::OK,
            format!(
                "{{\"checkpoint\":{},\"duplicate\":{}}}\n",
                ack.checkpoint_id.0, ack.duplicate
            ),
        ),
        Err(TicketError::KeyReused { .. }) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "the key was used for another body\n".into(),
        ),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{error}: retry with the same key\n"),
        ),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sink_cli::flags::init_tracing();
    let args = Args::parse();
    let sink = FileSink::builder(&args.out, JsonLinesEncoder).build()?;
    let pipeline = Pipeline::builder("events", sink)
        .checkpointing(CheckpointConfig::every(args.checkpoint_interval))
        .checkpoint_storage(LocalCheckpointStorage::open(&args.state)?)
        .start()
        .await?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    let app = Router::new()
        .route("/events", post(post_events))
        .with_state(pipeline.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
        .await?;
    let report = pipeline.shutdown().await?;
    println!(
        "stopped: {:?}, {} records committed",
        report.status, report.metrics.records_committed
    );
    Ok(())
}
