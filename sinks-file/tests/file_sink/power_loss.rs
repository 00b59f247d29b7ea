//! The file sink through power cuts, driven by hand as the runtime drives
//! it, in a process of its own that the power-loss harness traces
//! (`sink_testkit::power_loss`): what a committer reported committed must be
//! in the finished files of every state a power cut can leave.
//!
//! The first scenario is the one a time-based bucket meets at every rollover
//! with two subtasks: subtask 0 passes barrier 2 and then opens a part in a new
//! bucket directory, creating it; subtask 1 opens its part in the directory
//! subtask 0 made (not synced yet), reaches barrier 2, and checkpoint 2
//! commits subtask 1's part. The directory's own name must be durable by
//! then, although subtask 1 did not create it.
//!
//! The second runs a whole job with compaction at every checkpoint (sealed
//! epochs, merged segments, directories exchanged) and local checkpoints,
//! and recovers from each crash state by running the job again: a
//! checkpoint reported complete is restored (or a later one), a job reported
//! finished is found finished, and every record is in the finished files
//! once.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Lineage,
    PositionAdvance, Sink, SinkWriter, SplitKey,
};
use sink_runtime::{CheckpointConfig, Job, JobStatus, LocalCheckpointStorage, SequenceSource};
use sink_testkit::power_loss::{self, CrashState, Entry, Plan, Recording};
use sinks_file::{CompactionPolicy, FileSink, FnBucketAssigner, LineEncoder, RollingPolicy};

use crate::common::{exactly_once_problem, visible_numbers};

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

/// Waits, as the runtime does before it acknowledges checkpoint `id`, for
/// what the writer made durable for it.
async fn durable(writer: &mut impl SinkWriter, id: u64) {
    if let Some(durability) = writer.durability(CheckpointId(id)) {
        durability.await.unwrap();
    }
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
    durable(&mut zero, 1).await;
    first.extend(one.prepare_commit(CheckpointId(1)).await.unwrap());
    one.snapshot_state(CheckpointId(1)).await.unwrap();
    durable(&mut one, 1).await;
    commit(first, 1).await;

    let nothing = zero.prepare_commit(CheckpointId(2)).await.unwrap();
    zero.snapshot_state(CheckpointId(2)).await.unwrap();
    durable(&mut zero, 2).await;
    // Past its barrier, subtask 0 creates the new bucket's directory.
    zero.write_batch(vec![1000]).await.unwrap();
    one.write_batch(vec![1001]).await.unwrap();
    let mut second = one.prepare_commit(CheckpointId(2)).await.unwrap();
    one.snapshot_state(CheckpointId(2)).await.unwrap();
    durable(&mut one, 2).await;
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
    // No recovery to run: each state is checked as it is, so every point.
    let summary = recording.check(&Plan::full(2, 3), |state| {
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
        match lost.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "reported committed and not in a finished file: {lost:?}"
            )),
        }
    });
    println!(
        "the file sink, a bucket made by another subtask, {} operations traced: {summary}",
        recording.operations()
    );
    if !summary.violations().is_empty() {
        let kept = std::env::temp_dir().join("power-loss-bucket.trace");
        std::fs::write(&kept, recording.trace()).unwrap();
        println!("the trace is kept in {}", kept.display());
    }
    summary.assert_no_violations();
}

/// Commits one position group, after a committer of an earlier process
/// created the position log's directories and was killed before it synced
/// them (made here with std's `create_dir_all`, which syncs nothing);
/// prints `committed` once the committer reported the group committed.
#[tokio::test]
#[ignore = "the traced child of the test below"]
async fn child_a_position_log_an_earlier_process_created() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let out = Path::new(&dir).join("out");
    let sink = FileSink::builder(&out, LineEncoder)
        .bucket_assigner(FnBucketAssigner(|_: &u64| "b".to_string()))
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(0), Vec::new()).await.unwrap();
    writer.write_batch(vec![1, 2, 3]).await.unwrap();
    for log_dir in ["log", "snapshot", "tmp"] {
        std::fs::create_dir_all(out.join(".positions").join(log_dir)).unwrap();
    }
    writer
        .carry_positions(vec![PositionAdvance {
            key: SplitKey::new("input", "p0"),
            from: None,
            to: 3,
        }])
        .unwrap();
    let committables = writer.prepare_commit(CheckpointId(1)).await.unwrap();
    writer.snapshot_state(CheckpointId(1)).await.unwrap();
    durable(&mut writer, 1).await;
    let mut committer = sink.create_committer(&context(0)).await.unwrap();
    let mut requests: Vec<_> = committables
        .into_iter()
        .map(|c| CommitRequest::new(c, CheckpointId(1), 0))
        .collect();
    committer.commit(&mut requests).await.unwrap();
    for request in requests {
        assert_eq!(request.into_parts().1, CommitOutcome::Committed);
    }
    println!("committed");
}

