//! Instances of one consumer group across hosts, on one machine: three
//! instances of a Kafka-to-files job (`file-sink-demo --source
//! kafka-unbounded`) and of a Kafka-to-Kafka job (`kafka-sink-demo`), each
//! on a host of its own (a network namespace, `sink_testkit::hosts`), their
//! checkpoints on the S3-compatible server and the broker on the bridge.
//!
//! While the input grows, instance a's host is killed and a is started
//! again on another host from its `s3://` checkpoints (the same static
//! member of the group, so its partitions move there at once); instance b
//! is cut off from the network while it runs, started again elsewhere (its
//! partitions move to the new start, which fences the old), then
//! reconnected: the cut-off start must stop, fenced, without committing.
//! At the end a bounded run of the group drains the rest, and every value of
//! the input is in the output exactly once (the finished files; the
//! output topic's `read_committed` view).
//!
//! The broker (noida-db) never expires a member's session, so a member that
//! dies stays in the group until a start with its static id takes its
//! place: here, the start on another host. On Apache Kafka the session's
//! timeout would also hand its partitions to the other members (see
//! `docs/scale-out.md`).
//!
//! Needs root and `ip`, `scripts/with-s3` (`MOTO_SERVER`) and
//! `scripts/with-kafka` (`NOIDA_DB`); prints "skipped" without them.
//! `GROUPS_KEEP=1` keeps the programs' logs (the path is printed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sink_testkit::hosts::{start_kafka, start_s3, Host, Net, Process, TestDir};

use crate::kafka_topics::{committed_values_at, fill_at, finished_values, unique};
use crate::output::summary;

const BUCKET: &str = "groups";
const PARTITIONS: u32 = 6;

/// Which job the instances run.
enum Job {
    /// `file-sink-demo` into this directory.
    Files(PathBuf),
    /// `kafka-sink-demo` into this topic.
    Kafka(String),
}

/// The servers, the input and how to start an instance.
struct Group {
    dir: PathBuf,
    brokers: String,
    endpoint: String,
    input: String,
    group: String,
    job: Job,
}

impl Group {
    /// The program and its arguments for an instance whose checkpoints are
    /// under `state` in the bucket.
    fn command(&self, state: &str, source: &[&str]) -> (String, Vec<String>) {
        let mut args: Vec<String> = Vec::new();
        let program = match &self.job {
            Job::Files(out) => {
                args.extend(["--topic".into(), self.input.clone()]);
                args.extend(["--out".into(), out.display().to_string()]);
                env!("CARGO_BIN_EXE_file-sink-demo")
            }
            Job::Kafka(output) => {
                args.extend(["--input-topic".into(), self.input.clone()]);
                args.extend([
                    "--topic".into(),
                    output.clone(),
                    "--partitions".into(),
                    "3".into(),
                ]);
                env!("CARGO_BIN_EXE_kafka-sink-demo")
            }
        };
        args.extend(["--brokers".into(), self.brokers.clone()]);
        args.extend(["--group".into(), self.group.clone()]);
        args.extend(["--state".into(), format!("s3://{BUCKET}/{state}")]);
        args.extend(["--endpoint".into(), self.endpoint.clone()]);
        for arg in [
            "--checkpoint-interval",
            "200ms",
            "--parallelism",
            "2",
            "--json",
        ] {
            args.push(arg.into());
        }
        args.extend(source.iter().map(|s| s.to_string()));
        (program.to_string(), args)
    }

    /// Starts an instance on `host`, reading until `run_for` is over.
    fn start(&self, host: &Host, name: &str, state: &str, run_for: &str) -> Process {
        let source = ["--source", "kafka-unbounded", "--run-for", run_for];
        let (program, args) = self.command(state, &source);
        Process::start(Some(host), &self.dir, name, &program, &args)
    }

    fn fill(&self, from: u64, to: u64) {
        fill_at(&self.brokers, &self.input, PARTITIONS, from, to);
    }

    /// The ids of the values in the output, sorted, duplicates kept.
    fn output_values(&self) -> Vec<u64> {
        match &self.job {
            Job::Files(out) => finished_values(out),
            Job::Kafka(output) => committed_values_at(&self.brokers, output),
        }
    }
}

