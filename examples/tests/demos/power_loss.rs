//! The file sink demo through power cuts: one run traced, the states a
//! power cut could leave of its output and checkpoints built at sampled
//! points, and from each, the demo run again (`docs/semantics.md`,
//! "Durability").
//!
//! What must hold in each state, given what the run had said before the
//! power went:
//! - a checkpoint reported complete (the runtime's "checkpoint completed"
//!   log line) is restored, or a later one;
//! - a job reported finished (its summary on standard output) is found
//!   finished, and nothing is written again;
//! - the run from the state ends well, with every record in the finished
//!   files exactly once.
//!
//! `POWER_LOSS_FULL=1` checks every crash point of the run.

use std::path::Path;
use std::process::Command;

use sink_testkit::power_loss::{self, CrashState, Plan, Recording};

const RECORDS: u64 = 240;

fn demo(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"));
    command
        .current_dir(dir)
        .args(["--out", "out", "--parallelism", "2", "--json"])
        .args(["--records", &RECORDS.to_string()])
        .args(["--rate", "1500", "--checkpoint-interval", "25ms"])
        .env("RUST_LOG", "sink_runtime=info");
    command
}

/// The number after `key=` in `line`.
fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Runs `demo` on one crash state of its own recording and checks what the
/// run from it found against what the recording had reported before the
/// crash point: a checkpoint reported complete (the runtime's log line) is
/// restored or passed, a job reported finished is found finished. Returns
/// the run's summary and the directory, for the destination's own checks.
fn recover(
    recording: &Recording,
    state: &CrashState,
    demo: fn(&Path) -> Command,
) -> Result<(serde_json::Value, tempfile::TempDir), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let summary = recover_in(recording, state, demo, dir.path())?;
    Ok((summary, dir))
}

