//! The file sink demo, run as a user would run it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::output::{summary, text};

fn demo(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("the demo runs")
}

/// The ids in the finished files, sorted.
fn finished_ids(dir: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    for path in sinks_file::finished_files(dir).expect("the output can be read") {
        let content = std::fs::read_to_string(&path).unwrap();
        for line in content.lines() {
            assert_eq!(line.len(), 100, "a complete record: {line:?}");
            ids.push(line[..20].parse().expect("an id of 20 digits"));
        }
    }
    ids.sort_unstable();
    ids
}

#[test]
fn the_three_presets_give_the_write_ups_table() {
    let dir = tempfile::tempdir().unwrap();

    let unbounded = summary(&demo(
        &dir.path().join("a"),
        &["--preset", "unbounded", "--run-for", "3s", "--json"],
    ));
    assert_eq!(unbounded["written"], 160);
    assert_eq!(unbounded["committed"], 160, "{unbounded}");
    assert!(
        unbounded["prepare_commit_calls"].as_u64().unwrap() >= 4,
        "{unbounded}"
    );
    assert_eq!(
        finished_ids(&dir.path().join("a")),
        (0..160).collect::<Vec<_>>()
    );

    let refused = demo(
        &dir.path().join("b"),
        &["--preset", "unbounded-nockpt", "--run-for", "1s"],
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("Enable checkpointing"),
        "{}",
        text(&refused)
    );

    let forced = summary(&demo(
        &dir.path().join("c"),
        &[
            "--preset",
            "unbounded-nockpt",
            "--allow-uncommitted",
            "--run-for",
            "2s",
            "--json",
        ],
    ));
    assert_eq!(forced["written"], 160);
    assert_eq!(forced["committed"], 0);
    assert_eq!(forced["prepare_commit_calls"], 0);
    assert_eq!(forced["finished_files"], 0);

    let nockpt = summary(&demo(
        &dir.path().join("d"),
        &["--preset", "nockpt", "--json"],
    ));
    assert_eq!(nockpt["committed"], 160);
    assert_eq!(nockpt["prepare_commit_calls"], 2);
    assert_eq!(
        finished_ids(&dir.path().join("d")),
        (0..160).collect::<Vec<_>>()
    );
    for field in [
        "mode",
        "records",
        "parallelism",
        "written",
        "committed",
        "prepare_commit_calls",
        "commit_calls",
        "checkpoints_completed",
        "finished_files",
        "wall_s",
        "records_per_s",
    ] {
        assert!(!nockpt[field].is_null(), "{field} missing: {nockpt}");
    }
}

