//! A sink without a second phase (`NoCommitter`, `NoCommittable`): its
//! writer upserts, so a replay after a restore writes the same values
//! again; the runtime never calls a committer and holds no committable.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use sink_api::{
    async_trait, CheckpointId, InitContext, NoCommittable, NoCommitter, Sink, SinkError, SinkWriter,
};
use sink_runtime::{CheckpointConfig, Job, JobStatus, MemoryCheckpointStorage};

type Table = Arc<Mutex<BTreeMap<u64, u64>>>;

/// Upserts `n → n * 2`, counting every write.
struct Upserts(Table, Arc<Mutex<u64>>);
struct UpsertWriter(Table, Arc<Mutex<u64>>);

#[async_trait]
impl Sink for Upserts {
    type Writer = UpsertWriter;
    type Committer = NoCommitter;

    async fn create_writer(&self, _: &InitContext, _: Vec<()>) -> Result<UpsertWriter, SinkError> {
        Ok(UpsertWriter(self.0.clone(), self.1.clone()))
    }

    async fn create_committer(&self, _: &InitContext) -> Result<NoCommitter, SinkError> {
        Ok(NoCommitter)
    }
}

#[async_trait]
impl SinkWriter for UpsertWriter {
    type Input = u64;
    type Committable = NoCommittable;
    type State = ();

    async fn write(&mut self, n: u64) -> Result<(), SinkError> {
        self.0.lock().unwrap().insert(n, n * 2);
        *self.1.lock().unwrap() += 1;
        Ok(())
    }

    async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<NoCommittable>, SinkError> {
        Ok(Vec::new())
    }
}

#[tokio::test(start_paused = true)]
async fn a_sink_without_a_second_phase_runs_and_survives_a_restore_without_a_committer() {
    let table = Table::default();
    let writes = Arc::new(Mutex::new(0));
    let storage = MemoryCheckpointStorage::new(3);
    let job = |source: ThrottledSource| {
        Job::builder("upserts", source, Upserts(table.clone(), writes.clone()))
            .parallelism(2)
            .checkpointing(CheckpointConfig::every(ms(100)))
            .checkpoint_storage(storage.clone())
            .build()
            .unwrap()
    };
    let first = job(ThrottledSource::unbounded(2_000, 10, ms(10))).start();
    tokio::time::sleep(ms(450)).await;
    first.cancel();
    first.join().await.unwrap();
    let report = job(ThrottledSource::bounded(2_000, 10, ms(10)))
        .run()
        .await
        .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    assert_eq!(report.metrics.commit_calls, 0, "{:?}", report.metrics);
    assert_eq!(report.metrics.committables_pending, 0);
    let table = table.lock().unwrap();
    assert_eq!(table.len(), 2_000);
    assert!(table.iter().all(|(n, v)| *v == n * 2));
    assert!(*writes.lock().unwrap() >= 2_000, "replays write again");
}
