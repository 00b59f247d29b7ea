//! The ingest service: an HTTP endpoint that answers "stored" only
//! once the events are in finished files (or a PostgreSQL table, with
//! [`Destination::Postgres`]), written exactly once.
//!
//! It exists to show a [`Pipeline`] embedded in a real service: request
//! parsing that refuses a bad request before anything of it is written,
//! honest answers (200 only after the commit, 503 with `Retry-After` when the
//! answer cannot be given), idempotency keys that make client retries safe
//! across crashes, metrics, and a shutdown that loses nothing.
//!
//! ```text
//!  client ─POST /events─▶ parse + validate ─▶ pipeline.try_send(events, key) ─▶ subtask i ─▶ file sink
//!     ▲                   (400: nothing sent)      │ Full/Unavailable/Closed: 503    writes <dir>/data/.part-…
//!     │                                            ▼ ticket                              │ checkpoint n:
//!     └──── 200 {"checkpoint": n} ◀──── ticket resolves after the commit of n ◀───────────┘ roll + rename
//! ```
//!
//! The file sink rolls every part at every checkpoint
//! ([`RollingPolicy::on_checkpoint`]), so the commit of checkpoint `n` turns
//! everything written before barrier `n` into finished (visible) files, and
//! a ticket resolves only after its subtask's share of `n` was committed: a
//! 200 therefore means "in finished files under `<dir>/data`" (with
//! [`Config::compaction`], in a segment that is merged later, atomically for
//! readers). On PostgreSQL it means "in a committed transaction": one
//! `event jsonb` row per event, one prepared transaction per subtask and
//! checkpoint, `COMMIT PREPARED` after the checkpoint.
//!
//! With checkpoints on demand ([`CheckpointConfig::on_demand`]) a request
//! is answered about one checkpoint's duration after it arrived, and a
//! checkpoint answers every request that arrived while the one before ran.
//!
//! # The HTTP contract
//!
//! | request | answer |
//! |---|---|
//! | `POST /events`, valid | `200`, JSON `{"checkpoint": n, "events": k, "duplicate": b}`, after the commit of `n` |
//! | `POST /events`, malformed body or `Idempotency-Key` | `400`, JSON `{"error": "..."}` saying where and why; nothing is written |
//! | `POST /events`, an `Idempotency-Key` already used with a different body | `422`, JSON `{"error": "..."}`; nothing of this request is written |
//! | `POST /events`, body over the size limit | `413`, JSON `{"error": "..."}`; a body whose `Content-Length` is over it is refused at once, unread (no `100 Continue`), and the connection closed |
//! | `POST /events` or `GET /metrics` with [`Config::tokens`], without one valid `Authorization: Bearer <token>` | `401` + `WWW-Authenticate: Bearer …`, JSON `{"error": "..."}`; nothing of the request is read or written |
//! | `POST /events`, the body not complete within [`Config::body_read_timeout`] | `408`, JSON `{"error": "..."}`, the connection closed; nothing is written |
//! | `POST /events` with [`Config::tokens`], the tenant at its share of the in-flight bound ([`Config::tenant_max_in_flight`]) | `429` + `Retry-After`, JSON `{"error": "..."}`; nothing was taken |
//! | `POST /events` with [`Config::instances`], an `Idempotency-Key` another instance owns | `421` + `Ingest-Owner: <id>`, JSON `{"error": "..."}`; nothing is written |
//! | `POST /events`, pipeline overloaded, restarting or shutting down | `503` + `Retry-After`, JSON `{"error": "..."}`; nothing was taken |
//! | `POST /events`, taken but not confirmed (ticket failed or the ack timeout passed) | `503` + `Retry-After`, JSON `{"error": "..."}`: may or may not be stored, retry with the same key |
//! | `GET /metrics` | `200`, OpenMetrics text |
//! | `GET /healthz` (no token needed) | `200` `ok` while the pipeline runs, the server is not draining and checkpoints complete; `503` and the state otherwise (`degraded: …` after [`DEGRADED_AFTER_FAILED_CHECKPOINTS`] checkpoints failed in a row) |
//!
//! # Exposure
//!
//! [`IngestService::serve`] runs its own HTTP/1.1 accept loop (see
//! `server.rs`): HTTPS with [`Config::tls`], a header read timeout that is
//! also the idle timeout, and a cap on open connections
//! ([`ConnectionLimits`]). With [`Config::tokens`] every request to
//! `/events` and `/metrics` needs a bearer token ([`auth`]); its tenant is
//! stored with each event ([`TENANT_FIELD`]), scopes its idempotency keys
//! and their retention budget ([`Config::key_namespaces`]), and holds at
//! most its share of the requests in flight. The service
//! reads no other identity: not the peer address, nor `X-Forwarded-*`.
//! [`Reloader`] reads tokens and certificate again.
//!
//! The body of `POST /events` is a JSON array of objects when its first
//! non-whitespace byte is `[`, and JSON lines otherwise (one object per
//! non-blank line). See [`parse_events`] for the messages.
//!
//! # Shutdown
//!
//! When the `shutdown` future given to [`IngestService::serve`] completes,
//! the server stops accepting connections and lets the requests in flight
//! finish: the pipeline keeps checkpointing meanwhile, so their tickets
//! resolve. Only then is the pipeline shut down (final checkpoint and
//! commit). A drain that takes longer than the ack timeout plus
//! [`DRAIN_GRACE`] is cut short: the remaining connections are left behind,
//! and their events, already taken, are still committed by the final
//! checkpoint (the clients see a dropped connection and retry with their
//! keys). The checkpoints stay in `<dir>/checkpoints`: a new start on the
//! same directory resumes with its idempotency keys.
//!
//! # Limits
//!
//! Bodies up to [`Config::max_body_bytes`]; `Idempotency-Key` 1 to 255
//! visible ASCII characters, kept with the fingerprint of its body
//! ([`body_fingerprint`]): the same key with another body is refused with
//! 422 (the IETF Idempotency-Key draft's answer), the same key with the same
//! body is a duplicate; [`Config::capacity`] queued requests per
//! subtask; an answer waits at most [`Config::ack_timeout`]. Events are
//! stored as the same JSON values they were sent as, re-encoded: object keys
//! sorted, whitespace dropped, each number as the shortest text of its value
//! (`1.5e3` as `1500.0`, `2.50` as `2.5`). What cannot be stored as the same
//! value is refused with 400 naming where, and nothing of the request is
//! written: a number that would change (an integer beyond 64 bits, a
//! decimal beyond double precision: send it as a string) and a key twice in
//! one object.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use sink_runtime::pipeline::{
    IdempotencyKey, KeyNamespaces, KeyRetention, Pipeline, PipelineState, Refusal, SendError,
    TicketError,
};
use sink_runtime::{CheckpointConfig, RestartStrategy, RetryPolicy};
use sinks_file::{JsonLinesEncoder, RollingPolicy};
use sinks_postgres::PostgresSink;