#[test]
fn with_no_flags_it_prints_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let output = demo(dir.path(), &[]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    let row = |mode: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{mode} ")))
            .unwrap_or_else(|| panic!("no row {mode}: {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let numbers = |cells: Vec<String>| cells[cells.len() - 4..cells.len() - 1].to_vec();
    assert_eq!(numbers(row("unbounded"))[..2], ["160", "160"]);
    assert_eq!(numbers(row("unbounded-nockpt")), ["-", "refused", "-"]);
    assert_eq!(numbers(row("nockpt")), ["160", "160", "2"]);
    let forced = out
        .lines()
        .find(|l| l.contains("(forced)"))
        .expect("the forced row");
    assert!(
        forced
            .split_whitespace()
            .rev()
            .skip(1)
            .take(3)
            .all(|c| c == "0" || c == "160"),
        "{forced}"
    );
    assert!(out.contains("refused at build time"));
}

/// SIGKILL at random moments, then the same command again until it ends:
/// every id exactly once in the finished files. A finished job is not run
/// again; --fresh starts over.
#[test]
fn killed_and_resumed_it_writes_every_record_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = [
        "--records",
        "300000",
        "--rate",
        "60000",
        "--checkpoint-interval",
        "100ms",
        "--json",
    ];
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    for attempt in 0..20 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
            .arg("--out")
            .arg(&out)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts");
        if attempt < 4 {
            std::thread::sleep(Duration::from_millis(rng.u64(200..1_500)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let output = child.wait_with_output().unwrap();
        let report = summary(&output);
        // A kill can land after the job finished (its FINISHED marker
        // written) but before the process exited: then this run finds the
        // job already finished, which is right.
        let finished_before = kills > 0 && report["status"] == "AlreadyFinished";
        assert!(
            report["status"] == "Finished" || finished_before,
            "seed {seed}: {report}"
        );
        break;
    }
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");
    let ids = finished_ids(&out);
    assert_eq!(ids.len(), 300_000, "seed {seed}: {kills} kills");
    assert!(
        ids.iter().enumerate().all(|(i, &id)| i as u64 == id),
        "seed {seed}: not each id once"
    );

    let files_before = std::fs::read_dir(&out).unwrap().count();
    let again = summary(&demo(&out, &args));
    assert_eq!(again["status"], "AlreadyFinished");
    assert_eq!(again["written"], 0);
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        files_before,
        "nothing written"
    );

    let fresh = summary(&demo(&out, &["--records", "1000", "--fresh", "--json"]));
    assert_eq!(fresh["status"], "Finished");
    assert_eq!(finished_ids(&out), (0..1000).collect::<Vec<_>>());
}

#[test]
fn the_timeline_shows_written_committed_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("timeline.svg");
    let report = summary(&demo(
        &dir.path().join("out"),
        &[
            "--records",
            "60000",
            "--rate",
            "20000",
            "--checkpoint-interval",
            "300ms",
            "--json",
            "--timeline",
            svg.to_str().unwrap(),
        ],
    ));
    assert_eq!(report["committed"], 60_000);
    let svg = std::fs::read_to_string(&svg).expect("the timeline was written");
    assert!(svg.starts_with("<svg"));
    assert!(svg.contains("class=\"written\"") && svg.contains("class=\"committed\""));
    let marks = svg.matches("class=\"checkpoint\"").count() as u64;
    assert!(
        marks >= 3 && marks <= report["checkpoints_completed"].as_u64().unwrap(),
        "{marks} marks: {report}"
    );
}

/// A demo long enough to be killed in the middle: 300 000 records at
/// 60 000 per second and subtask, a checkpoint every 100 ms.
const LONG_RUN: [&str; 7] = [
    "--records",
    "300000",
    "--rate",
    "60000",
    "--checkpoint-interval",
    "100ms",
    "--json",
];

/// Runs the demo with the runtime's and the sink's warnings on stderr.
fn demo_logging(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(out)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the demo runs")
}

/// Starts [`LONG_RUN`] on `out` and kills it with SIGKILL once it stored a
/// few checkpoints (each holding committables of its own), before it ends.
fn killed_midway(out: &Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(out)
        .args(LONG_RUN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo starts");
    let state = out.join(".state");
    let started = std::time::Instant::now();
    loop {
        let checkpoints = std::fs::read_dir(&state)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
                    .count()
            })
            .unwrap_or(0);
        if checkpoints >= 2 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the demo ended before it could be killed"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "no checkpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(fastrand::u64(0..300)));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the demo ended before it could be killed"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let committed = finished_ids(out).len();
    assert!(committed < 300_000, "killed in the middle: {committed}");
}

/// Every file under `dir`, hidden ones too, with its size.
fn listing(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                found.push((entry.path(), entry.metadata().unwrap().len()));
            }
        }
    }
    found.sort();
    found
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp runs");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

fn assert_each_id_once(out: &Path, count: u64) {
    let ids = finished_ids(out);
    assert_eq!(ids.len() as u64, count, "{}", out.display());
    assert!(
        ids.iter().enumerate().all(|(i, &id)| i as u64 == id),
        "not each id once in {}",
        out.display()
    );
}

/// `--fresh` takes the state directory's lock before it deletes anything:
/// while another instance holds it, `--fresh` is refused and the output is
/// untouched. Once free, `--fresh` starts over, and the generation goes on
/// growing (committable ids never repeat across runs).
#[test]
fn fresh_is_refused_while_another_instance_holds_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let first = summary(&demo(&out, &["--records", "1000", "--json"]));
    assert_eq!(first["status"], "Finished");
    let before = listing(&out);
    let generation = |out: &Path| {
        sink_runtime::LocalCheckpointStorage::inspect(out.join(".state"))
            .expect("a state directory")
            .generation
            .expect("a generation")
            .0
    };
    let first_generation = generation(&out);

    let running = sink_runtime::LocalCheckpointStorage::open(out.join(".state"))
        .expect("the test holds the lock, as a running instance would");
    let refused = demo(&out, &["--records", "10", "--fresh", "--json"]);
    let message = text(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(
        message.contains("--fresh") && message.contains("in use by another running instance"),
        "{message}"
    );
    drop(running);
    assert_eq!(listing(&out), before, "nothing deleted");
    assert_each_id_once(&out, 1000);

    let fresh = summary(&demo(&out, &["--records", "10", "--fresh", "--json"]));
    assert_eq!(fresh["status"], "Finished");
    assert_each_id_once(&out, 10);
    assert!(
        generation(&out) > first_generation,
        "generations never repeat after --fresh"
    );
}

