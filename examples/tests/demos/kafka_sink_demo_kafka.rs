//! The Kafka sink demo reading Kafka as a consumer group (`--source
//! kafka`), against the test broker (`scripts/with-kafka`): Kafka to Kafka,
//! the group's offsets committed in the output's transactions. A kill -9
//! loop, and two instances of one group, one killed and started again
//! while partitions move, then a bounded drain: every value of the input
//! once in the output's `read_committed` view.

use std::path::Path;
use std::process::Command;

use crate::kafka_topics::{
    brokers, committed_values_at, fill, fill_partitions, kill, kill_at_random, spawn,
    two_instances_one_killed_then_a_drain, unique,
};
use crate::output::{assert_each_once, summary};

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
        .env(
            "RUST_LOG",
            std::env::var("DEMO_LOG").unwrap_or_else(|_| "warn".into()),
        );
    command
}

/// The ids of the values in `topic`'s `read_committed` view, sorted,
/// duplicates kept.
fn committed_values(topic: &str) -> Vec<u64> {
    committed_values_at(&brokers(), topic)
}

#[test]
fn a_topic_copied_into_a_topic_and_killed_at_random_holds_every_value_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (input, output, group) = (unique("k2k-in"), unique("k2k-out"), unique("g"));
    kill_at_random(&input, 3535, || {
        let unbounded = ["--source", "kafka-unbounded", "--run-for", "60s"];
        demo(&input, &group, &output, &state, &unbounded)
    });
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
    two_instances_one_killed_then_a_drain(&input, dir.path(), |state, flags| {
        demo(&input, &group, &output, state, flags)
    });
    assert_eq!(committed_values(&output), (0..60_000).collect::<Vec<_>>());
}

/// Issue 52's short recipe: an unbounded run killed, values written to two
/// of the four partitions only, and at once a bounded run on the same state
/// and group. Its members rejoin as the killed run's static members and may
/// be dealt any assignment (noida-db deals one twice, or none); the run must
/// not end before the output holds every value of every partition.
#[test]
fn a_bounded_run_right_after_a_kill_ends_only_with_every_partition_in_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (input, output, group) = (unique("k2k-short-in"), unique("k2k-short-out"), unique("g"));
    fill(&input, 4, 0, 4_000);
    let unbounded = ["--source", "kafka-unbounded", "--run-for", "60s"];
    let run = spawn(demo(&input, &group, &output, &state, &unbounded));
    std::thread::sleep(std::time::Duration::from_millis(2500));
    kill(run);
    fill_partitions(&input, 4, &[0, 1], 4_000, 8_000);
    let done = demo(&input, &group, &output, &state, &["--source", "kafka"])
        .output()
        .unwrap();
    if std::env::var_os("DEMO_LOG").is_some() {
        eprintln!("{}", crate::output::text(&done));
    }
    let json = summary(&done);
    assert_eq!(json["status"], "Finished", "{json}");
    assert_each_once(&committed_values(&output), 8_000, "the output");
}
