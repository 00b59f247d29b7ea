//! The Delta sink demo reading Kafka as a consumer group (`--source kafka`,
//! `--features delta,kafka`), against the test broker
//! (`scripts/with-kafka`): two instances of one group on one table, one
//! killed and started again while partitions move, then a bounded run of
//! the group that drains the rest. Every value of the topic once in the
//! table: the partitions' positions are committed in the table with the
//! rows.

use std::path::Path;
use std::process::Command;

use crate::kafka_topics::{brokers, two_instances_one_killed_then_a_drain, unique, value_id};

/// The demo reading `topic` as `group` into the table `out`, its
/// checkpoints in `state`.
fn demo(topic: &str, group: &str, out: &Path, state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_delta-sink-demo"));
    command
        .args(["--brokers", &brokers(), "--topic", topic, "--group", group])
        .arg("--out")
        .arg(out)
        .arg("--state")
        .arg(state)
        .args([
            "--checkpoint-interval",
            "200ms",
            "--parallelism",
            "2",
            "--json",
        ])
        .args(args)
        .env("RUST_LOG", "warn");
    command
}

/// The ids of the values in the table at `out`, sorted, duplicates kept.
fn table_values(out: &Path) -> Vec<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let location = sinks_delta::TableLocation::local(out).unwrap();
    let payloads = runtime
        .block_on(sinks_delta::read::string_column(&location, "payload", None))
        .expect("the table reads");
    let mut values: Vec<u64> = payloads.iter().map(|value| value_id(value)).collect();
    values.sort_unstable();
    values
}

#[test]
fn two_instances_of_one_group_on_one_table_one_killed_then_a_bounded_drain_write_every_value_once()
{
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("table");
    let (topic, group) = (unique("delta-group"), unique("g"));
    two_instances_one_killed_then_a_drain(&topic, dir.path(), |state, flags| {
        demo(&topic, &group, &out, state, flags)
    });
    assert_eq!(table_values(&out), (0..60_000).collect::<Vec<_>>());
}
