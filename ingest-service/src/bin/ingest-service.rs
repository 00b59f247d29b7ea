//! The ingest service: `POST /events` answers 200 only once the events are
//! committed into finished files (or a PostgreSQL table), exactly once, even across crashes (with
//! `Idempotency-Key`). The service itself is this crate's library
//! (`ingest_service`); this is its command line.
//!
//! ```text
//! cargo run --release -p ingest-service --bin ingest-service -- --output-dir ingest-output --plain-http --no-auth
//! curl -s -XPOST localhost:8080/events -H 'Idempotency-Key: req-1' -d '[{"id": 1}]'
//! ```
//!
//! Stdout holds two lines: `listening on http://<addr>` once requests are
//! served, and a JSON summary after a clean stop (SIGTERM or Ctrl-C). Logs
//! go to stderr (`RUST_LOG`, default `info`). A second signal during the
//! drain exits at once with status 1; nothing acknowledged is lost by that.
//! Fenced by a newer start of the same instance, it exits with status 3
//! (`ingest_service::EXIT_FENCED`): do not restart it then. SIGHUP reads
//! the tokens and the TLS certificate again (a failure is logged and the
//! old ones stay in force).
//!
//! It serves HTTPS and only to bearer tokens unless told otherwise: it
//! needs `--tls-cert`/`--tls-key` or `--plain-http`, and `--tokens` (or
//! `--tokens-env`) or `--no-auth`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{CommandFactory, Parser, ValueEnum};
use ingest_service::auth::TokenSource;
use ingest_service::routing::Instances;
use ingest_service::{
    parse_table_name, Config, ConnectionLimits, Destination, IngestService, TlsFiles,
};
use sink_cli::flags::{parse_checkpoints, parse_duration, parse_positive_duration, Checkpoints};
use sink_cli::location::{self, Location};
use sink_runtime::pipeline::KeyRetention;
use tokio::net::{TcpListener, TcpSocket};

