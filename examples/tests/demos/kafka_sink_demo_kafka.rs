//! The Kafka sink demo reading Kafka as a consumer group (`--source
//! kafka`), against the test broker (`scripts/with-kafka`): Kafka to Kafka,
//! the group's offsets committed in the output's transactions. A kill -9
//! loop, and two instances of one group, one killed and started again
//! while partitions move, then a bounded drain: every value of the input
//! once in the output's `read_committed` view.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::kafka_topics::{brokers, fill, kill, spawn, unique, value_id};
use crate::output::summary;

/// The demo copying `input` as `group` into `output`, its checkpoints in
/// `state`.
fn demo(input: &str, group: &str, output: &str, state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kafka-sink-demo"));
    command
        .args(["--brokers", &brokers(), "--topic", output])
        .args(["--input-topic", input, "--group", group])
        .args(["--partitions", "3"])
        .arg("--state")
        .arg(state)
        .args([
            "--checkpoint-interval",
            "100ms",
            "--parallelism",
            "2",
            "--json",
        ])
        .args(args)
        .env("RUST_LOG", "warn");
    command
}

/// The ids of the values in `topic`'s `read_committed` view, sorted,
/// duplicates kept.
fn committed_values(topic: &str) -> Vec<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let read = runtime
        .block_on(sinks_kafka::read_committed(&brokers(), topic))
        .unwrap();
    let mut ids: Vec<u64> = read
        .messages
        .iter()
        .map(|m| value_id(std::str::from_utf8(&m.value).unwrap()))
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn a_topic_copied_into_a_topic_and_killed_at_random_holds_every_value_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (input, output, group) = (unique("k2k-in"), unique("k2k-out"), unique("g"));
    fill(&input, 4, 0, 20_000);
    let mut rng = fastrand::Rng::with_seed(3535);
    let unbounded = ["--source", "kafka-unbounded", "--run-for", "60s"];
    for round in 0..4u64 {
        let run = spawn(demo(&input, &group, &output, &state, &unbounded));
        std::thread::sleep(Duration::from_millis(rng.u64(300..900)));
        fill(&input, 4, 20_000 + round * 5_000, 25_000 + round * 5_000);
        std::thread::sleep(Duration::from_millis(rng.u64(100..1200)));
        kill(run);
    }
    let done = demo(&input, &group, &output, &state, &["--source", "kafka"])
        .output()
        .unwrap();
    let json = summary(&done);
    assert_eq!(json["status"], "Finished", "{json}");
    assert_eq!(committed_values(&output), (0..40_000).collect::<Vec<_>>());
}

#[test]
fn two_instances_of_one_group_copying_a_topic_one_killed_then_a_bounded_drain_hold_every_value_once(
) {
    let dir = tempfile::tempdir().unwrap();
    let (input, output, group) = (unique("k2k-group-in"), unique("k2k-group-out"), unique("g"));
    fill(&input, 6, 0, 20_000);
    let unbounded = |run_for: &'static str| ["--source", "kafka-unbounded", "--run-for", run_for];
    let a_state = dir.path().join("a");
    let a = spawn(demo(&input, &group, &output, &a_state, &unbounded("60s")));
    std::thread::sleep(Duration::from_millis(1500));
    // B joins: the partitions move between them.
    let b = spawn(demo(
        &input,
        &group,
        &output,
        &dir.path().join("b"),
        &unbounded("14s"),
    ));
    std::thread::sleep(Duration::from_millis(1500));
    fill(&input, 6, 20_000, 40_000);
    // A is killed while both read; it comes back from its state (the same
    // static member of the group) and runs out its --run-for.
    kill(a);
    fill(&input, 6, 40_000, 50_000);
    let a = spawn(demo(&input, &group, &output, &a_state, &unbounded("6s")));
    std::thread::sleep(Duration::from_millis(2000));
    fill(&input, 6, 50_000, 60_000);
    for mut run in [a, b] {
        assert!(run.wait().unwrap().success(), "an instance failed");
    }
    // A bounded run of the group, on a state of its own, drains the rest.
    let done = demo(
        &input,
        &group,
        &output,
        &dir.path().join("c"),
        &["--source", "kafka"],
    )
    .output()
    .unwrap();
    let json = summary(&done);
    assert_eq!(json["status"], "Finished", "{json}");
    assert_eq!(committed_values(&output), (0..60_000).collect::<Vec<_>>());
}
