//! `Sink::on_start`: called once per start of the job (fresh, restore,
//! rescale, restart), before any writer or committer of that start, with
//! the lineage, the generation, both parallelisms and exactly what the
//! restored checkpoint holds for the sink; its errors are classed like any
//! sink error.

use crate::common;

use std::sync::{Arc, Mutex};

use common::*;
use sink_api::{
    async_trait, CheckpointId, Generation, InitContext, JobStart, Lineage, Sink, SinkError,
};
use sink_runtime::storage::CompletedCheckpoint;
use sink_runtime::{
    CheckpointConfig, Job, JobError, JobStatus, MemoryCheckpointStorage, RestartStrategy,
};
use sinks_memory::{
    MemoryCommittable, MemoryCommitter, MemorySink, MemoryStore, MemoryWriter, MemoryWriterState,
};

const RECORDS: u64 = 2_000;

/// What the runtime asked of the sink, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Start {
        lineage: Lineage,
        generation: Generation,
        parallelism: usize,
        previous_parallelism: Option<usize>,
        restored: Option<CheckpointId>,
        committables: usize,
        writer_states: usize,
    },
    Writer(usize),
    Committer(usize),
}

/// The memory sink, logging every call of the factory; its `on_start`
/// fails with the errors queued in `start_errors` first.
struct Watched {
    inner: MemorySink<u64>,
    calls: Arc<Mutex<Vec<Call>>>,
    start_errors: Arc<Mutex<Vec<SinkError>>>,
}

impl Watched {
    fn new(store: &MemoryStore<u64>) -> Watched {
        Watched {
            inner: MemorySink::new(store.clone()),
            calls: Arc::default(),
            start_errors: Arc::default(),
        }
    }
}

#[async_trait]
impl Sink for Watched {
    type Writer = MemoryWriter<u64>;
    type Committer = MemoryCommitter<u64>;

    async fn on_start(
        &self,
        start: &JobStart<'_, MemoryCommittable, MemoryWriterState<u64>>,
    ) -> Result<(), SinkError> {
        self.calls.lock().unwrap().push(Call::Start {
            lineage: start.lineage.clone(),
            generation: start.generation,
            parallelism: start.parallelism,
            previous_parallelism: start.previous_parallelism,
            restored: start.restored_checkpoint_id,
            committables: start.restored_committables.len(),
            writer_states: start.restored_writer_states.len(),
        });
        match self.start_errors.lock().unwrap().pop() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<MemoryWriterState<u64>>,
    ) -> Result<MemoryWriter<u64>, SinkError> {
        let call = Call::Writer(context.subtask_index);
        self.calls.lock().unwrap().push(call);
        self.inner.create_writer(context, restored).await
    }

    async fn create_committer(
        &self,
        context: &InitContext,
    ) -> Result<MemoryCommitter<u64>, SinkError> {
        let call = Call::Committer(context.subtask_index);
        self.calls.lock().unwrap().push(call);
        self.inner.create_committer(context).await
    }
}

/// How many committables and writer states `checkpoint` holds for the sink,
/// from its summaries and blobs.
fn held(checkpoint: &CompletedCheckpoint) -> (usize, usize) {
    let global = checkpoint.global_committer.iter().flat_map(|g| &g.pending);
    let parts = checkpoint.subtasks.iter().flat_map(|s| &s.pending);
    let committables = parts.chain(global).map(|p| p.committables.len()).sum();
    let states = checkpoint
        .subtasks
        .iter()
        .map(|s| s.writer_states.len())
        .sum();
    (committables, states)
}

/// Splits the log into starts, each with the calls that followed it, and
/// checks that nothing came before the first start, that the first
/// `failed` starts (whose `on_start` failed) made nothing, and that every
/// other start made exactly one writer and one committer per subtask.
fn starts(calls: &[Call], failed: usize) -> Vec<Call> {
    assert!(
        matches!(calls.first(), Some(Call::Start { .. })),
        "the first call is on_start: {calls:?}"
    );
    let mut starts = Vec::new();
    let mut made = Vec::new();
    let check = |starts: &[Call], made: &mut Vec<Call>| {
        let start = starts.last();
        if let Some(Call::Start { parallelism, .. }) = start {
            let expected: Vec<Call> = match starts.len() <= failed {
                true => Vec::new(),
                false => (0..*parallelism)
                    .flat_map(|i| [Call::Writer(i), Call::Committer(i)])
                    .collect(),
            };
            assert_eq!(*made, expected, "what one start made, after {start:?}");
        }
        made.clear();
    };
    for call in calls {
        match call {
            Call::Start { .. } => {
                check(&starts, &mut made);
                starts.push(call.clone());
            }
            other => made.push(other.clone()),
        }
    }
    check(&starts, &mut made);
    starts
}