#[derive(Debug, Parser)]
#[command(
    about = "HTTP ingest into exactly-once files: 200 only after the commit",
    long_about = None
)]
struct Args {
    /// Address and port to listen on; port 0 lets the system pick (the
    /// `listening on` line says which).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Finished files go to DIR/data, checkpoints to DIR/checkpoints; start
    /// again on the same DIR to resume.
    #[arg(long, value_name = "DIR", default_value = "ingest-output")]
    output_dir: PathBuf,
    /// Finished files go here instead of DIR/data: a directory or an
    /// s3://bucket/prefix URL (credentials and region from the AWS_*
    /// variables).
    #[arg(long, value_parser = Location::parse)]
    out: Option<Location>,
    /// Checkpoints are kept here instead of DIR/checkpoints: a directory or
    /// an s3://bucket/prefix URL.
    #[arg(long, value_parser = Location::parse)]
    state: Option<Location>,
    /// The S3 endpoint, for S3-compatible servers (default:
    /// AWS_ENDPOINT_URL, else AWS itself).
    #[arg(long)]
    endpoint: Option<String>,
    /// Where the events go: files (under --output-dir or --out), a
    /// PostgreSQL table (--url, --table), a Delta Lake table at DIR/data or
    /// --out (built with the delta feature), an Apache Iceberg table
    /// (--table NAMESPACE.NAME, --catalog; its warehouse DIR/data or --out;
    /// built with the iceberg feature), or a Kafka topic (--brokers,
    /// --topic).
    #[arg(long, value_enum, default_value = "files")]
    sink: SinkKind,
    /// This instance's id (1 to 64 of a-z, 0-9, - and _), when several
    /// instances share --out and --state: its checkpoints go under
    /// STATE/ID, and a replacement started anywhere with the same id
    /// resumes from them and fences this one (see docs/scale-out.md).
    #[arg(long, value_name = "ID")]
    instance_id: Option<String>,
    /// With --instance-id: every instance's id, comma-separated (this one's
    /// among them). A keyed request whose key another instance owns is
    /// answered 421 with the owner in the Ingest-Owner header. Default:
    /// this instance alone.
    #[arg(
        long,
        value_name = "IDS",
        value_delimiter = ',',
        requires = "instance_id"
    )]
    instances: Vec<String>,
    /// With --sink postgres: the server, as a libpq connection string or a
    /// postgresql:// URL. It needs max_prepared_transactions of at least
    /// twice the parallelism.
    #[arg(long, value_name = "CONNECTION")]
    url: Option<String>,
    /// With --sink postgres: the name of an environment variable holding
    /// the connection, instead of --url (whose password `ps` would show).
    #[arg(long, value_name = "VAR", conflicts_with = "url")]
    url_env: Option<String>,
    /// With --sink kafka: the brokers to start from, host:port,
    /// comma-separated.
    #[arg(long, value_name = "HOST:PORT")]
    brokers: Option<String>,
    /// With --sink kafka: a Kafka client properties file (Java's
    /// client.properties format): security.protocol, sasl.mechanism,
    /// sasl.username, sasl.password, ssl.ca.location, compression.type, …
    /// (docs/kafka.md, "Settings"). Secrets in it are never printed.
    #[arg(long, value_name = "FILE")]
    kafka_config: Option<std::path::PathBuf>,
    /// With --sink kafka: the topic, created if missing (with as many
    /// partitions as --parallelism); one message per event, its JSON text.
    #[arg(long, default_value = "ingest-events")]
    topic: String,
    /// With --sink postgres: the table, created if missing with one column
    /// `event jsonb NOT NULL` (default ingest_events). With --sink iceberg:
    /// the table as NAMESPACE.NAME, created if missing with one column
    /// `event string` (default ingest.events).
    #[arg(long)]
    table: Option<String>,
    /// With --sink iceberg: the catalog, as sqlite:PATH (an SQL catalog in
    /// a local file, created when missing) or rest:URL (a catalog speaking
    /// the Iceberg REST protocol, which places the table; the data
    /// directory then holds the checkpoints only). Default:
    /// sqlite:WAREHOUSE/catalog.db for a local warehouse.
    #[arg(long)]
    catalog: Option<String>,
    /// With --catalog rest:URL: a catalog property, as KEY=VALUE
    /// (repeatable), named as PyIceberg names them: credential, token,
    /// warehouse, s3.endpoint, s3.access-key-id, s3.secret-access-key,
    /// s3.region, s3.path-style-access. Secrets are never printed.
    #[arg(long = "catalog-property", value_name = "KEY=VALUE", value_parser = sink_cli::flags::parse_property)]
    catalog_properties: Vec<(String, String)>,
    /// Time between checkpoints (commits), such as 1s or 200ms; or
    /// `on-demand`: a checkpoint as soon as events wait for one and none is
    /// in flight (answers in about one checkpoint's duration).
    #[arg(long, default_value = "1s", value_parser = parse_checkpoints)]
    checkpoint_interval: Checkpoints,
    /// The least time between the end of a checkpoint and the next, such as
    /// 2ms. Default 0.
    #[arg(long, value_parser = parse_duration)]
    checkpoint_min_pause: Option<Duration>,
    /// With on-demand checkpoints: the longest time between two, idle or
    /// not. Default 1s.
    #[arg(long, value_parser = parse_positive_duration)]
    checkpoint_max_interval: Option<Duration>,
    /// With files: merge the committed files of every this long into one
    /// file (a segment at a time, swapped in atomically for readers), such
    /// as 10s. Local output directories only. Default off.
    #[arg(long, value_parser = parse_duration)]
    compact_every: Option<Duration>,
    /// Subtasks writing in parallel. Default 1: each subtask adds a file (a
    /// transaction, a partition) and its sync to every checkpoint, and one
    /// keeps up with what two cores can take in (docs/performance.md); more
    /// for destinations that write slower than the service reads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    parallelism: u64,
    /// Requests queued per subtask before answering 503.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    capacity: u64,
    /// Requests each subtask takes in and has not answered yet; past it,
    /// requests queue (then get 503) while commits catch up.
    #[arg(long, default_value_t = 16_384, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_in_flight: u64,
    /// About how many idempotency keys are remembered: per tenant with
    /// tokens (a tenant's new keys push out only its own oldest ones), in
    /// all without.
    #[arg(long, value_name = "COUNT", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    key_retention: u64,
    /// How long an idempotency key is remembered, such as 1h or 30m.
    #[arg(long, default_value = "1h", value_parser = parse_positive_duration)]
    key_max_age: Duration,
    /// The longest a request waits for its commit before it is answered 503
    /// (retry with the same key); longer than the checkpoint interval.
    /// Default: 30s, or three checkpoint intervals if that is longer.
    #[arg(long, value_parser = parse_positive_duration)]
    ack_timeout: Option<Duration>,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 2 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..=1024 * 1024 * 1024))]
    max_body_bytes: u64,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); read
    /// again on SIGHUP. Needs --tls-key.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        conflicts_with = "plain_http"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1); read
    /// again on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP: behind a proxy that terminates TLS, or on
    /// loopback. Without it, --tls-cert and --tls-key are needed.
    #[arg(long)]
    plain_http: bool,
    /// Only requests with `Authorization: Bearer <token>` of a token in
    /// FILE may write and read /metrics: one `<tenant> <token>` per line
    /// (# comments), read again on SIGHUP. Each event is stored with its
    /// tenant in `_tenant`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["tokens_env", "no_auth"])]
    tokens: Option<PathBuf>,
    /// As --tokens, with the lines in the environment variable VAR (a
    /// reload reads the same ones: rotate with a file, or restart).
    #[arg(long, value_name = "VAR", conflicts_with = "no_auth")]
    tokens_env: Option<String>,
    /// Let anyone who reaches the listener write (and read /metrics).
    /// Without it, --tokens or --tokens-env is needed.
    #[arg(long)]
    no_auth: bool,
    /// The longest wait for a request's headers, from a new connection or
    /// the last answer on a kept-alive one: also the idle timeout. A TLS
    /// handshake has as long again, before. Such as 10s.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    header_read_timeout: Duration,
    /// The longest a write to a client may stay blocked (a client that does
    /// not read its answers); past it the connection is closed.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    write_timeout: Duration,
    /// The longest a request's body may take once its headers arrived;
    /// past it, 408 and nothing stored.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    body_read_timeout: Duration,
    /// Connections open at once; past it, new ones are closed at once.
    /// Keep it below the file descriptor limit (ulimit -n).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// With tokens: the requests one tenant may have in flight (from before
    /// the body is read until the commit); past it, 429 with Retry-After.
    /// Default: half of --capacity.
    #[arg(long, value_name = "COUNT", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    tenant_max_in_flight: Option<u64>,
}

