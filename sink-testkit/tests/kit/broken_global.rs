//! A sink whose data becomes visible only through the global committer it
//! brings (as a table format's sink does): certified when its global
//! committer recognises replays from the destination, caught by
//! `unknown-outcome/global-commit` when it recognises them from memory, and
//! by `contract/global-replay-regrouped` when it recognises checkpoints
//! handed over together by the newest alone.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use sink_api::{
    async_trait, CheckpointId, CommitRequest, Committer, GlobalCommitter, GlobalCommitterFactory,
    InitContext, Sink, SinkError, SinkWriter,
};
use sink_testkit::{certify_with, Destination, Knobs, Report, Verdict};

/// The destination: staged batches (durable, invisible), and the visible
/// rows with the checkpoints of each job already applied.
#[derive(Default)]
struct Store {
    staged: BTreeSet<String>,
    visible: Vec<u64>,
    applied: BTreeSet<(String, u64)>,
}

#[derive(Clone)]
struct TableLike {
    store: Arc<Mutex<Store>>,
    flaw: Flaw,
}

/// How the global committer recognises what it applied.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// From the destination, each checkpoint: right.
    None,
    /// From its own memory, which a restart forgets.
    Forgetful,
    /// Checkpoints handed over together are marked, and recognised, by the
    /// newest alone: a later delivery grouped otherwise applies again the
    /// ones it shares with the earlier group.
    NewestOfAGroupOnly,
}

#[derive(serde::Serialize, serde::Deserialize, Clone)]
struct Staged {
    name: String,
    job: String,
    ids: Vec<u64>,
}

struct Writer {
    job: String,
    prefix: String,
    buffer: Vec<u64>,
    store: Arc<Mutex<Store>>,
}

#[async_trait]
impl Sink for TableLike {
    type Writer = Writer;
    type Committer = Stager;

    async fn create_writer(&self, context: &InitContext, _: Vec<()>) -> Result<Writer, SinkError> {
        Ok(Writer {
            job: format!("{}/{}", context.job_name, context.lineage),
            prefix: format!("{}-s{}", context.lineage, context.subtask_index),
            buffer: Vec::new(),
            store: self.store.clone(),
        })
    }

    async fn create_committer(&self, _: &InitContext) -> Result<Stager, SinkError> {
        Ok(Stager(self.store.clone()))
    }

    fn global_committer(&self) -> Option<GlobalCommitterFactory<Staged>> {
        let (store, flaw) = (self.store.clone(), self.flaw);
        Some(Box::new(move |context: &InitContext| {
            Box::new(Publisher {
                store: store.clone(),
                job: format!("{}/{}", context.job_name, context.lineage),
                forgetful: flaw == Flaw::Forgetful,
                newest_only: flaw == Flaw::NewestOfAGroupOnly,
                remembered: BTreeSet::new(),
            })
        }))
    }
}

#[async_trait]
impl SinkWriter for Writer {
    type Input = u64;
    type Committable = Staged;
    type State = ();

    async fn write(&mut self, id: u64) -> Result<(), SinkError> {
        self.buffer.push(id);
        Ok(())
    }

    async fn prepare_commit(&mut self, checkpoint: CheckpointId) -> Result<Vec<Staged>, SinkError> {
        if self.buffer.is_empty() {
            return Ok(Vec::new());
        }
        let name = format!("{}-c{checkpoint}-{}", self.prefix, self.buffer[0]);
        self.store.lock().unwrap().staged.insert(name.clone());
        Ok(vec![Staged {
            name,
            job: self.job.clone(),
            ids: std::mem::take(&mut self.buffer),
        }])
    }
}

/// The per-subtask committer: checks the batch is staged (idempotent).
struct Stager(Arc<Mutex<Store>>);

#[async_trait]
impl Committer for Stager {
    type Committable = Staged;

