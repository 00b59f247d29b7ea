//! The ingest service, run as a user runs it: the compiled binary on a
//! random port and a temporary directory, driven over HTTP, stopped with
//! SIGTERM or killed with SIGKILL.
//!
//! Every event carries a unique `"id"`; the output is every non-hidden file
//! under `<dir>/data`, read line by line, and counted by id.
//!
//! Services start with HTTPS (a certificate the test binary makes) and
//! bearer tokens on, as the binary asks for; [`client`] trusts that
//! certificate and sends the token of the tenant `alpha`. A test that wants
//! plain HTTP or no tokens says so with `--plain-http` or `--no-auth`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Time allowed for a start (pipeline restore included) or a stop.
const PROCESS_DEADLINE: Duration = Duration::from_secs(30);

/// The token `client` sends: the tenant `alpha`'s.
const ALPHA_TOKEN: &str = "alpha-token-0123456789abcdef";

/// The tenants of the shared token file, and their tokens.
const TOKENS: [(&str, &str); 4] = [
    ("alpha", ALPHA_TOKEN),
    ("beta", "beta-token-0123456789abcdef"),
    ("greedy", "greedy-token-0123456789abcdef"),
    ("polite", "polite-token-0123456789abcdef"),
];

/// A certificate for 127.0.0.1 and localhost and its key, as PEM files.
struct TestCert {
    cert: PathBuf,
    key: PathBuf,
    /// The certificate, PEM, for a client to trust.
    pem: String,
}

impl TestCert {
    /// A new self-signed certificate, written into `dir` as `<name>.pem`
    /// and `<name>.key`.
    fn make(dir: &Path, name: &str) -> TestCert {
        let made =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".into()])
                .expect("a test certificate");
        let cert = TestCert {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
            pem: made.cert.pem(),
        };
        std::fs::write(&cert.cert, &cert.pem).unwrap();
        std::fs::write(&cert.key, made.signing_key.serialize_pem()).unwrap();
        cert
    }

    /// Writes this certificate and key over `other`'s files.
    fn install_as(&self, other: &TestCert) {
        std::fs::copy(&self.cert, &other.cert).unwrap();
        std::fs::copy(&self.key, &other.key).unwrap();
    }
}

/// Writes a token file as the service takes it: the owner's only.
fn write_private(path: &Path, content: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The certificate and token file every service of this test binary
/// starts with, made once.
struct Shared {
    cert: TestCert,
    tokens: PathBuf,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        // Kept for the life of the test process, which nextest ends
        // without running destructors: under the target's directory for
        // tests (removed with the target), not in the system's /tmp.
        let dir = tempfile::Builder::new()
            .prefix("ingest-service-shared-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap()
            .keep();
        let tokens = dir.join("tokens");
        let lines: String = TOKENS
            .iter()
            .map(|(tenant, token)| format!("{tenant} {token}\n"))
            .collect();
        write_private(&tokens, &format!("# the test tenants\n{lines}"));
        Shared {
            cert: TestCert::make(&dir, "shared"),
            tokens,
        }
    })
}

/// A running `ingest-service`; killed (SIGKILL) when dropped, so a failing
/// test leaves no process behind.
struct Service {
    child: Child,
    base: String,
    stdout: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Service {
    /// Starts the binary on `dir` with a 100 ms checkpoint interval (unless
    /// `extra` sets one) and waits for its `listening on` line.
    fn start(dir: &Path, extra: &[&str]) -> Service {
        Service::start_on(&Output::Dir(dir.to_path_buf()), extra)
    }

    /// [`start`](Self::start) on `output`, a directory or S3.
    fn start_on(output: &Output, extra: &[&str]) -> Service {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ingest-service"));
        command.args(["--listen", "127.0.0.1:0"]);
        match output {
            Output::Dir(dir) => {
                command.arg("--output-dir").arg(dir);
            }
            Output::S3 { url, endpoint } => {
                command
                    .args(["--out", &format!("{url}/data")])
                    .args(["--state", &format!("{url}/state")])
                    .args(["--endpoint", endpoint]);
            }
            Output::Postgres { url, table, dir } => {
                command
                    .arg("--output-dir")
                    .arg(dir)
                    // In the environment, as a password should be: `ps`
                    // shows a command line.
                    .env("INGEST_TEST_PG_URL", url)
                    .args(["--sink", "postgres", "--url-env", "INGEST_TEST_PG_URL"])
                    .args(["--table", table]);
            }
            Output::Kafka {
                brokers,
                topic,
                dir,
            } => {
                command.arg("--output-dir").arg(dir).args([
                    "--sink",
                    "kafka",
                    "--brokers",
                    brokers,
                    "--topic",
                    topic,
                ]);
            }
            #[cfg(feature = "iceberg")]
            Output::Iceberg { dir } => {
                command
                    .arg("--output-dir")
                    .arg(dir)
                    .args(["--sink", "iceberg"]);
            }
            #[cfg(feature = "iceberg")]
            Output::IcebergRest { dir, server, table } => {
                command
                    .arg("--output-dir")
                    .arg(dir)
                    .args(["--sink", "iceberg", "--table", table])
                    .arg("--catalog")
                    .arg(format!("rest:{}", server.uri));
                for (key, value) in server.properties() {
                    command
                        .arg("--catalog-property")
                        .arg(format!("{key}={value}"));
                }
            }
        }
        if !extra.contains(&"--checkpoint-interval") {
            command.args(["--checkpoint-interval", "100ms"]);
        }
        if !extra.contains(&"--plain-http") && !extra.contains(&"--tls-cert") {
            let cert = &shared().cert;
            command
                .arg("--tls-cert")
                .arg(&cert.cert)
                .arg("--tls-key")
                .arg(&cert.key);
        }
        if !extra.contains(&"--no-auth") && !extra.contains(&"--tokens") {
            command.arg("--tokens").arg(&shared().tokens);
        }
        let mut child = command
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the ingest service starts");
        let stdout = lines_of(child.stdout.take().expect("piped stdout"));
        let stderr = collect(child.stderr.take().expect("piped stderr"));
        let mut service = Service {
            child,
            base: String::new(),
            stdout,
            stderr,
        };
        let line = service.next_line();
        service.base = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the first line is not 'listening on ...': {line:?}"))
            .to_string();
        let https = !extra.contains(&"--plain-http");
        let scheme = if https { "https" } else { "http" };
        assert!(
            service.base.starts_with(&format!("{scheme}://127.0.0.1:")),
            "{line}"
        );
        service
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The next line on stdout, within the deadline.
    fn next_line(&self) -> String {
        match self.stdout.recv_timeout(PROCESS_DEADLINE) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no line on stdout in time; stderr:\n{}", self.stderr())
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("stdout closed early; stderr:\n{}", self.stderr())
            }
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit, within the deadline.
    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PROCESS_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the service") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the service did not exit in time; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, exit 0, and the summary line.
    fn stop(mut self) -> Value {
        self.terminate();
        let status = self.wait_exit();
        assert!(
            status.success(),
            "exit {status:?} after SIGTERM; stderr:\n{}",
            self.stderr()
        );
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("summary not JSON ({e}): {line}"))
    }

    /// SIGKILL.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaping the killed service");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of(stream: impl Read + Send + 'static) -> Receiver<String> {
    let (lines, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// Reads a stream to its end in the background (so the child never blocks
/// on a full pipe), keeping the last 16 KiB for failure messages.
fn collect(stream: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let kept = Arc::new(Mutex::new(String::new()));
    let sink = kept.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if let Ok(mut kept) = sink.lock() {
                kept.push_str(&line);
                kept.push('\n');
                if kept.len() > 16 * 1024 {
                    let mut cut = kept.len() - 16 * 1024;
                    while !kept.is_char_boundary(cut) {
                        cut += 1;
                    }
                    kept.drain(..cut);
                }
            }
        }
    });
    kept
}

/// How often each id is in the finished files under `<dir>/data`.
fn output_ids(dir: &Path) -> BTreeMap<String, usize> {
    let mut ids = BTreeMap::new();
    let data = dir.join("data");
    for path in sinks_file::finished_files(&data).expect("the output can be read") {
        let text = std::fs::read_to_string(&path).expect("a finished file");
        count_ids(&path.display().to_string(), &text, &mut ids);
    }
    ids
}

/// Counts the ids of the events in `text`, read from `from`.
fn count_ids(from: &str, text: &str, ids: &mut BTreeMap<String, usize>) {
    for line in text.lines() {
        let event: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{from}: a broken line ({e}): {line}"));
        let id = event["id"]
            .as_str()
            .unwrap_or_else(|| panic!("an event without an id: {line}"));
        *ids.entry(id.to_string()).or_default() += 1;
    }
}

/// Where a service writes: a directory (data in `<dir>/data`), or S3 (data
/// in `<url>/data`, checkpoints in `<url>/state`).
enum Output {
    Dir(PathBuf),
    S3 {
        url: String,
        endpoint: String,
    },
    /// Events in a PostgreSQL table, checkpoints in `<dir>/checkpoints`.
    Postgres {
        url: String,
        table: String,
        dir: PathBuf,
    },
    /// Events in a Kafka topic, checkpoints in `<dir>/checkpoints`.
    Kafka {
        brokers: String,
        topic: String,
        dir: PathBuf,
    },
    /// Events in the Iceberg table `ingest.events` of the catalog
    /// `<dir>/data/catalog.db`, checkpoints in `<dir>/checkpoints`.
    #[cfg(feature = "iceberg")]
    Iceberg {
        dir: PathBuf,
    },
    /// Events in the table `table` of the REST test catalog
    /// (`scripts/with-seaweedfs`), checkpoints in `<dir>/checkpoints`.
    #[cfg(feature = "iceberg")]
    IcebergRest {
        dir: PathBuf,
        server: sink_testkit::servers::IcebergRestServer,
        table: String,
    },
}

