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
