//! The file sink demo reading Kafka as a consumer group (`--source kafka`,
//! `--features kafka`), against the test broker (`scripts/with-kafka`): a
//! kill -9 loop, and two instances of one group on one output directory,
//! one killed and started again while partitions move, then a bounded run
//! of the group that drains the rest. Every value of the topic once in the
//! finished files.

use std::path::Path;
use std::process::Command;

use crate::kafka_topics::{
    brokers, finished_values, kill_at_random, two_instances_one_killed_then_a_drain, unique,
};
use crate::output::summary;

/// The demo reading `topic` as `group` into `out`, its checkpoints in
/// `state`.
fn demo(topic: &str, group: &str, out: &Path, state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"));
    command
        .args(["--brokers", &brokers(), "--topic", topic, "--group", group])
        .arg("--out")
        .arg(out)
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

#[test]
fn a_topic_read_into_files_and_killed_at_random_writes_every_value_once() {
    let dir = tempfile::tempdir().unwrap();
    let (out, state) = (dir.path().join("out"), dir.path().join("state"));
    let (topic, group) = (unique("demo-source"), unique("g"));
    // Each run resumes from its state (and every split from the output's
    // positions).
    kill_at_random(&topic, 35, || {
        let unbounded = ["--source", "kafka-unbounded", "--run-for", "60s"];
        demo(&topic, &group, &out, &state, &unbounded)
    });
    // A bounded run ends at the topic's end as it starts.
    let output = demo(&topic, &group, &out, &state, &["--source", "kafka"])
        .output()
        .unwrap();
    let json = summary(&output);
    assert_eq!(json["status"], "Finished", "{json}");
    assert_eq!(finished_values(&out), (0..40_000).collect::<Vec<_>>());
}

#[test]
fn two_instances_of_one_group_on_one_output_one_killed_then_a_bounded_drain_write_every_value_once()
{
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (topic, group) = (unique("demo-group"), unique("g"));
    two_instances_one_killed_then_a_drain(&topic, dir.path(), |state, flags| {
        demo(&topic, &group, &out, state, flags)
    });
    assert_eq!(finished_values(&out), (0..60_000).collect::<Vec<_>>());
}

/// The end check counts what the output lacks, read back, whatever the job
/// reported: a finished file lost after a bounded run (deleted here, as a
/// disk or an operator could) fails the next run of the finished job,
/// naming how many records of the topic are missing.
#[test]
fn a_finished_file_lost_after_the_run_is_counted_by_the_end_check() {
    let dir = tempfile::tempdir().unwrap();
    let (out, state) = (dir.path().join("out"), dir.path().join("state"));
    let (topic, group) = (unique("demo-lost"), unique("g"));
    crate::kafka_topics::fill(&topic, 2, 0, 2_000);
    let bounded = ["--source", "kafka"];
    let first = demo(&topic, &group, &out, &state, &bounded)
        .output()
        .unwrap();
    assert_eq!(summary(&first)["status"], "Finished");
    let files = sinks_file::finished_files(&out).unwrap();
    let lost = std::fs::read_to_string(&files[0]).unwrap().lines().count();
    assert!(lost > 0);
    std::fs::remove_file(&files[0]).unwrap();
    let again = demo(&topic, &group, &out, &state, &bounded)
        .output()
        .unwrap();
    let text = crate::output::text(&again);
    assert!(!again.status.success(), "{text}");
    assert!(
        text.contains(&format!("lacks {lost} of the 2000 records of {topic}")),
        "{text}"
    );
}