impl Output {
    /// Every id in the finished output, with how often it is there.
    async fn ids(&self) -> BTreeMap<String, usize> {
        match self {
            Output::Dir(dir) => output_ids(dir),
            Output::S3 { url, endpoint } => {
                let options = sink_cli::location::s3_options(Some(endpoint));
                let data = format!("{url}/data");
                let output = sink_cli::location::object_output(&data, &options).unwrap();
                let mut ids = BTreeMap::new();
                for object in sinks_file::finished_objects(&output).await.unwrap() {
                    let bytes = sinks_file::read_object(&output, &object).await.unwrap();
                    count_ids(&object, &String::from_utf8_lossy(&bytes), &mut ids);
                }
                ids
            }
            Output::Postgres { url, table, .. } => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .expect("connecting to the test server");
                tokio::spawn(connection);
                let rows = client
                    .query(&format!("SELECT event::text FROM {table}"), &[])
                    .await
                    .expect("reading the table");
                let text: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
                let mut ids = BTreeMap::new();
                count_ids(table, &text.join("\n"), &mut ids);
                ids
            }
            Output::Kafka { brokers, topic, .. } => {
                let read = sinks_kafka::read_committed(brokers, topic)
                    .await
                    .expect("reading the topic read_committed");
                let text: Vec<String> = read
                    .messages
                    .iter()
                    .map(|m| String::from_utf8_lossy(m.value_bytes()).into_owned())
                    .collect();
                let mut ids = BTreeMap::new();
                count_ids(topic, &text.join("\n"), &mut ids);
                ids
            }
            #[cfg(feature = "iceberg")]
            Output::Iceberg { dir } => {
                let warehouse = dir.join("data");
                let catalog =
                    sinks_iceberg::SqliteCatalog::new(&warehouse.join("catalog.db"), &warehouse)
                        .unwrap();
                let ident = sinks_iceberg::parse_table_name("ingest.events").unwrap();
                let opened = catalog.open().await.expect("the catalog opens");
                let mut ids = BTreeMap::new();
                let Some(table) = sinks_iceberg::read::table(opened.as_ref(), &ident)
                    .await
                    .expect("the catalog reads")
                else {
                    return ids;
                };
                let events = sinks_iceberg::read::string_column(&table, "event")
                    .await
                    .expect("the table reads");
                count_ids("ingest.events", &events.join("\n"), &mut ids);
                ids
            }
            #[cfg(feature = "iceberg")]
            Output::IcebergRest { server, table, .. } => {
                let catalog = sinks_iceberg::RestCatalog::new(&server.uri, server.properties())
                    .expect("a REST catalog");
                let ident = sinks_iceberg::parse_table_name(table).unwrap();
                let opened = catalog.open().await.expect("the catalog opens");
                let mut ids = BTreeMap::new();
                let Some(table) = sinks_iceberg::read::table(opened.as_ref(), &ident)
                    .await
                    .expect("the catalog reads")
                else {
                    return ids;
                };
                let events = sinks_iceberg::read::string_column(&table, "event")
                    .await
                    .expect("the table reads");
                count_ids("ingest.events", &events.join("\n"), &mut ids);
                ids
            }
        }
    }
}

fn assert_no_duplicates(ids: &BTreeMap<String, usize>) {
    let twice: Vec<_> = ids.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "ids written more than once: {twice:?}");
}

/// A body with one event per id: a JSON array, or JSON lines.
fn body(ids: &[String], lines: bool) -> String {
    let events = ids
        .iter()
        .map(|id| serde_json::json!({ "id": id, "payload": "x".repeat(20) }).to_string());
    if lines {
        events.map(|e| e + "\n").collect()
    } else {
        format!("[{}]", events.collect::<Vec<_>>().join(","))
    }
}

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// A client that trusts the shared certificate and sends `alpha`'s token.
fn client() -> reqwest::Client {
    client_of(ALPHA_TOKEN, &shared().cert.pem)
}

/// A client that sends `token` (none if empty) and trusts only `cert_pem`.
fn client_of(token: &str, cert_pem: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if !token.is_empty() {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
    }
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap())
        .default_headers(headers)
        .build()
        .expect("an HTTP client")
}

