//! The file sink demo, run as a user would run it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn demo(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("the demo runs")
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// The JSON object on the last line of stdout.
fn summary(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", text(output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a line of output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
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
        assert_eq!(report["status"], "Finished", "seed {seed}: {report}");
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

/// The benchmark runs end to end at a small scale and reports every figure
/// (a smoke run: no timing is asserted).
#[test]
fn the_benchmark_smoke_run_reports_every_figure() {
    let output = Command::new(env!("CARGO_BIN_EXE_sink-bench"))
        .args(["--scale", "0.002", "--json"])
        .output()
        .expect("the benchmark runs");
    let report = summary(&output);
    for path in [
        ["runtime_overhead", "ratio"],
        ["runtime_overhead", "job_records_per_s"],
        ["file_sink", "ratio"],
        ["file_sink", "job_bytes_per_s"],
        ["checkpoint_cost", "ratio"],
    ] {
        let value = report[path[0]][path[1]].as_f64();
        assert!(
            value.is_some_and(|v| v.is_finite() && v > 0.0),
            "{path:?}: {report}"
        );
    }
    assert!(
        report["peak_rss_mib"].as_f64().is_some_and(|v| v > 0.0),
        "{report}"
    );
    assert!(
        report["startup_to_first_record_ms"].as_f64().is_some(),
        "{report}"
    );
}
