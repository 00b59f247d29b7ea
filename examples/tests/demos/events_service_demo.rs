//! `events-service-demo`, the HTTP service on the file sink, as a client
//! uses it: every 200 means the events are in the output's finished files
//! at once (read right after each answer), and a request cut off by a
//! SIGKILL, retried with its key on the restarted service, is written once,
//! as is one answered before the kill and sent again after it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const EVENTS: u64 = 240;

/// The ids in the output's finished files, with how often each is there.
fn visible_ids(out: &Path) -> BTreeMap<u64, u32> {
    let mut ids = BTreeMap::new();
    for file in sinks_file::finished_files(out).expect("the output reads") {
        for line in std::fs::read_to_string(&file).unwrap_or_default().lines() {
            let event: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            *ids.entry(event["id"].as_u64().expect("an id")).or_default() += 1;
        }
    }
    ids
}

/// Starts the demo; returns it and the address it listens on.
fn start(out: &Path, state: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_events-service-demo"))
        .args(["--listen", "127.0.0.1:0", "--checkpoint-interval", "20ms"])
        .arg("--out")
        .arg(out)
        .arg("--state")
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo starts");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("its stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the demo says where it listens");
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("not an address: {line:?}"))
        .to_string();
    (child, address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_200_is_in_the_output_at_once_and_once_across_kills() {
    let out = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let mut rng = fastrand::Rng::with_seed(56);
    let (mut id, mut kills, mut duplicates) = (0, 0, 0);
    while id < EVENTS {
        let (mut child, address) = start(out.path(), state.path());
        let url = format!("http://{address}/events");
        // Killed after a few answers, while a request is in flight, the
        // first three starts; the last serves the rest.
        let kill_after = (kills < 3).then(|| id + rng.u64(20..60));
        if let Some(last) = id.checked_sub(1) {
            // The last request answered before the kill, sent again by a
            // client that missed the answer: answered, not written again.
            let again = client
                .post(&url)
                .header("idempotency-key", format!("event-{last}"))
                .body(format!(r#"[{{"id":{last},"kind":"click"}}]"#))
                .send()
                .await
                .expect("the restarted service answers");
            assert_eq!(again.status(), 200);
            let body: serde_json::Value = again.json().await.expect("a JSON answer");
            assert_eq!(body["duplicate"], true, "{body}");
            duplicates += 1;
            assert_eq!(visible_ids(out.path()).get(&last), Some(&1));
        }
        while id < EVENTS {
            let request = client
                .post(&url)
                .header("idempotency-key", format!("event-{id}"))
                .body(format!(r#"[{{"id":{id},"kind":"click"}}]"#))
                .send();
            let answer = if kill_after.is_some_and(|at| id >= at) {
                let in_flight = tokio::spawn(request);
                tokio::time::sleep(Duration::from_millis(rng.u64(0..15))).await;
                child.kill().expect("SIGKILL");
                child.wait().expect("the killed demo's status");
                kills += 1;
                match in_flight.await.expect("the request task") {
                    // Answered before the kill: it must hold.
                    Ok(answer) if answer.status() == 200 => Some(answer),
                    // Cut off: retried, with its key, after the restart.
                    _ => break,
                }
            } else {
                Some(request.await.expect("the service answers"))
            };
            let answer = answer.expect("an answer");
            if answer.status() != 200 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            let body: serde_json::Value = answer.json().await.expect("a JSON answer");
            duplicates += u32::from(body["duplicate"] == true);
            let visible = visible_ids(out.path());
            assert_eq!(
                visible.get(&id),
                Some(&1),
                "event {id} was answered 200 but is not in the output once: {body}"
            );
            id += 1;
            if kill_after.is_some_and(|at| id > at) {
                break;
            }
        }
        if child.try_wait().expect("the demo's status").is_none() {
            // The last start: a clean stop commits what was taken.
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            child.wait().expect("the demo stops");
        }
    }
    assert_eq!(kills, 3, "the demo was killed three times");
    let visible = visible_ids(out.path());
    let wrong: Vec<_> = visible.iter().filter(|(_, n)| **n != 1).collect();
    assert!(wrong.is_empty(), "events not once: {wrong:?}");
    assert_eq!(visible.len() as u64, EVENTS, "every event is in the output");
    assert!(
        duplicates >= 3,
        "{duplicates} retries answered as duplicates"
    );
    eprintln!("{kills} kills, {duplicates} retries answered as duplicates");
}