use sink_cli::location::{self, Location, Storage};
use tokio::net::TcpListener;
use tracing::{info, warn};

pub mod auth;
#[cfg(feature = "delta")]
pub mod delta;
mod destination;
pub mod event_sink;
pub mod files;
#[cfg(feature = "iceberg")]
pub mod iceberg;
pub mod kafka;
mod metrics;
mod request;
pub mod routing;
mod server;
mod shares;
pub mod signals;

use auth::{Auth, Tenant, TokenSource};
use shares::Shares;

pub use server::{ConnectionLimits, Tls, TlsFiles};

use routing::{Instances, OWNER_HEADER};

pub use destination::{parse_table_name, Destination, Event};

pub use request::{
    body_fingerprint, idempotency_key, parse_events, BodyError, KeyError, MAX_KEY_LEN,
};

/// How long a draining server waits past [`Config::ack_timeout`] for the
/// requests in flight before it shuts the pipeline down anyway.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// The field the service adds to every event of an authenticated request:
/// the tenant its token stands for. A request whose events already hold it
/// is refused (400): a client cannot write under another tenant's name.
pub const TENANT_FIELD: &str = "_tenant";

/// The content type of `GET /metrics`: what `prometheus-client` encodes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the service runs with. Made by [`Config::new`] (the defaults) and
/// then adjusted field by field; read once by [`IngestService::start`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Finished data files go under `<output_dir>/data`, checkpoints under
    /// `<output_dir>/checkpoints` (the binary's default: `ingest-output`).
    pub output_dir: PathBuf,
    /// When checkpoints (and so commits and answers) are taken. Default
    /// every 1 s; on demand ([`CheckpointConfig::on_demand`]) an answer takes
    /// about one checkpoint's duration under light load.
    pub checkpointing: CheckpointConfig,
    /// Where the events go. Default [`Destination::Files`].
    pub destination: Destination,
    /// With files on a local disk: merge the committed files, a segment
    /// at a time (see [`sinks_file::CompactionPolicy`]), so that frequent
    /// checkpoints do not leave many tiny files. Default off.
    pub compaction: Option<sinks_file::CompactionPolicy>,
    /// Subtasks writing in parallel. Default 1 (see the `--parallelism` flag
    /// of `ingest-service`).
    pub parallelism: usize,
    /// Requests queued per subtask before `POST /events` answers 503.
    /// Default 1024.
    pub capacity: usize,
    /// Requests each subtask takes in and has not answered yet, before it
    /// lets them queue (see `PipelineBuilder::max_in_flight`). Default 16 384.
    pub max_in_flight: usize,
    /// How long idempotency keys are remembered: `max_age` (default 1 h),
    /// and `max_keys` (default 100 000) per tenant with
    /// [`tokens`](Self::tokens), for the whole service without. A tenant's
    /// new keys push out only its own oldest ones, never another tenant's
    /// (see [`key_namespaces`](Self::key_namespaces)); with `T` tenants
    /// sending keys, up to `T × max_keys` are kept, each in every checkpoint.
    pub key_retention: KeyRetention,
    /// The longest a request waits for its commit before it is answered 503
    /// (its events may still be committed: the client retries with its key).
    /// Must be longer than the checkpoint interval. Default 30 s.
    pub ack_timeout: Duration,
    /// The largest request body. Default 2 MiB.
    pub max_body_bytes: usize,
    /// Where the finished data files go instead of `<output_dir>/data`: a
    /// directory or an `s3://bucket/prefix` URL.
    pub data: Option<Location>,
    /// Where the checkpoints are kept instead of `<output_dir>/checkpoints`:
    /// a directory or an `s3://bucket/prefix` URL.
    pub state: Option<Location>,
    /// The object store client's options (`--endpoint`).
    pub s3_options: Vec<(String, String)>,
    /// This instance's id among the instances that share the data and the
    /// state location (`--instance-id`, `--instances`). With it, the job is
    /// named `ingest-<id>`, its checkpoints are kept under `<state>/<id>`
    /// (a replacement started with the same id anywhere resumes from them
    /// and fences this one), and a keyed request whose key another instance
    /// owns is answered 421 with the owner in `Ingest-Owner` (see
    /// [`routing`]). Default none: one instance, named `ingest-service`.
    pub instances: Option<Instances>,
    /// Serve HTTPS with this certificate and key (read again on
    /// [`Reloader::reload`]). Default none: plain HTTP, for a listener
    /// behind a proxy that terminates TLS, or on loopback. The binary asks
    /// for `--tls-cert`/`--tls-key` or an explicit `--plain-http`.
    pub tls: Option<TlsFiles>,
    /// Only requests with `Authorization: Bearer <token>` of a token from
    /// here may write and read `/metrics` (401 otherwise, nothing written);
    /// each event is stored with its tenant in [`TENANT_FIELD`], and
    /// idempotency keys are kept per tenant, each tenant with its own
    /// retention budget ([`key_retention`](Self::key_retention)). Default
    /// none: anyone who
    /// reaches the listener may write. The binary asks for `--tokens` (or
    /// `--tokens-env`) or an explicit `--no-auth`.
    pub tokens: Option<TokenSource>,
    /// The header read (and idle) timeout and the connection cap.
    pub limits: ConnectionLimits,
    /// The longest a request's body may take to arrive once its headers
    /// did; past it the request is answered 408 and nothing of it is
    /// written. Default 30 s.
    pub body_read_timeout: Duration,
    /// With [`tokens`](Self::tokens): the requests one tenant may have in
    /// flight (sent to the pipeline, not answered yet); past it, 429 with
    /// `Retry-After` and nothing taken. A request holds its place from
    /// before its body is read until its events are committed or failed
    /// (also when its client left, or its answer timed out). Default half of
    /// one subtask's queue ([`capacity`](Self::capacity)): the queues are
    /// what fills while the subtasks checkpoint, and keyed requests go to
    /// the subtask their key hashes to, so a tenant at its share leaves at
    /// least half of every queue to the others.
    pub tenant_max_in_flight: Option<usize>,
}

