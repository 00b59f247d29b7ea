//! The ingest service, run as a user runs it: the compiled binary on a
//! random port and a temporary directory, driven over HTTP, stopped with
//! SIGTERM or killed with SIGKILL.
//!
//! Every event carries a unique `"id"`; the output is every non-hidden file
//! under `<dir>/data`, read line by line, and counted by id.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Time allowed for a start (pipeline restore included) or a stop.
const PROCESS_DEADLINE: Duration = Duration::from_secs(30);

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
                    .args(["--sink", "postgres", "--url", url, "--table", table]);
            }
        }
        if !extra.contains(&"--checkpoint-interval") {
            command.args(["--checkpoint-interval", "100ms"]);
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
        assert!(service.base.starts_with("http://127.0.0.1:"), "{line}");
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
}

impl Output {
    /// Every id in the finished output, with how often it is there.
    async fn ids(&self) -> BTreeMap<String, usize> {
        match self {
            Output::Dir(dir) => output_ids(dir),
            Output::S3 { url, endpoint } => {
                let options = examples::location::s3_options(Some(endpoint));
                let data = format!("{url}/data");
                let output = examples::location::object_output(&data, &options).unwrap();
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

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
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
            "the body is larger than 4096 bytes; split the events over several requests",
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
    /// Sent before the stop signal was sent, and answered 200 after it.
    drained: bool,
}

/// `clients` concurrent clients posting 5 unique events per request, each
/// request with its own key, until a request fails after `stopping` was set
/// (or a 20 s deadline). A failure before `stopping` fails the test.
fn load(
    url: String,
    prefix: &'static str,
    clients: usize,
    stopping: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Sent>>> {
    let client = client();
    (0..clients)
        .map(|c| {
            let (client, url) = (client.clone(), url.clone());
            let (stopping, stopped) = (stopping.clone(), stopped.clone());
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
                    let before = !stopping.load(Ordering::SeqCst);
                    let answer = post(&client, &url, body(&ids, lines), Some(&key)).await;
                    let after = stopped.load(Ordering::SeqCst);
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
                        drained: before && after && acked.is_some(),
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
    let (stopping, stopped) = (Arc::default(), Arc::<AtomicBool>::default());
    let clients = load(url, prefix, 6, Arc::clone(&stopping), Arc::clone(&stopped));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stopping.store(true, Ordering::SeqCst);
    stop();
    stopped.store(true, Ordering::SeqCst);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_and_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut service = Service::start(dir.path(), &["--parallelism", "2"]);
    let sent = load_then(service.url("/events"), "d", || service.terminate()).await;
    let status = service.wait_exit();
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        service.stderr()
    );
    let summary: Value = serde_json::from_str(&service.next_line()).expect("a JSON summary");
    assert!(
        sent.iter().any(|s| s.drained),
        "no request in flight at SIGTERM was answered: the drain did not wait"
    );
    let output = assert_acked_once(dir.path(), &sent, "after SIGTERM");
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
    let (Ok(endpoint), Ok(bucket)) = (
        std::env::var("S3_TEST_ENDPOINT"),
        std::env::var("S3_TEST_BUCKET"),
    ) else {
        println!("skipped: no S3-compatible test server (run under scripts/with-s3)");
        return;
    };
    let url = format!("s3://{bucket}/ingest-{}", fastrand::u64(..));
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
    let (code, stderr, stdout) = run(&["--listen", "127.0.0.1:0", "--output-dir", &file_arg]);
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
    let (code, stderr, _) = run(&["--listen", "127.0.0.1:0", "--output-dir", &shared_arg]);
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
    use examples::ingest::{run, Config};
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
            &["--sink", "postgres", "--url", "host=x", "--table", "a;b"][..],
            "not a plain table name",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_ingest-service"))
            .args(["--listen", "127.0.0.1:0", "--output-dir"])
            .arg(tempfile::tempdir().unwrap().path())
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
    match std::env::var("PG_TEST_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            println!("skipped: no PostgreSQL test server (run under scripts/with-postgres)");
            None
        }
    }
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
        let owner = examples::ingest::routing::owner(&key, &all)
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
