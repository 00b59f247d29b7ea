//! The part-file lifecycle, driven by hand as the runtime would drive it.

use crate::common;

use std::path::Path;

use common::visible_files;
use std::time::Duration;

use sink_api::{
    CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext, Sink,
    SinkWriter,
};
use sinks_file::{
    DateTimeBucketAssigner, FileCommittable, FileSink, FileWriterState, FnBucketAssigner,
    LineEncoder, ManualClock, RollingPolicy,
};

fn context() -> InitContext {
    InitContext::new(
        "files",
        sink_api::Lineage::new("test-lineage"),
        Generation(1),
        0,
        1,
    )
}

fn visible_lines(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = visible_files(dir)
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    lines.sort_by_key(|l| l.parse::<u64>().unwrap_or(u64::MAX));
    lines
}

async fn commit(
    sink: &FileSink<u64, LineEncoder, impl sinks_file::BucketAssigner<u64>>,
    committables: &[FileCommittable],
) -> Vec<CommitOutcome> {
    let mut committer = sink.create_committer(&context()).await.unwrap();
    let mut requests: Vec<_> = committables
        .iter()
        .cloned()
        .map(|c| CommitRequest::new(c, CheckpointId(1), 0))
        .collect();
    committer.commit(&mut requests).await.unwrap();
    requests.into_iter().map(|r| r.into_parts().1).collect()
}

fn numbers(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn nothing_is_visible_before_the_commit_and_everything_after() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .part_suffix(".txt")
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..100).collect()).await.unwrap();
    writer.flush(false).await.unwrap();
    let committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    writer.snapshot_state(CheckpointId(1)).await.unwrap();
    assert_eq!(committables.len(), 1);
    assert_eq!(committables[0].records, 100);
    assert!(
        visible_files(dir.path()).is_empty(),
        "pending files are hidden"
    );

    assert_eq!(
        commit(&sink, &committables).await,
        vec![CommitOutcome::Committed]
    );
    let files = visible_files(dir.path());
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("part-") && name.ends_with("-0.txt"),
        "{name}"
    );
    assert_eq!(visible_lines(dir.path()), numbers(0..100));
    assert!(!dir.path().join(&committables[0].pending).exists());
    assert_eq!(sink.stats().snapshot().committed_records, 100);
}

#[tokio::test]
async fn a_replayed_commit_is_recognised_and_a_lost_file_is_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..10).collect()).await.unwrap();
    let committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    assert_eq!(
        commit(&sink, &committables).await,
        vec![CommitOutcome::Committed]
    );
    assert_eq!(
        commit(&sink, &committables).await,
        vec![CommitOutcome::AlreadyCommitted]
    );
    assert_eq!(visible_lines(dir.path()), numbers(0..10), "not duplicated");

    std::fs::remove_file(dir.path().join(&committables[0].target)).unwrap();
    let outcomes = commit(&sink, &committables).await;
    assert!(
        matches!(&outcomes[0], CommitOutcome::FailedWithKnownReason(reason) if reason.contains("lost")),
        "{outcomes:?}"
    );
    let stats = sink.stats().snapshot();
    assert_eq!(
        (stats.committed_files, stats.replayed, stats.failed),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn parts_roll_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(100),
            ..RollingPolicy::on_checkpoint()
        })
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    // "10\n".."99\n": 3 bytes each, 33 records per 100-byte part.
    writer.write_batch((10..100).collect()).await.unwrap();
    let committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    let sizes: Vec<u64> = committables.iter().map(|c| c.size_bytes).collect();
    assert_eq!(sizes, vec![99, 99, 72]);
    commit(&sink, &committables).await;
    assert_eq!(visible_files(dir.path()).len(), 3);
    assert_eq!(visible_lines(dir.path()), numbers(10..100));
}

#[tokio::test]
async fn parts_roll_by_age_and_inactivity() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(0);
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: None,
            rollover_interval: Some(Duration::from_secs(60)),
            inactivity_interval: Some(Duration::from_secs(10)),
            roll_on_checkpoint: false,
        })
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch(vec![1]).await.unwrap();
    clock.advance(5_000);
    assert!(
        writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap()
            .is_empty(),
        "neither old nor idle"
    );
    writer.write_batch(vec![2]).await.unwrap();
    clock.advance(10_000);
    let idle = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    assert_eq!(idle.len(), 1, "idle for 10 s");
    for _ in 0..7 {
        writer.write_batch(vec![3]).await.unwrap();
        clock.advance(9_000);
    }
    writer.write_batch(vec![4]).await.unwrap();
    let old = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    assert_eq!(old.len(), 1, "60 s old although never idle");
}

