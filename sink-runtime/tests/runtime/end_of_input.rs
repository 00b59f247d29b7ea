//! End of input with checkpointing on: the final checkpoint, the two Flink
//! seeds (FLINK-38614: end of stream deferred to the global committer;
//! FLINK-23473: no transaction after finish, and no waiting for every
//! checkpoint triggered after it).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use sink_api::{
    async_trait, CheckpointId, GlobalCommitter, InitContext, Sink, SinkError, SinkWriter,
    WriterStateOf,
};
use sink_runtime::source::RangeSplit;
use sink_runtime::{CheckpointConfig, Job, JobStatus, SequenceSource};
use sinks_memory::{MemoryCommittable, MemoryGlobalCommitter, MemorySink, MemoryStore};
use tokio::time::Instant;

/// Bounded input with checkpoints in the middle of it: every record is
/// committed after the final checkpoint, and `run` returns only after that
/// commit.
#[tokio::test(start_paused = true)]
async fn bounded_with_checkpoints_commits_everything_before_returning() {
    let store = MemoryStore::<u64>::new();
    let storage = ScriptedStorage::new(|_| StoreScript::Succeed);
    let report = Job::builder(
        "bounded",
        ThrottledSource::bounded(2_000, 50, ms(100)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(500)))
    .checkpoint_storage(storage.clone())
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();

    // Read right after `run` returned: nothing may still be on its way.
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 2_000);
    assert!(store.pending().is_empty(), "nothing left prepared or open");
    assert_no_violations(&store);
    let metrics = &report.metrics;
    assert_eq!(metrics.records_committed, 2_000);
    assert_eq!(metrics.committables_pending, 0);
    assert!(
        metrics.checkpoints_completed >= 3,
        "checkpoints during the input: {metrics:?}"
    );
    // One prepare_commit per subtask per checkpoint before its end of input,
    // plus exactly one at end of input; none after.
    assert_eq!(store.stats().end_of_input_flushes, 2);
    let last = report
        .last_checkpoint
        .expect("a final checkpoint completed");
    let stored = storage.inner.checkpoints();
    let final_checkpoint = stored.last().unwrap();
    assert_eq!(final_checkpoint.checkpoint_id, last);
    assert!(final_checkpoint.is_final);
    assert!(final_checkpoint.subtasks.iter().all(|s| s.end_of_input));
}

/// Seed 1 (FLINK-38614): the final checkpoint's committables reach the global
/// committer before its end of input. The completion of the final checkpoint
/// is delayed (slow storage) so that, were end of stream forwarded at end of
/// input, it would deterministically overtake the final committables.
async fn run_with_slow_final_checkpoint(defer: bool) -> MemoryStore<u64> {
    let store = MemoryStore::<u64>::new();
    let builder = Job::builder(
        "global",
        ThrottledSource::bounded(160, 10, ms(100)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(300)))
    .checkpoint_storage(ScriptedStorage::new(|_| StoreScript::SucceedAfter(ms(400))))
    .global_committer({
        let store = store.clone();
        move || MemoryGlobalCommitter::new(store.clone())
    });
    let builder = if defer {
        builder
    } else {
        builder.unsafe_disable_end_of_stream_deferral()
    };
    let report = builder.build().unwrap().run().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    store
}

#[tokio::test(start_paused = true)]
async fn the_global_committer_receives_the_final_committables_before_end_of_input() {
    let store = run_with_slow_final_checkpoint(true).await;
    assert!(store.global_end_of_input_called());
    assert_no_violations(&store);
    assert_exactly_once("global committer", &store.global_records(), 160);
    assert_exactly_once("committed", &store.committed(), 160);
    let checkpoints = store.global_checkpoints();
    assert!(
        checkpoints.windows(2).all(|w| w[0] < w[1]),
        "in order: {checkpoints:?}"
    );
}

/// The same test with the deferral switched off reproduces the Flink bug:
/// end of input reaches the global committer before the final committables.
/// This proves the test above would catch a regression.
#[tokio::test(start_paused = true)]
async fn without_the_deferral_the_final_committables_arrive_too_late() {
    let store = run_with_slow_final_checkpoint(false).await;
    let violations = store.violations();
    assert!(
        violations.iter().any(|v| v.contains("after end_of_input")),
        "expected late deliveries, got {violations:?}"
    );
}

