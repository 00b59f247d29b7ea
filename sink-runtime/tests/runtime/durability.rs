//! A checkpoint waits for the writer's durability work
//! (`SinkWriter::durability`), and only the checkpoint does: records keep
//! flowing meanwhile, nothing is committed before it is done, and a failed
//! one fails the job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sink_api::{
    async_trait, CheckpointId, CommitRequest, Committer, Durability, InitContext, Sink, SinkError,
    SinkWriter,
};
use sink_runtime::{CheckpointConfig, Job, JobError, SequenceSource};
use sinks_memory::{MemorySink, MemoryStore};
use tokio::sync::Semaphore;

/// What the test sees of the gated sink.
#[derive(Clone, Default)]
struct Seen {
    written: Arc<AtomicU64>,
    prepared: Arc<AtomicU64>,
    committed: Arc<AtomicU64>,
}

/// A sink whose durability work waits for a permit of `gate` (only the
/// first work of each writer, with `only_first`), or fails.
#[derive(Clone)]
struct Gated {
    seen: Seen,
    gate: Arc<Semaphore>,
    fail: bool,
    only_first: bool,
}

struct GatedWriter {
    sink: Gated,
    records: u64,
    works: u64,
}

#[async_trait]
impl Sink for Gated {
    type Writer = GatedWriter;
    type Committer = Gated;

    async fn create_writer(&self, _: &InitContext, _: Vec<()>) -> Result<GatedWriter, SinkError> {
        Ok(GatedWriter {
            sink: self.clone(),
            records: 0,
            works: 0,
        })
    }

    async fn create_committer(&self, _: &InitContext) -> Result<Gated, SinkError> {
        Ok(self.clone())
    }
}

#[async_trait]
impl SinkWriter for GatedWriter {
    type Input = u64;
    type Committable = u64;
    type State = ();

    async fn write(&mut self, _: u64) -> Result<(), SinkError> {
        self.records += 1;
        self.sink.seen.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<u64>, SinkError> {
        self.sink.seen.prepared.fetch_add(1, Ordering::SeqCst);
        Ok(vec![std::mem::take(&mut self.records)])
    }

    fn durability(&mut self, _: CheckpointId) -> Option<Durability> {
        let (gate, fail) = (self.sink.gate.clone(), self.sink.fail);
        self.works += 1;
        if self.sink.only_first && self.works > 1 {
            return Some(Box::pin(async { Ok(()) }));
        }
        Some(Box::pin(async move {
            if fail {
                return Err(SinkError::msg("the disk refused the fsync"));
            }
            let permit = gate
                .acquire()
                .await
                .map_err(|e| SinkError::other("waiting for the gate", e))?;
            permit.forget();
            Ok(())
        }))
    }
}

#[async_trait]
impl Committer for Gated {
    type Committable = u64;

