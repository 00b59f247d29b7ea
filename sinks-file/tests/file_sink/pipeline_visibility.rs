//! Under a `Pipeline`, a ticket's "committed" means visible: with its
//! default rolling policy the file sink rolls its parts at every
//! checkpoint there, so a reader of the output finds a send's records as
//! soon as its ticket resolves. A rolling policy chosen not to roll at
//! checkpoints is refused with the fix, unless the pipeline acknowledges
//! before visible, in which case records stay out of sight after their
//! ticket (what the default used to do).

use std::path::Path;
use std::time::Duration;

use sink_runtime::{CheckpointConfig, Pipeline};
use sinks_file::{FileSink, LineEncoder, RollingPolicy};

use crate::common::visible_numbers;

fn checkpoints() -> CheckpointConfig {
    CheckpointConfig::every(Duration::from_millis(20))
}

/// Sends `count` records one at a time; after each ticket, whether the
/// record is in the visible output.
async fn send_and_look(pipeline: &Pipeline<u64>, dir: &Path, count: u64) -> Vec<bool> {
    let mut seen = Vec::new();
    for n in 0..count {
        let ticket = pipeline
            .try_send(vec![n], None)
            .expect("room in the channel");
        ticket.await.expect("committed");
        seen.push(visible_numbers(dir).contains(&n));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_rolling_policy_a_resolved_ticket_means_visible() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder).build().unwrap();
    let pipeline = Pipeline::builder("visible", sink)
        .parallelism(2)
        .checkpointing(checkpoints())
        .start()
        .await
        .unwrap();
    let seen = send_and_look(&pipeline, dir.path(), 20).await;
    assert!(seen.iter().all(|&visible| visible), "{seen:?}");
    pipeline.shutdown().await.unwrap();
    assert_eq!(visible_numbers(dir.path()), (0..20).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_chosen_policy_that_does_not_roll_at_checkpoints_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy::default())
        .build()
        .unwrap();
    let error = Pipeline::<u64>::builder("refused", sink)
        .checkpointing(checkpoints())
        .start()
        .await
        .expect_err("refused")
        .to_string();
    for fix in [
        "RollingPolicy::on_checkpoint()",
        "leave the rolling policy unset",
        "PipelineBuilder::acknowledge_before_visible",
    ] {
        assert!(error.contains(fix), "{fix} is not in: {error}");
    }
    // A chosen policy that rolls at checkpoints is taken.
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy::on_checkpoint())
        .build()
        .unwrap();
    let pipeline = Pipeline::<u64>::builder("taken", sink)
        .checkpointing(checkpoints())
        .start()
        .await
        .unwrap();
    pipeline.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_before_visible_records_wait_for_their_part_to_roll() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy::default())
        .build()
        .unwrap();
    let pipeline = Pipeline::builder("durable", sink)
        .checkpointing(checkpoints())
        .acknowledge_before_visible()
        .start()
        .await
        .unwrap();
    let seen = send_and_look(&pipeline, dir.path(), 5).await;
    assert!(seen.iter().all(|&visible| !visible), "{seen:?}");
    // The shutdown's end of input rolls every part: all visible then.
    pipeline.shutdown().await.unwrap();
    assert_eq!(visible_numbers(dir.path()), (0..5).collect::<Vec<_>>());
}
