//! A load test of `ingest-service` (and of `ingest-baseline`, the same
//! service written the obvious way), on loopback only, bounded in requests
//! and in time.
//!
//! It starts the service (the binary next to this one) on a port the OS
//! picks, with its output in a temporary directory or a fresh PostgreSQL
//! table; `--concurrency` clients post `--requests` requests of `--events`
//! events each, every request with its own idempotency key, and time each
//! from send to its 200 (the acknowledgement, which comes only after the
//! commit). A 503 is retried with the same key after a short pause and
//! counted. Then it stops the service with SIGTERM and checks that the
//! output (the finished files, or the table) holds every acknowledged event
//! exactly once; it exits non-zero otherwise.
//!
//! `--compare` runs, in one invocation with the same client, the service on
//! files with checkpoints every `--checkpoint-interval` (today's way), on
//! files and on PostgreSQL with checkpoints on demand, and the baseline,
//! at each of the `--concurrency` values, and prints one table.
//!
//! ```text
//! cargo build --release -p examples
//! ./target/release/ingest-load --requests 20000 --concurrency 32 --events 10
//! PG_DURABLE=1 scripts/with-postgres bash -c \
//!   './target/release/ingest-load --compare --concurrency 32,128 --requests 20000 --url "$PG_TEST_URL"'
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};
use sink_cli::flags::{parse_checkpoints, parse_duration, Checkpoints};

#[derive(Debug, Parser)]
#[command(
    about = "Load-tests ingest-service (and its baseline) on loopback: requests per second and acknowledgement latency"
)]
struct Args {
    /// Requests to send per run (at most; --max-duration may stop earlier).
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Clients sending at the same time; with --compare, a comma-separated
    /// list (each value is a run of every target).
    #[arg(long, default_value = "32", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=4096))]
    concurrency: Vec<u64>,
    /// Events per request.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    events: u64,
    /// The service's checkpoints: an interval such as 100ms, or on-demand.
    /// With --compare, the interval of the "today" run.
    #[arg(long, default_value = "100ms", value_parser = parse_checkpoints)]
    checkpoint_interval: Checkpoints,
    /// With files: the service's --compact-every (merge the committed files
    /// of every this long into one). With --compare, the compacted run's
    /// (default 10s).
    #[arg(long, value_parser = parse_duration)]
    compact_every: Option<Duration>,
    /// Where the service writes (ignored with --baseline and --compare).
    #[arg(long, value_enum, default_value = "files")]
    sink: SinkKind,
    /// Load ingest-baseline instead of ingest-service.
    #[arg(long)]
    baseline: bool,
    /// Run every target (files at --checkpoint-interval, files and
    /// PostgreSQL on demand, the baseline) at every --concurrency.
    #[arg(long)]
    compare: bool,
    /// The PostgreSQL server for --sink postgres, --baseline and --compare
    /// (default: the PG_TEST_URL variable that scripts/with-postgres sets).
    #[arg(long, value_name = "CONNECTION")]
    url: Option<String>,
    /// The baseline's pool of connections (default: the concurrency, so
    /// that no request waits for a connection).
    #[arg(long)]
    connections: Option<u64>,
    /// The service's parallelism; by default the service's own.
    #[arg(long)]
    parallelism: Option<usize>,
    /// Stop sending after this long, whatever the count.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    max_duration: Duration,
    /// The service binary; by default `ingest-service` next to this program.
    #[arg(long)]
    service: Option<PathBuf>,
    /// More flags for ingest-service, one per use (such as
    /// --service-arg=--key-retention=1000).
    #[arg(long, allow_hyphen_values = true)]
    service_arg: Vec<String>,
    /// The baseline binary; by default `ingest-baseline` next to this
    /// program.
    #[arg(long)]
    baseline_binary: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// The service over HTTPS with a bearer token, as it runs in
    /// production: a certificate of a CA made for the run (trusted by the
    /// clients, and nothing else), and a token file of one tenant (whose
    /// keys then get the tenant's budget). Without it, plain HTTP and no
    /// tokens, as the baseline. With --compare, the service's targets run
    /// both ways.
    #[arg(long)]
    tls: bool,
}