/// The scenario of the module's header, for `job` (given the test's
/// directory).
fn across_hosts(kind: &str, job: impl FnOnce(&Path) -> Job) {
    if std::env::var("MOTO_SERVER").is_err() || std::env::var("NOIDA_DB").is_err() {
        println!(
            "skipped: no S3-compatible server or Kafka broker to start (run under scripts/with-s3 \
             and scripts/with-kafka)"
        );
        return;
    }
    let Some((net, hosts)) = Net::with_hosts(&["a", "b", "c", "a2", "b2"]) else {
        return;
    };
    let dir = TestDir::new("GROUPS_KEEP");
    let (_s3, endpoint) = start_s3(&net, dir.path(), BUCKET).expect("MOTO_SERVER is set");
    let (_kafka, brokers) = start_kafka(&net, dir.path()).expect("NOIDA_DB is set");
    hosts["a"]
        .check_reach(&format!("{endpoint}/{BUCKET}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let group = Group {
        dir: dir.path().to_path_buf(),
        brokers,
        endpoint,
        input: unique(&format!("{kind}-in")),
        group: unique("g"),
        job: job(dir.path()),
    };

    group.fill(0, 20_000);
    let mut a = group.start(&hosts["a"], "a", "a", "60s");
    let mut b = group.start(&hosts["b"], "b", "b", "60s");
    let mut c = group.start(&hosts["c"], "c", "c", "45s");
    std::thread::sleep(Duration::from_secs(5));
    group.fill(20_000, 30_000);

    // 1. a's host dies; a starts again on another host from its
    //    checkpoints, and takes its partitions back.
    net.kill_host(&hosts["a"]);
    let _ = a.wait_for(Duration::from_secs(5));
    let mut a2 = group.start(&hosts["a2"], "a2", "a", "35s");
    std::thread::sleep(Duration::from_secs(4));
    group.fill(30_000, 40_000);

    // 2. b is cut off while it runs; b starts again elsewhere (its
    //    partitions move there); then the cut-off start is reconnected.
    net.link(&hosts["b"], false);
    let mut b2 = group.start(&hosts["b2"], "b2", "b", "30s");
    std::thread::sleep(Duration::from_secs(4));
    group.fill(40_000, 50_000);
    std::thread::sleep(Duration::from_secs(4));
    net.reconnect(&hosts["b"], &mut b);
    let zombie = b
        .wait_for(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("the reconnected start did not stop:\n{}", b.tail()));
    let zombie_log = b.stderr_text();
    assert!(
        !zombie.success() && zombie_log.to_lowercase().contains("fenced"),
        "the reconnected start must stop, fenced (it exited with {zombie}):\n{}",
        b.tail()
    );

    // 3. The instances run out their time and stop cleanly; a bounded run
    //    of the group (on the test's own host) drains what is left.
    for process in [&mut a2, &mut b2, &mut c] {
        process.ends_well(Duration::from_secs(120));
    }
    group.fill(50_000, 60_000);
    let (program, args) = group.command("drain", &["--source", "kafka"]);
    let drained = Command::new(program)
        .args(&args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the draining run starts");
    let json = summary(&drained);
    assert_eq!(json["status"], "Finished", "{json}");

    let values = group.output_values();
    let twice = values.windows(2).filter(|w| w[0] == w[1]).count();
    let mut distinct = values.clone();
    distinct.dedup();
    let missing = 60_000 - distinct.len();
    println!(
        "{kind} across hosts: {} values in the output, {missing} of 60000 missing, {twice} twice; \
         the cut-off start stopped fenced",
        values.len()
    );
    assert_eq!(values, (0..60_000).collect::<Vec<_>>());
}

#[test]
fn a_group_across_hosts_into_files_loses_a_host_and_a_cut_off_start_commits_nothing() {
    across_hosts("files", |dir| Job::Files(dir.join("out")));
}

#[test]
fn a_group_across_hosts_into_a_topic_loses_a_host_and_a_cut_off_start_commits_nothing() {
    across_hosts("k2k", |_| Job::Kafka(unique("k2k-out")));
}
