//! A keyed client of several ingest-service instances: each request carries
//! an `Idempotency-Key`, goes to the instance that owns the key (the rule of
//! `ingest_service::routing`), and is retried with the same key and the
//! same bytes until it is acknowledged, following the instance to a new
//! address when the routes file says it moved. Used by the multi-host test
//! (`tests/scale_out.rs`) as the clients behind a load balancer would be.
//!
//! ```text
//! ingest-client --routes routes.txt --instances a,b,c --duration 30s --acked acked.txt
//! ```
//!
//! The routes file holds one `ID URL` pair a line and is read again every
//! 100 ms, so a test (or an operator) moves an instance by rewriting it.
//! On SIGTERM, or after `--duration`, no new request starts; those in
//! flight are retried until acknowledged or `--give-up-after` passes. The
//! ids of the acknowledged events go to `--acked` (one a line), and one
//! JSON summary line to stdout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use ingest_service::routing::{owner, parse_instance_id};
use serde_json::json;
use sink_cli::flags::{parse_duration, parse_positive_duration};
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(about = "Keyed load on several ingest-service instances, each key sent to its owner")]
struct Args {
    /// `ID URL` a line: where each instance answers; read again every 100 ms.
    #[arg(long)]
    routes: PathBuf,
    /// Every instance id, comma-separated (as the instances' --instances).
    #[arg(long, value_delimiter = ',', required = true)]
    instances: Vec<String>,
    /// Clients sending at the same time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    concurrency: u64,
    /// Events per request.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    events: u64,
    /// Stop starting requests after this long.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    duration: Duration,
    /// How long one attempt may take before it is abandoned and retried.
    #[arg(long, default_value = "3s", value_parser = parse_positive_duration)]
    attempt_timeout: Duration,
    /// After the end, how long requests still unacknowledged keep being
    /// retried.
    #[arg(long, default_value = "120s", value_parser = parse_positive_duration)]
    give_up_after: Duration,
    /// Where the acknowledged events' ids go, one a line.
    #[arg(long)]
    acked: PathBuf,
    /// A prefix of every key and event id, so that runs do not collide.
    #[arg(long, default_value = "c")]
    prefix: String,
    /// Send `Authorization: Bearer <token>` with the token in the
    /// environment variable VAR (not on the command line, where `ps` shows
    /// it), for instances started with --tokens.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// Trust this CA certificate (PEM) for `https://` routes, instead of
    /// none: the instances' own or their CA's.
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
}

/// What every client's HTTP connections carry: the token and the root.
#[derive(Debug, Clone, Default)]
struct Http {
    headers: reqwest::header::HeaderMap,
    root: Option<reqwest::Certificate>,
}

impl Http {
    async fn from_args(args: &Args) -> anyhow::Result<Http> {
        let mut http = Http::default();
        if let Some(var) = &args.token_env {
            let token = std::env::var(var)
                .with_context(|| format!("--token-env: the variable {var} is not set"))?;
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .with_context(|| {
                    format!("--token-env: the token in {var} is not a header value")
                })?;
            value.set_sensitive(true);
            http.headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        if let Some(path) = &args.ca_cert {
            let pem = tokio::fs::read(path)
                .await
                .with_context(|| format!("reading the CA certificate {}", path.display()))?;
            http.root = Some(
                reqwest::Certificate::from_pem(&pem)
                    .with_context(|| format!("{} is not a PEM certificate", path.display()))?,
            );
        }
        Ok(http)
    }

    fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .default_headers(self.headers.clone())
            .tls_built_in_root_certs(false);
        if let Some(root) = &self.root {
            builder = builder.add_root_certificate(root.clone());
        }
        builder.build().context("building the HTTP client")
    }
}

/// Where each instance answers, as last read from the routes file.
type Routes = Arc<RwLock<BTreeMap<String, String>>>;

fn read_routes(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the routes file {}", path.display()))?;
    let mut routes = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, url) = line.split_once(char::is_whitespace).with_context(|| {
            format!(
                "{}:{}: expected `ID URL`, found '{line}'",
                path.display(),
                n + 1
            )
        })?;
        routes.insert(id.to_string(), url.trim().to_string());
    }
    Ok(routes)
}

/// What one client did.
#[derive(Debug, Default)]
struct Tally {
    acked_requests: u64,
    acked_events: Vec<String>,
    duplicates: u64,
    attempts: u64,
    misdirected: u64,
    unavailable: u64,
    failed_attempts: u64,
    gave_up: u64,
    latencies: Vec<Duration>,
}

impl Tally {
    /// Adds what another client did.
    fn add(&mut self, other: Tally) {
        self.acked_requests += other.acked_requests;
        self.acked_events.extend(other.acked_events);
        self.duplicates += other.duplicates;
        self.attempts += other.attempts;
        self.misdirected += other.misdirected;
        self.unavailable += other.unavailable;
        self.failed_attempts += other.failed_attempts;
        self.gave_up += other.gave_up;
        self.latencies.extend(other.latencies);
    }
}

/// The answer to one attempt.
enum Attempt {
    Acked { duplicate: bool },
    Misdirected,
    Unavailable,
    Failed,
    Refused(String),
}