/// Seed 2 (FLINK-23473): after every subtask finished, checkpoints n+1, n+2
/// and n+3 are triggered; n+1 fails, n+2 completes, n+3 never would. The job
/// commits on n+2 and ends without waiting for n+3, and no prepare_commit
/// (no new transaction) happens after end of input.
#[tokio::test(start_paused = true)]
async fn after_finish_the_first_completion_ends_the_job_and_no_transaction_is_opened() {
    let store = MemoryStore::<u64>::new();
    let storage = ScriptedStorage::new(|id| match id.0 {
        1 => StoreScript::FailAfter(ms(250)),
        2 => StoreScript::Succeed,
        _ => StoreScript::Hang,
    });
    let timeout = Duration::from_secs(600);
    let started = Instant::now();
    let report = Job::builder(
        "finish",
        SequenceSource::bounded(160),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(
        CheckpointConfig::every(ms(100))
            .max_concurrent(3)
            .timeout(timeout),
    )
    .checkpoint_storage(storage.clone())
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    let elapsed = started.elapsed();

    assert_eq!(report.status, JobStatus::Finished);
    assert!(
        elapsed < Duration::from_secs(1),
        "did not wait for checkpoint 3: {elapsed:?}"
    );
    let metrics = &report.metrics;
    assert_eq!(metrics.checkpoints_triggered, 3, "{metrics:?}");
    assert_eq!(metrics.checkpoints_failed, 1);
    assert_eq!(metrics.checkpoints_completed, 1);
    assert_eq!(metrics.checkpoints_aborted, 1, "checkpoint 3 abandoned");
    assert_eq!(report.last_checkpoint, Some(CheckpointId(2)));
    assert_eq!(
        storage.store_calls(),
        vec![CheckpointId(1), CheckpointId(2)]
    );
    // The input ended before the first checkpoint: the only prepare_commit of
    // each subtask is the one at end of input, tagged checkpoint 1 and
    // committed when checkpoint 2 completed.
    assert_eq!(store.stats().prepare_commit_calls, 2);
    assert_eq!(metrics.prepare_commit_calls, 2);
    assert_eq!(store.stats().transactions_opened, 2);
    assert_eq!(
        store
            .commits_per_checkpoint()
            .into_iter()
            .collect::<Vec<_>>(),
        vec![(CheckpointId(1), 2)]
    );
    assert_exactly_once("committed", &store.committed(), 160);
    assert_no_violations(&store);
}

/// A writer that finished earlier than the others keeps serving barriers
/// without preparing anything, and the job still commits all of it.
#[tokio::test(start_paused = true)]
async fn subtasks_finishing_at_different_times_commit_exactly_once() {
    let store = MemoryStore::<u64>::new();
    // Subtask 0 reads 10 records, subtask 1 reads 990, subtask 2 nothing at all:
    // they reach end of input many checkpoints apart.
    let mut source = ThrottledSource::bounded(1_000, 7, ms(30));
    source.splits = Some(vec![
        RangeSplit { next: 0, end: 10 },
        RangeSplit {
            next: 10,
            end: 1_000,
        },
        RangeSplit {
            next: 1_000,
            end: 1_000,
        },
    ]);
    let report = Job::builder("uneven", source, MemorySink::new(store.clone()))
        .parallelism(3)
        .batch_size(5)
        .checkpointing(CheckpointConfig::every(ms(200)))
        .global_committer({
            let store = store.clone();
            move || MemoryGlobalCommitter::new(store.clone())
        })
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 1_000);
    assert_exactly_once("global committer", &store.global_records(), 1_000);
    assert_eq!(store.stats().end_of_input_flushes, 3);
    assert!(
        report.metrics.checkpoints_completed > 5,
        "{:?}",
        report.metrics
    );
    assert_no_violations(&store);
}

/// A global committer that takes its time.
struct SlowGlobalCommitter(MemoryGlobalCommitter<u64>);

#[async_trait::async_trait]
impl GlobalCommitter for SlowGlobalCommitter {
    type Committable = MemoryCommittable;

    async fn commit_checkpoint(
        &mut self,
        id: CheckpointId,
        committables: Vec<MemoryCommittable>,
    ) -> Result<(), SinkError> {
        tokio::time::sleep(ms(50)).await;
        self.0.commit_checkpoint(id, committables).await
    }

    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        tokio::time::sleep(ms(50)).await;
        self.0.end_of_input().await
    }
}

