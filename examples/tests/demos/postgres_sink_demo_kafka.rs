//! The PostgreSQL sink demo reading Kafka as a consumer group (`--source
//! kafka`, `--features postgres,kafka`), against the test broker and the
//! test server (`scripts/with-kafka`, `scripts/with-postgres`): two
//! instances of one group on one table, one killed and started again while
//! partitions move, then a bounded run of the group that drains the rest.
//! Every value of the topic once in the table: the partitions' positions
//! are committed in the rows' transactions. Each instance has its own job
//! name (one live instance of a name per database).

use std::path::Path;
use std::process::Command;

use crate::kafka_topics::{brokers, two_instances_one_killed_then_a_drain, unique, value_id};
use crate::postgres_sink_demo::url;

/// The demo reading `topic` as `group` into `table`, its checkpoints in
/// `state`; the job is named after its state's directory (an instance of
/// the group and its restarts).
fn demo(topic: &str, group: &str, table: &str, state: &Path, args: &[&str]) -> Command {
    let instance = state.file_name().unwrap().to_string_lossy();
    let mut command = Command::new(env!("CARGO_BIN_EXE_postgres-sink-demo"));
    command
        .args(["--url", &url(), "--table", table])
        .args(["--job", &format!("{table}-{instance}")])
        .args(["--brokers", &brokers(), "--topic", topic, "--group", group])
        .arg("--state-dir")
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

/// The ids of the values in `table`, sorted, duplicates kept.
fn table_values(table: &str) -> Vec<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
            .await
            .expect("connecting to the test server");
        tokio::spawn(connection);
        let rows = client
            .query(&format!("SELECT payload FROM {table}"), &[])
            .await
            .expect("the table reads");
        let mut values: Vec<u64> = rows
            .iter()
            .map(|row| value_id(row.get::<_, &str>(0)))
            .collect();
        values.sort_unstable();
        values
    })
}

#[test]
fn two_instances_of_one_group_on_one_table_one_killed_then_a_bounded_drain_write_every_value_once()
{
    let dir = tempfile::tempdir().unwrap();
    let (topic, group) = (unique("pg-group"), unique("g"));
    let table = unique("demo_kafka").replace('-', "_");
    two_instances_one_killed_then_a_drain(&topic, dir.path(), |state, flags| {
        demo(&topic, &group, &table, state, flags)
    });
    assert_eq!(table_values(&table), (0..60_000).collect::<Vec<_>>());
}