impl Args {
    fn config(&self) -> anyhow::Result<Config> {
        let size = |value: u64, flag: &str| {
            usize::try_from(value).with_context(|| format!("{flag} {value} is too large here"))
        };
        let checkpointing = self
            .checkpoint_interval
            .config(self.checkpoint_min_pause, self.checkpoint_max_interval)
            .map_err(anyhow::Error::msg)?;
        let url = match (&self.url, &self.url_env) {
            (Some(url), _) => Some(url.clone()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| {
                anyhow::anyhow!(
                    "the environment variable {var} (--url-env) is not set or not UTF-8; it must \
                     hold the PostgreSQL connection"
                )
            })?),
            (None, None) => None,
        };
        if (self.brokers.is_some() || self.kafka_config.is_some()) && self.sink != SinkKind::Kafka {
            bail!("--brokers and --kafka-config go with --sink kafka");
        }
        if self.table.is_some() && !matches!(self.sink, SinkKind::Postgres | SinkKind::Iceberg) {
            bail!("--table goes with --sink postgres or --sink iceberg");
        }
        if (self.catalog.is_some() || !self.catalog_properties.is_empty())
            && self.sink != SinkKind::Iceberg
        {
            bail!("--catalog and --catalog-property go with --sink iceberg");
        }
        let destination = match (self.sink, &url) {
            (SinkKind::Files, None) => Destination::Files,
            (SinkKind::Delta, None) => Destination::Delta,
            (SinkKind::Iceberg, None) => {
                let catalog = self.catalog.clone();
                if let Some(text) = &catalog {
                    let known = ["sqlite:", "rest:"]
                        .iter()
                        .any(|scheme| text.len() > scheme.len() && text.starts_with(scheme));
                    if !known {
                        bail!(
                            "--catalog {text}: give the catalog as sqlite:PATH (an SQLite \
                             database, created when missing) or rest:URL (a REST catalog)"
                        );
                    }
                }
                if !self.catalog_properties.is_empty()
                    && !catalog.as_deref().is_some_and(|c| c.starts_with("rest:"))
                {
                    bail!("--catalog-property goes with --catalog rest:URL");
                }
                let table = self
                    .table
                    .clone()
                    .unwrap_or_else(|| "ingest.events".to_string());
                let parts: Vec<&str> = table.split('.').collect();
                if parts.len() < 2 || parts.iter().any(|part| part.is_empty()) {
                    bail!("--table {table}: give the Iceberg table as NAMESPACE.NAME, such as ingest.events");
                }
                if self.instance_id.is_some() {
                    bail!(
                        "--instance-id with --sink iceberg: the Iceberg catalog is a local SQLite \
                         database, which instances on other hosts cannot share; run one instance, \
                         or write files, Delta or Kafka with several"
                    );
                }
                Destination::Iceberg {
                    catalog,
                    catalog_properties: self.catalog_properties.clone(),
                    table,
                }
            }
            (SinkKind::Kafka, None) => {
                if self.out.is_some() {
                    bail!("--out names a file destination; with --sink kafka the events go to --topic");
                }
                let Some(brokers) = self.brokers.clone() else {
                    bail!("--sink kafka needs --brokers HOST:PORT");
                };
                Destination::Kafka {
                    brokers,
                    topic: self.topic.clone(),
                    kafka_config: self.kafka_config.clone(),
                }
            }
            (SinkKind::Files | SinkKind::Delta | SinkKind::Iceberg | SinkKind::Kafka, Some(_)) => {
                bail!("--url and --url-env go with --sink postgres")
            }
            (SinkKind::Postgres, None) => {
                bail!("--sink postgres needs --url CONNECTION or --url-env VAR")
            }
            (SinkKind::Postgres, Some(_)) if self.out.is_some() => {
                bail!(
                    "--out names a file destination; with --sink postgres the events go to --table"
                )
            }
            (SinkKind::Postgres, Some(url)) => Destination::Postgres {
                url: url.clone(),
                table: parse_table_name(self.table.as_deref().unwrap_or("ingest_events"))
                    .map_err(anyhow::Error::msg)?,
            },
        };
        if self.tls_cert.is_none() && !self.plain_http {
            refuse_flags(
                "ingest-service serves HTTPS: pass --tls-cert FILE --tls-key FILE, or \
                 --plain-http to serve plain HTTP (behind a proxy that terminates TLS, or on \
                 loopback)",
            );
        }
        if self.tokens.is_none() && self.tokens_env.is_none() && !self.no_auth {
            refuse_flags(
                "ingest-service lets only bearer tokens write: pass --tokens FILE (lines of \
                 `<tenant> <token>`) or --tokens-env VAR, or --no-auth to let anyone who \
                 reaches the listener write",
            );
        }
        if self.compact_every.is_some() && destination != Destination::Files {
            bail!("--compact-every goes with files (--sink files)");
        }
        if self.compact_every.is_some()
            && self
                .out
                .as_ref()
                .is_some_and(|out| matches!(out, Location::S3(_)))
        {
            bail!("--compact-every works on local output directories only, not on object storage");
        }
        Ok(Config {
            output_dir: self.output_dir.clone(),
            checkpointing,
            destination,
            compaction: self.compact_every.map(sinks_file::CompactionPolicy::every),
            parallelism: size(self.parallelism, "--parallelism")?,
            capacity: size(self.capacity, "--capacity")?,
            max_in_flight: size(self.max_in_flight, "--max-in-flight")?,
            key_retention: KeyRetention {
                max_keys: size(self.key_retention, "--key-retention")?,
                max_age: self.key_max_age,
            },
            ack_timeout: self
                .ack_timeout
                .unwrap_or(Duration::from_secs(30).max(checkpointing.interval * 3)),
            max_body_bytes: size(self.max_body_bytes, "--max-body-bytes")?,
            data: self.out.clone(),
            state: self.state.clone(),
            s3_options: location::s3_options(self.endpoint.as_deref()),
            instances: match &self.instance_id {
                None => None,
                Some(id) if self.instances.is_empty() => Some(Instances::alone(id)),
                Some(id) => Some(Instances::new(id, &self.instances)),
            }
            .transpose()
            .map_err(|e| anyhow::anyhow!("--instance-id/--instances: {e}"))?,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            },
            tokens: match (&self.tokens, &self.tokens_env) {
                (Some(file), _) => Some(TokenSource::File(file.clone())),
                (None, Some(var)) => Some(TokenSource::Env(var.clone())),
                (None, None) => None,
            },
            limits: ConnectionLimits {
                header_read_timeout: self.header_read_timeout,
                write_timeout: self.write_timeout,
                max_connections: size(self.max_connections, "--max-connections")?,
            },
            body_read_timeout: self.body_read_timeout,
            tenant_max_in_flight: self
                .tenant_max_in_flight
                .map(|count| size(count, "--tenant-max-in-flight"))
                .transpose()?,
        })
    }
}