/// How the clients reach the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// Plain HTTP, no token: what the baseline is reached by.
    Plain,
    /// HTTPS with a bearer token.
    Tls,
}

/// The certificate, key and token file of a `Transport::Tls` run, in a
/// temporary directory; what its clients trust and send.
struct TlsFiles {
    _dir: tempfile::TempDir,
    flags: Vec<String>,
    ca_pem: String,
    token: String,
}

/// The tenant of the runs with tokens.
const LOAD_TENANT: &str = "load";

impl TlsFiles {
    /// A CA, a certificate it signs for the loopback address, a random
    /// token of one tenant, written where the service reads them.
    fn make() -> anyhow::Result<TlsFiles> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate()?;
        let ca = ca_params.self_signed(&ca_key)?;
        let server_params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])?;
        let server_key = rcgen::KeyPair::generate()?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server = server_params.signed_by(&server_key, &issuer)?;
        let (cert, key, tokens) = (
            dir.path().join("server.pem"),
            dir.path().join("server.key"),
            dir.path().join("tokens"),
        );
        std::fs::write(&cert, server.pem())?;
        std::fs::write(&key, server_key.serialize_pem())?;
        // 244 random bits from the system's generator.
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        std::fs::write(&tokens, format!("{LOAD_TENANT} {token}\n"))?;
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600))?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        Ok(TlsFiles {
            flags: vec![
                "--tls-cert".into(),
                path(&cert),
                "--tls-key".into(),
                path(&key),
                "--tokens".into(),
                path(&tokens),
            ],
            ca_pem: ca.pem(),
            token,
            _dir: dir,
        })
    }

    /// An HTTP client that trusts the run's CA only and sends its token.
    fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", self.token))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
        Ok(reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes())?)
            .default_headers(headers)
            .build()?)
    }
}

/// The `--sink` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SinkKind {
    Files,
    Postgres,
}

/// What one run loads.
#[derive(Debug, Clone)]
enum Target {
    /// `ingest-service` with these checkpoints, into files or PostgreSQL.
    Service {
        sink: SinkKind,
        checkpoints: Checkpoints,
        /// With files: `--compact-every`.
        compact_every: Option<Duration>,
        transport: Transport,
    },
    /// `ingest-baseline`.
    Baseline,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Service {
                sink,
                checkpoints,
                compact_every,
                transport,
            } => {
                let sink = match sink {
                    SinkKind::Files => "files",
                    SinkKind::Postgres => "postgres",
                };
                write!(f, "service, {sink}, checkpoints {checkpoints}")?;
                if let Some(every) = compact_every {
                    write!(f, ", compaction {}s", every.as_secs_f64())?;
                }
                match transport {
                    Transport::Tls => f.write_str(", HTTPS + token"),
                    Transport::Plain => Ok(()),
                }
            }
            Target::Baseline => f.write_str("baseline: INSERT per request, synchronous commit"),
        }
    }
}

/// Where a run's events end up, to be counted afterwards.
enum Output {
    Dir(tempfile::TempDir),
    /// A table; the service's checkpoints, if any, in `_state` (removed
    /// with it).
    Table {
        url: String,
        table: String,
        _state: Option<tempfile::TempDir>,
    },
}

/// The running program under load; stopped if the run ends early.
struct Server {
    child: Child,
    url: String,
    /// The rest of its stdout (its closing summary), read on a thread so
    /// that it never writes into a closed pipe.
    rest: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `binary` with `args`, reads its `listening on <url>` line.
    fn start(binary: &Path, args: &[String]) -> anyhow::Result<Server> {
        if !binary.exists() {
            bail!(
                "{} does not exist; build it first with `cargo build --release -p examples`, or pass --service",
                binary.display()
            );
        }
        let mut command = Command::new(binary);
        command
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if std::env::var_os("RUST_LOG").is_none() {
            // A log line per checkpoint, hundreds a second, would be load.
            command.env("RUST_LOG", "warn");
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let stdout = child.stdout.take().context("the service has no stdout")?;
        let mut server = Server {
            child,
            url: String::new(),
            rest: None,
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .context("cannot read the service's first line")?;
        server.rest = Some(std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
            rest
        }));
        server.url = line
            .trim()
            .strip_prefix("listening on ")
            .with_context(|| format!("unexpected first line from the service: {line:?}"))?
            .to_string();
        Ok(server)
    }

