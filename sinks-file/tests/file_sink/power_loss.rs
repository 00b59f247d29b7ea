//! The file sink through power cuts, driven by hand as the runtime drives
//! it, in a process of its own that the power-loss harness traces
//! (`sink_testkit::power_loss`): what a committer reported committed must be
//! in the finished files of every state a power cut can leave.
//!
//! The scenario is the one a time-based bucket meets at every rollover with
//! two subtasks: subtask 0 passes barrier 2 and then opens a part in a new
//! bucket directory, creating it; subtask 1 opens its part in the directory
//! subtask 0 made (not synced yet), reaches barrier 2, and checkpoint 2
//! commits subtask 1's part. The directory's own name must be durable by
//! then, although subtask 1 did not create it.

use std::path::Path;
use std::process::Command;

use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Lineage, Sink,
    SinkWriter,
};
use sink_testkit::power_loss::{self, Entry, Plan, Summary};
use sinks_file::{FileSink, FnBucketAssigner, LineEncoder, RollingPolicy};

/// Where the traced child writes; its presence makes the ignored test
/// below the child.
const CHILD_DIR: &str = "POWER_LOSS_CHILD_DIR";

fn context(subtask: usize) -> InitContext {
    InitContext::new(
        "files",
        Lineage::new("power-loss"),
        Generation(1),
        subtask,
        2,
    )
}

/// Writes, prepares and commits as described above, printing
/// `committed N` for every record the committer reported committed.
#[tokio::test]
#[ignore = "the traced child of the test below"]
async fn child_two_subtasks_and_a_new_bucket() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let sink = FileSink::builder(Path::new(&dir).join("out"), LineEncoder)
        .bucket_assigner(FnBucketAssigner(|n: &u64| match n {
            0..1000 => "first".to_string(),
            _ => "second".to_string(),
        }))
        .rolling_policy(RollingPolicy::on_checkpoint())
        .build()
        .unwrap();
    let mut zero = sink.create_writer(&context(0), Vec::new()).await.unwrap();
    let mut one = sink.create_writer(&context(1), Vec::new()).await.unwrap();
    let mut committer = sink.create_committer(&context(0)).await.unwrap();
    let mut commit = async |committables: Vec<sinks_file::FileCommittable>, id: u64| {
        let mut requests: Vec<_> = committables
            .into_iter()
            .map(|c| CommitRequest::new(c, CheckpointId(id), 0))
            .collect();
        committer.commit(&mut requests).await.unwrap();
        for request in requests {
            let (committable, outcome) = request.into_parts();
            assert_eq!(outcome, CommitOutcome::Committed);
            let lines =
                std::fs::read_to_string(Path::new(&dir).join("out").join(&committable.target))
                    .unwrap();
            for line in lines.lines() {
                println!("committed {line}");
            }
        }
    };

    zero.write_batch(vec![0]).await.unwrap();
    one.write_batch(vec![1]).await.unwrap();
    let mut first = zero.prepare_commit(CheckpointId(1)).await.unwrap();
    zero.snapshot_state(CheckpointId(1)).await.unwrap();
    first.extend(one.prepare_commit(CheckpointId(1)).await.unwrap());
    one.snapshot_state(CheckpointId(1)).await.unwrap();
    commit(first, 1).await;

    let nothing = zero.prepare_commit(CheckpointId(2)).await.unwrap();
    zero.snapshot_state(CheckpointId(2)).await.unwrap();
    // Past its barrier, subtask 0 creates the new bucket's directory.
    zero.write_batch(vec![1000]).await.unwrap();
    one.write_batch(vec![1001]).await.unwrap();
    let mut second = one.prepare_commit(CheckpointId(2)).await.unwrap();
    one.snapshot_state(CheckpointId(2)).await.unwrap();
    second.extend(nothing);
    commit(second, 2).await;
}

#[test]
fn what_a_committer_reported_committed_survives_a_power_cut_in_a_bucket_another_subtask_made() {
    if !power_loss::strace_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "power_loss::child_two_subtasks_and_a_new_bucket"])
        .args(["--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_DIR, root.path());
    let recording = power_loss::record(&child, root.path()).unwrap();
    let stdout = String::from_utf8_lossy(&recording.stdout);
    assert!(
        recording.status.success() && stdout.contains("committed 1001"),
        "{stdout}{}",
        String::from_utf8_lossy(&recording.stderr)
    );
    let mut summary = Summary::default();
    for state in recording.crash_states(&Plan::full(2, 3)) {
        let reported: Vec<u64> = recording
            .outputs_before(state.point)
            .iter()
            .flat_map(|o| {
                o.text()
                    .lines()
                    .filter_map(|l| l.strip_prefix("committed ")?.parse().ok())
                    .collect::<Vec<u64>>()
            })
            .collect();
        let mut finished: Vec<u64> = Vec::new();
        for (path, entry) in state.tree.entries() {
            let hidden = path
                .components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with('.'));
            if let (Entry::File(data), false) = (entry, hidden) {
                let text = String::from_utf8_lossy(data);
                finished.extend(text.lines().filter_map(|l| l.parse::<u64>().ok()));
            }
        }
        let lost: Vec<u64> = reported
            .iter()
            .copied()
            .filter(|id| !finished.contains(id))
            .collect();
        let verdict = match lost.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "reported committed and not in a finished file: {lost:?}"
            )),
        };
        summary.check(&state, verdict);
    }
    println!(
        "the file sink, a bucket made by another subtask, {} operations traced: {summary}",
        recording.operations()
    );
    summary.assert_no_violations();
}