/// The listener, with a backlog of 4096 (the kernel's `somaxconn` caps
/// it): a burst of connections waits there to be accepted (and shed by the
/// cap or the timeouts) instead of having its handshakes dropped and
/// retried for seconds.
fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(4096)
}

/// Exits with status 2 and `message`, as clap does for a bad command line.
fn refuse_flags(message: &str) -> ! {
    Args::command()
        .error(clap::error::ErrorKind::MissingRequiredArgument, message)
        .exit()
}

/// The `--sink` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SinkKind {
    /// JSON-lines files.
    Files,
    /// A PostgreSQL table.
    Postgres,
    /// A Delta Lake table.
    Delta,
    /// An Apache Iceberg table.
    Iceberg,
    /// A Kafka topic.
    Kafka,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error:?}");
            if ingest_service::is_fenced(&error) {
                eprintln!(
                    "this instance was fenced by a newer start of it: exiting with status {} \
                     (do not restart it: a new process would take the storage back)",
                    ingest_service::EXIT_FENCED
                );
                std::process::ExitCode::from(ingest_service::EXIT_FENCED)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    sink_cli::flags::init_tracing_or("info");
    let signals = ingest_service::signals::StopSignals::install()?;
    let config = args.config()?;
    let listener = listen(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let address = listener
        .local_addr()
        .context("reading the address listened on")?;
    // Taken over before the start, so that a SIGHUP never kills the process.
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("handling SIGHUP")?;
    let service = IngestService::start(config).await?;
    let reloader = service.reloader();
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reloader.reload().await {
                Ok(what) => tracing::info!("SIGHUP: reloaded {what}"),
                Err(error) => tracing::error!("SIGHUP: {error:#}"),
            }
        }
    });
    sink_cli::flags::print_line(&format!("listening on {}://{address}", service.scheme()))?;
    let summary = service.serve(listener, signals.first()).await?;
    let line = serde_json::to_string(&summary).context("encoding the summary")?;
    sink_cli::flags::print_line(&line)?;
    Ok(())
}
