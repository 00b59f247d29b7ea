//! A crash between a checkpoint's completion and its commit: on restart the
//! pending committables are committed again before any new record is
//! written. Needs the `failpoints` feature (its own process: `fail`'s
//! configuration is process-wide).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use sink_api::{async_trait, CheckpointId, InitContext, Sink, SinkError, SinkWriter};
use sink_runtime::{CheckpointConfig, Job, JobError, JobStatus, LocalCheckpointStorage};
use sinks_memory::{
    MemoryCommitter, MemorySink, MemoryStore, MemoryWriter, MemoryWriterState, TransactionState,
};

/// Every transaction and its state, taken at the first write of a run.
type Picture = Arc<Mutex<Option<Vec<(String, TransactionState)>>>>;

/// The memory sink, with a writer that takes a picture of every transaction
/// at its first write.
struct Probe {
    inner: MemorySink<u64>,
    store: MemoryStore<u64>,
    at_first_write: Picture,
}

struct ProbeWriter {
    inner: MemoryWriter<u64>,
    store: MemoryStore<u64>,
    at_first_write: Picture,
}

#[async_trait]
impl Sink for Probe {
    type Writer = ProbeWriter;
    type Committer = MemoryCommitter<u64>;

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<MemoryWriterState<u64>>,
    ) -> Result<ProbeWriter, SinkError> {
        Ok(ProbeWriter {
            inner: self.inner.create_writer(context, restored).await?,
            store: self.store.clone(),
            at_first_write: self.at_first_write.clone(),
        })
    }

    async fn create_committer(
        &self,
        context: &InitContext,
    ) -> Result<MemoryCommitter<u64>, SinkError> {
        self.inner.create_committer(context).await
    }
}

#[async_trait]
impl SinkWriter for ProbeWriter {
    type Input = u64;
    type Committable = sinks_memory::MemoryCommittable;
    type State = MemoryWriterState<u64>;

    async fn write(&mut self, record: u64) -> Result<(), SinkError> {
        self.write_batch(vec![record]).await
    }

    async fn write_batch(&mut self, records: Vec<u64>) -> Result<(), SinkError> {
        {
            let mut picture = self.at_first_write.lock().unwrap();
            if picture.is_none() {
                *picture = Some(self.store.transactions());
            }
        }
        self.inner.write_batch(records).await
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.inner.flush(end_of_input).await
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: sink_api::CheckpointId,
    ) -> Result<Vec<sinks_memory::MemoryCommittable>, SinkError> {
        self.inner.prepare_commit(checkpoint_id).await
    }

    async fn snapshot_state(
        &mut self,
        id: CheckpointId,
    ) -> Result<Vec<MemoryWriterState<u64>>, SinkError> {
        self.inner.snapshot_state(id).await
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.inner.close().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_between_completion_and_commit_the_commit_comes_before_new_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<u64>::new();
    let run = |picture: Picture| {
        let sink = Probe {
            inner: MemorySink::new(store.clone()),
            store: store.clone(),
            at_first_write: picture,
        };
        Job::builder(
            "recommit",
            ThrottledSource::bounded(2_000, 20, Duration::from_millis(1)),
            sink,
        )
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
        .build()
        .unwrap()
        .run()
    };

    // Crash right after checkpoint 3 is stored, before anyone hears of it.
    fail::cfg("after-checkpoint-stored", "2*off->1*return->off").unwrap();
    let error = run(Arc::default()).await.unwrap_err();
    fail::remove("after-checkpoint-stored");
    assert!(
        matches!(
            error,
            JobError::Crash {
                failpoint: "after-checkpoint-stored"
            }
        ),
        "{error:?}"
    );
    let prepared: Vec<String> = store
        .transactions()
        .into_iter()
        .filter(|(_, state)| *state == TransactionState::Prepared)
        .map(|(id, _)| id)
        .collect();
    assert!(
        !prepared.is_empty(),
        "checkpoint 3's transactions wait for their commit"
    );

    let picture = Arc::new(Mutex::new(None));
    let report = run(picture.clone()).await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let at_first_write = picture
        .lock()
        .unwrap()
        .clone()
        .expect("the restarted job wrote");
    for id in &prepared {
        let state = at_first_write
            .iter()
            .find(|(t, _)| t == id)
            .map(|(_, s)| *s);
        assert_eq!(
            state,
            Some(TransactionState::Committed),
            "transaction {id} of the restored checkpoint was not committed before new data"
        );
    }
    assert_exactly_once("committed", &store.committed(), 2_000);
    assert_no_violations(&store);
}