impl Config {
    /// The defaults, writing under `output_dir`.
    pub fn new(output_dir: impl Into<PathBuf>) -> Config {
        Config {
            output_dir: output_dir.into(),
            checkpointing: CheckpointConfig::every(Duration::from_secs(1)),
            destination: Destination::Files,
            compaction: None,
            parallelism: 1,
            capacity: 1024,
            max_in_flight: 16_384,
            key_retention: KeyRetention::default(),
            ack_timeout: Duration::from_secs(30),
            max_body_bytes: 2 * 1024 * 1024,
            data: None,
            state: None,
            s3_options: Vec::new(),
            instances: None,
            tls: None,
            tokens: None,
            limits: ConnectionLimits::default(),
            body_read_timeout: Duration::from_secs(30),
            tenant_max_in_flight: None,
        }
    }

    /// Which idempotency keys share the `max_keys` budget of
    /// [`key_retention`](Self::key_retention): with [`tokens`](Self::tokens),
    /// each tenant's (the service keeps a key as `<tenant>/<key>`, and a
    /// tenant's name holds no `/`), so one tenant's new keys never push out
    /// another's; without, all keys share one budget (a client's key may
    /// hold `/`, and there are no tenants). Read by [`IngestService::start`].
    pub fn key_namespaces(&self) -> KeyNamespaces {
        match self.tokens {
            Some(_) => KeyNamespaces::Prefix { separator: '/' },
            None => KeyNamespaces::Single,
        }
    }

    /// What one tenant may have in flight: [`tenant_max_in_flight`](Self::tenant_max_in_flight),
    /// else half of one subtask's queue.
    pub fn tenant_share(&self) -> usize {
        self.tenant_max_in_flight
            .unwrap_or_else(|| self.capacity.div_ceil(2))
    }

    /// The pipeline's job name: `ingest-<id>` for an instance, else
    /// `ingest-service`.
    pub fn job_name(&self) -> String {
        match &self.instances {
            Some(instances) => format!("ingest-{}", instances.me()),
            None => "ingest-service".to_string(),
        }
    }

    /// Where the finished data goes: [`data`](Self::data), else
    /// `<output_dir>/data`.
    pub fn data_location(&self) -> Location {
        self.data
            .clone()
            .unwrap_or_else(|| Location::Local(self.data_dir()))
    }

    /// Where the checkpoints are: [`state`](Self::state), else
    /// `<output_dir>/checkpoints`; under `<id>` there for an instance.
    pub fn state_location(&self) -> Location {
        let state = self
            .state
            .clone()
            .unwrap_or_else(|| Location::Local(self.checkpoint_dir()));
        match &self.instances {
            Some(instances) => state.join(instances.me()),
            None => state,
        }
    }

    /// Where the finished data files are: `<output_dir>/data`.
    pub fn data_dir(&self) -> PathBuf {
        self.output_dir.join("data")
    }

    /// Where the checkpoints are: `<output_dir>/checkpoints`.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.output_dir.join("checkpoints")
    }

    /// What `Retry-After` says: one checkpoint interval (on demand, the
    /// maximum one), at least 1 s.
    fn retry_after_s(&self) -> u64 {
        let interval = self.checkpointing.interval;
        (interval.as_secs() + u64::from(interval.subsec_nanos() > 0)).max(1)
    }
}

/// What the service did, printed as one JSON line when it stops. Returned
/// by [`IngestService::serve`] and [`run`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Records (events) handed to the file writers by this process.
    pub records_written: u64,
    /// Records committed by this process (not counting re-commits of a
    /// restored checkpoint).
    pub records_committed: u64,
    /// Checkpoints completed by this process.
    pub checkpoints: u64,
    /// The newest completed checkpoint, if any.
    pub last_checkpoint: Option<u64>,
    /// Commits that failed with a known reason (a part file deleted or
    /// damaged before its commit): their events were never acknowledged
    /// (their requests were answered with an error), but they are not in the
    /// output. Above zero, look at the warnings on stderr.
    pub commits_failed: u64,
    /// Events lost with those commits, as the file committer counted them.
    pub records_lost: u64,
    /// What the destination committed for this process: finished files
    /// made visible, or PostgreSQL transactions committed (one per subtask
    /// and checkpoint that had events), not counting re-commits of a
    /// restored checkpoint.
    pub commits: u64,
}

/// A started service: its pipeline runs, and [`serve`](Self::serve) answers
/// HTTP on a listener until told to stop.
#[derive(Debug)]
pub struct IngestService {
    pipeline: Pipeline<Event>,
    app: AppState,
    tls: Option<Arc<Tls>>,
    limits: ConnectionLimits,
    connections: server::ConnectionMetrics,
}

/// Reads the service's tokens and TLS certificate again, for a rotation
/// without a restart. Made by [`IngestService::reloader`]; the binary calls
/// it on SIGHUP. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Reloader {
    auth: Option<Arc<Auth>>,
    tls: Option<Arc<Tls>>,
}