/// The state never lies where readers take it for output: the output and
/// the state at one location (however spelled), the state inside the output
/// under a visible name, and the output inside the state are refused before
/// anything is written, naming the fix; on S3 too, before any request.
#[test]
fn output_and_state_at_one_location_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("same");
    for (state, expected) in [
        (out.clone(), "one location"),
        (dir.path().join("./same/."), "one location"),
        (out.join("state"), "starting with a dot"),
        (dir.path().to_path_buf(), "inside the state"),
    ] {
        let refused = demo(
            &out,
            &[
                "--state",
                &state.display().to_string(),
                "--records",
                "1000",
                "--json",
            ],
        );
        let message = text(&refused);
        assert!(!refused.status.success(), "{}: {message}", state.display());
        assert!(message.contains(expected), "{message}");
        assert!(message.contains("--state"), "the fix is named: {message}");
        assert!(!out.exists(), "nothing written for {}", state.display());
    }
    // No server listens at this endpoint: the refusal comes first.
    let refused = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .args(["--out", "s3://bucket/same", "--state", "s3://bucket//same/"])
        .args(["--endpoint", "http://127.0.0.1:9", "--records", "10"])
        .output()
        .expect("the demo runs");
    let message = text(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains("one location"), "{message}");
}

/// `--fresh` keeps the state directory however the two paths are spelled:
/// `--out ./fr --state fr/.state` after a run with `--out fr` deletes the
/// output, keeps the lock, the generation and the state directory, and the
/// new run's generation is higher (names never repeat).
#[test]
fn fresh_keeps_the_state_directory_whatever_its_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fr");
    let first = summary(&demo(&out, &["--records", "1000", "--json"]));
    assert_eq!(first["status"], "Finished");
    let generation = || {
        sink_runtime::LocalCheckpointStorage::inspect(out.join(".state"))
            .expect("a state directory")
            .generation
            .expect("a generation")
            .0
    };
    let first_generation = generation();

    // The same two directories, spelled through a symbolic link and `.`.
    let alias = dir.path().join("alias");
    std::os::unix::fs::symlink(&out, &alias).unwrap();
    let fresh = demo(
        &alias.join("."),
        &[
            "--state",
            &out.join("../fr/.state").display().to_string(),
            "--records",
            "1000",
            "--fresh",
            "--json",
        ],
    );
    let report = summary(&fresh);
    assert_eq!(report["status"], "Finished", "{}", text(&fresh));
    assert_each_id_once(&out, 1000);
    assert!(
        generation() > first_generation,
        "the generation was kept and grew"
    );
}

/// The hidden part files (in progress or pending) in `out`, its state
/// directory apart.
/// Read while a job may be writing: a missing directory or a file renamed
/// meanwhile is passed over.
fn hidden_parts(out: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![out.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() && name != ".state" => stack.push(entry.path()),
                Ok(kind)
                    if kind.is_file() && name.starts_with('.') && name.contains(".inprogress.") =>
                {
                    found.push(entry.path())
                }
                _ => {}
            }
        }
    }
    found
}

/// Killed before its first checkpoint, with parts written: the next start
/// restores nothing, but continues the lineage the state directory keeps,
/// so it finds and removes those parts (a new lineage would leave them for
/// good).
#[test]
fn a_job_killed_before_its_first_checkpoint_leaves_no_part_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(&out)
        .args(["--records", "300000", "--rate", "60000"])
        .args(["--checkpoint-interval", "1h", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the demo starts");
    let started = std::time::Instant::now();
    while hidden_parts(&out).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the demo ended before it could be killed"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no part written"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap(); // SIGKILL, long before the first checkpoint
    child.wait().unwrap();
    let left = hidden_parts(&out);
    assert!(!left.is_empty());

    let report = summary(&demo(&out, &["--records", "1000", "--json"]));
    assert_eq!(report["status"], "Finished", "{report}");
    assert_each_id_once(&out, 1000);
    let still = hidden_parts(&out);
    assert!(
        still.is_empty(),
        "the killed start's parts are left: {still:?} (of {left:?})"
    );
}

/// Killed while its checkpoints hold committables, moved with `mv`, resumed
/// with the new `--out`: every id exactly once, and nothing refers to the
/// old place.
#[test]
fn a_killed_job_whose_output_directory_was_moved_resumes_there_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (first, moved) = (dir.path().join("first"), dir.path().join("moved"));
    killed_midway(&first);
    std::fs::rename(&first, &moved).unwrap();

    let output = demo_logging(&moved, &LONG_RUN);
    let report = summary(&output);
    assert_eq!(report["status"], "Finished", "{report}");
    let log = text(&output);
    assert!(
        !log.contains(&first.display().to_string()),
        "nothing may refer to the old place: {log}"
    );
    assert_each_id_once(&moved, 300_000);
    assert!(!first.exists(), "nothing recreated in the old place");
}