/// [`recover`] in the empty directory `dir`.
fn recover_in(
    recording: &Recording,
    state: &CrashState,
    demo: fn(&Path) -> Command,
    dir: &Path,
) -> Result<serde_json::Value, String> {
    let said: String = recording
        .outputs_before(state.point)
        .iter()
        .map(|o| o.text())
        .collect();
    let reported_checkpoint = said
        .lines()
        .filter(|line| line.contains("checkpoint completed"))
        .filter_map(|line| field(line, "checkpoint="))
        .max();
    let reported_finished = said.contains("\"status\":\"Finished\"");

    state.write_to(dir).map_err(|e| e.to_string())?;
    let run = demo(dir).output().map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    if !run.status.success() {
        return Err(format!(
            "the run from it failed ({}): {}",
            run.status,
            stderr.trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&run.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .map_err(|e| format!("the run from it printed no summary ({e}): {stdout}"))?;
    // A job found finished has gone past every checkpoint.
    let found_finished = summary["status"] == "AlreadyFinished";
    if reported_finished && !found_finished {
        return Err(format!(
            "the job had reported it finished, and the run from it did not find it finished: {summary}"
        ));
    }
    if let Some(reported) = reported_checkpoint.filter(|_| !found_finished) {
        let restored = stderr
            .lines()
            .find(|line| line.contains("job starting"))
            .and_then(|line| field(line, "restored=Some(CheckpointId("));
        if restored.is_none_or(|restored| restored < reported) {
            return Err(format!(
                "checkpoint {reported} was reported complete, and the run from it restored {restored:?}"
            ));
        }
    }
    Ok(summary)
}

/// Recovers from one crash state of the file sink demo: every record in
/// the finished files once.
fn verdict(recording: &Recording, state: &CrashState) -> Result<(), String> {
    let (_, dir) = recover(recording, state, demo)?;
    let mut ids = Vec::new();
    let out = dir.path().join("out");
    let files = match out.exists() {
        true => sinks_file::finished_files(&out).map_err(|e| e.to_string())?,
        false => Vec::new(),
    };
    for path in files {
        let content = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        for line in content.lines() {
            let id: u64 = line
                .get(..20)
                .and_then(|id| id.parse().ok())
                .ok_or_else(|| format!("{} holds a damaged record {line:?}", path.display()))?;
            ids.push(id);
        }
    }
    ids.sort_unstable();
    if ids != (0..RECORDS).collect::<Vec<_>>() {
        let mut seen = std::collections::BTreeMap::<u64, u32>::new();
        for id in &ids {
            *seen.entry(*id).or_default() += 1;
        }
        let missing = (0..RECORDS).filter(|id| !seen.contains_key(id)).count();
        let twice = seen.values().filter(|&&n| n > 1).count();
        return Err(format!(
            "after the run from it, {missing} records are missing and {twice} are there more than once"
        ));
    }
    Ok(())
}

#[test]
fn after_a_power_cut_at_any_point_the_demo_keeps_what_it_reported_and_every_record_once() {
    if !power_loss::strace_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let recording = power_loss::record(&demo(root.path()), root.path()).unwrap();
    assert!(
        recording.status.success(),
        "{}",
        String::from_utf8_lossy(&recording.stderr)
    );
    let completed = recording
        .outputs()
        .iter()
        .filter(|o| o.text().contains("checkpoint completed"))
        .count();
    assert!(
        completed >= 2,
        "the traced run completed {completed} checkpoints"
    );
    let summary = recording.check(&Plan::from_env(1, 24, 1), |state| {
        verdict(&recording, state)
    });
    println!(
        "file-sink-demo, {} operations traced: {summary}",
        recording.operations()
    );
    summary.assert_no_violations();
}

/// The Delta demo on a local table through power cuts: the same checks as
/// the file sink demo's, the rows read from the table (`table_rows`,
/// `distinct_ids` in the run's summary).
#[cfg(feature = "delta")]
mod delta {
    use super::*;

    fn delta_demo(dir: &Path) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_delta-sink-demo"));
        command
            .current_dir(dir)
            .args(["--out", "out", "--parallelism", "2", "--json"])
            .args(["--records", &RECORDS.to_string()])
            .args(["--rate", "1500", "--checkpoint-interval", "25ms"])
            .env("RUST_LOG", "sink_runtime=info");
        command
    }

    /// Recovers from one crash state of the Delta demo: every row in the
    /// table once (the run's `table_rows` and `distinct_ids`).
    fn delta_verdict(recording: &Recording, state: &CrashState) -> Result<(), String> {
        let (summary, _dir) = recover(recording, state, delta_demo)?;
        if summary["table_rows"] != RECORDS || summary["distinct_ids"] != RECORDS {
            return Err(format!(
                "after the run from it the table holds {} rows, {} distinct ids",
                summary["table_rows"], summary["distinct_ids"]
            ));
        }
        Ok(())
    }

    #[test]
    fn after_a_power_cut_at_any_point_the_delta_demo_keeps_what_it_reported_and_every_row_once() {
        if !power_loss::strace_available() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let recording = power_loss::record(&delta_demo(root.path()), root.path()).unwrap();
        assert!(
            recording.status.success(),
            "{}",
            String::from_utf8_lossy(&recording.stderr)
        );
        let summary = recording.check(&Plan::from_env(4, 16, 1), |state| {
            delta_verdict(&recording, state)
        });
        println!(
            "delta-sink-demo on a local table, {} operations traced: {summary}",
            recording.operations()
        );
        summary.assert_no_violations();
    }
}

/// The Iceberg demo on a local table through power cuts: the same checks as
/// the file sink demo's, the rows read from the table. An Iceberg catalog
/// names its files by absolute paths, so each crash state is rebuilt where
/// the traced run wrote (emptied first), not in a directory of its own.
#[cfg(feature = "iceberg")]
mod iceberg {
    use super::*;

    fn iceberg_demo(dir: &Path) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_iceberg-sink-demo"));
        command
            .current_dir(dir)
            .args(["--warehouse", "wh", "--parallelism", "2", "--json"])
            .args(["--records", &RECORDS.to_string()])
            .args(["--rate", "1500", "--checkpoint-interval", "25ms"])
            .env("RUST_LOG", "sink_runtime=info");
        command
    }

    /// Recovers from one crash state of the Iceberg demo, rebuilt in
    /// `root`: every row in the table once.
    fn iceberg_verdict(
        recording: &Recording,
        state: &CrashState,
        root: &Path,
    ) -> Result<(), String> {
        std::fs::remove_dir_all(root).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
        let summary = recover_in(recording, state, iceberg_demo, root)?;
        if summary["table_rows"] != RECORDS || summary["distinct_ids"] != RECORDS {
            return Err(format!(
                "after the run from it the table holds {} rows, {} distinct ids",
                summary["table_rows"], summary["distinct_ids"]
            ));
        }
        Ok(())
    }

    #[test]
    fn after_a_power_cut_at_any_point_the_iceberg_demo_keeps_what_it_reported_and_every_row_once() {
        if !power_loss::strace_available() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let recording = power_loss::record(&iceberg_demo(root.path()), root.path()).unwrap();
        assert!(
            recording.status.success(),
            "{}",
            String::from_utf8_lossy(&recording.stderr)
        );
        let summary = recording.check(&Plan::from_env(5, 16, 1), |state| {
            iceberg_verdict(&recording, state, root.path())
        });
        println!(
            "iceberg-sink-demo on a local table, {} operations traced: {summary}",
            recording.operations()
        );
        summary.assert_no_violations();
    }
}
