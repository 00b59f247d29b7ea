//! What the demo tests against the test broker share: its address, unique
//! names, an input topic filled with values, and child processes killed
//! with SIGKILL.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The test broker (`scripts/with-kafka` sets it).
pub fn brokers() -> String {
    std::env::var("KAFKA_TEST_BROKERS").unwrap_or_else(|_| {
        panic!("KAFKA_TEST_BROKERS is not set: run through scripts/with-kafka (./scripts/test-all does)")
    })
}

/// `what`, made unique to this run.
pub fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{what}-{}-{nanos}", std::process::id())
}

/// Writes the values `v<id>` for ids `from..to` into `topic` (created with
/// `partitions` partitions), keyed by id.
pub fn fill(topic: &str, partitions: u32, from: u64, to: u64) {
    fill_at(&brokers(), topic, partitions, from, to);
}

/// [`fill`], on the broker at `brokers`.
pub fn fill_at(brokers: &str, topic: &str, partitions: u32, from: u64, to: u64) {
    write_values(brokers, topic, partitions, from, to, None);
}

/// Writes the values `v<id>` for ids `from..to` into `only` of the
/// partitions of `topic` (which has `partitions`), in turn.
pub fn fill_partitions(topic: &str, partitions: u32, only: &[i32], from: u64, to: u64) {
    write_values(&brokers(), topic, partitions, from, to, Some(only));
}

/// The values `v<id>` for ids `from..to`, keyed by id, into `topic` (created
/// with `partitions` partitions if missing), each to its key's partition
/// or to `only`'s in turn.
fn write_values(
    brokers: &str,
    topic: &str,
    partitions: u32,
    from: u64,
    to: u64,
    only: Option<&[i32]>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut producer = sinks_kafka::IdempotentProducer::connect(brokers, topic, partitions)
            .await
            .unwrap();
        let records: Vec<sinks_kafka::KafkaRecord> = (from..to)
            .map(|id| {
                let record =
                    sinks_kafka::KafkaRecord::new(format!("v{id}")).with_key(id.to_string());
                match only {
                    Some(only) => record.with_partition(only[id as usize % only.len()]),
                    None => record,
                }
            })
            .collect();
        for chunk in records.chunks(2000) {
            producer.send_batch(chunk.to_vec()).await.unwrap();
        }
        producer.flush().await.unwrap();
    });
}

/// Writes `records` into `topic` (created with `partitions` partitions if
/// missing), with a plain idempotent producer.
pub fn write_records(topic: &str, partitions: u32, records: Vec<sinks_kafka::KafkaRecord>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut producer = sinks_kafka::IdempotentProducer::connect(&brokers(), topic, partitions)
            .await
            .unwrap();
        producer.send_batch(records).await.unwrap();
        producer.flush().await.unwrap();
    });
}

/// Every committed message of `topic`, as a `read_committed` consumer sees
/// it.
pub fn read_all(topic: &str) -> Vec<sinks_kafka::CommittedMessage> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(sinks_kafka::read_committed(&brokers(), topic))
        .unwrap()
        .messages
}

/// The id of a value `v<id>`.
pub fn value_id(value: &str) -> u64 {
    value
        .strip_prefix('v')
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("not a value of the input topic: {value:?}"))
}

/// Starts `command`, its output dropped.
pub fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// SIGKILL, and the wait for it.
pub fn kill(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The kill -9 loop of a demo reading `input` (4 partitions, 20 000 values
/// written first): four runs of `unbounded()`, each killed at a random
/// moment (from `seed`) while the input grows by 5 000 values, to 40 000.
pub fn kill_at_random(input: &str, seed: u64, unbounded: impl Fn() -> Command) {
    fill(input, 4, 0, 20_000);
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..4u64 {
        let run = spawn(unbounded());
        std::thread::sleep(Duration::from_millis(rng.u64(200..900)));
        fill(input, 4, 20_000 + round * 5_000, 25_000 + round * 5_000);
        std::thread::sleep(Duration::from_millis(rng.u64(100..1200)));
        kill(run);
    }
}

/// Two instances of one group reading `input` (6 partitions, 60 000
/// values written over the run): A (state `<dir>/a`) runs, B (`<dir>/b`)
/// joins and the partitions move, A is killed while both read and comes
/// back from its state; both must end well. Then a bounded run of the
/// group, on a state of its own (`<dir>/c`), drains the rest and must
/// finish. `demo(state, source_flags)` is an instance's command.
pub fn two_instances_one_killed_then_a_drain(
    input: &str,
    dir: &Path,
    demo: impl Fn(&Path, &[&str]) -> Command,
) {
    let unbounded = |state: &Path, run_for: &str| {
        demo(
            state,
            &["--source", "kafka-unbounded", "--run-for", run_for],
        )
    };
    fill(input, 6, 0, 20_000);
    let (a_state, b_state) = (dir.join("a"), dir.join("b"));
    let a = spawn(unbounded(&a_state, "60s"));
    std::thread::sleep(Duration::from_millis(1500));
    let b = spawn(unbounded(&b_state, "14s"));
    std::thread::sleep(Duration::from_millis(1500));
    fill(input, 6, 20_000, 40_000);
    // Killed while both read, A comes back from its state (the same static
    // member of the group) and runs out its --run-for.
    kill(a);
    fill(input, 6, 40_000, 50_000);
    let a = spawn(unbounded(&a_state, "6s"));
    std::thread::sleep(Duration::from_millis(2000));
    fill(input, 6, 50_000, 60_000);
    for mut run in [a, b] {
        assert!(run.wait().unwrap().success(), "an instance failed");
    }
    let drained = demo(&dir.join("c"), &["--source", "kafka"])
        .output()
        .unwrap();
    if std::env::var_os("DEMO_LOG").is_some() {
        eprintln!("{}", crate::output::text(&drained));
    }
    let json = crate::output::summary(&drained);
    assert_eq!(json["status"], "Finished", "{json}");
}

/// The ids of the values in the finished files under `out`, sorted,
/// duplicates kept.
pub fn finished_values(out: &Path) -> Vec<u64> {
    let mut values = Vec::new();
    for path in sinks_file::finished_files(out).expect("the output can be read") {
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            values.push(value_id(line));
        }
    }
    values.sort_unstable();
    values
}

/// The ids of the values in `topic`'s `read_committed` view on the broker
/// at `brokers`, sorted, duplicates kept.
pub fn committed_values_at(brokers: &str, topic: &str) -> Vec<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let read = runtime
        .block_on(sinks_kafka::read_committed(brokers, topic))
        .unwrap();
    let mut ids: Vec<u64> = read
        .messages
        .iter()
        .map(|m| value_id(std::str::from_utf8(m.value_bytes()).unwrap()))
        .collect();
    ids.sort_unstable();
    ids
}