impl Reloader {
    /// Reads the token source and the certificate files again and puts
    /// what read well in force; returns what was reloaded, for the log.
    /// Fails, naming each failure, when either could not be read: then
    /// that one's old version stays in force (the other is still
    /// reloaded). Requests and connections in progress are not affected.
    pub async fn reload(&self) -> anyhow::Result<String> {
        let mut done = Vec::new();
        let mut failed = Vec::new();
        if let Some(auth) = &self.auth {
            match auth.reload().await {
                Ok(count) => done.push(format!("{count} tokens from {}", auth.source())),
                Err(error) => failed.push(
                    anyhow::Error::new(error)
                        .context(format!("reloading the tokens from {}", auth.source())),
                ),
            }
        }
        if let Some(tls) = &self.tls {
            match tls.reload().await {
                Ok(()) => done.push(format!(
                    "the TLS certificate {}",
                    tls.files().cert.display()
                )),
                Err(error) => failed.push(error.context("reloading the TLS certificate")),
            }
        }
        if failed.is_empty() {
            return Ok(if done.is_empty() {
                "nothing (no tokens, no TLS)".to_string()
            } else {
                done.join(" and ")
            });
        }
        let reasons: Vec<String> = failed.iter().map(|e| format!("{e:#}")).collect();
        anyhow::bail!(
            "{}; the old version stays in force{}",
            reasons.join("; "),
            if done.is_empty() {
                String::new()
            } else {
                format!(" (reloaded: {})", done.join(" and "))
            }
        )
    }
}

/// Starts the service with `config` and serves `listener` until `shutdown`
/// completes; then drains and shuts the pipeline down. For callers that have
/// nothing to do between the start and the serving (a load test); the
/// binary uses [`IngestService::start`] and [`IngestService::serve`] so that
/// it can say it listens only once the pipeline runs.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Summary> {
    IngestService::start(config)
        .await?
        .serve(listener, shutdown)
        .await
}

impl IngestService {
    /// Opens `<dir>/checkpoints` and `<dir>/data` and starts the pipeline,
    /// restoring from the newest checkpoint there, if any (which commits it
    /// again: the file sink recognises files it committed before). Returns
    /// once every subtask reads its channel.
    ///
    /// Fails with the directory and the reason when a directory cannot be
    /// created or the checkpoints are locked by another live process, and
    /// when the configuration is refused.
    pub async fn start(config: Config) -> anyhow::Result<IngestService> {
        anyhow::ensure!(
            config.ack_timeout > config.checkpointing.interval,
            "the ack timeout ({:?}) must be longer than the checkpoint interval ({:?}): \
             every request would time out before its commit",
            config.ack_timeout,
            config.checkpointing.interval
        );
        // Read before the pipeline starts: a bad certificate or token file
        // fails the start, naming the file, before anything runs.
        let tls = match &config.tls {
            Some(files) => Some(Arc::new(Tls::open(files.clone()).await?)),
            None => None,
        };
        let auth = match &config.tokens {
            Some(source) => {
                Some(Arc::new(Auth::open(source.clone()).await.with_context(
                    || format!("reading the tokens from {source}"),
                )?))
            }
            None => None,
        };
        let data = config.data_location();
        if let (Destination::Files, Location::Local(data_dir)) = (&config.destination, &data) {
            // Created here, not by the first writer, so a bad directory is
            // reported at once instead of failing (and restarting) the job.
            // Durable with every entry above it before anything is
            // acknowledged (docs/semantics.md, "Durability").
            sink_local_fs::create_dir_all(data_dir).with_context(|| {
                format!(
                    "creating the data directory {}; pass an --output-dir you can write to",
                    data_dir.display()
                )
            })?;
        }
        let state = config.state_location();
        let storage = Storage::open(&state, &config.s3_options)
            .with_context(|| format!("opening the checkpoint storage {state}"))?;
        let pipeline = match &config.destination {
            Destination::Files => {
                let mut builder =
                    location::file_sink_builder(&data, JsonLinesEncoder, &config.s3_options)?
                        .rolling_policy(RollingPolicy::on_checkpoint())
                        .part_suffix(".jsonl");
                if let Some(policy) = config.compaction {
                    builder = builder.compaction(policy);
                }
                let sink = builder.build().context("configuring the file sink")?;
                start_pipeline(&config, storage, sink).await
            }
            #[cfg(feature = "delta")]
            Destination::Delta => {
                let table = location::delta_table(&data, &config.s3_options)?;
                let sink = delta::EventTable::new(table).context("configuring the Delta sink")?;
                start_pipeline(&config, storage, sink).await
            }
            #[cfg(not(feature = "delta"))]
            Destination::Delta => anyhow::bail!(
                "this ingest-service was built without Delta Lake support: build it with \
                 `cargo build --release -p examples --features delta`"
            ),
            #[cfg(feature = "iceberg")]
            Destination::Iceberg {
                catalog,
                catalog_properties,
                table,
            } => {
                let (flag, warehouse) = match (&data, catalog) {
                    (Location::Local(warehouse), catalog) => (
                        catalog.clone().unwrap_or_else(|| {
                            format!("sqlite:{}", warehouse.join("catalog.db").display())
                        }),
                        warehouse.display().to_string(),
                    ),
                    (Location::S3(url), Some(catalog)) => (catalog.clone(), url.clone()),
                    (Location::S3(url), None) => anyhow::bail!(
                        "--sink iceberg with the warehouse {url} needs --catalog sqlite:PATH \
                         (the SQL catalog is a local SQLite database) or rest:URL"
                    ),
                };
                // A REST catalog places its tables: the data location holds
                // the checkpoints only.
                let warehouse = (!flag.starts_with("rest:")).then_some(warehouse.as_str());
                let catalog = sinks_iceberg::IcebergCatalog::from_flags(
                    &flag,
                    catalog_properties,
                    warehouse,
                    &config.s3_options,
                )?;
                let table = sinks_iceberg::parse_table_name(table)?;
                let sink = iceberg::EventTable::new(catalog, table)
                    .context("configuring the Iceberg sink")?;
                start_pipeline(&config, storage, sink).await
            }
            #[cfg(not(feature = "iceberg"))]
            Destination::Iceberg { .. } => anyhow::bail!(
                "this ingest-service was built without Apache Iceberg support: build it with \
                 `cargo build --release -p ingest-service --features iceberg`"
            ),
            Destination::Kafka {
                brokers,
                topic,
                kafka_config,
            } => {
                let properties = match kafka_config {
                    Some(path) => sinks_kafka::ClientProperties::read(path)
                        .map_err(anyhow::Error::msg)?,
                    None => sinks_kafka::ClientProperties::default(),
                };
                for ignored in &properties.ignored {
                    tracing::warn!(property = %ignored, "a Kafka client property the sink does not use: ignored");
                }
                let sink = sinks_kafka::KafkaSink::builder(brokers.as_str(), topic)
                    .properties(&properties)
                    .partitions(u32::try_from(config.parallelism).unwrap_or(u32::MAX))
                    .connect()
                    .await
                    .with_context(|| format!("connecting the sink to the Kafka topic {topic}"))?;
                start_pipeline(&config, storage, event_sink::EventSink(sink)).await
            }
            Destination::Postgres { url, table } => {
                create_table(url, table).await?;
                let sink = PostgresSink::<Event>::connect(url, table, config.parallelism)
                    .await
                    .with_context(|| format!("connecting the sink to the table {table}"))?;
                start_pipeline(&config, storage, sink).await
            }
        }
        .with_context(|| {
            format!(
                "starting the pipeline on {}",
                config.destination.describe(&data)
            )
        })?;
        let responses = Family::<StatusLabel, Counter>::default();
        let mut registry = Registry::default();
        registry.register(
            "ingest_http_responses",
            "HTTP responses sent, by status code",
            responses.clone(),
        );
        registry.register_collector(Box::new(metrics::PipelineCollector {
            pipeline: pipeline.clone(),
        }));
        let connections = server::ConnectionMetrics::default();
        connections.register(&mut registry);
        let tenant_refusals = Counter::default();
        registry.register(
            "ingest_tenant_share_refusals",
            "Requests answered 429 because their tenant had its share of the in-flight bound",
            tenant_refusals.clone(),
        );
        let app = AppState {
            pipeline: pipeline.clone(),
            responses,
            draining: Arc::new(AtomicBool::new(false)),
            ack_timeout: config.ack_timeout,
            retry_after_s: config.retry_after_s(),
            max_body_bytes: config.max_body_bytes,
            registry: Arc::new(registry),
            instances: config.instances.clone().map(Arc::new),
            auth,
            shares: Shares::new(config.tenant_share()),
            tenant_refusals,
            body_read_timeout: config.body_read_timeout,
        };
        Ok(IngestService {
            pipeline,
            app,
            tls,
            limits: config.limits,
            connections,
        })
    }