/// Killed, copied with `cp -a`, resumed on the copy: every id exactly once
/// in the copy, and the original is not touched.
#[test]
fn a_killed_job_whose_output_directory_was_copied_resumes_in_the_copy_only() {
    let dir = tempfile::tempdir().unwrap();
    let (original, copy) = (dir.path().join("original"), dir.path().join("copy"));
    killed_midway(&original);
    copy_dir(&original, &copy);
    let before = listing(&original);

    let output = demo_logging(&copy, &LONG_RUN);
    let report = summary(&output);
    assert_eq!(report["status"], "Finished", "{report}");
    let log = text(&output);
    assert!(
        !log.contains(&original.display().to_string()),
        "nothing may refer to the original: {log}"
    );
    assert_each_id_once(&copy, 300_000);
    assert_eq!(listing(&original), before, "the original is not touched");
}

/// The state directory of one job put into another job's output directory:
/// refused with both directories named, and nothing written.
#[test]
fn a_state_directory_of_another_output_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (owner, other) = (dir.path().join("owner"), dir.path().join("other"));
    killed_midway(&owner);
    killed_midway(&other);
    std::fs::remove_dir_all(other.join(".state")).unwrap();
    copy_dir(&owner.join(".state"), &other.join(".state"));
    let owner_before = listing(&owner);
    let other_ids = finished_ids(&other);

    let refused = demo(&other, &LONG_RUN);
    let message = text(&refused);
    assert!(!refused.status.success(), "{message}");
    for path in [&owner, &other] {
        assert!(
            message.contains(&path.display().to_string()),
            "names {}: {message}",
            path.display()
        );
    }
    assert!(message.contains(".file-sink-id"), "{message}");
    assert_eq!(listing(&owner), owner_before, "the owner is not touched");
    assert_eq!(finished_ids(&other), other_ids, "nothing committed");
}

/// Output the runtime knows is lost is reported, never hidden: after a kill,
/// the files the newest checkpoint still had to commit are deleted by hand.
/// The resumed run says on stderr which files are gone (warnings are on by
/// default), counts the failed commits and lost records in its `--json`
/// summary, and exits non-zero although the job itself finished.
#[test]
fn a_run_that_lost_records_exits_non_zero_and_names_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    killed_midway(&out);
    // Every part file, finished or hidden: whatever the newest checkpoint
    // refers to is gone.
    for (path, _) in listing(&out) {
        if !path.starts_with(out.join(".state"))
            && path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains("part"))
        {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let output = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(&out)
        .args(LONG_RUN)
        .env_remove("RUST_LOG")
        .output()
        .expect("the demo runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a loss is a failure: {}",
        text(&output)
    );
    assert!(stderr.contains("the job lost output"), "{stderr}");
    assert!(stderr.contains("WARN"), "warnings on by default: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON");
    assert_eq!(report["status"], "Finished", "{report}");
    let losses = &report["losses"];
    let failed = losses["commits_failed"].as_u64().unwrap();
    assert!(failed >= 1, "{report}");
    let failures = losses["known_failures"].as_array().unwrap();
    assert_eq!(failures.len() as u64, failed.min(100), "{report}");
    for failure in failures {
        let reason = failure["reason"].as_str().unwrap();
        assert!(
            reason.contains("part") && stderr.contains(reason),
            "the reason names the file and is on stderr: {reason}"
        );
    }
    // What was not lost is there once.
    let ids = finished_ids(&out);
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "no duplicates");

    // The finished marker keeps the loss: a run that finds the job finished
    // (as one does after a kill between the marker and the exit) exits
    // non-zero and names it again, writing nothing.
    let again = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(&out)
        .args(LONG_RUN)
        .env_remove("RUST_LOG")
        .output()
        .expect("the demo runs");
    let stderr_again = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success(),
        "a finished job's loss is a failure every time: {}",
        text(&again)
    );
    let report: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&again.stdout)
            .lines()
            .last()
            .expect("a summary"),
    )
    .expect("JSON");
    assert_eq!(report["status"], "AlreadyFinished", "{report}");
    assert_eq!(report["losses"]["commits_failed"].as_u64(), Some(failed));
    for failure in failures {
        let reason = failure["reason"].as_str().unwrap();
        assert!(
            stderr_again.contains(reason),
            "named again: {reason}\n{stderr_again}"
        );
    }
    assert_eq!(finished_ids(&out), ids, "nothing written again");
}