    async fn commit(&mut self, requests: &mut [CommitRequest<u64>]) -> Result<(), SinkError> {
        for request in requests.iter_mut() {
            self.seen
                .committed
                .fetch_add(*request.committable(), Ordering::SeqCst);
            request.signal_committed();
        }
        Ok(())
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Rule: a checkpoint is acknowledged (and so completed and committed)
/// only once the writer's durability work for it is done; the writer keeps
/// writing meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_waits_for_the_durability_work_and_writing_goes_on() {
    let seen = Seen::default();
    let gate = Arc::new(Semaphore::new(0));
    let sink = Gated {
        seen: seen.clone(),
        gate: gate.clone(),
        fail: false,
        only_first: false,
    };
    let handle = Job::builder(
        "durability",
        SequenceSource::unbounded(1_000_000).paced(20_000),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(10)))
    .build()
    .unwrap()
    .start();
    wait_for("both subtasks at the first barrier", || {
        seen.prepared.load(Ordering::SeqCst) >= 2
    })
    .await;
    let at_barrier = seen.written.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = handle.metrics();
    assert_eq!(
        metrics.checkpoints_completed, 0,
        "completed before the durability work was done: {metrics:?}"
    );
    assert_eq!(seen.committed.load(Ordering::SeqCst), 0, "committed early");
    assert!(
        seen.written.load(Ordering::SeqCst) > at_barrier + 100,
        "the writer stopped while the work was pending"
    );
    // Done: the checkpoint completes, in order, and commits.
    gate.add_permits(1_000_000);
    wait_for("a completed checkpoint with commits", || {
        handle.metrics().checkpoints_completed >= 2 && seen.committed.load(Ordering::SeqCst) > 0
    })
    .await;
    handle.cancel();
    let _ = handle.join().await;
}

/// Rule: acknowledgements go in checkpoint order. With two checkpoints in
/// flight, the second's work done and the first's not, neither completes;
/// once the first's is done, both do, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_checkpoint_done_first_waits_for_the_earlier_one() {
    let seen = Seen::default();
    let gate = Arc::new(Semaphore::new(0));
    let sink = Gated {
        seen: seen.clone(),
        gate: gate.clone(),
        fail: false,
        only_first: true,
    };
    let handle = Job::builder(
        "durability-order",
        SequenceSource::unbounded(1_000_000).paced(20_000),
        sink,
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(10)).max_concurrent(2))
    .build()
    .unwrap()
    .start();
    wait_for("both subtasks past the second barrier", || {
        seen.prepared.load(Ordering::SeqCst) >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let metrics = handle.metrics();
    assert!(metrics.checkpoints_triggered >= 2, "{metrics:?}");
    assert_eq!(
        metrics.checkpoints_completed, 0,
        "a checkpoint completed while the first one's work was pending: {metrics:?}"
    );
    gate.add_permits(2);
    // Commits follow the completion on the committers' tasks: wait for
    // both, not for the completion alone.
    wait_for("the checkpoints completed and committed", || {
        handle.metrics().checkpoints_completed >= 2 && seen.committed.load(Ordering::SeqCst) > 0
    })
    .await;
    handle.cancel();
    let _ = handle.join().await;
}

/// Rule: durability work that fails fails the job; its checkpoint never
/// completes and nothing of it is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_durability_work_fails_the_job_and_commits_nothing() {
    let seen = Seen::default();
    let sink = Gated {
        seen: seen.clone(),
        gate: Arc::new(Semaphore::new(0)),
        fail: true,
        only_first: false,
    };
    let result = Job::builder("durability-fails", SequenceSource::bounded(1_000), sink)
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(10)))
        .build()
        .unwrap()
        .run()
        .await;
    let error = result.expect_err("the job failed");
    assert!(
        matches!(&error, JobError::Sink { action, .. } if *action == "durability"),
        "{error:?}"
    );
    assert!(error.to_string().contains("refused the fsync"), "{error}");
    assert_eq!(seen.committed.load(Ordering::SeqCst), 0);
}

/// With the memory sink making its transactions durable in the background,
/// a job with checkpoints and one on demand commit every record once, and
/// the store saw no transaction committed before it was durable (it
/// records one as a violation: an acknowledgement sent too early).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_durability_commits_everything_once_and_never_early() {
    for config in [
        CheckpointConfig::every(Duration::from_millis(5)),
        CheckpointConfig::on_demand(Duration::ZERO, Duration::from_secs(1)),
    ] {
        let store = MemoryStore::<u64>::new();
        let sink = MemorySink::new(store.clone())
            .roll_every(30)
            .durable_in_background();
        let report = Job::builder(
            "background",
            // A tenth of a second per subtask at least: several
            // checkpoints, even on a loaded machine.
            SequenceSource::bounded(20_000).paced(50_000),
            sink,
        )
        .parallelism(2)
        .checkpointing(config)
        .build()
        .unwrap()
        .run()
        .await
        .unwrap();
        assert!(report.metrics.checkpoints_completed >= 3, "{config:?}");
        assert_eq!(store.violations(), Vec::<String>::new(), "{config:?}");
        let mut committed = store.committed();
        committed.sort_unstable();
        assert_eq!(committed, (0..20_000).collect::<Vec<_>>(), "{config:?}");
    }
}