#[test]
fn source_positions_reported_committed_survive_a_power_cut_whoever_made_the_log() {
    if !power_loss::strace_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "power_loss::child_a_position_log_an_earlier_process_created",
        ])
        .args(["--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_DIR, root.path());
    let recording = power_loss::record(&child, root.path()).unwrap();
    let stdout = String::from_utf8_lossy(&recording.stdout);
    assert!(
        recording.status.success() && stdout.contains("committed"),
        "{stdout}{}",
        String::from_utf8_lossy(&recording.stderr)
    );
    let entry = Path::new("out/.positions/log/00000000000000000001");
    let summary = recording.check(&Plan::full(4, 2), |state| {
        let reported = recording
            .outputs_before(state.point)
            .iter()
            .any(|o| o.text().contains("committed"));
        match (reported, state.tree.get(entry)) {
            (false, _) | (true, Some(Entry::File(_))) => Ok(()),
            (true, _) => Err(format!(
                "the group was reported committed, and its positions ({}) are gone",
                entry.display()
            )),
        }
    });
    println!(
        "a position log made by an earlier process, {} operations traced: {summary}",
        recording.operations()
    );
    summary.assert_no_violations();
}

/// Records of the compacting job.
const COMPACTED_RECORDS: u64 = 600;

/// Runs (or resumes) the compacting job in `$POWER_LOSS_CHILD_DIR/out`,
/// printing `checkpoint N` once checkpoint N completed and `finished` when
/// the job finished.
#[tokio::test]
#[ignore = "the traced child of the test below"]
async fn child_a_compacting_job() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let out = Path::new(&dir).join("out");
    let sink = FileSink::builder(&out, LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(512),
            ..RollingPolicy::default()
        })
        .compaction(CompactionPolicy::every(Duration::ZERO).retention(Duration::ZERO))
        .build()
        .unwrap();
    let handle = Job::builder(
        "compacted",
        SequenceSource::bounded(COMPACTED_RECORDS).paced(2_000),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(25)))
    .checkpoint_storage(LocalCheckpointStorage::open(out.join(".state")).unwrap())
    .build()
    .unwrap()
    .start();
    let mut said = 0;
    while !handle.is_finished() {
        let completed = handle.metrics().checkpoints_completed;
        if completed > said {
            println!("checkpoint {completed}");
            said = completed;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let report = handle.join().await.unwrap();
    assert!(matches!(
        report.status,
        JobStatus::Finished | JobStatus::AlreadyFinished
    ));
    println!("finished");
}

fn compacting_child(dir: &Path) -> Command {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "power_loss::child_a_compacting_job"])
        .args(["--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_DIR, dir);
    child
}

/// Recovers from one crash state of the compacting job.
fn compacted_verdict(recording: &Recording, state: &CrashState) -> Result<(), String> {
    let said: String = recording
        .outputs_before(state.point)
        .iter()
        .map(|o| o.text())
        .collect();
    // The counter read after the fact: checkpoint N was complete when it
    // was printed.
    let reported = said
        .lines()
        .filter_map(|l| l.strip_prefix("checkpoint ")?.parse::<u64>().ok())
        .max();
    let finished = said.lines().any(|l| l == "finished");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    state.write_to(dir.path()).map_err(|e| e.to_string())?;
    let out = dir.path().join("out");
    if reported.is_some() || finished {
        let found = LocalCheckpointStorage::inspect(out.join(".state"))
            .map_err(|e| format!("what was reported has no state directory: {e}"))?;
        let newest = found.checkpoints.last().map(|c| c.checkpoint_id.0);
        if finished && found.finished.is_none() {
            return Err("the job reported it finished; its finished marker is gone".into());
        }
        if let Some(n) = reported.filter(|_| found.finished.is_none()) {
            if newest.is_none_or(|newest| newest < n) {
                return Err(format!(
                    "checkpoint {n} was reported complete; the newest left is {newest:?}"
                ));
            }
        }
    }
    let run = compacting_child(dir.path())
        .output()
        .map_err(|e| e.to_string())?;
    if !run.status.success() {
        return Err(format!(
            "the run from it failed: {}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    match exactly_once_problem(&visible_numbers(&out), COMPACTED_RECORDS) {
        Some(problem) => Err(format!("after the run from it: {problem}")),
        None => Ok(()),
    }
}

#[test]
fn with_compaction_a_power_cut_at_any_point_keeps_what_was_reported_and_every_record_once() {
    if !power_loss::strace_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let recording = power_loss::record(&compacting_child(root.path()), root.path()).unwrap();
    let stdout = String::from_utf8_lossy(&recording.stdout);
    assert!(
        recording.status.success() && stdout.contains("finished"),
        "{stdout}{}",
        String::from_utf8_lossy(&recording.stderr)
    );
    let summary = recording.check(&Plan::from_env(3, 16, 1), |state| {
        compacted_verdict(&recording, state)
    });
    println!(
        "the file sink with compaction, {} operations traced: {summary}",
        recording.operations()
    );
    summary.assert_no_violations();
}