/// An answer: status, `Retry-After`, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
    key: Option<&str>,
) -> Result<Answer, reqwest::Error> {
    let mut request = client.post(url).body(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.text().await?;
    Ok(Answer {
        status,
        retry_after,
        body,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_means_the_events_are_in_finished_files() {
    let dir = tempfile::tempdir().unwrap();
    // Checkpoints far enough apart that an early answer would find nothing.
    let service = Service::start(dir.path(), &["--checkpoint-interval", "300ms"]);
    let client = client();
    let mut last_checkpoint = 0;
    let mut sent = 0;
    for request in 0..6 {
        let ids = ids(&format!("a{request}"), 3 + request);
        let key = format!("a-key-{request}");
        // Every third request has no key; both kinds must be committed.
        let key = (request % 3 != 2).then_some(key.as_str());
        let answer = post(
            &client,
            &service.url("/events"),
            body(&ids, request % 2 == 1),
            key,
        )
        .await
        .unwrap();
        // Read right after the answer, before anything else happens.
        let output = output_ids(dir.path());
        assert_eq!(answer.status, 200, "{answer:?}");
        for id in &ids {
            assert_eq!(
                output.get(id),
                Some(&1),
                "{id} answered 200 but is not in the finished files once"
            );
        }
        let json = answer.json();
        assert_eq!(json["events"], ids.len(), "{json}");
        assert_eq!(json["duplicate"], false, "{json}");
        let checkpoint = json["checkpoint"].as_u64().expect("a checkpoint id");
        assert!(
            checkpoint > last_checkpoint,
            "a request sent after an answer is in a later checkpoint: {checkpoint} after {last_checkpoint}"
        );
        last_checkpoint = checkpoint;
        sent += ids.len();
    }
    let summary = service.stop();
    assert_eq!(summary["records_committed"], sent, "{summary}");
    assert_eq!(summary["records_written"], sent, "{summary}");
    assert!(
        summary["last_checkpoint"].as_u64().unwrap() >= last_checkpoint,
        "{summary}"
    );
    assert!(summary["checkpoints"].as_u64().unwrap() >= 6, "{summary}");
    assert_eq!(summary["commits_failed"], 0, "{summary}");
    assert_eq!(summary["records_lost"], 0, "{summary}");
    assert_eq!(output_ids(dir.path()).len(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_service_answers_503_with_retry_after_and_takes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // One subtask that takes in one unanswered request and queues one more;
    // checkpoints far enough apart that nothing is answered meanwhile.
    let service = Service::start(
        dir.path(),
        &[
            "--parallelism",
            "1",
            "--capacity",
            "1",
            "--max-in-flight",
            "1",
            "--checkpoint-interval",
            "2s",
            // The pipeline's own bound is what is tested here, not the
            // tenant's share of it (half of it by default: one request).
            "--tenant-max-in-flight",
            "10",
        ],
    );
    let client = client();
    let url = service.url("/events");
    let spawn_post = |ids: Vec<String>| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { post(&client, &url, body(&ids, false), None).await })
    };
    let taken = spawn_post(ids("taken", 2));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued = spawn_post(ids("queued", 2));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = post(
        &client,
        &url,
        body(&ids("refused", 2), false),
        Some("k-refused"),
    )
    .await
    .unwrap();
    assert!(!taken.is_finished(), "answered before any checkpoint");
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.retry_after.as_deref(), Some("2"), "{refused:?}");
    assert!(
        refused.json()["error"]
            .as_str()
            .unwrap_or("")
            .contains("overloaded"),
        "{refused:?}"
    );
    // The first two are answered by the next commits; the refused key was
    // not spent: sent again, it is written.
    assert_eq!(taken.await.unwrap().unwrap().status, 200);
    assert_eq!(queued.await.unwrap().unwrap().status, 200);
    let again = post(
        &client,
        &url,
        body(&ids("refused", 2), false),
        Some("k-refused"),
    )
    .await
    .unwrap();
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.json()["duplicate"], false);
    service.stop();
    let output = output_ids(dir.path());
    assert_eq!(output.len(), 6, "{output:?}");
    assert_no_duplicates(&output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_key_is_answered_as_a_duplicate_and_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &[]);
    let client = client();
    let url = service.url("/events");
    let first_ids = ids("b1", 4);
    let first = post(&client, &url, body(&first_ids, false), Some("b-key-1"))
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{first:?}");
    let first = first.json();
    assert_eq!(first["duplicate"], false);

    // The answer was "lost": the client sends the same request again.
    let retry = post(&client, &url, body(&first_ids, false), Some("b-key-1"))
        .await
        .unwrap();
    assert_eq!(retry.status, 200, "{retry:?}");
    let retry = retry.json();
    assert_eq!(retry["duplicate"], true, "{retry}");
    assert_eq!(retry["checkpoint"], first["checkpoint"], "{retry}");
    assert_eq!(retry["events"], 4);

    // Other events under a used key are not a retry: refused with 422 and
    // not written (a_key_reused_with_another_body_is_refused_with_422_...).
    let other = post(
        &client,
        &url,
        body(&ids("b-other", 2), true),
        Some("b-key-1"),
    )
    .await
    .unwrap();
    assert_eq!(other.status, 422, "{other:?}");

    // Two copies at once, before any commit: one is written, the other waits
    // for it and gets the same checkpoint.
    let twin_ids = ids("b2", 3);
    let (x, y) = tokio::join!(
        post(&client, &url, body(&twin_ids, false), Some("b-key-2")),
        post(&client, &url, body(&twin_ids, false), Some("b-key-2")),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!((x.status, y.status), (200, 200), "{x:?} {y:?}");
    let (x, y) = (x.json(), y.json());
    assert_eq!(x["checkpoint"], y["checkpoint"], "{x} {y}");
    let duplicates = [&x, &y].iter().filter(|a| a["duplicate"] == true).count();
    assert_eq!(
        duplicates, 1,
        "exactly one of the twins is the original: {x} {y}"
    );

    let summary = service.stop();
    assert_eq!(summary["records_committed"], 7, "{summary}");
    let output = output_ids(dir.path());
    let expected: BTreeMap<String, usize> = first_ids
        .iter()
        .chain(&twin_ids)
        .map(|id| (id.clone(), 1))
        .collect();
    assert_eq!(output, expected);

    // Started again on the same directory, it still knows the key.
    let service = Service::start(dir.path(), &[]);
    let again = post(
        &client,
        &service.url("/events"),
        body(&first_ids, false),
        Some("b-key-1"),
    )
    .await
    .unwrap();
    assert_eq!(again.status, 200, "{again:?}");
    let again = again.json();
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["checkpoint"], first["checkpoint"], "{again}");
    let summary = service.stop();
    assert_eq!(summary["records_written"], 0, "{summary}");
    assert_eq!(output_ids(dir.path()), expected);
}

/// The IETF Idempotency-Key draft: a key reused with another body is 422,
/// and nothing of that body is stored; the same body is still a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_body_is_refused_with_422_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Checkpoints far enough apart that a request is still in flight when
    // the next one arrives.
    let service = Service::start(dir.path(), &["--checkpoint-interval", "1s"]);
    let client = client();
    let url = service.url("/events");
    let assert_422 = |answer: &Answer| {
        assert_eq!(answer.status, 422, "{answer:?}");
        let error = answer.json()["error"].as_str().unwrap_or("").to_string();
        assert!(
            error.contains("Idempotency-Key") && error.contains("different"),
            "{answer:?}"
        );
    };

    // Committed first, then reused with other events.
    let first_ids = ids("h1", 3);
    let first = post(&client, &url, body(&first_ids, false), Some("h-key-1"))
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.json()["duplicate"], false);
    let reused = post(
        &client,
        &url,
        body(&ids("h1-other", 2), false),
        Some("h-key-1"),
    )
    .await
    .unwrap();
    assert_422(&reused);
    // The same body is still a duplicate, answered with the first checkpoint.
    let retry = post(&client, &url, body(&first_ids, false), Some("h-key-1"))
        .await
        .unwrap();
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.json()["duplicate"], true, "{retry:?}");
    assert_eq!(retry.json()["checkpoint"], first.json()["checkpoint"]);
    // The same events in another encoding are another body.
    let relined = post(&client, &url, body(&first_ids, true), Some("h-key-1"))
        .await
        .unwrap();
    assert_422(&relined);

    // Still in flight (not committed yet) when it is reused.
    let pending_ids = ids("h2", 2);
    let pending = {
        let (client, url, body) = (client.clone(), url.clone(), body(&pending_ids, true));
        tokio::spawn(async move { post(&client, &url, body, Some("h-key-2")).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reused = post(
        &client,
        &url,
        body(&ids("h2-other", 4), true),
        Some("h-key-2"),
    )
    .await
    .unwrap();
    assert!(
        !pending.is_finished(),
        "the first request was answered before its checkpoint: the test proves nothing"
    );
    assert_422(&reused);
    let pending = pending.await.unwrap().unwrap();
    assert_eq!(pending.status, 200, "{pending:?}");
    assert_eq!(pending.json()["duplicate"], false);

    let summary = service.stop();
    assert_eq!(summary["records_written"], 5, "{summary}");
    let expected: BTreeMap<String, usize> = first_ids
        .iter()
        .chain(&pending_ids)
        .map(|id| (id.clone(), 1))
        .collect();
    assert_eq!(output_ids(dir.path()), expected);

    // After a restart from the checkpoints, the keys keep their bodies.
    let service = Service::start(dir.path(), &[]);
    let url = service.url("/events");
    let reused = post(
        &client,
        &url,
        body(&ids("h3-other", 1), false),
        Some("h-key-2"),
    )
    .await
    .unwrap();
    assert_422(&reused);
    let retry = post(&client, &url, body(&pending_ids, true), Some("h-key-2"))
        .await
        .unwrap();
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.json()["duplicate"], true, "{retry:?}");
    let summary = service.stop();
    assert_eq!(summary["records_written"], 0, "{summary}");
    assert_eq!(output_ids(dir.path()), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_with_the_reason_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &["--max-body-bytes", "4096"]);
    let client = client();
    let url = service.url("/events");
    let long_key = "k".repeat(256);
    let big = body(&ids("bad-big", 100), false);
    assert!(big.len() > 4096);
    let too_large = format!(
        "the body is larger than 4096 bytes; split the events over several requests (its \
         Content-Length declares {}; nothing was stored)",
        big.len()
    );
    let cases: Vec<(Vec<u8>, Option<&str>, u16, &str)> = vec![
        (
            b"[{\"id\": \"bad-1\"},\n {\"id\": }]".to_vec(),
            None,
            400,
            "line 2, column 9: expected value",
        ),
        (
            b"{\"id\": \"bad-2\"}\n\n{\"id\": \"bad-3\", \"x\": tru}\n".to_vec(),
            Some("bad-key-a"),
            400,
            "line 3, column 25: expected ident",
        ),
        (
            br#"[{"id": "bad-4"}, "bad-5"]"#.to_vec(),
            None,
            400,
            "event 2 is a string; every event must be a JSON object",
        ),
        (
            b"{\"id\": \"bad-6\"}\n[{\"id\": \"bad-7\"}]\n".to_vec(),
            None,
            400,
            "event 2 (line 2) is an array; every event must be a JSON object",
        ),
        (
            b"".to_vec(),
            None,
            400,
            "the body holds no events: send a JSON array of objects, or one JSON object per line",
        ),
        // Stored as 1.2345678901234568e29 and 0.1 before: never "stored"
        // for something else.
        (
            br#"[{"id":"bad-bignum","n":123456789012345678901234567890,"f":0.1000000000000000055511151231257827}]"#
                .to_vec(),
            None,
            400,
            "event 1: the number 123456789012345678901234567890 at /n cannot be stored as sent \
             (integers are kept to 64 bits, decimals to double precision); send it as a string",
        ),
        (
            br#"[{"id":"bad-dup","id":"bad-dup-2"}]"#.to_vec(),
            None,
            400,
            "event 1: the key \"id\" appears twice in the object at the top level; send each key \
             once",
        ),
        (
            b" [ ] ".to_vec(),
            None,
            400,
            "the body holds no events: send a JSON array of objects, or one JSON object per line",
        ),
        (
            b"[{\"id\": \"bad-8\", \"x\": \"\xff\"}]".to_vec(),
            None,
            400,
            "the body is not valid UTF-8: line 1, column 24 (byte 23) starts an invalid sequence",
        ),
        (
            br#"[{"id": "bad-9"}]"#.to_vec(),
            Some(&long_key),
            400,
            "the Idempotency-Key header must be 1 to 255 visible ASCII characters; \
             this one is 256 bytes long",
        ),
        (
            br#"[{"id": "bad-10"}]"#.to_vec(),
            Some("two words"),
            400,
            "the Idempotency-Key header must be 1 to 255 visible ASCII characters \
             ('!' to '~'); character 4 is byte 0x20",
        ),
        (
            big.into_bytes(),
            None,
            413,
            &too_large,
        ),
    ];
    for (body, key, status, message) in cases {
        let answer = post(&client, &url, body.clone(), key).await.unwrap();
        assert_eq!(
            (answer.status, answer.json()["error"].as_str()),
            (status, Some(message)),
            "body {:?}",
            String::from_utf8_lossy(&body)
        );
    }
    // The service still works, and a key refused above is not spent.
    let ok = post(
        &client,
        &url,
        body(&["ok-1".into()], false),
        Some("bad-key-a"),
    )
    .await
    .unwrap();
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["duplicate"], false);

    let summary = service.stop();
    assert_eq!(summary["records_written"], 1, "{summary}");
    let output = output_ids(dir.path());
    assert_eq!(output, BTreeMap::from([("ok-1".to_string(), 1)]));
}

/// One request of a load test: its key, its ids, and how it went.
#[derive(Debug, Clone)]
struct Sent {
    key: String,
    ids: Vec<String>,
    lines: bool,
    /// The answer's JSON, for a 200.
    acked: Option<Value>,
}

/// `clients` concurrent clients posting 5 unique events per request, each
/// request with its own key, until a request fails after `stopping` was set
/// (or a 20 s deadline). A failure before `stopping` fails the test.
fn load(
    url: String,
    prefix: &'static str,
    clients: usize,
    stopping: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Sent>>> {
    let client = client();
    (0..clients)
        .map(|c| {
            let (client, url) = (client.clone(), url.clone());
            let stopping = stopping.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut sent = Vec::new();
                for request in 0.. {
                    if Instant::now() > deadline {
                        break;
                    }
                    let ids = ids(&format!("{prefix}-{c}-{request}"), 5);
                    let key = format!("{prefix}-key-{c}-{request}");
                    let lines = request % 2 == 0;
                    let answer = post(&client, &url, body(&ids, lines), Some(&key)).await;
                    let acked = match &answer {
                        Ok(a) if a.status == 200 => Some(a.json()),
                        Ok(a) => {
                            assert!(
                                stopping.load(Ordering::SeqCst),
                                "refused under plain load: {a:?}"
                            );
                            assert_eq!(a.status, 503, "{a:?}");
                            assert!(a.retry_after.is_some(), "503 without Retry-After");
                            None
                        }
                        Err(e) => {
                            assert!(
                                stopping.load(Ordering::SeqCst),
                                "a request failed under plain load: {e}"
                            );
                            None
                        }
                    };
                    let failed = acked.is_none();
                    sent.push(Sent {
                        key,
                        ids,
                        lines,
                        acked,
                    });
                    if failed && stopping.load(Ordering::SeqCst) {
                        break;
                    }
                }
                sent
            })
        })
        .collect()
}

/// Loads the service with 6 clients for 1.5 s, then `stop`s it, and returns
/// every request sent once the clients are done.
async fn load_then(url: String, prefix: &'static str, stop: impl FnOnce()) -> Vec<Sent> {
    let stopping = Arc::<AtomicBool>::default();
    let clients = load(url, prefix, 6, Arc::clone(&stopping));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stopping.store(true, Ordering::SeqCst);
    stop();
    let mut sent = Vec::new();
    for client in clients {
        sent.extend(client.await.expect("a client panicked"));
    }
    let acked = sent.iter().filter(|s| s.acked.is_some()).count();
    assert!(
        acked >= 10,
        "too little load to test anything: {acked} answers"
    );
    sent
}