    /// Stops it as an operator would (SIGTERM) and returns its summary.
    fn stop(mut self) -> anyhow::Result<Value> {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status()?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        let exit = self.child.wait()?;
        let summary = self
            .rest
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        if !exit.success() {
            bail!("the service exited with {exit} after SIGTERM");
        }
        serde_json::from_str(summary.trim())
            .with_context(|| format!("reading the service's summary: {summary:?}"))
    }
}

/// Counts the finished files a reader sees, once a second while the load
/// runs, and keeps the largest count.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Sampler {
    fn start(dir: PathBuf) -> Sampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::Relaxed) {
                if let Ok(files) = sinks_file::finished_files(&dir) {
                    peak = peak.max(files.len() as u64);
                }
                for _ in 0..10 {
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            peak
        });
        Sampler { stop, thread }
    }

    /// The largest count seen.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// What the clients measured.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    retried: u64,
}

/// One run's plan: what, how hard.
struct Plan {
    requests: u64,
    events: u64,
    concurrency: u64,
    max_duration: Duration,
}

async fn client(
    http: reqwest::Client,
    url: String,
    next: Arc<AtomicU64>,
    plan: Arc<Plan>,
    deadline: Instant,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    loop {
        let request = next.fetch_add(1, Ordering::Relaxed);
        if request >= plan.requests || Instant::now() >= deadline {
            return Ok(tally);
        }
        let events: Vec<Value> = (0..plan.events)
            .map(|e| json!({"id": format!("r{request}-e{e}"), "source": "ingest-load"}))
            .collect();
        let body = serde_json::to_vec(&events)?;
        loop {
            let sent = Instant::now();
            let response = http
                .post(format!("{url}/events"))
                .header("Idempotency-Key", format!("load-{request}"))
                .header("Content-Type", "application/json")
                .body(body.clone())
                .send()
                .await
                .context("the service stopped answering")?;
            match response.status().as_u16() {
                200 => {
                    tally.latencies.push(sent.elapsed());
                    break;
                }
                503 => {
                    tally.retried += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                status => bail!(
                    "request {request}: HTTP {status}: {}",
                    response.text().await?
                ),
            }
        }
    }
}

/// Counts the events in the finished files under `dir`, and the files.
fn count_files(dir: &Path, counts: &mut HashMap<String, u32>) -> anyhow::Result<u64> {
    let files = sinks_file::finished_files(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?;
    for path in &files {
        let text = std::fs::read_to_string(path)?;
        for line in text.lines().filter(|line| !line.is_empty()) {
            let event: Value = serde_json::from_str(line)
                .with_context(|| format!("{}: not a JSON line: {line}", path.display()))?;
            let id = event["id"].as_str().unwrap_or_default().to_string();
            *counts.entry(id).or_default() += 1;
        }
    }
    Ok(files.len() as u64)
}

/// A connection to the test server, its driver on the runtime.
async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let redacted = sinks_postgres::redact_connection_string(url);
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to PostgreSQL at {redacted}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Counts the events in `table` by their id, then drops the table (and the
/// baseline's table of keys).
async fn count_table(
    url: &str,
    table: &str,
    counts: &mut HashMap<String, u32>,
) -> anyhow::Result<()> {
    let client = connect(url).await?;
    let rows = client
        .query(&format!("SELECT event->>'id' FROM {table}"), &[])
        .await
        .with_context(|| format!("reading {table}"))?;
    for row in rows {
        let id: Option<String> = row.get(0);
        *counts.entry(id.unwrap_or_default()).or_default() += 1;
    }
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_keys"
        ))
        .await
        .with_context(|| format!("dropping {table}"))?;
    Ok(())
}

/// The settings of the server that decide what a commit costs.
async fn server_settings(url: &str) -> anyhow::Result<Value> {
    let client = connect(url).await?;
    let mut settings = serde_json::Map::new();
    for name in [
        "server_version",
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
    ] {
        let row = client
            .query_one(&format!("SHOW {name}"), &[])
            .await
            .with_context(|| format!("SHOW {name}"))?;
        settings.insert(name.to_string(), Value::String(row.get(0)));
    }
    Ok(Value::Object(settings))
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

/// Everything one run needs besides its target.
struct Setup<'a> {
    args: &'a Args,
    service: PathBuf,
    baseline: PathBuf,
    url: Option<String>,
    runtime: &'a tokio::runtime::Runtime,
    /// Numbers the runs' tables.
    runs: u64,
}

impl Setup<'_> {
    fn url(&self) -> anyhow::Result<String> {
        self.url.clone().context(
            "PostgreSQL is needed here: pass --url CONNECTION, or run under scripts/with-postgres (PG_TEST_URL)",
        )
    }

    fn table(&mut self) -> String {
        self.runs += 1;
        format!("ingest_load_{}_{}", std::process::id(), self.runs)
    }

    /// Starts the target, loads it, stops it, counts its output.
    fn run(&mut self, target: &Target, concurrency: u64) -> anyhow::Result<Value> {
        let args = self.args;
        let mut tls: Option<TlsFiles> = None;
        let (binary, flags, output) = match target {
            Target::Service {
                sink,
                checkpoints,
                compact_every,
                transport,
            } => {
                // Plain HTTP without tokens, as the baseline, unless the
                // cost of TLS and tokens is measured.
                let mut flags = vec!["--checkpoint-interval".to_string(), checkpoints.to_string()];
                if let Some(parallelism) = args.parallelism {
                    flags.extend(["--parallelism".into(), parallelism.to_string()]);
                }
                match transport {
                    Transport::Plain => flags.extend(["--plain-http".into(), "--no-auth".into()]),
                    Transport::Tls => {
                        let files = TlsFiles::make().context("making the run's certificates")?;
                        flags.extend(files.flags.iter().cloned());
                        tls = Some(files);
                    }
                }
                flags.extend(args.service_arg.iter().cloned());
                if let Some(every) = compact_every {
                    flags.push("--compact-every".into());
                    flags.push(format!("{}ms", every.as_millis()));
                }
                let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
                flags.push("--output-dir".into());
                flags.push(dir.path().to_string_lossy().into_owned());
                let output = match sink {
                    SinkKind::Files => Output::Dir(dir),
                    SinkKind::Postgres => {
                        let (url, table) = (self.url()?, self.table());
                        flags.extend(["--sink".into(), "postgres".into(), "--url".into()]);
                        flags.extend([url.clone(), "--table".into(), table.clone()]);
                        Output::Table {
                            url,
                            table,
                            _state: Some(dir),
                        }
                    }
                };
                (self.service.clone(), flags, output)
            }
            Target::Baseline => {
                let (url, table) = (self.url()?, self.table());
                let connections = args.connections.unwrap_or(concurrency).to_string();
                let flags = vec![
                    "--url".into(),
                    url.clone(),
                    "--table".into(),
                    table.clone(),
                    "--connections".into(),
                    connections,
                ];
                let output = Output::Table {
                    url,
                    table,
                    _state: None,
                };
                (self.baseline.clone(), flags, output)
            }
        };
        let server = Server::start(&binary, &flags)?;
        let sampler = match &output {
            Output::Dir(dir) => Some(Sampler::start(dir.path().join("data"))),
            Output::Table { .. } => None,
        };
        let plan = Arc::new(Plan {
            requests: args.requests,
            events: args.events,
            concurrency,
            max_duration: args.max_duration,
        });
        let started = Instant::now();
        let url = server.url.clone();
        let http = match &tls {
            Some(files) => files.client()?,
            None => reqwest::Client::new(),
        };
        let tallies = self
            .runtime
            .block_on(load(http, url, plan.clone(), started))?;
        let elapsed = started.elapsed();
        let peak_files = sampler.map(Sampler::stop);
        let summary = server.stop()?;

        let mut counts = HashMap::new();
        let files = match &output {
            Output::Dir(dir) => Some(count_files(&dir.path().join("data"), &mut counts)?),
            Output::Table { url, table, .. } => {
                self.runtime
                    .block_on(count_table(url, table, &mut counts))?;
                None
            }
        };
        let mut latencies: Vec<Duration> = tallies
            .iter()
            .flat_map(|t| t.latencies.iter().copied())
            .collect();
        latencies.sort_unstable();
        let acknowledged = latencies.len() as u64;
        let retried: u64 = tallies.iter().map(|t| t.retried).sum();
        let events = acknowledged * args.events;
        let twice = counts.values().filter(|&&n| n > 1).count();
        let committed = summary["records_committed"].as_u64();
        let exactly_once = counts.len() as u64 == events && twice == 0 && committed == Some(events);
        let seconds = elapsed.as_secs_f64();
        let rps = acknowledged as f64 / seconds;
        let per_second = |value: &Value| value.as_f64().map(|n| n / seconds);
        let commits = match target {
            Target::Baseline => summary["transactions"].clone(),
            Target::Service { .. } => summary["commits"].clone(),
        };
        let report = json!({
            "target": target.to_string(),
            "requests_acknowledged": acknowledged,
            "retried_503": retried,
            "events_per_request": args.events,
            "concurrency": concurrency,
            "checkpoint_interval": match target {
                Target::Service { checkpoints, .. } => Value::String(checkpoints.to_string()),
                Target::Baseline => Value::Null,
            },
            "seconds": seconds,
            "requests_per_second": rps,
            "events_per_second": rps * args.events as f64,
            "latency_ms": {
                "p50": percentile(&latencies, 0.50),
                "p90": percentile(&latencies, 0.90),
                "p99": percentile(&latencies, 0.99),
                "max": percentile(&latencies, 1.0),
            },
            "checkpoints": summary["checkpoints"],
            "checkpoints_per_second": per_second(&summary["checkpoints"]),
            "commits": commits,
            "commits_per_second": per_second(&commits),
            "commits_are": match (target, &files) {
                (Target::Baseline, _) => "transactions",
                (_, Some(_)) => "finished files",
                (_, None) => "prepared transactions committed",
            },
            "finished_files": files,
            "finished_files_per_minute": files.map(|f| f as f64 * 60.0 / seconds),
            "peak_finished_files_during_load": peak_files,
            "output_events": counts.len(),
            "exactly_once": exactly_once,
        });
        if !exactly_once {
            bail!(
                "{target}: the output holds {} distinct events ({twice} more than once) for {events} acknowledged; \
                 the service says it committed {committed:?}",
                counts.len()
            );
        }
        Ok(report)
    }
}

