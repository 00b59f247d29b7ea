//! A custom two-phase-commit sink: batches of lines committed into a shared
//! table, keyed by a batch id unique to the job's lineage, generation,
//! subtask and checkpoint, so that a replayed commit is recognised and a run
//! of the job on fresh checkpoint storage never meets the ids of an earlier
//! run. It keeps no writer state: a restored writer's checkpoints are newer
//! than the restored one, and its generation is new. `src/bin/custom-sink.rs` runs it; the test suite certifies it
//! with `sink-testkit`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sink_api::{
    async_trait, CheckpointId, CommitRequest, Committer, InitContext, Sink, SinkError, SinkWriter,
};

/// The committed-to system: batches of lines by batch id. Clones share the
/// table.
#[derive(Clone, Default)]
pub struct TableSink(pub Arc<Mutex<BTreeMap<String, Vec<String>>>>);

/// The committable: a batch and its unique id.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Batch {
    id: String,
    lines: Vec<String>,
}

/// Buffers lines until `prepare_commit`.
pub struct TableWriter {
    prefix: String,
    lines: Vec<String>,
}

#[async_trait]
impl Sink for TableSink {
    type Input = String;
    type Committable = Batch;
    type WriterState = ();
    type Writer = TableWriter;
    type Committer = TableSink;

    async fn create_writer(&self, cx: &InitContext, _: Vec<()>) -> Result<TableWriter, SinkError> {
        let prefix = format!(
            "{}-{}-g{}-s{}",
            cx.job_name, cx.lineage, cx.generation, cx.subtask_index
        );
        Ok(TableWriter {
            prefix,
            lines: Vec::new(),
        })
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
        self.lines.push(line);
        Ok(())
    }

    async fn flush(&mut self, _end_of_input: bool) -> Result<(), SinkError> {
        Ok(())
    }

    async fn prepare_commit(&mut self, checkpoint: CheckpointId) -> Result<Vec<Batch>, SinkError> {
        if self.lines.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![Batch {
            id: format!("{}-c{checkpoint}", self.prefix),
            lines: std::mem::take(&mut self.lines),
        }])
    }

    async fn snapshot_state(&mut self, _: CheckpointId) -> Result<Vec<()>, SinkError> {
        Ok(Vec::new())
    }
}

#[async_trait]
impl Committer for TableSink {
    type Committable = Batch;

    async fn commit(&mut self, requests: &mut [CommitRequest<Batch>]) -> Result<(), SinkError> {
        let mut table = self
            .0
            .lock()
            .map_err(|_| SinkError::msg("the table lock is poisoned"))?;
        for request in requests.iter_mut() {
            let batch = request.committable();
            if table.contains_key(&batch.id) {
                request.signal_already_committed();
            } else {
                table.insert(batch.id.clone(), batch.lines.clone());
                request.signal_committed();
            }
        }
        Ok(())
    }
}
