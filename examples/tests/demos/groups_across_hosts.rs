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
//! A host lost for good (issue 53): two instances, one on a host cut off
//! from the network for good, its checkpoints on that host (local). Its
//! static members stay in the group and hold every rebalance, so a bounded
//! drain of the group on fresh checkpoints cannot be dealt partitions: it
//! must end with every value once, or fail within its group-wait bound
//! with the error that names the group, its state, the lost host's members
//! and what to do; never hang. Into files, the test then does what the
//! error says (removes the lost host's static members) and a second drain
//! writes every value once. (Into a topic it stops at the error: the lost
//! instance's open transaction holds the output's `read_committed` end on
//! a broker without transaction timeouts, until a start of that instance
//! aborts it.)
//!
//! Needs root and `ip`, `scripts/with-s3` (`MOTO_SERVER`) and
//! `scripts/with-kafka` (`NOIDA_DB`); prints "skipped" without them.
//! `GROUPS_KEEP=1` keeps the programs' logs (the path is printed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sink_testkit::hosts::{start_kafka, start_s3, Host, Net, Process, TestDir};

use crate::kafka_topics::{committed_values_at, fill_at, finished_values, unique};
use crate::output::{assert_each_once, summary};

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
    /// The S3-compatible server holding the checkpoints; `None`: each
    /// instance's checkpoints in a directory of its own (on its host).
    endpoint: Option<String>,
    partitions: u32,
    input: String,
    group: String,
    job: Job,
}

impl Group {
    /// The program and its arguments for an instance whose checkpoints are
    /// under `state` (in the bucket, or in the test's directory).
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
        match &self.endpoint {
            Some(endpoint) => {
                args.extend(["--state".into(), format!("s3://{BUCKET}/{state}")]);
                args.extend(["--endpoint".into(), endpoint.clone()]);
            }
            None => {
                let local = self.dir.join("state").join(state);
                args.extend(["--state".into(), local.display().to_string()]);
            }
        }
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
        fill_at(&self.brokers, &self.input, self.partitions, from, to);
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
        endpoint: Some(endpoint),
        partitions: PARTITIONS,
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

/// The bound the drains below are given (`--group-wait-timeout`), and
/// what a start may add to it: `docs/kafka-source.md`, "Waiting on the
/// group".
const DRAIN_BOUND: Duration = Duration::from_secs(10);
const START_MARGIN: Duration = Duration::from_secs(30);

/// The lost host's scenario of the module's header, for `job`.
fn lost_host(kind: &str, job: impl FnOnce(&Path) -> Job, then_remove: bool) {
    if std::env::var("NOIDA_DB").is_err() {
        println!("skipped: no Kafka broker to start (run under scripts/with-kafka)");
        return;
    }
    let Some((net, hosts)) = Net::with_hosts(&["a", "b"]) else {
        return;
    };
    let dir = TestDir::new("GROUPS_KEEP");
    let (_kafka, brokers) = start_kafka(&net, dir.path()).expect("NOIDA_DB is set");
    let group = Group {
        dir: dir.path().to_path_buf(),
        brokers,
        endpoint: None,
        partitions: 4,
        input: unique(&format!("{kind}-lost-in")),
        group: unique("g"),
        job: job(dir.path()),
    };
    group.fill(0, 20_000);
    let mut a = group.start(&hosts["a"], "a", "a", "12s");
    let mut b = group.start(&hosts["b"], "b", "b", "15s");
    std::thread::sleep(Duration::from_secs(4));
    // a's host is cut off for good; its process runs on.
    net.link(&hosts["a"], false);
    group.fill(20_000, 30_000);
    b.ends_well(Duration::from_secs(120));
    if a.wait_for(Duration::from_secs(60)).is_none() {
        a.terminate();
    }

    // A bounded drain on fresh checkpoints: it ends, or fails naming the
    // group, within the bound.
    let drain = |name: &str| {
        let bound = format!("{}s", DRAIN_BOUND.as_secs());
        let source = ["--source", "kafka", "--group-wait-timeout", bound.as_str()];
        let (program, args) = group.command(name, &source);
        let started = Instant::now();
        let output = Command::new(program)
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("the draining run starts");
        (output, started.elapsed())
    };
    let (first, took) = drain("drain");
    let stderr = String::from_utf8_lossy(&first.stderr).into_owned();
    assert!(
        took < DRAIN_BOUND + START_MARGIN,
        "the drain took {took:?}, over its bound:\n{stderr}"
    );
    if first.status.success() {
        let json = summary(&first);
        assert_eq!(json["status"], "Finished", "{json}");
        println!("{kind}, a host lost: the drain ended in {took:?}");
        assert_each_once(&group.output_values(), 30_000, kind);
        return;
    }
    let error = stderr
        .lines()
        .find(|line| line.contains("did not deal this member"))
        .unwrap_or_default();
    println!(
        "{kind}, a host lost: the drain failed in {took:?} ({}): {error}",
        first.status
    );
    for part in [
        format!(
            "the consumer group {} did not deal this member its partitions within",
            group.group
        ),
        format!("host /{}", hosts["a"].ip),
        "removeMembersFromConsumerGroup".to_string(),
    ] {
        assert!(
            stderr.contains(&part),
            "{part:?} not in the drain's error:\n{stderr}"
        );
    }
    if !then_remove {
        return;
    }

    // What the error says to do: remove the lost host's static members;
    // the drain, run again, ends with every value once.
    let lost = remove_members_of_host(&group.brokers, &group.group, &hosts["a"].ip);
    assert_eq!(
        lost, 2,
        "the lost host's instance had one member per subtask"
    );
    let (second, took) = drain("drain");
    let json = summary(&second);
    assert_eq!(json["status"], "Finished", "{json}");
    assert!(json["group_wait_ms"].is_u64(), "{json}");
    println!("{kind}, a host lost: its {lost} members removed, the drain ended in {took:?}");
    assert_each_once(&group.output_values(), 30_000, kind);
}

/// Removes the static members of `group` that connected from `ip`, as an
/// operator does for a host lost for good; how many there were.
fn remove_members_of_host(brokers: &str, group: &str, ip: &str) -> usize {
    use sink_kafka_client::group::{describe_group, remove_static_members};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let cluster = sink_kafka_client::Brokers::from(brokers).cluster("operator");
        let described = describe_group(&cluster, group)
            .await
            .expect("the group is described");
        let lost: Vec<String> = described
            .members
            .iter()
            .filter(|m| m.client_host.trim_start_matches('/') == ip)
            .filter_map(|m| m.instance_id.clone())
            .collect();
        remove_static_members(&cluster, group, &lost)
            .await
            .unwrap_or_else(|e| panic!("removing {lost:?} from {group}: {e}"));
        lost.len()
    })
}

#[test]
fn a_drain_of_files_beside_a_host_cut_off_for_good_ends_or_fails_naming_it_within_its_bound() {
    lost_host("files", |dir| Job::Files(dir.join("out")), true);
}

#[test]
fn a_drain_into_a_topic_beside_a_host_cut_off_for_good_ends_or_fails_naming_it_within_its_bound() {
    lost_host("k2k", |_| Job::Kafka(unique("k2k-lost-out")), false);
}