async fn attempt(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &str,
    timeout: Duration,
) -> Attempt {
    let sent = http
        .post(format!("{url}/events"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .timeout(timeout)
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            // Expected while an instance is away; RUST_LOG=debug shows why
            // (a certificate not trusted, a refused connection, ...).
            tracing::debug!(?error, url, "an attempt failed");
            return Attempt::Failed;
        }
    };
    let status = response.status();
    if status == reqwest::StatusCode::MISDIRECTED_REQUEST {
        // This client and the instance disagree on the set of instances.
        return Attempt::Misdirected;
    }
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return Attempt::Unavailable;
    }
    let text = match response.text().await {
        Ok(text) => text,
        Err(_) => return Attempt::Failed,
    };
    if !status.is_success() {
        return Attempt::Refused(format!("{status}: {text}"));
    }
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(answer) => Attempt::Acked {
            duplicate: answer["duplicate"].as_bool().unwrap_or(false),
        },
        Err(_) => Attempt::Failed,
    }
}

/// One client: requests one after the other until `stop`, each retried
/// until acknowledged or `give_up` passes after the stop.
async fn client(
    n: u64,
    args: Arc<Args>,
    http: Arc<Http>,
    routes: Routes,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Tally> {
    let http = http.client()?;
    let mut tally = Tally::default();
    for seq in 0u64.. {
        if *stop.borrow() {
            break;
        }
        let key = format!("{}{n}-{seq}", args.prefix);
        let ids: Vec<String> = (0..args.events).map(|i| format!("{key}-{i}")).collect();
        let body =
            serde_json::to_string(&ids.iter().map(|id| json!({ "id": id })).collect::<Vec<_>>())
                .context("encoding a request")?;
        let started = Instant::now();
        let mut stopped_at: Option<Instant> = None;
        loop {
            if stopped_at.is_none() && *stop.borrow() {
                stopped_at = Some(Instant::now());
            }
            if stopped_at.is_some_and(|at| at.elapsed() > args.give_up_after) {
                tally.gave_up += 1;
                return Ok(tally);
            }
            let target = owner(&key, &args.instances).context("no instances")?;
            let url = routes
                .read()
                .map_err(|_| anyhow::anyhow!("the routes lock was poisoned"))?
                .get(target)
                .cloned();
            let Some(url) = url else {
                tally.failed_attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            tally.attempts += 1;
            match attempt(&http, &url, &key, &body, args.attempt_timeout).await {
                Attempt::Acked { duplicate } => {
                    tally.acked_requests += 1;
                    tally.duplicates += u64::from(duplicate);
                    tally.latencies.push(started.elapsed());
                    tally.acked_events.extend(ids);
                    break;
                }
                Attempt::Misdirected => tally.misdirected += 1,
                Attempt::Unavailable => tally.unavailable += 1,
                Attempt::Failed => tally.failed_attempts += 1,
                Attempt::Refused(why) => anyhow::bail!("the request {key} was refused: {why}"),
            }
            // A pause between attempts; before the stop, the stop cuts it
            // short (after it, the sender is gone and `changed` would
            // return at once).
            if stopped_at.is_none() {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.changed() => {}
                }
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Ok(tally)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    sink_cli::flags::init_tracing_or("warn");
    for id in &args.instances {
        parse_instance_id(id).map_err(anyhow::Error::msg)?;
    }
    let http = Arc::new(Http::from_args(&args).await?);
    let routes: Routes = Arc::new(RwLock::new(read_routes(&args.routes)?));
    let refresh = {
        let (routes, path) = (routes.clone(), args.routes.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                // A file being rewritten may be read half-way: keep the
                // last good one.
                if let Ok(fresh) = read_routes(&path) {
                    if let Ok(mut held) = routes.write() {
                        *held = fresh;
                    }
                }
            }
        })
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let signals = ingest_service::signals::StopSignals::install()?;
    let duration = args.duration;
    let stopper = tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = signals.first() => {}
        }
        stop_tx.send_replace(true);
    });
    let started = Instant::now();
    let clients: Vec<_> = (0..args.concurrency)
        .map(|n| {
            tokio::spawn(client(
                n,
                args.clone(),
                http.clone(),
                routes.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();
    let mut total = Tally::default();
    for handle in clients {
        total.add(handle.await.context("a client panicked")??);
    }
    let elapsed = started.elapsed();
    stopper.abort();
    refresh.abort();
    let mut acked = total.acked_events.join("\n");
    acked.push('\n');
    std::fs::write(&args.acked, acked)
        .with_context(|| format!("writing {}", args.acked.display()))?;
    total.latencies.sort_unstable();
    let at = |q: f64| {
        total
            .latencies
            .get(((total.latencies.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let summary = json!({
        "acked_requests": total.acked_requests,
        "acked_events": total.acked_events.len(),
        "duplicates": total.duplicates,
        "attempts": total.attempts,
        "misdirected": total.misdirected,
        "unavailable": total.unavailable,
        "failed_attempts": total.failed_attempts,
        "gave_up": total.gave_up,
        "seconds": elapsed.as_secs_f64(),
        "latency_ms": { "p50": at(0.5), "p99": at(0.99), "max": at(1.0) },
    });
    sink_cli::flags::print_line(&summary.to_string())?;
    Ok(())
}
