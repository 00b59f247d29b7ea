//! What the demos' tests read from a finished run of a demo.

use std::process::Output;

/// Stdout and stderr together, for failure messages.
pub fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// The JSON object on the last line of stdout of a run that succeeded.
pub fn summary(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", text(output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a line of output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
}

/// Fails unless `values` (sorted) are `0..count`, each once; the message
/// counts and samples what is missing and what is there twice, rather than
/// print tens of thousands of numbers.
pub fn assert_each_once(values: &[u64], count: u64, context: &str) {
    let mut missing = Vec::new();
    let mut twice = Vec::new();
    let mut at = 0;
    for id in 0..count {
        let start = at;
        while at < values.len() && values[at] == id {
            at += 1;
        }
        match at - start {
            0 => missing.push(id),
            1 => {}
            _ => twice.push(id),
        }
    }
    let foreign = values.len() - at;
    assert!(
        missing.is_empty() && twice.is_empty() && foreign == 0,
        "{context}: of {count} values, {} missing (first {:?}), {} more than once (first {:?}), \
         {foreign} outside 0..{count}",
        missing.len(),
        &missing[..missing.len().min(10)],
        twice.len(),
        &twice[..twice.len().min(10)],
    );
}

/// Runs `program` with `args` until it finishes, killing its first
/// `kills` starts with SIGKILL after a random 0.3 to 1.5 s (from `seed`),
/// unless a start ended first. Each start adds `--checkpoint-interval`:
/// `1h` for the first, which is killed before its first checkpoint, then
/// `100ms`. Returns the kills made and the last run's JSON summary, whose
/// status must be `Finished` (or `AlreadyFinished` after a kill).
pub fn killed_until_finished(
    program: &str,
    args: &[&str],
    kills: usize,
    seed: u64,
) -> (usize, serde_json::Value) {
    use std::process::{Command, Stdio};
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut killed = 0;
    for attempt in 0..kills + 10 {
        let interval = if attempt == 0 { "1h" } else { "100ms" };
        let mut child = Command::new(program)
            .args(args)
            .args(["--checkpoint-interval", interval])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts");
        if attempt < kills {
            std::thread::sleep(std::time::Duration::from_millis(rng.u64(300..1_500)));
            if child.try_wait().expect("the demo's status").is_none() {
                child.kill().expect("SIGKILL");
                child.wait().expect("the killed demo's status");
                killed += 1;
                continue;
            }
        }
        let report = summary(&child.wait_with_output().expect("the demo's output"));
        let finished_before = killed > 0 && report["status"] == "AlreadyFinished";
        assert!(
            report["status"] == "Finished" || finished_before,
            "seed {seed}: {report}"
        );
        return (killed, report);
    }
    panic!(
        "seed {seed}: the demo did not finish in {} starts",
        kills + 10
    )
}