    async fn commit(&mut self, requests: &mut [CommitRequest<Staged>]) -> Result<(), SinkError> {
        let store = self.0.lock().unwrap();
        for request in requests.iter_mut() {
            match store.staged.contains(&request.committable().name) {
                true => request.signal_committed(),
                false => request.signal_failed_with_unknown_reason("a staged batch is missing"),
            }
        }
        Ok(())
    }
}

/// The global committer: makes a checkpoint's batches visible at once.
struct Publisher {
    store: Arc<Mutex<Store>>,
    job: String,
    forgetful: bool,
    newest_only: bool,
    remembered: BTreeSet<u64>,
}

#[async_trait]
impl GlobalCommitter for Publisher {
    type Committable = Staged;

    async fn commit_checkpoint(
        &mut self,
        checkpoint: CheckpointId,
        batches: Vec<Staged>,
    ) -> Result<(), SinkError> {
        let mut store = self.store.lock().unwrap();
        let applied = match self.forgetful {
            true => !self.remembered.insert(checkpoint.0),
            false => !store.applied.insert((self.job.clone(), checkpoint.0)),
        };
        if self.forgetful {
            store.applied.insert((self.job.clone(), checkpoint.0));
        }
        if !applied {
            for batch in batches {
                store.visible.extend(batch.ids);
            }
        }
        Ok(())
    }

    async fn commit_checkpoints(
        &mut self,
        checkpoints: Vec<(CheckpointId, Vec<Staged>)>,
    ) -> Result<(), SinkError> {
        if !self.newest_only {
            for (checkpoint, batches) in checkpoints {
                self.commit_checkpoint(checkpoint, batches).await?;
            }
            return Ok(());
        }
        let newest = checkpoints.iter().map(|(id, _)| id.0).max().unwrap_or(0);
        let mut store = self.store.lock().unwrap();
        if store.applied.insert((self.job.clone(), newest)) {
            for (_, batches) in checkpoints {
                for batch in batches {
                    store.visible.extend(batch.ids);
                }
            }
        }
        Ok(())
    }
}

struct Dest(TableLike);

#[async_trait]
impl Destination for Dest {
    type Sink = TableLike;

    async fn sink(&self) -> TableLike {
        self.0.clone()
    }

    async fn committed_ids(&self) -> Vec<u64> {
        self.0.store.lock().unwrap().visible.clone()
    }
}

async fn certify_table_like(flaw: Flaw) -> Report {
    let knobs = Knobs {
        records: 200,
        seeds: 4,
        ..Knobs::default()
    };
    certify_with(
        knobs,
        move || async move {
            Dest(TableLike {
                store: Arc::default(),
                flaw,
            })
        },
        |id| id,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_committer_recognising_replays_from_the_destination_passes() {
    let report = certify_table_like(Flaw::None).await;
    assert!(
        matches!(
            report.verdict("unknown-outcome/global-commit"),
            Some(Verdict::Passed)
        ),
        "{report}"
    );
    report
        // One batch per checkpoint and subtask: calls cannot be half-applied.
        .allow_unchecked([
            "contract/no-transaction-after-end-of-input",
            "unknown-outcome/middle-of-batch",
            "unknown-outcome/last-of-batch",
        ])
        .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_committer_recognising_replays_from_memory_is_caught() {
    let report = certify_table_like(Flaw::Forgetful).await;
    match report.verdict("unknown-outcome/global-commit") {
        Some(Verdict::Failed(why)) => assert!(why.contains("outcome was lost"), "{why}"),
        other => {
            panic!("unknown-outcome/global-commit should have failed, got {other:?}:\n{report}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_committer_recognising_grouped_checkpoints_by_the_newest_only_is_caught() {
    let report = certify_table_like(Flaw::NewestOfAGroupOnly).await;
    match report.verdict("contract/global-replay-regrouped") {
        Some(Verdict::Failed(why)) => assert!(why.contains("grouped"), "{why}"),
        other => {
            panic!("contract/global-replay-regrouped should have failed, got {other:?}:\n{report}")
        }
    }
}