    /// `https` with [`Config::tls`], else `http`: for the address a caller
    /// prints.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The handle that reloads the tokens and the certificate.
    pub fn reloader(&self) -> Reloader {
        Reloader {
            auth: self.app.auth.clone(),
            tls: self.tls.clone(),
        }
    }

    /// The routes, for serving on another server or calling in a test.
    pub fn router(&self) -> Router {
        let app = self.app.clone();
        // `/healthz` stays open: a load balancer probes it without a token,
        // and it says only whether the service takes requests.
        Router::new()
            .route("/events", post(post_events))
            .route("/metrics", get(get_metrics))
            .route_layer(middleware::from_fn_with_state(app.clone(), authenticate))
            .route("/healthz", get(get_healthz))
            .layer(DefaultBodyLimit::max(app.max_body_bytes))
            .layer(middleware::from_fn_with_state(
                app.responses.clone(),
                count_responses,
            ))
            .with_state(app)
    }

    /// Serves HTTP on `listener` until `shutdown` completes (or the pipeline
    /// stops for good), drains the requests in flight, shuts the pipeline
    /// down and returns what it did.
    ///
    /// Fails when the pipeline failed past its restart strategy: the error
    /// says why; what was committed stays committed, and a restart on the
    /// same directory resumes.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<Summary> {
        let router = self.router();
        let draining = self.app.draining.clone();
        let (stopping_tx, mut stopping_rx) = tokio::sync::watch::channel(false);
        let pipeline = self.pipeline.clone();
        let signal = async move {
            tokio::select! {
                () = shutdown => info!("stopping: no new connections; draining the requests in flight"),
                () = pipeline.stopped() => warn!("the pipeline stopped; stopping the server"),
            }
            draining.store(true, Ordering::SeqCst);
            stopping_tx.send_replace(true);
        };
        // The server stops accepting once `stopping` is set, lets the
        // requests in flight finish and ends when every connection closed.
        let serving = server::serve(
            listener,
            router,
            self.tls.clone(),
            self.limits,
            self.connections.clone(),
            stopping_rx.clone(),
        );
        let server = async move {
            tokio::join!(signal, serving);
        };
        let drain_limit = self.app.ack_timeout + DRAIN_GRACE;
        let drain_deadline = async move {
            if stopping_rx.wait_for(|stopping| *stopping).await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(drain_limit).await;
        };
        tokio::select! {
            () = server => {}
            () = drain_deadline => warn!(
                ?drain_limit,
                "requests still in flight after the drain limit; shutting the pipeline down anyway"
            ),
        }
        let report = self
            .pipeline
            .shutdown()
            .await
            .context("shutting the pipeline down")?;
        info!(status = ?report.status, "pipeline shut down");
        Ok(Summary {
            records_written: report.metrics.records_written,
            records_committed: report.metrics.records_committed,
            checkpoints: report.metrics.checkpoints_completed,
            last_checkpoint: report.last_checkpoint.map(|id| id.0),
            commits_failed: report.metrics.commits_failed,
            records_lost: report.metrics.records_lost,
            commits: report.metrics.commits_succeeded,
        })
    }
}

