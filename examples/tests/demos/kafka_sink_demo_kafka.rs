//! The Kafka sink demo reading Kafka as a consumer group (`--source
//! kafka`), against the test broker (`scripts/with-kafka`): Kafka to Kafka,
//! the group's offsets committed in the output's transactions. A kill -9
//! loop, and two instances of one group, one killed and started again
//! while partitions move, then a bounded drain: every value of the input
//! once in the output's `read_committed` view.

use std::path::Path;
use std::process::Command;

use crate::kafka_topics::{
    brokers, committed_values_at, fill, fill_partitions, kill, kill_at_random, read_all, spawn,
    two_instances_one_killed_then_a_drain, unique, write_records,
};
use crate::output::{assert_each_once, summary};

/// The demo copying `input` as `group` into `output`, its checkpoints in
/// `state`.
pub fn demo(input: &str, group: &str, output: &str, state: &Path, args: &[&str]) -> Command {
    demo_at(&brokers(), input, group, output, state, args)
}

/// [`demo`], reaching the cluster through `brokers`. Its log level is
/// `warn`, or `$DEMO_LOG` when set (`DEMO_LOG=info` also prints the log of
/// the bounded runs that the tests read), for looking into a failure.
fn demo_at(
    brokers: &str,
    input: &str,
    group: &str,
    output: &str,
    state: &Path,
    args: &[&str],
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kafka-sink-demo"));
    command
        .args(["--brokers", brokers, "--topic", output])
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

/// Keys, values, tombstones (null, apart from empty values), headers and
/// timestamps survive a copy: the input written with all of them, copied
/// by a bounded run, and the output read back holds each record once as it
/// was (the demo's own check compares them too, and fails the run if not).
#[test]
fn keys_headers_tombstones_and_timestamps_survive_a_copy() {
    use sinks_kafka::KafkaRecord;
    let dir = tempfile::tempdir().unwrap();
    let (input, output, group) = (unique("k2k-shape-in"), unique("k2k-shape-out"), unique("g"));
    // Timestamps of the last ten minutes: older ones fall to the broker's
    // retention (7 days) as soon as they are written.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let records: Vec<KafkaRecord> = (0..600i64)
        .map(|i| {
            let record = match i % 3 {
                0 => KafkaRecord::tombstone(),
                1 => KafkaRecord::new(Vec::new()),
                _ => KafkaRecord::new(format!("v{i}")),
            };
            let record = record
                .with_key(format!("k{}", i % 50))
                .with_timestamp(now - 600_000 + i * 1000)
                .with_header("trace", Some(format!("t{i}")));
            match i % 4 {
                0 => record.with_header("empty", Some(Vec::new())),
                1 => record.with_header("null", None::<Vec<u8>>),
                _ => record,
            }
        })
        .collect();
    write_records(&input, 4, records);
    let done = demo(
        &input,
        &group,
        &output,
        &dir.path().join("state"),
        &["--source", "kafka"],
    )
    .output()
    .unwrap();
    let json = summary(&done);
    assert_eq!(json["status"], "Finished", "{json}");
    let shape = |topic: &str| {
        let mut all: Vec<_> = read_all(topic)
            .into_iter()
            .map(|m| (m.key, m.value, m.headers, m.timestamp))
            .collect();
        all.sort();
        all
    };
    let (copied, original) = (shape(&output), shape(&input));
    assert_eq!(copied.len(), 600);
    assert_eq!(copied, original);
    let tombstones = copied.iter().filter(|m| m.1.is_none()).count();
    let empty = copied
        .iter()
        .filter(|m| m.1.as_deref() == Some(&[][..]))
        .count();
    assert_eq!((tombstones, empty), (200, 200));
}

/// The kill loop over SASL_SSL (SCRAM-SHA-512): the demo reaches the
/// broker only through a proxy that enforces TLS and SASL
/// (`sink_kafka_client::proxy`, in this test's process), with its
/// settings in a client properties file (`--kafka-config`).
#[test]
fn over_sasl_ssl_a_topic_copied_into_a_topic_and_killed_at_random_holds_every_value_once() {
    use sink_kafka_client::proxy::AuthProxy;
    use sink_kafka_client::test_certificates::TestCertificates;
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::new();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &certificates.ca_pem).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let proxy = runtime
        .block_on(AuthProxy::start(certificates.sasl_ssl_proxy(
            brokers(),
            sink_kafka_client::SaslMechanism::ScramSha512,
            "demo",
            "pa55-w0rd",
        )))
        .unwrap();
    let config = dir.path().join("client.properties");
    std::fs::write(
        &config,
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=demo\n\
             sasl.password=pa55-w0rd\nssl.ca.location={}\n",
            ca_file.display()
        ),
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();
    let state = dir.path().join("state");
    let (input, output, group) = (unique("k2k-tls-in"), unique("k2k-tls-out"), unique("g"));
    let secured = |args: &[&str]| {
        let mut all = vec!["--kafka-config", &config];
        all.extend_from_slice(args);
        demo_at(proxy.address(), &input, &group, &output, &state, &all)
    };
    kill_at_random(&input, 5252, || {
        secured(&["--source", "kafka-unbounded", "--run-for", "60s"])
    });
    let done = secured(&["--source", "kafka"]).output().unwrap();
    let json = summary(&done);
    assert_eq!(json["status"], "Finished", "{json}");
    assert_each_once(&committed_values(&output), 40_000, "the output");
    drop(proxy);
}
