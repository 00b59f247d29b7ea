//! The ingest service written the obvious other way, as the baseline of
//! `ingest-load --compare`: `POST /events` INSERTs each request's events into
//! PostgreSQL in a transaction of its own, with synchronous commit on, and
//! answers 200 once that transaction committed. No pipeline, no checkpoints.
//!
//! ```text
//! cargo build --release -p examples
//! PG_DURABLE=1 scripts/with-postgres bash -c './target/release/ingest-baseline --url "$PG_TEST_URL"'
//! ```
//!
//! It takes the same requests as `ingest-service` (the same parsing: a JSON
//! array of objects or JSON lines, the same `Idempotency-Key` checks) and
//! keeps idempotency keys the way a database service would: a table of keys
//! (`<table>_keys`, the key and the body's fingerprint) written in the
//! request's transaction, so a retry with the same key and body is answered
//! as a duplicate and writes nothing, and the same key with another body is
//! refused with 422. Events go to `<table>` (`event jsonb NOT NULL`), one row
//! each, with one `INSERT … SELECT unnest($1::jsonb[])`.
//!
//! Connections come from a pool (deadpool-postgres) of `--connections`;
//! a request waits for a free one. Stdout holds `listening on http://<addr>`
//! once requests are served, and a JSON summary after SIGTERM or Ctrl-C
//! (requests and events committed, duplicates). Logs go to stderr.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use ingest_service::{body_fingerprint, idempotency_key, parse_events, parse_table_name};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tracing::warn;

#[derive(Debug, Parser)]
#[command(
    about = "The ingest service the obvious way: each request INSERTed into PostgreSQL in its own transaction (the baseline of ingest-load --compare)"
)]
struct Args {
    /// The PostgreSQL server, as a libpq connection string or a
    /// postgresql:// URL.
    #[arg(long, value_name = "CONNECTION")]
    url: String,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// The events' table (created if missing); its keys go to `<table>_keys`.
    #[arg(long, default_value = "baseline_events", value_parser = parse_table_name)]
    table: String,
    /// Connections in the pool: requests beyond them wait for one.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    connections: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    max_body_bytes: usize,
}

/// What every request shares.
#[derive(Clone)]
struct App {
    pool: Pool,
    insert_events: Arc<str>,
    insert_key: Arc<str>,
    select_key: Arc<str>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    events: AtomicU64,
    duplicates: AtomicU64,
}

fn answer(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// What one request's transaction did.
enum Stored {
    Events(usize),
    Duplicate,
    KeyReused,
}

async fn store(
    app: &App,
    key: Option<&str>,
    fingerprint: &[u8],
    events: &[Value],
) -> Result<Stored, anyhow::Error> {
    let mut client = app.pool.get().await.context("taking a connection")?;
    let transaction = client.transaction().await?;
    if let Some(key) = key {
        let inserted = transaction
            .execute(&*app.insert_key, &[&key, &fingerprint])
            .await?;
        if inserted == 0 {
            let row = transaction.query_one(&*app.select_key, &[&key]).await?;
            let first: Vec<u8> = row.get(0);
            transaction.rollback().await?;
            return Ok(match first == fingerprint {
                true => Stored::Duplicate,
                false => Stored::KeyReused,
            });
        }
    }
    transaction.execute(&*app.insert_events, &[&events]).await?;
    transaction.commit().await?;
    Ok(Stored::Events(events.len()))
}

async fn post_events(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(error) => return answer(StatusCode::BAD_REQUEST, error.to_string()),
    };
    let events = match parse_events(&body) {
        Ok(events) => events,
        Err(error) => return answer(StatusCode::BAD_REQUEST, error.to_string()),
    };
    let fingerprint = body_fingerprint(&body);
    match store(&app, key.as_deref(), fingerprint.as_bytes(), &events).await {
        Ok(Stored::Events(count)) => {
            app.counts.requests.fetch_add(1, Ordering::Relaxed);
            app.counts.events.fetch_add(count as u64, Ordering::Relaxed);
            Json(json!({ "events": count, "duplicate": false })).into_response()
        }
        Ok(Stored::Duplicate) => {
            app.counts.duplicates.fetch_add(1, Ordering::Relaxed);
            Json(json!({ "events": events.len(), "duplicate": true })).into_response()
        }
        Ok(Stored::KeyReused) => answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was already used with a different body; nothing was stored",
        ),
        Err(error) => {
            warn!(error = format!("{error:#}"), "a request was not stored");
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{error:#}; the events may or may not be stored: retry with the same Idempotency-Key"),
            )
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    sink_cli::flags::init_tracing_or("warn");
    let signals = ingest_service::signals::StopSignals::install()?;
    let redacted = sinks_postgres::redact_connection_string(&args.url);
    let mut config = tokio_postgres::Config::from_str(&args.url)
        .with_context(|| format!("reading the connection string {redacted}"))?;
    // The baseline's promise: a 200 means the transaction is durable.
    config.options("-c synchronous_commit=on");
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let size = usize::try_from(args.connections).context("--connections is too large")?;
    let pool = Pool::builder(manager)
        .max_size(size)
        .build()
        .context("building the connection pool")?;
    let table = &args.table;
    let keys = format!("{table}_keys");
    pool.get()
        .await
        .with_context(|| format!("connecting to PostgreSQL at {redacted}"))?
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (event jsonb NOT NULL);
             CREATE TABLE IF NOT EXISTS {keys} (key text PRIMARY KEY, fingerprint bytea NOT NULL)"
        ))
        .await
        .with_context(|| format!("creating the tables {table} and {keys} if they are missing"))?;
    let app = App {
        pool,
        insert_events: format!("INSERT INTO {table} (event) SELECT unnest($1::jsonb[])").into(),
        insert_key: format!(
            "INSERT INTO {keys} (key, fingerprint) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING"
        )
        .into(),
        select_key: format!("SELECT fingerprint FROM {keys} WHERE key = $1").into(),
        counts: Arc::default(),
    };
    let counts = app.counts.clone();
    let router = Router::new()
        .route("/events", post(post_events))
        .layer(DefaultBodyLimit::max(args.max_body_bytes))
        .with_state(app);
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener
        .local_addr()
        .context("reading the address listened on")?;
    sink_cli::flags::print_line(&format!("listening on http://{address}"))?;
    axum::serve(listener, router)
        .with_graceful_shutdown(signals.first())
        .await
        .context("serving HTTP")?;
    let summary = json!({
        "requests_committed": counts.requests.load(Ordering::Relaxed),
        "records_committed": counts.events.load(Ordering::Relaxed),
        "transactions": counts.requests.load(Ordering::Relaxed),
        "duplicates": counts.duplicates.load(Ordering::Relaxed),
    });
    sink_cli::flags::print_line(&summary.to_string())?;
    Ok(())
}