/// Starts the service's pipeline into `sink`: its checkpoints, storage,
/// limits and restart strategy are the same whatever the destination.
async fn start_pipeline<S>(
    config: &Config,
    storage: Storage,
    sink: S,
) -> Result<Pipeline<Event>, sink_runtime::pipeline::PipelineError>
where
    S: sink_api::Sink<Writer: sink_api::SinkWriter<Input = Event>>,
{
    Pipeline::builder(config.job_name(), sink)
        .parallelism(config.parallelism)
        .checkpointing(config.checkpointing)
        .checkpoint_storage(storage)
        .capacity(config.capacity)
        .max_in_flight(config.max_in_flight)
        .key_retention(config.key_retention)
        .key_namespaces(config.key_namespaces())
        // A failed task restarts the job from its last checkpoint; past
        // ten restarts the pipeline stops and the service exits 1.
        .restart_strategy(RestartStrategy::ExponentialBackoff(RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }))
        .start()
        .await
}

/// Creates the PostgreSQL destination's table if it is missing.
async fn create_table(url: &str, table: &str) -> anyhow::Result<()> {
    let redacted = sinks_postgres::redact_connection_string(url);
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to PostgreSQL at {redacted}"))?;
    let connection = tokio::spawn(connection);
    client
        .batch_execute(&destination::create_table_sql(table))
        .await
        .with_context(|| format!("creating the table {table} if it is missing"))?;
    drop(client);
    // The connection ends once its client is gone.
    let _ = connection.await;
    Ok(())
}

/// What every handler shares.
#[derive(Debug, Clone)]
struct AppState {
    pipeline: Pipeline<Event>,
    responses: Family<StatusLabel, Counter>,
    /// Set once the server stops accepting connections.
    draining: Arc<AtomicBool>,
    ack_timeout: Duration,
    retry_after_s: u64,
    max_body_bytes: usize,
    registry: Arc<Registry>,
    instances: Option<Arc<Instances>>,
    /// With tokens: who may write.
    auth: Option<Arc<Auth>>,
    /// Each tenant's requests in flight (with tokens).
    shares: Arc<Shares>,
    tenant_refusals: Counter,
    body_read_timeout: Duration,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: u16,
}

async fn count_responses(
    State(responses): State<Family<StatusLabel, Counter>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    responses
        .get_or_create(&StatusLabel {
            status: response.status().as_u16(),
        })
        .inc();
    response
}

/// The answer of `POST /events` when it is an error: its status and a JSON
/// `{"error": message}` body, with `Retry-After` on 503 and 429.
fn refuse(status: StatusCode, message: impl Into<String>, retry_after_s: u64) -> Response {
    let mut response =
        (status, Json(serde_json::json!({ "error": message.into() }))).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_s));
    }
    response
}

/// The exit status of `ingest-service` when it stopped because a newer
/// start of its instance fenced it (off the checkpoint storage, or off the
/// Delta table): a supervisor must not start it again (systemd's
/// `RestartPreventExitStatus=3`), since a new process would take the
/// storage back from its replacement.
pub const EXIT_FENCED: u8 = 3;

/// Whether `error` says a newer start of this instance fenced it: its
/// chain holds the checkpoint storage's `Fenced`, the Kafka sink's
/// `NewerInstance`, or the table sinks' `TableFenced` (Delta with the
/// `delta` feature, Iceberg with `iceberg`). Read by the binary to choose
/// its exit status.
pub fn is_fenced(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        let storage = matches!(
            cause.downcast_ref::<sink_runtime::storage::StorageError>(),
            Some(sink_runtime::storage::StorageError::Fenced { .. })
        );
        #[cfg(feature = "delta")]
        let delta = cause.downcast_ref::<sinks_delta::TableFenced>().is_some();
        #[cfg(not(feature = "delta"))]
        let delta = false;
        #[cfg(feature = "iceberg")]
        let iceberg = cause.downcast_ref::<sinks_iceberg::TableFenced>().is_some();
        #[cfg(not(feature = "iceberg"))]
        let iceberg = false;
        storage || delta || iceberg || cause.downcast_ref::<sinks_kafka::NewerInstance>().is_some()
    })
}

/// The answer to a request whose tenant has `limit` requests in flight
/// already: 429 with `Retry-After`; nothing of it was taken.
fn too_many(tenant: &Tenant, limit: usize, retry_after_s: u64) -> Response {
    refuse(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "the tenant '{tenant}' has {limit} requests in flight, its share of the service; \
             nothing of this request was stored: retry after the answers to the others"
        ),
        retry_after_s,
    )
}