/// The output, after checking that no id is in it twice and that every
/// acknowledged id is in it.
fn assert_acked_once(dir: &Path, sent: &[Sent], when: &str) -> BTreeMap<String, usize> {
    check_acked_once(output_ids(dir), sent, when)
}

/// `output`, after checking that no id is in it twice and that every
/// acknowledged id is in it.
fn check_acked_once(
    output: BTreeMap<String, usize>,
    sent: &[Sent],
    when: &str,
) -> BTreeMap<String, usize> {
    assert_no_duplicates(&output);
    for id in sent
        .iter()
        .filter(|s| s.acked.is_some())
        .flat_map(|s| &s.ids)
    {
        assert_eq!(
            output.get(id),
            Some(&1),
            "{when}: acknowledged {id} is missing"
        );
    }
    output
}

/// Under load, SIGTERM: every acknowledged event is stored once, and a
/// request in flight at SIGTERM is answered 200 and stored. The load's own
/// requests may or may not straddle the signal (on a busy machine the
/// server may not have read any of them yet, and closes their connections),
/// so one request certainly does: its head and half its body go before the
/// signal, the rest after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_and_loses_no_acknowledged_event() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut service = Service::start(dir.path(), &["--parallelism", "2", "--plain-http"]);
    let in_flight = ids("d-in-flight", 3);
    let body = body(&in_flight, false);
    let mut stream = tokio::net::TcpStream::connect(service.address())
        .await
        .unwrap();
    let head = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALPHA_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (first, rest) = body.as_bytes().split_at(body.len() / 2);
    stream.write_all(first).await.unwrap();
    let sent = load_then(service.url("/events"), "d", || service.terminate()).await;
    stream.write_all(rest).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
        .await
        .expect("the draining server answers the request in flight")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "a request in flight at SIGTERM: {answer}"
    );
    let status = service.wait_exit();
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        service.stderr()
    );
    let summary: Value = serde_json::from_str(&service.next_line()).expect("a JSON summary");
    let output = assert_acked_once(dir.path(), &sent, "after SIGTERM");
    for id in &in_flight {
        assert_eq!(output.get(id), Some(&1), "{id}, in flight at SIGTERM");
    }
    assert_eq!(
        summary["records_committed"].as_u64(),
        Some(output.len() as u64),
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_then_retries_with_the_same_keys_store_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    sigkill_then_retries(Output::Dir(dir.path().to_path_buf()), "e").await;
}

/// The same with the output and the checkpoints on an S3-compatible server
/// (`scripts/with-s3`; skipped without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_s3_sigkill_under_load_then_retries_with_the_same_keys_store_everything_once() {
    let Some(s3) = sink_testkit::servers::s3() else {
        return;
    };
    let (url, endpoint) = (
        format!("s3://{}/ingest-{}", s3.bucket, fastrand::u64(..)),
        s3.endpoint,
    );
    sigkill_then_retries(Output::S3 { url, endpoint }, "s").await;
}

/// Killed under load, started again on the same output: acknowledged
/// requests are there once and answered as duplicates; every request that
/// got no 200, retried with its key, is stored once.
async fn sigkill_then_retries(out: Output, prefix: &'static str) {
    sigkill_then_retries_with(out, prefix, &["--parallelism", "2"]).await;
}

