//! The ingest service through power cuts: one run on a new output
//! directory traced while a client sends it requests one after another, the
//! states a power cut could leave built at sampled points, and from each,
//! the service started again and stopped: every event of every request
//! answered 200 before the power went is in the finished files exactly once
//! (`docs/semantics.md`, "Durability").
//!
//! `POWER_LOSS_FULL=1` checks every crash point of the run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

use sink_testkit::power_loss::{self, CrashState, Plan, Recording};

const REQUESTS: usize = 5;
const EVENTS: usize = 3;

fn service(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ingest-service"));
    command
        .args(["--listen", "127.0.0.1:0", "--output-dir"])
        .arg(dir.join("svc"))
        .args(["--plain-http", "--no-auth", "--parallelism", "2"])
        .args(["--checkpoint-interval", "on-demand"])
        .env("RUST_LOG", "warn");
    command
}

fn ids(request: usize) -> Vec<String> {
    (0..EVENTS).map(|i| format!("r{request}-{i}")).collect()
}

/// Posts the events of `request` to `address` and returns the answer's
/// status line.
fn post(address: &str, request: usize) -> String {
    let events: Vec<String> = ids(request)
        .iter()
        .map(|id| format!(r#"{{"id":"{id}","payload":"x"}}"#))
        .collect();
    let body = format!("[{}]", events.join(","));
    let mut stream = TcpStream::connect(address).expect("the service listens");
    write!(
        stream,
        "POST /events HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.lines().next().unwrap_or_default().to_string()
}

/// Reads the `listening on` line of a service's standard output; the rest
/// is drained on a thread, so that the service never writes to a closed
/// pipe.
fn address(stdout: impl Read + Send + 'static) -> String {
    let mut lines = BufReader::new(stdout);
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    first
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("not a 'listening on' line: {first:?}"))
        .to_string()
}

fn terminate(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// How often each id is in the finished files under `svc/data`.
fn stored(dir: &Path) -> Result<BTreeMap<String, usize>, String> {
    let data = dir.join("svc/data");
    let mut ids = BTreeMap::new();
    if !data.exists() {
        return Ok(ids);
    }
    for path in sinks_file::finished_files(&data).map_err(|e| e.to_string())? {
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        for line in text.lines() {
            let event: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("{}: a broken line ({e}): {line}", path.display()))?;
            let id = event["id"].as_str().unwrap_or_default().to_string();
            *ids.entry(id).or_default() += 1;
        }
    }
    Ok(ids)
}

/// Starts the service on one crash state, stops it, and says what was
/// violated.
fn verdict(recording: &Recording, state: &CrashState) -> Result<(), String> {
    let answered = recording
        .outputs_before(state.point)
        .iter()
        .filter(|o| o.text().contains("HTTP/1.1 200"))
        .count();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    state.write_to(dir.path()).map_err(|e| e.to_string())?;
    let mut child = service(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut first = String::new();
    let mut lines = BufReader::new(stdout);
    lines.read_line(&mut first).map_err(|e| e.to_string())?;
    if !first.starts_with("listening on") {
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        return Err(format!(
            "the service did not start on it: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    terminate(child.id());
    let mut rest = String::new();
    lines.read_to_string(&mut rest).map_err(|e| e.to_string())?;
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!(
            "the service started on it ended with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let found = stored(dir.path())?;
    let twice: Vec<&String> = found
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(id, _)| id)
        .collect();
    let missing: Vec<String> = (0..answered)
        .flat_map(ids)
        .filter(|id| !found.contains_key(id))
        .collect();
    match (missing.is_empty(), twice.is_empty()) {
        (true, true) => Ok(()),
        _ => Err(format!(
            "{answered} requests were answered 200; missing {missing:?}, more than once {twice:?}"
        )),
    }
}

#[test]
fn after_a_power_cut_every_event_answered_200_is_stored_once() {
    if !power_loss::strace_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (recording, answers) =
        power_loss::record_with(&service(root.path()), root.path(), |traced| {
            let address = address(traced.take_stdout().expect("stdout"));
            let answers: Vec<String> = (0..REQUESTS).map(|r| post(&address, r)).collect();
            terminate(traced.pid().expect("the service's pid"));
            answers
        })
        .unwrap();
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 200")),
        "{answers:?}\n{}",
        String::from_utf8_lossy(&recording.stderr)
    );
    assert!(
        recording.status.success(),
        "{}",
        String::from_utf8_lossy(&recording.stderr)
    );
    let summary = recording.check(&Plan::from_env(5, 16, 1), |state| {
        verdict(&recording, state)
    });
    println!(
        "the ingest service, {} operations traced: {summary}",
        recording.operations()
    );
    summary.assert_no_violations();
}