/// `response`, marked to close its connection: for answers given before
/// the request's body was read whole, which leave the connection unusable.
/// The body length a request's `Content-Length` declares (hyper has
/// refused a malformed or doubled one before the handler runs).
fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(axum::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The answer to a keyed request whose key `owner` owns: 421 and the
/// owner's id in `Ingest-Owner`; nothing of it is stored.
fn misdirected(key: &str, owner: &str, me: &str) -> Response {
    let mut response = refuse(
        StatusCode::MISDIRECTED_REQUEST,
        format!(
            "the Idempotency-Key '{key}' belongs to the instance '{owner}', this is '{me}': \
             nothing was stored; send the request to '{owner}' (the owner of a key is the \
             rendezvous hash of the key over the instance ids, see docs/scale-out.md)"
        ),
        0,
    );
    if let Ok(value) = HeaderValue::from_str(owner) {
        response.headers_mut().insert(OWNER_HEADER, value);
    }
    response
}

/// With tokens: lets a request through only with a valid bearer token, and
/// hands its [`Tenant`] to the handler; 401 with `WWW-Authenticate`
/// otherwise, before anything of the request (its body included) is read.
async fn authenticate(State(app): State<AppState>, mut request: Request, next: Next) -> Response {
    let Some(auth) = &app.auth else {
        return next.run(request).await;
    };
    let values = request.headers().get_all(AUTHORIZATION).iter();
    match auth.authenticate(values.map(HeaderValue::as_bytes)) {
        Ok(tenant) => {
            request.extensions_mut().insert(tenant);
            next.run(request).await
        }
        Err(why) => {
            let mut response = refuse(StatusCode::UNAUTHORIZED, why.to_string(), 0);
            let challenge = match why {
                auth::Unauthenticated::Missing => r#"Bearer realm="ingest""#,
                auth::Unauthenticated::Malformed => {
                    r#"Bearer realm="ingest", error="invalid_request""#
                }
                auth::Unauthenticated::Invalid => r#"Bearer realm="ingest", error="invalid_token""#,
            };
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
            closing(response)
        }
    }
}

/// Adds the tenant to every event; refuses (the message of a 400) events
/// that hold [`TENANT_FIELD`] already.
fn stamp_tenant(events: &mut [Event], tenant: &Tenant) -> Result<(), String> {
    for (at, Event(event)) in events.iter_mut().enumerate() {
        let Some(object) = event.as_object_mut() else {
            continue;
        };
        if object.contains_key(TENANT_FIELD) {
            return Err(format!(
                "event {} holds the field \"{TENANT_FIELD}\", which the service sets from the \
                 bearer token; remove it (nothing was stored)",
                at + 1
            ));
        }
        object.insert(
            TENANT_FIELD.to_string(),
            serde_json::Value::String(tenant.name().to_string()),
        );
    }
    Ok(())
}

/// The idempotency key the pipeline keeps for a request's `key`: with
/// tokens `<tenant>/<key>` (a tenant's name holds no `/`), so one tenant's
/// key never matches another's, and [`Config::key_namespaces`] budgets
/// the key's retention under its tenant; without, the key as sent.
fn scoped_key(tenant: Option<&Tenant>, key: String) -> String {
    match tenant {
        Some(tenant) => format!("{tenant}/{key}"),
        None => key,
    }
}

/// `POST /events`: validate everything, send once, answer after the commit.
async fn post_events(
    State(app): State<AppState>,
    tenant: Option<Extension<Tenant>>,
    request: Request,
) -> Response {
    let retry_after_s = app.retry_after_s;
    let tenant = tenant.map(|Extension(tenant)| tenant);
    // A body declared over the limit is refused before anything else, and
    // without reading it: no `100 Continue` is sent (hyper sends it only
    // once the body is read), and the connection is closed rather than
    // drained.
    if let Some(declared) = declared_length(request.headers()) {
        if declared > app.max_body_bytes as u64 {
            return closing(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body is larger than {} bytes; split the events over several requests \
                     (its Content-Length declares {declared}; nothing was stored)",
                    app.max_body_bytes
                ),
                retry_after_s,
            ));
        }
    }
    // The key and its owner first: neither needs the body.
    let key = match idempotency_key(request.headers()) {
        Ok(key) => key,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error.to_string(), retry_after_s),
    };
    if let (Some(key), Some(instances)) = (&key, &app.instances) {
        if let Some(owner) = instances.other_owner(key) {
            return misdirected(key, owner, instances.me());
        }
    }
    // The tenant's share is taken before the body is read, so that its
    // slow bodies count against it too, and held until its events are
    // committed or failed (below), not merely until the answer.
    let share = match &tenant {
        None => None,
        Some(tenant) => match app.shares.try_take(tenant) {
            Some(share) => Some(share),
            None => {
                app.tenant_refusals.inc();
                return too_many(tenant, app.shares.limit(), retry_after_s);
            }
        },
    };
    // A body that trickles in holds a connection, not the pipeline: it is
    // read with its own deadline, before anything is sent.
    let body = match tokio::time::timeout(app.body_read_timeout, Bytes::from_request(request, &()))
        .await
    {
        Ok(body) => body,
        Err(_elapsed) => {
            return closing(refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {:?}; nothing was stored: send it again",
                    app.body_read_timeout
                ),
                retry_after_s,
            ))
        }
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body is larger than {} bytes; split the events over several requests",
                    app.max_body_bytes
                ),
                retry_after_s,
            )
        }
        Err(rejection) => {
            return refuse(
                rejection.status(),
                format!("reading the body failed: {}", rejection.body_text()),
                retry_after_s,
            )
        }
    };
    let mut events = match parse_events(&body) {
        Ok(events) => events.into_iter().map(Event).collect::<Vec<_>>(),
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error.to_string(), retry_after_s),
    };
    if let Some(tenant) = &tenant {
        if let Err(message) = stamp_tenant(&mut events, tenant) {
            return refuse(StatusCode::BAD_REQUEST, message, retry_after_s);
        }
    }
    let count = events.len();
    // The key is kept with the body's fingerprint: a retry (the same body)
    // is a duplicate, another body under the same key is refused (422).
    let sent = match key {
        Some(key) => app.pipeline.try_send_keyed(
            events,
            IdempotencyKey::new(scoped_key(tenant.as_ref(), key))
                .with_fingerprint(body_fingerprint(&body)),
        ),
        None => app.pipeline.try_send(events, None),
    };
    let ticket = match sent {
        Ok(ticket) => ticket,
        Err(SendError { refusal, .. }) => {
            let message = match refusal {
                Refusal::Full => "the service is overloaded; nothing was stored: retry later",
                Refusal::Unavailable => {
                    "the pipeline is restarting; nothing was stored: retry later"
                }
                Refusal::Closed => "the service is shutting down; nothing was stored: retry later",
            };
            return refuse(StatusCode::SERVICE_UNAVAILABLE, message, retry_after_s);
        }
    };
    let unconfirmed = |why: String| {
        warn!(%why, events = count, "a request was not confirmed");
        refuse(StatusCode::SERVICE_UNAVAILABLE, why, retry_after_s)
    };
    let answer = match share {
        // Without tokens there is no share to hold: the ticket is awaited
        // here.
        None => tokio::time::timeout(app.ack_timeout, ticket).await,
        // With one, by a task of its own that holds the share: a client
        // that goes away, or an answer that times out, gives the share back
        // only once the pipeline no longer holds the events.
        Some(share) => {
            let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let answer = ticket.await;
                drop(share);
                // The handler may be gone (the client left): nobody to tell.
                let _ = answer_tx.send(answer);
            });
            match tokio::time::timeout(app.ack_timeout, answer_rx).await {
                Ok(Ok(answer)) => Ok(answer),
                // The task ended without an answer (it cannot, short of a
                // panic): as a ticket whose pipeline went away.
                Ok(Err(_gone)) => Ok(Err(TicketError::NotCommitted)),
                Err(elapsed) => Err(elapsed),
            }
        }
    };
    match answer {
        Ok(Ok(ack)) => Json(serde_json::json!({
            "checkpoint": ack.checkpoint_id.0,
            "events": count,
            "duplicate": ack.duplicate,
        }))
        .into_response(),
        Ok(Err(TicketError::NotCommitted)) => unconfirmed(
            "the pipeline restarted or stopped before the events were committed; they may or may \
             not be stored: retry with the same Idempotency-Key"
                .into(),
        ),
        Ok(Err(TicketError::PartlyLost { checkpoint_id })) => unconfirmed(format!(
            "the commit of checkpoint {checkpoint_id} lost part of its output; the events may or \
             may not be stored: retry (the same Idempotency-Key is fine, it was forgotten)"
        )),
        Ok(Err(TicketError::Refused(reason))) => unconfirmed(format!(
            "the events were not stored ({reason}); retry with the same Idempotency-Key"
        )),
        Ok(Err(TicketError::KeyReused { committed_in })) => refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "this Idempotency-Key was already used with a different body (its events are {}); \
                 nothing of this request was stored: send new events under a new \
                 Idempotency-Key, and a retry with the same bytes as the first request",
                match committed_in {
                    Some(checkpoint) => format!("committed in checkpoint {checkpoint}"),
                    None => "not committed yet".to_string(),
                }
            ),
            retry_after_s,
        ),
        Err(_elapsed) => unconfirmed(format!(
            "the events were not confirmed within {:?}; they may or may not be stored: retry \
             with the same Idempotency-Key",
            app.ack_timeout
        )),
    }
}

