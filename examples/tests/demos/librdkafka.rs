//! The Kafka demos against librdkafka, an independent client
//! (`scripts/with-librdkafka`: confluent-kafka from PyPI): topics it writes
//! with each codec are copied by both demos, the sink's output with each
//! codec is read by it, keys land in the partitions its Java-compatible
//! partitioner picks, records of every shape it writes (keys, tombstones,
//! headers, timestamps) survive a copy as it reads them, and a member of it
//! in a demo's group is refused.
//! Every count is of records, each value once.

use std::path::Path;
use std::process::Command;

use crate::kafka_topics::{brokers, committed_values_at, finished_values, unique};
use crate::output::{assert_each_once, summary, text};

const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];

/// Runs the librdkafka client (`$LIBRDKAFKA_CLIENT`) with `args`; its JSON.
pub fn librdkafka(args: &[&str]) -> serde_json::Value {
    let client = std::env::var("LIBRDKAFKA_CLIENT").unwrap_or_else(|_| {
        panic!("LIBRDKAFKA_CLIENT is not set: run through scripts/with-librdkafka (./scripts/test-all does)")
    });
    let mut words = client.split_whitespace();
    let output = Command::new(words.next().expect("a command"))
        .args(words)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "librdkafka {args:?}: {}",
        text(&output)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The ids of the values librdkafka reads in `topic`, sorted.
fn read_by_librdkafka(topic: &str, value: impl Fn(&str) -> u64) -> Vec<u64> {
    let read = librdkafka(&["consume", &brokers(), topic]);
    let mut ids: Vec<u64> = read["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| value(r[2].as_str().expect("a value")))
        .collect();
    ids.sort_unstable();
    ids
}

/// A bounded run of the Kafka-to-Kafka demo copying `input` as `group`.
fn kafka_to_kafka(input: &str, group: &str, output: &str, state: &Path) -> Command {
    crate::kafka_sink_demo_kafka::demo(input, group, output, state, &["--source", "kafka"])
}

#[test]
fn topics_librdkafka_compressed_with_each_codec_are_copied_by_both_demos_every_value_once() {
    let dir = tempfile::tempdir().unwrap();
    for codec in CODECS {
        let input = unique(&format!("rdk-{codec}-in"));
        librdkafka(&["produce", &brokers(), &input, codec, "0", "3000", "4"]);
        let output = unique(&format!("rdk-{codec}-out"));
        let state = dir.path().join(format!("{codec}-k2k"));
        let done = kafka_to_kafka(&input, &unique("g"), &output, &state)
            .output()
            .unwrap();
        assert_eq!(summary(&done)["status"], "Finished", "{codec}");
        let copied = committed_values_at(&brokers(), &output);
        assert_each_once(&copied, 3000, &format!("{codec}, Kafka to Kafka"));
        let out = dir.path().join(format!("{codec}-files"));
        let done = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
            .args([
                "--brokers",
                &brokers(),
                "--topic",
                &input,
                "--group",
                &unique("g"),
            ])
            .args([
                "--source",
                "kafka",
                "--json",
                "--checkpoint-interval",
                "100ms",
            ])
            .arg("--out")
            .arg(&out)
            .arg("--state")
            .arg(dir.path().join(format!("{codec}-files-state")))
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_eq!(summary(&done)["status"], "Finished", "{codec}");
        assert_each_once(
            &finished_values(&out),
            3000,
            &format!("{codec}, into files"),
        );
    }
}

#[test]
fn the_sinks_output_with_each_codec_is_read_by_librdkafka_every_value_once() {
    let dir = tempfile::tempdir().unwrap();
    for codec in CODECS {
        let topic = unique(&format!("rdk-read-{codec}"));
        let config = dir.path().join(format!("{codec}.properties"));
        std::fs::write(&config, format!("compression.type={codec}\n")).unwrap();
        let done = Command::new(env!("CARGO_BIN_EXE_kafka-sink-demo"))
            .args([
                "--brokers",
                &brokers(),
                "--topic",
                &topic,
                "--records",
                "5000",
            ])
            .arg("--kafka-config")
            .arg(&config)
            .arg("--state")
            .arg(dir.path().join(codec))
            .args(["--parallelism", "2", "--json", "--fresh"])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_eq!(summary(&done)["status"], "Finished", "{codec}");
        let ids = read_by_librdkafka(&topic, |line| {
            line.split(',').next().unwrap().parse().unwrap()
        });
        assert_each_once(&ids, 5000, &format!("{codec}, read by librdkafka"));
    }
}

/// Keys, null values apart from empty ones, headers (empty and null ones
/// among them) and timestamps, as librdkafka writes them, survive a
/// Kafka-to-Kafka copy as librdkafka reads them back: each record once,
/// unchanged.
#[test]
fn keys_headers_null_values_and_timestamps_librdkafka_wrote_survive_a_copy_as_it_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (unique("rdk-shape-in"), unique("rdk-shape-out"));
    librdkafka(&["produce-shaped", &brokers(), &input, "0", "900", "4"]);
    let done = kafka_to_kafka(&input, &unique("g"), &output, &dir.path().join("state"))
        .output()
        .unwrap();
    assert_eq!(summary(&done)["status"], "Finished");
    // Each record as librdkafka reads it, without its partition (the copy
    // has partitions of its own): key, value, headers, timestamp.
    let records = |topic: &str| {
        let read = librdkafka(&["consume", &brokers(), topic, "--full"]);
        let mut records: Vec<serde_json::Value> = read["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| serde_json::Value::from(r.as_array().unwrap()[1..].to_vec()))
            .collect();
        records.sort_by_key(|r| r.to_string());
        records
    };
    let (written, copied) = (records(&input), records(&output));
    assert_eq!(written.len(), 900);
    let count =
        |test: &dyn Fn(&serde_json::Value) -> bool| written.iter().filter(|r| test(r)).count();
    assert_eq!(count(&|r| r[1].is_null()), 300, "tombstones written");
    assert_eq!(count(&|r| r[1] == ""), 300, "empty values written");
    assert_eq!(
        count(&|r| r[2].to_string().contains(r#"["null",null]"#)),
        300
    );
    assert_eq!(
        count(&|r| r[2].to_string().contains(r#"["empty",""]"#)),
        300
    );
    assert_eq!(copied.len(), written.len(), "records in the copy");
    let differing: Vec<_> = written
        .iter()
        .zip(&copied)
        .filter(|(w, c)| w != c)
        .take(3)
        .collect();
    assert!(differing.is_empty(), "written, copied: {differing:?}");
}

#[test]
fn librdkafka_and_the_sink_put_each_key_in_one_partition() {
    let topic = unique("rdk-keys");
    librdkafka(&["produce", &brokers(), &topic, "none", "0", "1000", "8"]);
    crate::kafka_topics::fill(&topic, 8, 0, 1000);
    let read = librdkafka(&["consume", &brokers(), &topic]);
    let mut partitions_of: std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> =
        Default::default();
    for record in read["records"].as_array().unwrap() {
        let key = record[1].as_str().expect("a key").to_string();
        partitions_of
            .entry(key)
            .or_default()
            .insert(record[0].as_i64().unwrap());
    }
    assert_eq!(partitions_of.len(), 1000);
    let split: Vec<_> = partitions_of.iter().filter(|(_, p)| p.len() > 1).collect();
    assert!(
        split.is_empty(),
        "keys in two partitions: {:?}",
        &split[..split.len().min(5)]
    );
    let used: std::collections::BTreeSet<i64> = partitions_of.values().flatten().copied().collect();
    assert_eq!(used.len(), 8, "1000 keys over 8 partitions use each");
}

#[test]
fn a_librdkafka_member_that_committed_offsets_in_the_group_is_refused_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output, group) = (
        unique("rdk-foreign-in"),
        unique("rdk-foreign-out"),
        unique("g"),
    );
    crate::kafka_topics::fill(&input, 4, 0, 4000);
    let committed = librdkafka(&["commit", &brokers(), &group, &input]);
    assert!(committed["read"].as_u64().unwrap() > 0, "{committed}");
    let done = kafka_to_kafka(&input, &group, &output, &dir.path().join("state"))
        .output()
        .unwrap();
    let said = text(&done);
    assert!(
        !done.status.success(),
        "a run took a foreign member's offsets: {said}"
    );
    assert!(
        said.contains("holds offsets this job did not commit"),
        "{said}"
    );
    assert!(said.contains(&group), "{said}");
    assert!(
        committed_values_at(&brokers(), &output).is_empty(),
        "records written where the run was refused"
    );
}

/// A librdkafka consumer that stays in a demo's group while a bounded run
/// of the demo reads it, committing what it reads: the run either refuses
/// loudly (offsets it did not commit) or ends with every value once,
/// whoever leads the group; never exit 0 short.
#[test]
fn a_librdkafka_member_in_the_group_during_a_run_never_ends_it_short() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output, group) = (
        unique("rdk-member-in"),
        unique("rdk-member-out"),
        unique("g"),
    );
    crate::kafka_topics::fill(&input, 4, 0, 8000);
    let client = std::env::var("LIBRDKAFKA_CLIENT").expect("LIBRDKAFKA_CLIENT");
    let mut words = client.split_whitespace();
    let mut member = Command::new(words.next().unwrap())
        .args(words)
        .args(["member", &brokers(), &group, &input, "12"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let done = kafka_to_kafka(&input, &group, &output, &dir.path().join("state"))
        .output()
        .unwrap();
    let _ = member.wait();
    let said = text(&done);
    if done.status.success() {
        println!("the run ended with every value once");
        assert_eq!(summary(&done)["status"], "Finished", "{said}");
        assert_each_once(
            &committed_values_at(&brokers(), &output),
            8000,
            "the output",
        );
    } else {
        println!("the run refused: {said}");
        assert!(
            said.contains(&group),
            "refused without naming the group: {said}"
        );
        assert!(
            said.contains("did not commit") || said.contains("cannot end"),
            "refused without the cause: {said}"
        );
    }
}