/// Runs the clients of `plan` against `url` until their requests are sent
/// or the time is up.
async fn load(
    http: reqwest::Client,
    url: String,
    plan: Arc<Plan>,
    started: Instant,
) -> anyhow::Result<Vec<Tally>> {
    let next = Arc::new(AtomicU64::new(0));
    let deadline = started + plan.max_duration;
    let clients: Vec<_> = (0..plan.concurrency)
        .map(|_| {
            tokio::spawn(client(
                http.clone(),
                url.clone(),
                next.clone(),
                plan.clone(),
                deadline,
            ))
        })
        .collect();
    let mut tallies = Vec::new();
    for client in clients {
        tallies.push(client.await??);
    }
    Ok(tallies)
}

/// One line of the text table.
fn print_run(run: &Value) {
    let ms = |q: &str| run["latency_ms"][q].as_f64().unwrap_or(f64::NAN);
    let rate = |name: &str| {
        run[name]
            .as_f64()
            .map_or("-".to_string(), |r| format!("{r:.0}"))
    };
    println!(
        "{:<68} {:>5} {:>7} {:>8.0} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>8} {:>8}",
        run["target"].as_str().unwrap_or_default(),
        run["concurrency"],
        run["requests_acknowledged"],
        run["requests_per_second"].as_f64().unwrap_or(f64::NAN),
        ms("p50"),
        ms("p90"),
        ms("p99"),
        ms("max"),
        rate("checkpoints_per_second"),
        rate("commits_per_second"),
    );
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let here = std::env::current_exe().context("cannot find this program's path")?;
    let service = args
        .service
        .clone()
        .unwrap_or_else(|| here.with_file_name("ingest-service"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let url = args
        .url
        .clone()
        .or_else(|| std::env::var("PG_TEST_URL").ok());
    let targets: Vec<Target> = match (args.compare, args.baseline) {
        (true, true) => bail!("--compare runs the baseline already; leave --baseline out"),
        (true, false) => {
            let transports = match args.tls {
                true => vec![Transport::Plain, Transport::Tls],
                false => vec![Transport::Plain],
            };
            let mut targets = Vec::new();
            for transport in transports {
                targets.extend([
                    Target::Service {
                        sink: SinkKind::Files,
                        checkpoints: args.checkpoint_interval,
                        compact_every: None,
                        transport,
                    },
                    Target::Service {
                        sink: SinkKind::Files,
                        checkpoints: Checkpoints::OnDemand,
                        compact_every: None,
                        transport,
                    },
                    Target::Service {
                        sink: SinkKind::Files,
                        checkpoints: Checkpoints::OnDemand,
                        compact_every: Some(args.compact_every.unwrap_or(Duration::from_secs(10))),
                        transport,
                    },
                    Target::Service {
                        sink: SinkKind::Postgres,
                        checkpoints: Checkpoints::OnDemand,
                        compact_every: None,
                        transport,
                    },
                ]);
            }
            targets.push(Target::Baseline);
            targets
        }
        (false, true) => vec![Target::Baseline],
        (false, false) => vec![Target::Service {
            sink: args.sink,
            checkpoints: args.checkpoint_interval,
            compact_every: args.compact_every,
            transport: match args.tls {
                true => Transport::Tls,
                false => Transport::Plain,
            },
        }],
    };
    if !args.compare && args.concurrency.len() > 1 {
        bail!("several --concurrency values go with --compare");
    }
    let needs_postgres = targets.iter().any(|target| {
        matches!(
            target,
            Target::Baseline
                | Target::Service {
                    sink: SinkKind::Postgres,
                    ..
                }
        )
    });
    let settings = match (&url, needs_postgres) {
        (Some(url), true) => Some(runtime.block_on(server_settings(url))?),
        _ => None,
    };
    let mut setup = Setup {
        args: &args,
        service,
        baseline: args
            .baseline_binary
            .clone()
            .unwrap_or_else(|| here.with_file_name("ingest-baseline")),
        url,
        runtime: &runtime,
        runs: 0,
    };
    let mut runs = Vec::new();
    if !args.json {
        if let Some(settings) = &settings {
            println!("PostgreSQL: {settings}");
        }
        println!(
            "{:<68} {:>5} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8}",
            "target",
            "conc",
            "acked",
            "req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "ckpt/s",
            "commit/s"
        );
    }
    for &concurrency in &args.concurrency {
        for target in &targets {
            let run = setup.run(target, concurrency)?;
            if !args.json {
                print_run(&run);
            }
            runs.push(run);
        }
    }
    if args.json {
        let report = match (args.compare, runs.pop()) {
            (false, Some(mut run)) => {
                run["postgres"] = settings.unwrap_or(Value::Null);
                run
            }
            (_, last) => {
                runs.extend(last);
                json!({"postgres": settings, "runs": runs})
            }
        };
        println!("{report}");
    } else {
        println!("every run: each acknowledged event exactly once in the output");
    }
    Ok(())
}