/// `GET /healthz`.
async fn get_healthz(State(app): State<AppState>) -> Response {
    health(
        app.pipeline.state(),
        app.draining.load(Ordering::SeqCst),
        app.pipeline.metrics().checkpoints_failed_in_a_row,
    )
}

/// Checkpoints failed in a row from which `/healthz` says the service is
/// degraded: nothing it takes is being committed.
pub const DEGRADED_AFTER_FAILED_CHECKPOINTS: u64 = 3;

/// 200 `ok` while the pipeline runs, the server takes connections and
/// checkpoints complete; 503 and why otherwise (`degraded: …` once
/// [`DEGRADED_AFTER_FAILED_CHECKPOINTS`] checkpoints failed in a row).
fn health(state: PipelineState, draining: bool, failed_in_a_row: u64) -> Response {
    let text = match state {
        PipelineState::Running if draining => "shutting down".to_string(),
        PipelineState::Running if failed_in_a_row >= DEGRADED_AFTER_FAILED_CHECKPOINTS => {
            format!(
                "degraded: {failed_in_a_row} checkpoints failed in a row, so nothing is being \
                 committed (the log says why)"
            )
        }
        PipelineState::Running => return (StatusCode::OK, "ok").into_response(),
        PipelineState::Restarting => "restarting".to_string(),
        PipelineState::ShuttingDown => "shutting down".to_string(),
        PipelineState::Stopped => "stopped".to_string(),
    };
    (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
}

/// `GET /metrics`.
async fn get_metrics(State(app): State<AppState>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &app.registry) {
        Ok(()) => ([(CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_503_and_429_carry_retry_after() {
        let unavailable = refuse(StatusCode::SERVICE_UNAVAILABLE, "later", 3);
        assert_eq!(
            unavailable.headers().get(RETRY_AFTER),
            Some(&HeaderValue::from(3u64))
        );
        let too_many = refuse(StatusCode::TOO_MANY_REQUESTS, "later", 3);
        assert_eq!(
            too_many.headers().get(RETRY_AFTER),
            Some(&HeaderValue::from(3u64))
        );
        let bad = refuse(StatusCode::BAD_REQUEST, "bad", 3);
        assert_eq!(bad.headers().get(RETRY_AFTER), None);
    }

    #[test]
    fn health_is_ok_only_while_running_not_draining_and_checkpointing() {
        for failed_in_a_row in [0, DEGRADED_AFTER_FAILED_CHECKPOINTS - 1] {
            assert_eq!(
                health(PipelineState::Running, false, failed_in_a_row).status(),
                StatusCode::OK
            );
        }
        for (state, draining, failed_in_a_row) in [
            (PipelineState::Running, true, 0),
            (
                PipelineState::Running,
                false,
                DEGRADED_AFTER_FAILED_CHECKPOINTS,
            ),
            (PipelineState::Restarting, false, 0),
            (PipelineState::ShuttingDown, false, 0),
            (PipelineState::Stopped, false, 0),
        ] {
            assert_eq!(
                health(state, draining, failed_in_a_row).status(),
                StatusCode::SERVICE_UNAVAILABLE
            );
        }
    }

    #[test]
    fn with_tokens_a_key_s_retention_namespace_is_its_tenant() {
        let tenant = Tenant::new("alpha").expect("a valid tenant name");
        // A client's key may hold `/` itself: the tenant is still the
        // namespace, since a tenant's name holds none.
        let key = scoped_key(Some(&tenant), "orders/17".to_string());
        assert_eq!(key, "alpha/orders/17");
        let with_tokens = Config {
            tokens: Some(TokenSource::Env("TOKENS".into())),
            ..Config::new("x")
        };
        assert_eq!(with_tokens.key_namespaces().namespace(&key), "alpha");
        // Without tokens, one budget for every key as sent.
        let key = scoped_key(None, "orders/17".to_string());
        assert_eq!(key, "orders/17");
        let without = Config::new("x");
        assert_eq!(without.key_namespaces(), KeyNamespaces::Single);
        assert_eq!(without.key_namespaces().namespace(&key), "");
    }

    #[test]
    fn retry_after_is_one_interval_rounded_up_and_at_least_a_second() {
        let with = |interval| Config {
            checkpointing: CheckpointConfig::every(interval),
            ..Config::new("x")
        };
        assert_eq!(with(Duration::from_millis(100)).retry_after_s(), 1);
        assert_eq!(with(Duration::from_millis(2500)).retry_after_s(), 3);
    }
}