/// A fresh start, a restore with another parallelism and a restart after a
/// failure: one call each, before any writer of its start, with what the
/// restored checkpoint holds.
#[tokio::test(start_paused = true)]
async fn on_start_runs_once_per_start_before_any_writer_with_what_the_checkpoint_holds() {
    let store = MemoryStore::<u64>::new();
    let storage = MemoryCheckpointStorage::new(3);
    let build = |source: ThrottledSource, parallelism, sink: Watched| {
        Job::builder("hook", source, sink)
            .parallelism(parallelism)
            .checkpointing(CheckpointConfig::every(ms(200)))
            .checkpoint_storage(storage.clone())
            .restart_strategy(RestartStrategy::FixedDelay {
                attempts: 1,
                delay: ms(100),
            })
            .build()
            .unwrap()
    };

    let first_sink = Watched::new(&store);
    let first_calls = first_sink.calls.clone();
    let first = build(
        ThrottledSource::unbounded(RECORDS, 10, ms(10)),
        2,
        first_sink,
    )
    .start();
    tokio::time::sleep(ms(650)).await;
    first.cancel();
    first.join().await.unwrap();
    let first_starts = starts(&first_calls.lock().unwrap(), 0);
    let [Call::Start {
        lineage,
        generation,
        parallelism: 2,
        previous_parallelism: None,
        restored: None,
        committables: 0,
        writer_states: 0,
    }] = first_starts.as_slice()
    else {
        panic!("one fresh start of 2 subtasks: {first_starts:?}");
    };
    let restored = storage.checkpoints().last().unwrap().clone();
    let (committables, writer_states) = held(&restored);
    assert!(
        committables > 0 && writer_states >= 2,
        "{committables} {writer_states}"
    );

    // Restored with 3 subtasks; a prepare_commit fails once, so the job
    // restarts from whichever checkpoint is newest then (one of 3 subtasks
    // when one completed since the restore).
    let second_sink = Watched::new(&store);
    let second_calls = second_sink.calls.clone();
    let second = build(
        ThrottledSource::bounded(RECORDS, 10, ms(10)),
        3,
        second_sink,
    )
    .start();
    tokio::time::sleep(ms(250)).await;
    store.fail_next_prepare_commits(1);
    let report = second.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.restarts, 1);
    assert_exactly_once("committed", &store.committed(), RECORDS);

    let second_starts = starts(&second_calls.lock().unwrap(), 0);
    let [restore, restart] = second_starts.as_slice() else {
        panic!("a restore and a restart: {second_starts:?}");
    };
    assert_eq!(
        *restore,
        Call::Start {
            lineage: lineage.clone(),
            generation: Generation(generation.0 + 1),
            parallelism: 3,
            previous_parallelism: Some(2),
            restored: Some(restored.checkpoint_id),
            committables,
            writer_states,
        }
    );
    let Call::Start {
        lineage: restart_lineage,
        generation: restart_generation,
        parallelism: 3,
        previous_parallelism: Some(previous),
        restored: Some(restart_restored),
        ..
    } = restart
    else {
        panic!("a restart of 3 subtasks from a checkpoint: {restart:?}");
    };
    assert_eq!(restart_lineage, lineage, "a restart keeps the lineage");
    assert_eq!(restart_generation.0, generation.0 + 2);
    let written_by = match *restart_restored > restored.checkpoint_id {
        true => 3,
        false => 2,
    };
    assert_eq!(*previous, written_by, "{restart:?}");
    assert_no_violations(&store);
}

fn failing_start(error: SinkError) -> (MemoryStore<u64>, Watched) {
    let store = MemoryStore::<u64>::new();
    let sink = Watched::new(&store);
    sink.start_errors.lock().unwrap().push(error);
    (store, sink)
}

fn restarting_job(sink: Watched) -> Job<ThrottledSource, Watched> {
    Job::builder("hook", ThrottledSource::bounded(100, 10, ms(10)), sink)
        .parallelism(2)
        .restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: ms(100),
        })
        .build()
        .unwrap()
}

/// A permanent error from `on_start` fails the job at once, before any
/// writer exists, with its cause.
#[tokio::test(start_paused = true)]
async fn a_permanent_error_at_start_fails_the_job_before_any_writer() {
    let cause = std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        "no access to the table",
    );
    let (store, sink) = failing_start(SinkError::io("cleaning up", cause).permanent());
    let calls = sink.calls.clone();
    let error = restarting_job(sink)
        .run()
        .await
        .expect_err("a permanent error");
    assert!(
        matches!(
            error,
            JobError::Sink {
                action: "on_start",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(!error.is_restartable());
    let message = error.to_string();
    assert!(
        message.contains("cleaning up: no access to the table"),
        "{message}"
    );
    assert_eq!(
        calls.lock().unwrap().len(),
        1,
        "{:?}",
        calls.lock().unwrap()
    );
    assert!(store.written().is_empty());
}

/// A transient error from `on_start` is retried under the restart strategy.
#[tokio::test(start_paused = true)]
async fn a_transient_error_at_start_restarts_the_job() {
    let (store, sink) = failing_start(SinkError::msg("the server is restarting"));
    let calls = sink.calls.clone();
    let report = restarting_job(sink).run().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.restarts, 1);
    let starts = starts(&calls.lock().unwrap(), 1);
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_exactly_once("committed", &store.committed(), 100);
}