/// The job returns only after the global committer finished too.
#[tokio::test(start_paused = true)]
async fn the_job_returns_only_after_a_slow_global_committer_finished() {
    let store = MemoryStore::<u64>::new();
    let report = Job::builder(
        "slow-global",
        ThrottledSource::bounded(160, 10, ms(100)),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(ms(300)))
    .global_committer({
        let store = store.clone();
        move || SlowGlobalCommitter(MemoryGlobalCommitter::new(store.clone()))
    })
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert!(store.global_end_of_input_called());
    assert_exactly_once("global committer", &store.global_records(), 160);
    assert_exactly_once("committed", &store.committed(), 160);
    assert_no_violations(&store);
}

/// An interval and a timeout longer than any instant can hold (a flag of
/// `18446744073709551615s` once panicked with "overflow when adding duration
/// to instant"): no checkpoint is due before the end, the final one is taken
/// at end of input, and nothing overflows.
#[tokio::test]
async fn intervals_beyond_any_instant_do_not_overflow() {
    let store = MemoryStore::<u64>::new();
    let report = Job::builder(
        "forever",
        SequenceSource::bounded(500),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::MAX).timeout(Duration::MAX))
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 500);
    assert_eq!(
        report.metrics.checkpoints_completed, 1,
        "only the final one"
    );
}

/// The memory sink, with writers that log the checkpoint id each
/// `prepare_commit` is given.
struct PrepareLog {
    inner: MemorySink<u64>,
    log: Arc<Mutex<Vec<(usize, CheckpointId)>>>,
}

struct PrepareLogWriter {
    inner: sinks_memory::MemoryWriter<u64>,
    subtask: usize,
    log: Arc<Mutex<Vec<(usize, CheckpointId)>>>,
}

#[async_trait]
impl Sink for PrepareLog {
    type Writer = PrepareLogWriter;
    type Committer = sinks_memory::MemoryCommitter<u64>;

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<WriterStateOf<Self>>,
    ) -> Result<PrepareLogWriter, SinkError> {
        Ok(PrepareLogWriter {
            inner: self.inner.create_writer(context, restored).await?,
            subtask: context.subtask_index,
            log: self.log.clone(),
        })
    }

    async fn create_committer(&self, context: &InitContext) -> Result<Self::Committer, SinkError> {
        self.inner.create_committer(context).await
    }
}

#[async_trait]
impl SinkWriter for PrepareLogWriter {
    type Input = u64;
    type Committable = MemoryCommittable;
    type State = sinks_memory::MemoryWriterState<u64>;

    async fn write(&mut self, record: u64) -> Result<(), SinkError> {
        self.inner.write(record).await
    }

    async fn write_batch(&mut self, records: Vec<u64>) -> Result<(), SinkError> {
        self.inner.write_batch(records).await
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.inner.flush(end_of_input).await
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<MemoryCommittable>, SinkError> {
        self.log.lock().unwrap().push((self.subtask, checkpoint_id));
        self.inner.prepare_commit(checkpoint_id).await
    }

    async fn snapshot_state(&mut self, id: CheckpointId) -> Result<Vec<Self::State>, SinkError> {
        self.inner.snapshot_state(id).await
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.inner.close().await
    }
}

/// `prepare_commit` is told the checkpoint its committables belong to: each
/// barrier's id, growing, and at end of input the tag of the final
/// committables; every committed committable was committed under the id it
/// was prepared with.
#[tokio::test(start_paused = true)]
async fn prepare_commit_is_given_the_checkpoint_its_committables_belong_to() {
    let store = MemoryStore::<u64>::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = PrepareLog {
        inner: MemorySink::new(store.clone()),
        log: log.clone(),
    };
    let report = Job::builder("ids", ThrottledSource::bounded(1_000, 50, ms(100)), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(ms(300)))
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_exactly_once("committed", &store.committed(), 1_000);
    let log = log.lock().unwrap().clone();
    for subtask in 0..2 {
        let ids: Vec<u64> = log
            .iter()
            .filter(|(s, _)| *s == subtask)
            .map(|(_, id)| id.0)
            .collect();
        assert!(ids.len() >= 3, "subtask {subtask}: {ids:?}");
        assert!(
            ids.windows(2).all(|w| w[1] == w[0] + 1),
            "subtask {subtask}: one per barrier, in order, then the end-of-input tag: {ids:?}"
        );
        assert_eq!(ids[0], 1, "subtask {subtask}: {ids:?}");
    }
    let prepared: std::collections::BTreeSet<u64> = log.iter().map(|(_, id)| id.0).collect();
    for checkpoint in store.commits_per_checkpoint().keys() {
        assert!(
            prepared.contains(&checkpoint.0),
            "committed under checkpoint {checkpoint}, which no prepare_commit was given"
        );
    }
    assert_no_violations(&store);
}