#[tokio::test]
async fn a_checkpointed_in_progress_part_is_truncated_back_and_committed_after_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy::default())
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..50).collect()).await.unwrap();
    writer.flush(false).await.unwrap();
    assert!(
        writer
            .prepare_commit(sink_api::CheckpointId(1))
            .await
            .unwrap()
            .is_empty(),
        "the part is not due to roll"
    );
    let states: Vec<FileWriterState> = writer.snapshot_state(CheckpointId(1)).await.unwrap();
    assert_eq!(states[0].in_progress.len(), 1);
    assert_eq!(states[0].in_progress[0].records, 50);
    // Written after the checkpoint, then the process dies.
    writer.write_batch((50..80).collect()).await.unwrap();
    writer.flush(false).await.unwrap();
    drop(writer);

    let mut restored = sink.create_writer(&context(), states).await.unwrap();
    let committables = restored
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    assert_eq!(committables.len(), 1);
    assert_eq!(committables[0].records, 50);
    commit(&sink, &committables).await;
    assert_eq!(
        visible_lines(dir.path()),
        numbers(0..50),
        "truncated back to the checkpoint"
    );
}

#[tokio::test]
async fn a_vanished_in_progress_file_is_a_clear_error_at_restore() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder).build().unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..5).collect()).await.unwrap();
    let states = writer.snapshot_state(CheckpointId(1)).await.unwrap();
    std::fs::remove_file(dir.path().join(&states[0].in_progress[0].path)).unwrap();
    let error = match sink.create_writer(&context(), states).await {
        Ok(_) => panic!("a vanished file must not restore"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("has vanished") && error.contains("5 records"),
        "{error}"
    );
}

#[tokio::test]
async fn end_of_input_closes_every_part() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .bucket_assigner(FnBucketAssigner(|n: &u64| format!("mod{}", n % 3)))
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch((0..30).collect()).await.unwrap();
    writer.flush(true).await.unwrap();
    let committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    assert_eq!(committables.len(), 3, "one part per bucket");
    let state = writer.snapshot_state(CheckpointId(2)).await.unwrap();
    assert!(
        state[0].in_progress.is_empty(),
        "nothing open after end of input"
    );
    commit(&sink, &committables).await;
    for bucket in ["mod0", "mod1", "mod2"] {
        assert_eq!(visible_files(&dir.path().join(bucket)).len(), 1, "{bucket}");
    }
    assert_eq!(visible_lines(dir.path()), numbers(0..30));
}

#[tokio::test]
async fn date_time_buckets_follow_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_767_358_800_000); // 2026-01-02T13:00:00Z
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .bucket_assigner(DateTimeBucketAssigner::default())
        .rolling_policy(RollingPolicy::on_checkpoint())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    writer.write_batch(vec![1, 2]).await.unwrap();
    clock.advance(3_600_000);
    writer.write_batch(vec![3]).await.unwrap();
    let committables = writer
        .prepare_commit(sink_api::CheckpointId(1))
        .await
        .unwrap();
    commit(&sink, &committables).await;
    assert_eq!(visible_files(&dir.path().join("2026-01-02--13")).len(), 1);
    assert_eq!(visible_files(&dir.path().join("2026-01-02--14")).len(), 1);
}

#[tokio::test]
async fn bad_buckets_names_and_directories_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .bucket_assigner(FnBucketAssigner(|_: &u64| "../escape".to_string()))
        .build()
        .unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    let error = writer.write_batch(vec![1]).await.unwrap_err().to_string();
    assert!(error.contains("'../escape'"), "{error}");

    assert!(FileSink::<u64, _>::builder(dir.path(), LineEncoder)
        .part_prefix(".hidden")
        .build()
        .is_err());

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let sink = FileSink::<u64, _>::builder(file.join("out"), LineEncoder)
        .build()
        .unwrap();
    let error = match sink.create_writer(&context(), Vec::new()).await {
        Ok(_) => panic!("the output directory cannot be created under a file"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("creating the output directory"), "{error}");
}

/// A full disk is reported as such. Needs root to mount a small tmpfs.
#[tokio::test]
async fn a_full_disk_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(dir.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("SKIPPED a_full_disk_is_a_clear_error: mounting a small tmpfs needs root");
        return;
    }
    let sink = FileSink::builder(dir.path(), LineEncoder).build().unwrap();
    let mut writer = sink.create_writer(&context(), Vec::new()).await.unwrap();
    let mut result = Ok(());
    for chunk in 0..100u64 {
        result = writer
            .write_batch((chunk * 10_000..(chunk + 1) * 10_000).collect())
            .await;
        if result.is_ok() {
            result = writer.flush(false).await;
        }
        if result.is_err() {
            break;
        }
    }
    drop(writer);
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
    let error = result.expect_err("64 KiB fill up").to_string();
    assert!(error.contains("the disk is full"), "{error}");
}

/// An output directory that cannot be written is a clear error. Needs root
/// to mount a read-only tmpfs.
#[tokio::test]
async fn a_read_only_output_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs"])
        .arg(dir.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!(
            "SKIPPED a_read_only_output_directory_is_a_clear_error: mounting a tmpfs needs root"
        );
        return;
    }
    let sink = FileSink::<u64, _>::builder(dir.path(), LineEncoder)
        .build()
        .unwrap();
    let result = match sink.create_writer(&context(), Vec::new()).await {
        Ok(mut writer) => writer.write_batch(vec![1]).await,
        Err(error) => Err(error),
    };
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .status();
    let error = result.expect_err("nothing can be written").to_string();
    assert!(error.contains("must be writable"), "{error}");
    assert!(
        error.contains(&dir.path().display().to_string()),
        "names the path: {error}"
    );
}
