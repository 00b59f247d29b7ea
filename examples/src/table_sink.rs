//! A custom two-phase-commit sink: batches of lines committed into a shared
//! table, keyed by a batch id unique to the job's lineage, generation,
//! subtask and checkpoint (`InitContext::unique_name`), so that a replayed
//! commit is recognised and a run of the job on fresh checkpoint storage
//! never meets the ids of an earlier run. It keeps no writer state: its
//! `prepare_commit` hands out every line written since the last one. The
//! README's custom sink is this one; `src/bin/custom-sink.rs` runs it; the
//! test suite certifies it with `sink-testkit`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sink_api::{
    async_trait, CheckpointId, CommitRequest, Committer, InitContext, Sink, SinkError, SinkWriter,
};

/// The committed-to system: batches of lines by batch id. Clones share the
/// table.
#[derive(Clone, Default)]
pub struct TableSink(pub Arc<Mutex<BTreeMap<String, Vec<String>>>>);

/// The committable: a batch's unique id and its lines.
pub type Batch = (String, Vec<String>);

/// Buffers lines until `prepare_commit`.
pub struct TableWriter(InitContext, Vec<String>);

#[async_trait]
impl Sink for TableSink {
    type Writer = TableWriter;
    type Committer = TableSink;

    async fn create_writer(&self, cx: &InitContext, _: Vec<()>) -> Result<TableWriter, SinkError> {
        Ok(TableWriter(cx.clone(), Vec::new()))
    }

    async fn create_committer(&self, _: &InitContext) -> Result<TableSink, SinkError> {
        Ok(self.clone())
    }
}

#[async_trait]
impl SinkWriter for TableWriter {
    type Input = String;
    type Committable = Batch;
    type State = ();

    async fn write(&mut self, line: String) -> Result<(), SinkError> {
        self.1.push(line);
        Ok(())
    }

    /// One batch per checkpoint, even an empty one: committing it costs an
    /// entry, and its id is never reused.
    async fn prepare_commit(&mut self, n: CheckpointId) -> Result<Vec<Batch>, SinkError> {
        Ok(vec![(self.0.unique_name(n), std::mem::take(&mut self.1))])
    }
}

#[async_trait]
impl Committer for TableSink {
    type Committable = Batch;

    /// Inserts each batch under its id; an id already there is a replay.
    async fn commit(&mut self, requests: &mut [CommitRequest<Batch>]) -> Result<(), SinkError> {
        let mut table = self
            .0
            .lock()
            .map_err(|_| SinkError::msg("the table lock is poisoned"))?;
        for request in requests.iter_mut() {
            let (id, lines) = request.committable().clone();
            request.signal_committed_if_new(table.insert(id, lines).is_none());
        }
        Ok(())
    }
}