/// [`sigkill_then_retries`] with the service's flags.
async fn sigkill_then_retries_with(out: Output, prefix: &'static str, flags: &[&str]) {
    let service = Service::start_on(&out, flags);
    let sent = load_then(service.url("/events"), prefix, move || service.kill()).await;
    let unacked: Vec<&Sent> = sent.iter().filter(|s| s.acked.is_none()).collect();
    assert!(!unacked.is_empty(), "no request was in flight at the kill");

    check_acked_once(out.ids().await, &sent, "after SIGKILL");

    let service = Service::start_on(&out, flags);
    check_acked_once(out.ids().await, &sent, "after the restart");
    let client = client();
    let url = service.url("/events");

    // The keys survived the crash: acknowledged requests sent again are
    // answered with their first checkpoint and not written again.
    for s in sent.iter().filter(|s| s.acked.is_some()).take(20) {
        let answer = post(&client, &url, body(&s.ids, s.lines), Some(&s.key))
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        let json = answer.json();
        assert_eq!(json["duplicate"], true, "{} forgotten: {json}", s.key);
        let first = s.acked.as_ref().map(|a| &a["checkpoint"]);
        assert_eq!(Some(&json["checkpoint"]), first, "{}", s.key);
    }

    // The clients retry every request that got no 200, with the same key.
    let deadline = Instant::now() + Duration::from_secs(20);
    for s in &unacked {
        loop {
            assert!(Instant::now() < deadline, "{} never got a 200", s.key);
            match post(&client, &url, body(&s.ids, s.lines), Some(&s.key)).await {
                Ok(answer) if answer.status == 200 => break,
                Ok(answer) => {
                    assert_eq!(answer.status, 503, "{answer:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the restarted service failed a request: {e}"),
            }
        }
    }

    service.stop();
    let output = out.ids().await;
    assert_no_duplicates(&output);
    let expected: Vec<&String> = sent.iter().flat_map(|s| &s.ids).collect();
    for id in &expected {
        assert_eq!(output.get(*id), Some(&1), "{id} is not in the output once");
    }
    assert_eq!(
        output.len(),
        expected.len(),
        "ids nobody sent are in the output"
    );
}

/// The samples of an OpenMetrics text, by `name{labels}`; panics on a line
/// that is neither a comment of the format nor a sample.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last(),
        Some(&"# EOF"),
        "the exposition ends with # EOF"
    );
    let mut samples = BTreeMap::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split(' ').next().unwrap_or_default();
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind),
                "unknown comment: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample is 'name value': {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "a bad metric name: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "unclosed labels: {line}");
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("a bad value ({e}): {line}"));
        samples.insert(series.to_string(), value);
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_committed_records_and_healthz_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &[]);
    let client = client();
    let health = client.get(service.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");
    let ok = post(
        &client,
        &service.url("/events"),
        body(&ids("f", 3), false),
        None,
    )
    .await
    .unwrap();
    assert_eq!(ok.status, 200, "{ok:?}");
    let bad = post(&client, &service.url("/events"), "[1]", None)
        .await
        .unwrap();
    assert_eq!(bad.status, 400, "{bad:?}");

    let response = client.get(service.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    assert!(
        text.contains("# TYPE ingest_records_committed counter"),
        "{text}"
    );
    let samples = parse_exposition(&text);
    let sample = |series: &str| {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    assert_eq!(sample("ingest_records_committed_total"), 3.0);
    assert_eq!(sample("ingest_records_written_total"), 3.0);
    assert!(sample("ingest_checkpoints_completed_total") >= 1.0);
    assert_eq!(sample("ingest_checkpoints_failed_total"), 0.0);
    assert_eq!(sample("ingest_commits_failed_total"), 0.0);
    assert_eq!(sample("ingest_records_lost_total"), 0.0);
    assert_eq!(sample("ingest_restarts_total"), 0.0);
    assert_eq!(sample("ingest_queued_sends"), 0.0);
    assert_eq!(sample("ingest_pipeline_running"), 1.0);
    assert!(sample("ingest_last_checkpoint_duration_seconds") >= 0.0);
    // The file sink's own counters, registered in the job's metrics.
    assert_eq!(sample("ingest_file_sink_committed_records_total"), 3.0);
    assert!(sample("ingest_file_sink_committed_files_total") >= 1.0);
    assert_eq!(sample("ingest_file_sink_failed_commits_total"), 0.0);
    // The health check and the post; this scrape is counted after it.
    assert_eq!(sample(r#"ingest_http_responses_total{status="200"}"#), 2.0);
    assert_eq!(sample(r#"ingest_http_responses_total{status="400"}"#), 1.0);
    service.stop();
}

#[test]
fn bad_flags_exit_2_and_an_unusable_directory_exits_1() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_ingest-service"))
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .expect("the ingest service runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
            output.stdout,
        )
    };
    let (code, stderr, _) = run(&["--checkpoint-interval", "5x"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unknown unit 'x'"), "{stderr}");
    let (code, stderr, _) = run(&["--parallelism", "0"]);
    assert_eq!(code, Some(2), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let file: PathBuf = dir.path().join("a-file");
    std::fs::write(&file, "in the way").unwrap();
    let file_arg = file.to_string_lossy().into_owned();
    let (code, stderr, stdout) = run(&[
        "--listen",
        "127.0.0.1:0",
        "--output-dir",
        &file_arg,
        "--plain-http",
        "--no-auth",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("creating the data directory") && stderr.contains(&file_arg),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "nothing listens: {stdout:?}");

    // One directory, one service: a second one on it is refused.
    let shared = dir.path().join("shared");
    let first = Service::start(&shared, &[]);
    let shared_arg = shared.to_string_lossy().into_owned();
    let (code, stderr, _) = run(&[
        "--listen",
        "127.0.0.1:0",
        "--output-dir",
        &shared_arg,
        "--plain-http",
        "--no-auth",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("opening the checkpoint storage")
            && stderr.contains("in use by another running instance"),
        "{stderr}"
    );
    first.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_in_process_until_its_shutdown_future_completes() {
    use ingest_service::{run, Config};
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        checkpointing: sink_runtime::CheckpointConfig::every(Duration::from_millis(50)),
        ..Config::new(dir.path())
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(run(config, listener, async {
        let _ = stopped.await;
    }));
    let client = client();
    // The listener is bound before the pipeline starts: a request waits for it.
    let answer = post(&client, &url, body(&ids("g", 2), true), Some("g-1"))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(output_ids(dir.path()).len(), 2);
    stop.send(()).unwrap();
    let summary = service.await.unwrap().unwrap();
    assert_eq!(summary.records_committed, 2);
    assert!(summary.last_checkpoint >= answer.json()["checkpoint"].as_u64());
}

/// On demand, a request is answered by a checkpoint taken for it: with a
/// maximum interval of an hour, every answer comes (within the client's
/// 15 s timeout), and each of the requests sent one after the other took a
/// checkpoint of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_a_request_is_answered_without_waiting_for_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(
        dir.path(),
        &[
            "--checkpoint-interval",
            "on-demand",
            "--checkpoint-max-interval",
            "1h",
        ],
    );
    let client = client();
    let url = service.url("/events");
    let sent: Vec<Vec<String>> = (0..5).map(|r| ids(&format!("od-{r}"), 3)).collect();
    for ids in &sent {
        let answer = post(&client, &url, body(ids, false), None)
            .await
            .expect("answered before the client's timeout, not an hour later");
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let summary = service.stop();
    let output = output_ids(dir.path());
    assert_no_duplicates(&output);
    assert_eq!(output.len(), 15, "{output:?}");
    let checkpoints = summary["checkpoints"].as_u64().unwrap_or_default();
    assert!(
        (5..=7).contains(&checkpoints),
        "5 requests one after the other, {checkpoints} checkpoints: {summary}"
    );
}

/// Bad checkpoint and destination flags are refused with the fix.
#[test]
fn bad_checkpoint_and_sink_flags_are_refused_with_the_fix() {
    for (args, expected) in [
        (&["--checkpoint-interval", "soon"][..], "on-demand"),
        (
            &[
                "--checkpoint-interval",
                "1s",
                "--checkpoint-max-interval",
                "5s",
            ][..],
            "on-demand only",
        ),
        (
            &[
                "--checkpoint-interval",
                "on-demand",
                "--checkpoint-min-pause",
                "2s",
                "--checkpoint-max-interval",
                "1s",
            ][..],
            "longer than",
        ),
        (&["--sink", "postgres"][..], "needs --url"),
        (
            &["--sink", "iceberg", "--table", "events"][..],
            "NAMESPACE.NAME",
        ),
        (
            &["--sink", "iceberg", "--catalog", "events.db"][..],
            "sqlite:PATH",
        ),
        (
            &[
                "--sink",
                "iceberg",
                "--instance-id",
                "a",
                "--instances",
                "a,b",
            ][..],
            "cannot share",
        ),
        (&["--catalog", "sqlite:x.db"][..], "--sink iceberg"),
        (&["--instances", "a,b"][..], "--instance-id"),
        (
            &["--instance-id", "c", "--instances", "a,b"][..],
            "not among the instances",
        ),
        (&["--instance-id", "A"][..], "not an instance id"),
        (
            &["--instance-id", "a", "--instances", "a,b,a"][..],
            "listed twice",
        ),
        (&["--url", "host=x"][..], "--sink postgres"),
        (
            &["--sink", "postgres", "--url-env", "INGEST_TEST_NO_SUCH_VAR"][..],
            "INGEST_TEST_NO_SUCH_VAR (--url-env) is not set",
        ),
        (
            &["--sink", "postgres", "--url", "host=x", "--url-env", "V"][..],
            "cannot be used with",
        ),
        (
            &["--sink", "postgres", "--url", "host=x", "--table", "a;b"][..],
            "not a plain table name",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_ingest-service"))
            .args(["--listen", "127.0.0.1:0", "--output-dir"])
            .arg(tempfile::tempdir().unwrap().path())
            .args(["--plain-http", "--no-auth"])
            .args(args)
            .output()
            .expect("the service runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// The test server's connection string (`scripts/with-postgres`), or `None`
/// after saying the test is skipped.
fn postgres_url() -> Option<String> {
    sink_testkit::servers::postgres()
}

/// Into PostgreSQL, with checkpoints on demand: killed under load, started
/// again, the requests without a 200 retried with their keys: every event
/// is in the table once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_on_demand_sigkill_under_load_then_retries_store_everything_once() {
    let Some(url) = postgres_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let table = format!("ingest_test_{}", fastrand::u32(..));
    let out = Output::Postgres {
        url,
        table,
        dir: dir.path().to_path_buf(),
    };
    sigkill_then_retries_with(
        out,
        "p",
        &["--parallelism", "2", "--checkpoint-interval", "on-demand"],
    )
    .await;
}

/// Into Kafka, with checkpoints on demand: killed under load, started
/// again, the requests without a 200 retried with their keys: every event
/// is in the topic once, as a `read_committed` consumer sees it.
#[cfg(feature = "kafka-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_on_demand_sigkill_under_load_then_retries_store_everything_once() {
    let brokers = std::env::var("KAFKA_TEST_BROKERS").unwrap_or_else(|_| {
        panic!(
            "KAFKA_TEST_BROKERS is not set: run under scripts/with-kafka (./scripts/test-all does)"
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let out = Output::Kafka {
        brokers,
        topic: format!("ingest-test-{}", fastrand::u32(..)),
        dir: dir.path().to_path_buf(),
    };
    sigkill_then_retries_with(
        out,
        "k",
        &["--parallelism", "2", "--checkpoint-interval", "on-demand"],
    )
    .await;
}

/// Into Kafka over SASL_SSL (SCRAM-SHA-512), its settings in a client
/// properties file (`--kafka-config`): the service reaches the broker only
/// through a proxy that enforces TLS and SASL, and every event answered
/// 200 is in the topic once. With a wrong password it is refused at start,
/// naming SASL, and nothing is written.
#[cfg(feature = "kafka-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn into_kafka_over_sasl_ssl_from_a_kafka_config_and_a_wrong_password_refused_naming_sasl() {
    use sink_kafka_client::proxy::AuthProxy;
    use sink_kafka_client::test_certificates::TestCertificates;
    let brokers = std::env::var("KAFKA_TEST_BROKERS").unwrap_or_else(|_| {
        panic!(
            "KAFKA_TEST_BROKERS is not set: run under scripts/with-kafka (./scripts/test-all does)"
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::new();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &certificates.ca_pem).unwrap();
    let proxy = AuthProxy::start(certificates.sasl_ssl_proxy(
        brokers.clone(),
        sink_kafka_client::SaslMechanism::ScramSha512,
        "ingest",
        "s3cr3t-pass",
    ))
    .await
    .unwrap();
    let config = |password: &str| {
        let path = dir.path().join(format!("{password}.properties"));
        std::fs::write(
            &path,
            format!(
                "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
                 sasl.username=ingest\nsasl.password={password}\nssl.ca.location={}\n",
                ca_file.display()
            ),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    };
    let topic = format!("ingest-sasl-{}", fastrand::u32(..));
    let out = Output::Kafka {
        brokers: proxy.address().to_string(),
        topic: topic.clone(),
        dir: dir.path().join("good"),
    };
    let good = config("s3cr3t-pass");
    let service = Service::start_on(&out, &["--kafka-config", &good]);
    let client = client();
    let mut sent = Vec::new();
    for request in 0..3 {
        let ids = ids(&format!("sasl{request}-"), 20);
        let answer = post(&client, &service.url("/events"), body(&ids, false), None)
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        sent.extend(ids);
    }
    let summary = service.stop();
    assert_eq!(summary["records_committed"], sent.len(), "{summary}");
    // Read back from the broker itself, past the proxy.
    let read = sinks_kafka::read_committed(brokers.as_str(), &topic)
        .await
        .unwrap();
    let text: Vec<String> = read
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(m.value_bytes()).into_owned())
        .collect();
    let mut found = BTreeMap::new();
    count_ids(&topic, &text.join("\n"), &mut found);
    assert_no_duplicates(&found);
    assert_eq!(found.len(), sent.len(), "events in the topic");
    // A wrong password: refused at start, naming SASL; nothing written.
    let wrong_topic = format!("ingest-sasl-wrong-{}", fastrand::u32(..));
    let wrong = config("wrong-pass");
    let refused = Command::new(env!("CARGO_BIN_EXE_ingest-service"))
        .args(["--listen", "127.0.0.1:0", "--plain-http", "--no-auth"])
        .arg("--output-dir")
        .arg(dir.path().join("wrong"))
        .args(["--sink", "kafka", "--brokers", proxy.address()])
        .args(["--topic", &wrong_topic, "--kafka-config", &wrong])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success(), "{text}");
    assert!(text.contains("SASL"), "{text}");
    assert!(!text.contains("wrong-pass"), "the password printed: {text}");
    let nothing = sinks_kafka::read_committed(brokers.as_str(), &wrong_topic)
        .await
        .unwrap();
    assert!(nothing.messages.is_empty());
}

/// Into an Iceberg table, with checkpoints on demand: killed under load,
/// started again, the requests without a 200 retried with their keys:
/// every event is in the table once.
#[cfg(feature = "iceberg")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_iceberg_on_demand_sigkill_under_load_then_retries_store_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = Output::Iceberg {
        dir: dir.path().to_path_buf(),
    };
    sigkill_then_retries_with(
        out,
        "i",
        &["--parallelism", "2", "--checkpoint-interval", "on-demand"],
    )
    .await;
}

/// Into a table of a REST catalog (SeaweedFS's, `scripts/with-seaweedfs`),
/// with 200 ms checkpoints: killed under load, started again, the requests
/// without a 200 retried with their keys: every event is in the table once.
#[cfg(feature = "iceberg")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_iceberg_rest_sigkill_under_load_then_retries_store_everything_once() {
    let Some(server) = sink_testkit::servers::iceberg_rest() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = Output::IcebergRest {
        dir: dir.path().to_path_buf(),
        server,
        table: format!("ingest{:016x}.events", fastrand::u64(..)),
    };
    sigkill_then_retries_with(
        out,
        "r",
        &["--parallelism", "2", "--checkpoint-interval", "200ms"],
    )
    .await;
}

/// One of several instances: a keyed request whose key another instance
/// owns is refused with 421 and the owner's id, and nothing of it is
/// stored; its own keys and unkeyed requests are taken; its checkpoints are
/// kept under its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_refuses_keys_another_owns_with_421_naming_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &["--instance-id", "a", "--instances", "a,b,c"]);
    let client = client();
    let url = service.url("/events");
    let all: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    for n in 0..40 {
        let key = format!("k-{n}");
        let owner = ingest_service::routing::owner(&key, &all)
            .unwrap()
            .to_string();
        let ids = ids(&key, 2);
        let response = client
            .post(&url)
            .header("Idempotency-Key", &key)
            .body(body(&ids, false))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let named = response
            .headers()
            .get("ingest-owner")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if owner == "a" {
            assert_eq!(status, 200, "{key} is a's");
            mine.extend(ids);
        } else {
            assert_eq!(status, 421, "{key} is {owner}'s");
            assert_eq!(named.as_deref(), Some(owner.as_str()), "{key}");
            theirs.extend(ids);
        }
    }
    let unkeyed = ids("unkeyed", 3);
    let answer = post(&client, &url, body(&unkeyed, false), None)
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    service.stop();
    let output = output_ids(dir.path());
    assert_no_duplicates(&output);
    assert!(
        !mine.is_empty() && !theirs.is_empty(),
        "both kinds of keys were tried"
    );
    for id in mine.iter().chain(&unkeyed) {
        assert!(output.contains_key(id), "{id} was acknowledged");
    }
    for id in &theirs {
        assert!(!output.contains_key(id), "{id} was refused but stored");
    }
    assert!(
        dir.path().join("checkpoints").join("a").is_dir(),
        "the instance's checkpoints are under its id"
    );
}

impl Service {
    /// Sends SIGHUP: the service reads its tokens and certificate again.
    fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -HUP failed");
    }

    /// `host:port` of the listener.
    fn address(&self) -> String {
        let (_, address) = self.base.split_once("://").expect("a URL");
        address.to_string()
    }

    /// One sample of `/metrics`, read with `alpha`'s token.
    async fn metric(&self, client: &reqwest::Client, sample: &str) -> f64 {
        let text = client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        *parse_exposition(&text)
            .get(sample)
            .unwrap_or_else(|| panic!("no {sample} in:\n{text}"))
    }
}

/// Every event in the finished files under `<dir>/data`.
fn output_events(dir: &Path) -> Vec<Value> {
    let mut events = Vec::new();
    for path in sinks_file::finished_files(&dir.join("data")).expect("the output can be read") {
        let text = std::fs::read_to_string(&path).expect("a finished file");
        for line in text.lines() {
            events.push(serde_json::from_str(line).expect("a JSON line"));
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_get_401_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &[]);
    let url = service.url("/events");
    let pem = &shared().cert.pem;
    let anonymous = client_of("", pem);
    let wrong = client_of("alpha-token-0123456789abcdeX", pem);
    let bearer = format!("Bearer {ALPHA_TOKEN}");
    let refused = [
        ("none", anonymous.post(&url)),
        ("wrong", wrong.post(&url)),
        (
            "basic",
            anonymous
                .post(&url)
                .header("Authorization", format!("Basic {ALPHA_TOKEN}")),
        ),
        (
            "twice",
            anonymous
                .post(&url)
                .header("Authorization", &bearer)
                .header("Authorization", &bearer),
        ),
    ];
    for (name, request) in refused {
        let response = request
            .header("Idempotency-Key", format!("k-{name}"))
            .body(body(&ids(&format!("unauth-{name}"), 3), false))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 401, "{name}");
        let challenge = response.headers()["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.starts_with("Bearer realm="),
            "{name}: {challenge}"
        );
        let text = response.text().await.unwrap();
        assert!(text.contains("nothing was stored"), "{name}: {text}");
    }
    let metrics = anonymous.get(service.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status().as_u16(), 401, "/metrics is open");
    let health = anonymous.get(service.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200, "/healthz needs a token");

    // Keys are kept per tenant: the same key from two tenants is two keys.
    let alpha = client();
    let beta = client_of(TOKENS[1].1, pem);
    for (client, prefix) in [(&alpha, "ok-alpha"), (&beta, "ok-beta")] {
        let answer = post(client, &url, body(&ids(prefix, 2), false), Some("same-key"))
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.json()["duplicate"], false, "{answer:?}");
    }
    // A client cannot write under another tenant's name.
    let forged = r#"[{"id": "forged-0", "_tenant": "beta"}]"#;
    let answer = post(&alpha, &url, forged, None).await.unwrap();
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("_tenant"), "{answer:?}");
    // A refused request spent nothing: its key, with a token, writes.
    let retried = post(
        &alpha,
        &url,
        body(&ids("unauth-none", 3), false),
        Some("k-none"),
    )
    .await
    .unwrap();
    assert_eq!(retried.status, 200, "{retried:?}");
    assert_eq!(retried.json()["duplicate"], false, "{retried:?}");
    service.stop();

    let events = output_events(dir.path());
    let mut by_id = BTreeMap::new();
    for event in &events {
        let id = event["id"].as_str().expect("an id").to_string();
        let tenant = event["_tenant"].as_str().expect("a tenant").to_string();
        assert!(by_id.insert(id, tenant).is_none(), "{event} twice");
    }
    let expected: BTreeMap<String, String> = ids("ok-alpha", 2)
        .into_iter()
        .chain(ids("unauth-none", 3))
        .map(|id| (id, "alpha".to_string()))
        .chain(ids("ok-beta", 2).into_iter().map(|id| (id, "beta".into())))
        .collect();
    assert_eq!(
        by_id, expected,
        "the output is not what the valid tokens sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_refuses_plain_and_untrusted_clients_and_sighup_rotates_certificate_and_tokens(
) {
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let served = TestCert::make(files.path(), "served");
    let next = TestCert::make(files.path(), "next");
    let (old_token, new_token) = ("old-token-0123456789abcdef", "new-token-0123456789abcdef");
    let tokens = files.path().join("tokens");
    write_private(&tokens, &format!("alpha {old_token}\n"));
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (cert, key, tokens_arg) = (path(&served.cert), path(&served.key), path(&tokens));
    let service = Service::start(
        dir.path(),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tokens",
            &tokens_arg,
        ],
    );
    let url = service.url("/events");
    assert!(url.starts_with("https://"), "{url}");

    // The round trip, with a client that trusts the test certificate only.
    let answer = post_as(old_token, &served.pem, &url, "tls-1")
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    // Plain HTTP on the TLS port, and a client that does not trust the
    // certificate, get no answer at all.
    let plain = url.replacen("https://", "http://", 1);
    let sent = client_of(old_token, &served.pem)
        .post(&plain)
        .body(body(&ids("plain", 2), false))
        .send()
        .await;
    assert!(sent.is_err(), "plain HTTP was answered: {sent:?}");
    let untrusted = post_as(old_token, &next.pem, &url, "untrusted").await;
    assert!(
        untrusted.is_err(),
        "a certificate the client does not trust was accepted"
    );

    // Rotation: new files in place, then SIGHUP. New connections get the
    // new certificate and only the new token is valid.
    next.install_as(&served);
    std::fs::write(&tokens, format!("alpha {new_token}\n")).unwrap();
    service.hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // A new client each time: a new connection, a new handshake.
        match post(
            &client_of(new_token, &next.pem),
            &url,
            body(&ids("rotated", 2), false),
            Some("rotated"),
        )
        .await
        {
            Ok(answer) if answer.status == 200 => break,
            other => assert!(
                Instant::now() < deadline,
                "the rotation did not take: {other:?}; stderr:\n{}",
                service.stderr()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let revoked = post_as(old_token, &next.pem, &url, "revoked")
        .await
        .unwrap();
    assert_eq!(revoked.status, 401, "{revoked:?}");
    let old_cert = post_as(new_token, &served.pem, &url, "old-cert").await;
    assert!(old_cert.is_err(), "the old certificate is still served");

    // A reload that fails keeps what is in force, and says why.
    std::fs::write(&tokens, "alpha short\n").unwrap();
    service.hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !service.stderr().contains("SIGHUP") {
        assert!(Instant::now() < deadline, "no word of the failed reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(service.stderr().contains("line 1"), "{}", service.stderr());
    let still = post_as(new_token, &next.pem, &url, "still").await.unwrap();
    assert_eq!(still.status, 200, "{still:?}");
    service.stop();
    let output = output_ids(dir.path());
    assert_no_duplicates(&output);
    let stored: Vec<&str> = output
        .keys()
        .map(|id| id.rsplit_once('-').unwrap().0)
        .collect();
    let mut stored = stored;
    stored.dedup();
    assert_eq!(stored, ["rotated", "still", "tls-1"], "{output:?}");
}

/// A token file that blocks on open (a named pipe in its place, as a hung
/// network file system would) fails its reload at once, with the reason
/// logged and the tokens in force kept; a later SIGHUP is still heard, and
/// SIGTERM still ends the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_that_blocks_wedges_neither_reloads_nor_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let (old_token, new_token) = ("old-token-0123456789abcdef", "new-token-0123456789abcdef");
    let tokens = files.path().join("tokens");
    write_private(&tokens, &format!("alpha {old_token}\n"));
    let tokens_arg = tokens.to_str().unwrap().to_string();
    let service = Service::start(dir.path(), &["--plain-http", "--tokens", &tokens_arg]);
    let url = service.url("/events");
    let send = |token: &'static str, prefix: &'static str| {
        let client = reqwest::Client::builder().build().unwrap();
        let url = url.clone();
        async move {
            client
                .post(&url)
                .bearer_auth(token)
                .body(body(&ids(prefix, 2), false))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(send(old_token, "before").await, 200);

    std::fs::remove_file(&tokens).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&tokens)
        .status()
        .unwrap()
        .success());
    service.hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !service.stderr().contains("named pipe") {
        assert!(
            Instant::now() < deadline,
            "no word of the failed reload: {}",
            service.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(send(old_token, "kept").await, 200, "the old tokens stay");

    std::fs::remove_file(&tokens).unwrap();
    write_private(&tokens, &format!("alpha {new_token}\n"));
    service.hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while send(new_token, "rotated").await != 200 {
        assert!(
            Instant::now() < deadline,
            "a later SIGHUP was not heard: {}",
            service.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(send(old_token, "revoked").await, 401);
    service.stop();
}

/// Posts two events with ids `<prefix>-<n>` on a new connection of a new
/// client, with `token`, trusting only `cert_pem`.
async fn post_as(
    token: &str,
    cert_pem: &str,
    url: &str,
    prefix: &str,
) -> Result<Answer, reqwest::Error> {
    post(
        &client_of(token, cert_pem),
        url,
        body(&ids(prefix, 2), false),
        None,
    )
    .await
}

/// When the server closed a connection [`held_open`] held.
#[derive(Debug, Clone, Copy)]
struct Closed {
    since_connect: Duration,
    since_last_send: Duration,
}

/// Opens a connection to `address`, sends the chunks of `send` (none: a
/// silent connection) `pause` apart, and reads until the server closes it;
/// panics if it is still open 20 s after the last chunk.
async fn held_open(address: String, send: Vec<Vec<u8>>, pause: Duration) -> Closed {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connecting");
    let connected = Instant::now();
    let mut sent = connected;
    let mut pending: std::collections::VecDeque<Vec<u8>> = send.into();
    let mut buffer = [0u8; 4096];
    loop {
        let closed = |sent: Instant| Closed {
            since_connect: connected.elapsed(),
            since_last_send: sent.elapsed(),
        };
        if let Some(chunk) = pending.pop_front() {
            if stream.write_all(&chunk).await.is_err() {
                return closed(sent);
            }
            sent = Instant::now();
        }
        let wait = if pending.is_empty() {
            Duration::from_secs(20)
        } else {
            pause
        };
        // Reading while waiting to send the next chunk sees the close.
        match tokio::time::timeout(wait, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return closed(sent),
            Ok(Ok(_)) => {}
            Err(_) if pending.is_empty() => panic!("a connection was held open for 20 s"),
            Err(_) => {}
        }
    }
}

/// A client posting one request after another until `stop`, each of which
/// must be answered 200; returns how many were.
fn keep_posting(
    client: reqwest::Client,
    url: String,
    prefix: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut answered = 0;
        while !stop.load(Ordering::SeqCst) {
            let ids = ids(&format!("{prefix}-{answered}"), 2);
            let answer = post(&client, &url, body(&ids, false), None).await;
            match answer {
                Ok(answer) if answer.status == 200 => answered += 1,
                other => panic!("{prefix}: a request was not answered 200: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        answered
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_connections_are_closed_within_the_header_read_timeout_while_others_are_answered(
) {
    const SILENT: usize = 2000;
    let timeout = Duration::from_secs(2);
    for tls in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut flags = vec!["--header-read-timeout", "2s", "--max-connections", "2100"];
        if !tls {
            flags.push("--plain-http");
        }
        let service = Service::start(dir.path(), &flags);
        let client = client();
        let stop = Arc::new(AtomicBool::new(false));
        let polite = keep_posting(
            client.clone(),
            service.url("/events"),
            format!("polite-{tls}"),
            Arc::clone(&stop),
        );
        let address = service.address();
        let silent: Vec<_> = (0..SILENT)
            .map(|_| tokio::spawn(held_open(address.clone(), Vec::new(), Duration::ZERO)))
            .collect();
        // Without TLS: headers a byte every 300 ms, and a kept-alive
        // connection that sends nothing after its answer.
        let slow = (!tls).then(|| {
            let mut chunks = vec![b"POST /events HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_vec()];
            chunks.extend((0..30).map(|_| b"a".to_vec()));
            tokio::spawn(held_open(
                address.clone(),
                chunks,
                Duration::from_millis(300),
            ))
        });
        let kept_alive = (!tls).then(|| {
            let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
            tokio::spawn(held_open(address.clone(), vec![request], Duration::ZERO))
        });
        let mut closed = Vec::new();
        for connection in silent {
            closed.push(connection.await.expect("a silent connection").since_connect);
        }
        stop.store(true, Ordering::SeqCst);
        let answered = polite.await.expect("the polite client");
        closed.sort();
        let (first, median, last) = (closed[0], closed[SILENT / 2], closed[SILENT - 1]);
        println!(
            "tls {tls}: {SILENT} silent connections closed after {first:?} to {last:?} \
             (median {median:?}) at a {timeout:?} header read timeout; {answered} requests \
             answered meanwhile"
        );
        assert!(
            first >= timeout * 9 / 10,
            "closed before the timeout: {first:?}"
        );
        assert!(
            last <= timeout + Duration::from_secs(4),
            "closed late: {last:?}"
        );
        assert!(
            answered >= 10,
            "the other client was hardly answered: {answered}"
        );
        if let (Some(slow), Some(kept_alive)) = (slow, kept_alive) {
            // The slow one would have sent its last header byte after 9 s.
            let slow = slow.await.expect("the slow connection").since_connect;
            let idle = kept_alive
                .await
                .expect("the kept-alive connection")
                .since_last_send;
            println!(
                "headers a byte every 300 ms: cut off after {slow:?}; a kept-alive connection \
                 idle after its answer: closed after {idle:?}"
            );
            for (what, after) in [("slow headers", slow), ("an idle kept-alive", idle)] {
                assert!(
                    after >= timeout * 9 / 10 && after <= timeout + Duration::from_secs(4),
                    "{what} connection closed after {after:?}"
                );
            }
        }
        let timed_out = service
            .metric(&client, "ingest_connections_timed_out_total")
            .await;
        assert!(timed_out >= SILENT as f64, "{timed_out}");
        service.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(
        dir.path(),
        &["--max-connections", "20", "--header-read-timeout", "3s"],
    );
    let address = service.address();
    let held: Vec<_> = (0..20)
        .map(|_| tokio::spawn(held_open(address.clone(), Vec::new(), Duration::ZERO)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = held_open(address.clone(), Vec::new(), Duration::ZERO)
        .await
        .since_connect;
    assert!(
        refused < Duration::from_secs(1),
        "the 21st was held {refused:?}"
    );
    for connection in held {
        let closed = connection.await.unwrap().since_connect;
        assert!(closed >= Duration::from_millis(2500), "{closed:?}");
    }
    // Once the silent ones are shed, the service answers again.
    let client = client();
    let answer = post(
        &client,
        &service.url("/events"),
        body(&ids("after-cap", 2), false),
        None,
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let refused = service
        .metric(&client, "ingest_connections_refused_total")
        .await;
    assert!(refused >= 1.0, "{refused}");
    service.stop();
}

/// What the clients of one tenant got: answers by status.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    too_many: usize,
    unavailable: usize,
}

/// `clients` clients of the tenant with `token`, posting for `duration`;
/// a 429 must carry `Retry-After`.
async fn post_for(
    service: &Service,
    token: &str,
    clients: usize,
    duration: Duration,
    prefix: &str,
) -> Vec<tokio::task::JoinHandle<Tally>> {
    let client = client_of(token, &shared().cert.pem);
    (0..clients)
        .map(|c| {
            let (client, url) = (client.clone(), service.url("/events"));
            let prefix = format!("{prefix}-{c}");
            tokio::spawn(async move {
                let deadline = Instant::now() + duration;
                let mut tally = Tally::default();
                for request in 0.. {
                    if Instant::now() > deadline {
                        break;
                    }
                    let ids = ids(&format!("{prefix}-{request}"), 2);
                    let answer = post(&client, &url, body(&ids, false), None).await.unwrap();
                    match answer.status {
                        200 => tally.ok += 1,
                        429 => {
                            assert!(answer.retry_after.is_some(), "429 without Retry-After");
                            tally.too_many += 1;
                        }
                        503 => tally.unavailable += 1,
                        _ => panic!("{answer:?}"),
                    }
                }
                tally
            })
        })
        .collect()
}

/// One greedy tenant (48 clients) and one polite one (a client), 3 s,
/// with `share` in flight per tenant of a pipeline that queues 8 (and takes
/// in 8 more while it is not checkpointing).
async fn greedy_and_polite(share: &str) -> (Tally, Tally) {
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(
        dir.path(),
        &[
            "--parallelism",
            "1",
            "--capacity",
            "8",
            "--max-in-flight",
            "8",
            "--tenant-max-in-flight",
            share,
        ],
    );
    let duration = Duration::from_secs(3);
    let greedy = post_for(&service, TOKENS[2].1, 48, duration, "greedy").await;
    let polite = post_for(&service, TOKENS[3].1, 1, duration, "polite").await;
    let sum = |tallies: Vec<Tally>| {
        tallies.into_iter().fold(Tally::default(), |all, t| Tally {
            ok: all.ok + t.ok,
            too_many: all.too_many + t.too_many,
            unavailable: all.unavailable + t.unavailable,
        })
    };
    let mut greedy_tallies = Vec::new();
    for client in greedy {
        greedy_tallies.push(client.await.unwrap());
    }
    let polite = sum(vec![polite.into_iter().next().unwrap().await.unwrap()]);
    service.stop();
    (sum(greedy_tallies), polite)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_greedy_tenant_cannot_starve_a_polite_one() {
    // Each tenant may hold 4, half the queue: the polite one always finds
    // room, even while the subtask checkpoints and lets requests queue.
    let (greedy, polite) = greedy_and_polite("4").await;
    println!("share 4: greedy {greedy:?}, polite {polite:?}");
    assert!(greedy.too_many > 0 && greedy.ok > 0, "{greedy:?}");
    assert!(polite.ok >= 10, "{polite:?}");
    assert_eq!(
        (polite.too_many, polite.unavailable),
        (0, 0),
        "the polite tenant was refused: {polite:?}"
    );
    // The same load with a share as large as the whole bound: the greedy
    // tenant fills the pipeline and the polite one is turned away (which
    // shows the load above was enough to starve it).
    let (greedy, polite) = greedy_and_polite("1000").await;
    println!("share 1000: greedy {greedy:?}, polite {polite:?}");
    assert_eq!(greedy.too_many, 0, "{greedy:?}");
    assert!(
        polite.unavailable > 0,
        "not starved without shares: {polite:?}"
    );
}

/// Posts one event with the id `<key>-0` under the `Idempotency-Key` `key`;
/// panics unless it is answered 200. Returns the answer's JSON.
async fn post_keyed(client: &reqwest::Client, url: &str, key: &str) -> Value {
    let answer = post(client, url, body(&ids(key, 1), false), Some(key))
        .await
        .unwrap_or_else(|e| panic!("{key}: {e}"));
    assert_eq!(answer.status, 200, "{key}: {answer:?}");
    answer.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sending_new_keys_fast_does_not_push_out_another_tenants_keys() {
    let dir = tempfile::tempdir().unwrap();
    // 128 keys per tenant: 2 in each of the pipeline's 64 key partitions.
    let service = Service::start(
        dir.path(),
        &[
            "--key-retention",
            "128",
            "--checkpoint-interval",
            "on-demand",
        ],
    );
    let url = service.url("/events");
    let pem = &shared().cert.pem;
    let greedy = client_of(TOKENS[2].1, pem);
    let polite = client_of(TOKENS[3].1, pem);
    // The polite tenant's two keys: at most 2 in any partition, within its
    // budget.
    let mut first = BTreeMap::new();
    for key in ["polite-0", "polite-1"] {
        let answer = post_keyed(&polite, &url, key).await;
        assert_eq!(answer["duplicate"], false, "{key}: {answer}");
        first.insert(key, answer["checkpoint"].clone());
    }
    // The greedy tenant's first key, then 639 more, 16 at a time (about 10
    // a partition: five times its budget), each answered 200, so committed,
    // before the retries below.
    post_keyed(&greedy, &url, "greedy-0").await;
    let mut sending = tokio::task::JoinSet::new();
    for worker in 0..16 {
        let (greedy, url) = (greedy.clone(), url.clone());
        sending.spawn(async move {
            for i in (1 + worker..640).step_by(16) {
                post_keyed(&greedy, &url, &format!("greedy-{i}")).await;
            }
        });
    }
    while let Some(sent) = sending.join_next().await {
        sent.unwrap();
    }
    // The polite tenant's retries are recognised: duplicates of the first
    // requests, nothing stored again.
    for (key, checkpoint) in &first {
        let answer = post_keyed(&polite, &url, key).await;
        assert_eq!(
            answer["duplicate"], true,
            "{key} was forgotten, pushed out by another tenant's new keys: {answer}"
        );
        assert_eq!(&answer["checkpoint"], checkpoint, "{key}: {answer}");
    }
    // The greedy tenant's own oldest key went: past its budget, its retry
    // is stored again.
    let answer = post_keyed(&greedy, &url, "greedy-0").await;
    assert_eq!(answer["duplicate"], false, "{answer}");
    service.stop();
    let ids = output_ids(dir.path());
    assert_eq!(ids.len(), 642);
    assert_eq!(ids["polite-0-0"], 1);
    assert_eq!(ids["polite-1-0"], 1);
    assert_eq!(ids["greedy-0-0"], 2);
}

#[test]
fn tls_and_token_flags_are_asked_for_and_bad_files_refused_with_the_fix() {
    let files = tempfile::tempdir().unwrap();
    let cert = TestCert::make(files.path(), "c");
    let other = TestCert::make(files.path(), "other");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let bad_tokens = files.path().join("bad-tokens");
    write_private(&bad_tokens, "alpha short\n");
    let missing = path(&files.path().join("missing"));
    let exposed = files.path().join("exposed-tokens");
    std::fs::write(&exposed, "alpha token-of-alpha-0123456789\n").unwrap();
    let pipe = files.path().join("pipe-tokens");
    assert!(Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .unwrap()
        .success());
    let (exposed, pipe) = (path(&exposed), path(&pipe));
    let (cert_pem, cert_key, other_key, bad) = (
        path(&cert.cert),
        path(&cert.key),
        path(&other.key),
        path(&bad_tokens),
    );
    for (args, code, expected) in [
        (&["--no-auth"][..], 2, "--plain-http"),
        (&["--plain-http"][..], 2, "--no-auth"),
        (&["--no-auth", "--tls-cert", &cert_pem][..], 2, "--tls-key"),
        (
            &[
                "--no-auth",
                "--plain-http",
                "--tls-cert",
                &cert_pem,
                "--tls-key",
                &cert_key,
            ][..],
            2,
            "cannot be used with",
        ),
        (
            &["--no-auth", "--tls-cert", &missing, "--tls-key", &cert_key][..],
            1,
            "reading the TLS certificate",
        ),
        (
            &["--no-auth", "--tls-cert", &cert_key, "--tls-key", &cert_key][..],
            1,
            "holds no certificate",
        ),
        (
            &[
                "--no-auth",
                "--tls-cert",
                &cert_pem,
                "--tls-key",
                &other_key,
            ][..],
            1,
            "does not go with the certificate",
        ),
        (
            &["--plain-http", "--tokens", &missing][..],
            1,
            "reading the token file",
        ),
        (
            &["--plain-http", "--tokens", &bad][..],
            1,
            "line 1: the second word, the token, is 5",
        ),
        (&["--plain-http", "--tokens", &exposed][..], 1, "chmod 600"),
        // A pipe would block the open forever.
        (
            &["--plain-http", "--tokens", &pipe][..],
            1,
            "not a regular file but a named pipe",
        ),
        (
            &["--plain-http", "--tokens-env", "INGEST_TEST_NO_SUCH_VAR"][..],
            1,
            "INGEST_TEST_NO_SUCH_VAR is not set",
        ),
        (
            &["--plain-http", "--tokens", &bad, "--no-auth"][..],
            2,
            "cannot be used with",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_ingest-service"))
            .args(["--listen", "127.0.0.1:0", "--output-dir"])
            .arg(files.path().join("out"))
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .expect("the service runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?} listened");
    }
}

/// A body declared over the limit gets 413 at once, before any of it is
/// sent: not 408 after the body timeout, and with `Expect: 100-continue`
/// no `100 Continue` first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_the_limit_gets_413_at_once_and_no_100_continue() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &["--plain-http", "--body-read-timeout", "30s"]);
    for expect in ["", "Expect: 100-continue\r\n"] {
        for declared in ["99999999999999", "5000000"] {
            let mut stream = tokio::net::TcpStream::connect(service.address())
                .await
                .unwrap();
            let head = format!(
                "POST /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALPHA_TOKEN}\r\n\
                 {expect}Content-Length: {declared}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
                .await
                .expect("answered and closed at once, not after the body timeout")
                .unwrap();
            let answer = String::from_utf8_lossy(&answer);
            assert!(
                answer.starts_with("HTTP/1.1 413"),
                "{expect}{declared}: {answer}"
            );
            assert!(!answer.contains("100 Continue"), "{answer}");
            assert!(answer.contains(declared), "{answer}");
        }
    }
    service.stop();
    assert!(output_ids(dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_gets_408_and_writes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &["--plain-http", "--body-read-timeout", "1s"]);
    let body = body(&ids("trickled", 2), false);
    let mut stream = tokio::net::TcpStream::connect(service.address())
        .await
        .unwrap();
    let head = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALPHA_TOKEN}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // Half the body, then nothing.
    stream
        .write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("nothing was stored"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    service.stop();
    assert!(
        output_ids(dir.path()).is_empty(),
        "a trickled body was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_that_hangs_up_keeps_its_share_until_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    // Checkpoints 3 s apart: the requests below stay in the pipeline.
    let service = Service::start(
        dir.path(),
        &["--checkpoint-interval", "3s", "--tenant-max-in-flight", "2"],
    );
    let url = service.url("/events");
    let greedy = TOKENS[2].1;
    // Two requests whose client gives up (hangs up) after 300 ms.
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(shared().cert.pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    for n in 0..2 {
        let sent = impatient
            .post(&url)
            .header("Authorization", format!("Bearer {greedy}"))
            .body(body(&ids(&format!("hung-up-{n}"), 2), false))
            .send()
            .await;
        assert!(sent.is_err(), "answered before the checkpoint: {sent:?}");
    }
    // Their events are still in the pipeline: the share is still taken.
    let refused = post_as(greedy, &shared().cert.pem, &url, "third")
        .await
        .unwrap();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.retry_after.is_some(), "{refused:?}");
    // Another tenant is not affected.
    let other = post_as(TOKENS[3].1, &shared().cert.pem, &url, "other")
        .await
        .unwrap();
    assert_eq!(other.status, 200, "{other:?}");
    // Once they are committed (with several subtasks each commits on its
    // own, so give them a moment), the share is free again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let after = post_as(greedy, &shared().cert.pem, &url, "after")
            .await
            .unwrap();
        if after.status == 200 {
            break;
        }
        assert_eq!(after.status, 429, "{after:?}");
        assert!(Instant::now() < deadline, "the share was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    service.stop();
    let output = output_ids(dir.path());
    assert_no_duplicates(&output);
    assert_eq!(output.len(), 8, "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answers_is_cut_off_by_the_write_timeout() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start(dir.path(), &["--plain-http", "--write-timeout", "1s"]);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive buffer: the answers fill it quickly.
    socket.set_recv_buffer_size(4096).unwrap();
    let address = service.address().parse().unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    let requests = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(100);
    let started = Instant::now();
    // Pipelined requests, never reading an answer, until the server hangs
    // up (a write fails).
    let cut_off = loop {
        match tokio::time::timeout(Duration::from_secs(1), stream.write_all(&requests)).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_)) => break started.elapsed(),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "a client that reads nothing was kept for 20 s"
        );
    };
    println!("a client that reads nothing was cut off after {cut_off:?}");
    // Others are answered meanwhile and after.
    let answer = post(
        &client(),
        &service.url("/events"),
        body(&ids("reader", 2), false),
        None,
    )
    .await
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    service.stop();
}
