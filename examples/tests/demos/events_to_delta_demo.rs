//! The Kafka-JSON-to-Delta demo (`events-to-delta-demo`, `--features
//! delta,kafka`), as its user runs it: a topic of JSON events, some of them
//! bad (not JSON; a time the table cannot hold), read by runs killed with
//! SIGKILL while the topic grows, then a bounded run that drains it. Every
//! good event is in the table once, under its day; librdkafka reads every
//! bad message in the dead-letter topic once, with its reason.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::kafka_topics::{brokers, kill, spawn, unique, write_records};
use crate::librdkafka::librdkafka;
use crate::output::summary;

/// The events written, over the run.
const EVENTS: u64 = 20_000;
/// 2026-12-01T00:00:00Z, in milliseconds.
const DEC_1_MS: i64 = 1_796_083_200_000;
/// Three days of event time over the events.
const STEP_MS: i64 = 259_200_000 / EVENTS as i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Good,
    /// Not JSON: refused by the demo's parse step.
    NotJson,
    /// A time past what the table's microseconds hold: refused by the sink.
    TooFar,
}

fn kind(id: u64) -> Kind {
    match (id % 97, id % 89) {
        (13, _) => Kind::NotJson,
        (_, 7) => Kind::TooFar,
        _ => Kind::Good,
    }
}

/// The message of event `id`.
fn message(id: u64) -> Vec<u8> {
    let ts = match kind(id) {
        Kind::NotJson => return format!("not json: event {id}").into_bytes(),
        Kind::TooFar => 9_300_000_000_000_000,
        Kind::Good => DEC_1_MS + id as i64 * STEP_MS,
    };
    let amount = match id % 2 {
        0 => serde_json::Value::Null,
        _ => serde_json::json!(id as f64 / 4.0),
    };
    serde_json::json!({ "id": id, "ts": ts, "amount": amount })
        .to_string()
        .into_bytes()
}

/// The day directory of a good event `id`.
fn day_of(id: u64) -> String {
    let day = (id as i64 * STEP_MS) / 86_400_000;
    format!("day=2026-12-0{}", day + 1)
}

fn write(topic: &str, ids: std::ops::Range<u64>) {
    let records = ids.map(|id| sinks_kafka::KafkaRecord::new(message(id)));
    write_records(topic, 4, records.collect());
}

/// The demo reading `topic` into the table `table`, checkpoints in
/// `state`, bad messages to `dead`.
fn demo(topic: &str, dead: &str, table: &Path, state: &Path, bounded: bool) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_events-to-delta-demo"));
    command
        .args([
            "--brokers",
            &brokers(),
            "--topic",
            topic,
            "--dead-letters",
            dead,
        ])
        .arg("--table")
        .arg(table)
        .arg("--state")
        .arg(state)
        .args(["--checkpoint-interval", "100ms"])
        .env("RUST_LOG", "warn");
    if bounded {
        command.arg("--bounded");
    }
    command
}

/// Each id in the table at `table` (none before it exists), with the path
/// of its file.
fn table_ids(table: &Path) -> Vec<(String, u64)> {
    if !table.join("_delta_log").exists() {
        return Vec::new();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let location = sinks_delta::TableLocation::local(table).unwrap();
    let by_file = runtime
        .block_on(sinks_delta::read::int64_column_by_file(&location, "id"))
        .expect("the table reads");
    (by_file.into_iter())
        .flat_map(|(path, ids)| ids.into_iter().map(move |id| (path.clone(), id as u64)))
        .collect()
}

#[test]
fn json_events_are_in_the_table_by_day_once_and_bad_ones_in_the_dead_letter_topic_once_across_kill_9(
) {
    let dir = tempfile::tempdir().unwrap();
    let (table, state) = (dir.path().join("table"), dir.path().join("state"));
    let (topic, dead) = (unique("events"), unique("dead-letters"));
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    write(&topic, 0..8_000);
    for round in 0..3 {
        let run = spawn(demo(&topic, &dead, &table, &state, false));
        std::thread::sleep(Duration::from_millis(rng.u64(300..1_200)));
        write(&topic, 8_000 + round * 4_000..12_000 + round * 4_000);
        std::thread::sleep(Duration::from_millis(rng.u64(100..1_200)));
        kill(run);
    }
    eprintln!(
        "seed {seed}: {} rows before the drain",
        table_ids(&table).len()
    );
    let drained = demo(&topic, &dead, &table, &state, true).output().unwrap();
    let report = summary(&drained);
    assert_eq!(report["status"], "Finished", "seed {seed}: {report}");
    let bad: Vec<u64> = (0..EVENTS).filter(|&id| kind(id) != Kind::Good).collect();
    assert_eq!(
        report["counters"]["bad_records_dead_lettered"],
        bad.len() as u64,
        "seed {seed}: {report}"
    );

    // Every good event once, under the day of its time.
    let mut ids = Vec::new();
    for (path, id) in table_ids(&table) {
        assert!(path.starts_with(&day_of(id)), "seed {seed}: {id} in {path}");
        ids.push(id);
    }
    ids.sort_unstable();
    let good: Vec<u64> = (0..EVENTS).filter(|&id| kind(id) == Kind::Good).collect();
    assert_eq!(
        (ids.len(), ids == good),
        (good.len(), true),
        "seed {seed}: every good event once"
    );

    // Every bad message once in the dead-letter topic, as librdkafka reads
    // it, with why it was refused.
    let read = librdkafka(&["consume", &brokers(), &dead, "--full"]);
    let mut dead_ids = Vec::new();
    for record in read["records"].as_array().expect("records") {
        let value = record[2].as_str().expect("a value");
        let headers: Vec<(String, String)> = (record[3].as_array().expect("headers").iter())
            .map(|h| {
                (
                    h[0].as_str().unwrap().into(),
                    h[1].as_str().unwrap_or("").into(),
                )
            })
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let error = header("dead_letter.error").unwrap_or_default();
        let id = match value.strip_prefix("not json: event ") {
            Some(id) => {
                assert!(error.contains("expected"), "seed {seed}: {error}");
                assert!(header("dead_letter.position").is_some_and(|p| p.contains('@')));
                id.parse().unwrap()
            }
            None => {
                assert!(
                    error.contains("does not fit the table's schema"),
                    "seed {seed}: {error}"
                );
                let row: serde_json::Value = serde_json::from_str(value).unwrap();
                row["id"].as_u64().expect("an id")
            }
        };
        dead_ids.push(id);
    }
    dead_ids.sort_unstable();
    assert_eq!(dead_ids, bad, "seed {seed}: every bad message once");
}
