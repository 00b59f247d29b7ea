//! A small load test of `ingest-service`, on loopback only, bounded in
//! requests and in time.
//!
//! It starts the service (the `ingest-service` binary next to this one) on a
//! port the OS picks, with its output in a temporary directory; `--concurrency`
//! clients post `--requests` requests of `--events` events each, every request
//! with its own idempotency key, and time each from send to its 200 (the
//! acknowledgement, which comes only after the commit). A 503 is retried
//! with the same key after a short pause and counted. Then it stops the
//! service with SIGTERM and checks that the output holds every acknowledged
//! event exactly once.
//!
//! ```text
//! cargo build --release -p examples
//! ./target/release/ingest-load --requests 20000 --concurrency 32 --events 10
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use examples::cli::parse_duration;

#[derive(Debug, Parser)]
#[command(
    about = "Load-tests ingest-service on loopback: requests per second and acknowledgement latency"
)]
struct Args {
    /// Requests to send (at most; --max-duration may stop earlier).
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Clients sending at the same time.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Events per request.
    #[arg(long, default_value_t = 10)]
    events: usize,
    /// The service's checkpoint interval: what acknowledgement latency
    /// mostly depends on.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    checkpoint_interval: Duration,
    /// The service's parallelism.
    #[arg(long, default_value_t = 2)]
    parallelism: usize,
    /// Stop sending after this long, whatever the count.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    max_duration: Duration,
    /// The service binary; by default `ingest-service` next to this program.
    #[arg(long)]
    service: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Stops the service if the load test ends early.
struct Service {
    child: Child,
    url: String,
    /// The rest of its stdout (its closing summary), read on a thread so
    /// that it never writes into a closed pipe.
    rest: Option<std::thread::JoinHandle<String>>,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_service(args: &Args, output: &Path) -> anyhow::Result<Service> {
    let binary = match &args.service {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .context("cannot find this program's path")?
            .with_file_name("ingest-service"),
    };
    if !binary.exists() {
        bail!(
            "{} does not exist; build it first with `cargo build --release -p examples`, or pass --service",
            binary.display()
        );
    }
    let mut child = Command::new(&binary)
        .args(["--listen", "127.0.0.1:0", "--output-dir"])
        .arg(output)
        .args([
            "--checkpoint-interval",
            &format!("{}ms", args.checkpoint_interval.as_millis()),
        ])
        .args(["--parallelism", &args.parallelism.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let stdout = child.stdout.take().context("the service has no stdout")?;
    let mut service = Service {
        child,
        url: String::new(),
        rest: None,
    };
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .context("cannot read the service's first line")?;
    service.rest = Some(std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
        rest
    }));
    service.url = line
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected first line from the service: {line:?}"))?
        .to_string();
    Ok(service)
}

/// What the clients measured.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    retried: u64,
}

async fn client(
    http: reqwest::Client,
    url: String,
    next: Arc<AtomicU64>,
    args: Arc<Args>,
    deadline: Instant,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    loop {
        let request = next.fetch_add(1, Ordering::Relaxed);
        if request >= args.requests || Instant::now() >= deadline {
            return Ok(tally);
        }
        let events: Vec<serde_json::Value> = (0..args.events)
            .map(|e| serde_json::json!({"id": format!("r{request}-e{e}"), "source": "ingest-load"}))
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

/// Counts the events in the finished files under `dir`.
fn count_output(dir: &Path, counts: &mut HashMap<String, u32>) -> anyhow::Result<()> {
    let files = sinks_file::finished_files(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?;
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines().filter(|line| !line.is_empty()) {
            let event: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{}: not a JSON line: {line}", path.display()))?;
            let id = event["id"].as_str().unwrap_or_default().to_string();
            *counts.entry(id).or_default() += 1;
        }
    }
    Ok(())
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    if args.concurrency == 0 || args.events == 0 {
        bail!("--concurrency and --events must be at least 1");
    }
    let output = tempfile::tempdir().context("cannot make a temporary directory")?;
    let mut service = start_service(&args, output.path())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let tallies = runtime.block_on(async {
        let http = reqwest::Client::new();
        let next = Arc::new(AtomicU64::new(0));
        let deadline = started + args.max_duration;
        let clients: Vec<_> = (0..args.concurrency)
            .map(|_| {
                tokio::spawn(client(
                    http.clone(),
                    service.url.clone(),
                    next.clone(),
                    args.clone(),
                    deadline,
                ))
            })
            .collect();
        let mut tallies = Vec::new();
        for client in clients {
            tallies.push(client.await??);
        }
        anyhow::Ok(tallies)
    })?;
    let elapsed = started.elapsed();

    // Stop the service as an operator would, and check what it left.
    let pid = service.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status()?;
    if !status.success() {
        bail!("kill -TERM {pid} failed");
    }
    let exit = service.child.wait()?;
    let summary = service
        .rest
        .take()
        .and_then(|reader| reader.join().ok())
        .unwrap_or_default();
    if !exit.success() {
        bail!("the service exited with {exit} after SIGTERM");
    }
    let committed = serde_json::from_str::<serde_json::Value>(summary.trim())
        .ok()
        .and_then(|summary| summary["records_committed"].as_u64());
    let mut counts = HashMap::new();
    count_output(&output.path().join("data"), &mut counts)?;

    let mut latencies: Vec<Duration> = tallies
        .iter()
        .flat_map(|t| t.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let acknowledged = latencies.len() as u64;
    let retried: u64 = tallies.iter().map(|t| t.retried).sum();
    let events = acknowledged * args.events as u64;
    let twice = counts.values().filter(|&&n| n > 1).count();
    let exactly_once = counts.len() as u64 == events && twice == 0 && committed == Some(events);
    let rps = acknowledged as f64 / elapsed.as_secs_f64();
    let (p50, p90, p99, max) = (
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.90),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0),
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "requests_acknowledged": acknowledged,
                "retried_503": retried,
                "events_per_request": args.events,
                "concurrency": args.concurrency,
                "checkpoint_interval_ms": args.checkpoint_interval.as_millis() as u64,
                "seconds": elapsed.as_secs_f64(),
                "requests_per_second": rps,
                "events_per_second": rps * args.events as f64,
                "latency_ms": {"p50": p50, "p90": p90, "p99": p99, "max": max},
                "output_events": counts.len(),
                "exactly_once": exactly_once,
            })
        );
    } else {
        println!(
            "{acknowledged} requests acknowledged ({events} events) in {:.2} s, {retried} answered 503 and retried",
            elapsed.as_secs_f64()
        );
        println!(
            "{rps:.0} requests/s, {:.0} events/s, concurrency {}, checkpoints every {} ms",
            rps * args.events as f64,
            args.concurrency,
            args.checkpoint_interval.as_millis()
        );
        println!("acknowledgement latency: p50 {p50:.1} ms, p90 {p90:.1} ms, p99 {p99:.1} ms, max {max:.1} ms");
        println!(
            "output: {} distinct events, {twice} more than once: {}",
            counts.len(),
            if exactly_once {
                "every acknowledged event exactly once"
            } else {
                "NOT exactly once"
            }
        );
    }
    if !exactly_once {
        bail!(
            "the output holds {} distinct events ({twice} more than once) for {events} acknowledged; \
             the service says it committed {committed:?}",
            counts.len()
        );
    }
    Ok(())
}
