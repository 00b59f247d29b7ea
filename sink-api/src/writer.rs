//! The first phase of the two-phase commit: writing and preparing.

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};

use crate::{CheckpointId, SinkError};

/// Writes records of one subtask and turns them into committables.
///
/// Created by [`Sink::create_writer`](crate::Sink::create_writer), once per
/// subtask and per start of the job; driven by one runtime task, so its methods
/// are never called concurrently.
///
/// # Call sequence
///
/// ```text
/// create_writer ─▶ ( write | write_batch )*
///                  ─▶ at checkpoint n: flush(false) ─▶ prepare_commit(n) ─▶ snapshot_state(n)
///                  ─▶ … more records and checkpoints …
///                  ─▶ at end of input, once: flush(true) ─▶ prepare_commit(last n + 1)
///                  ─▶ after end of input: only snapshot_state(m) (an empty writer)
///                  ─▶ close
/// ```
///
/// # Guarantees the writer must give
///
/// - Records written before `prepare_commit` are covered by the committables it
///   returns or by the state `snapshot_state` returns right after it; none is
///   lost at a checkpoint.
/// - Nothing it writes is visible to readers before its committable is
///   committed by the [`Committer`](crate::Committer).
/// - **No new transaction after end of input.** After `flush(true)` and the
///   final `prepare_commit`, the runtime sends no more records and never calls
///   `prepare_commit` again; the writer must not open a transaction, a file or
///   anything else that would need a commit (Flink's FLINK-23473).
#[async_trait]
pub trait SinkWriter: Send + 'static {
    /// The records this writer accepts.
    type Input: Send + 'static;
    /// What [`prepare_commit`](Self::prepare_commit) returns: a description of
    /// written, not yet visible data (a pending file, a prepared transaction).
    /// Stored in checkpoints until committed, through the sink's
    /// [committable serializer](crate::Sink::committable_serializer).
    type Committable: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What [`snapshot_state`](Self::snapshot_state) returns: enough to resume
    /// writing after a restore (an in-progress file and its length); `()`
    /// for a writer that keeps nothing between checkpoints. Stored in
    /// checkpoints through the sink's
    /// [writer-state serializer](crate::Sink::writer_state_serializer).
    type State: Serialize + DeserializeOwned + Send + Sync + 'static;

    /// Writes one record. Called for every record of this subtask, in order,
    /// unless the runtime hands over a batch through
    /// [`write_batch`](Self::write_batch).
    async fn write(&mut self, record: Self::Input) -> Result<(), SinkError>;

    /// Writes a batch of records, in order. The runtime prefers this method;
    /// the default loops over [`write`](Self::write). Override it when a batch
    /// can be written faster than its records one by one.
    async fn write_batch(&mut self, records: Vec<Self::Input>) -> Result<(), SinkError> {
        for record in records {
            self.write(record).await?;
        }
        Ok(())
    }

    /// Pushes buffered records towards their transaction. Called right before
    /// every [`prepare_commit`](Self::prepare_commit); `end_of_input` is true
    /// exactly once, at the end of a bounded input. The default does
    /// nothing: enough for a writer whose `prepare_commit` takes everything.
    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        let _ = end_of_input;
        Ok(())
    }

    /// Closes the current transaction (or set of them) and returns what must be
    /// committed. Called at every checkpoint `checkpoint_id` before the
    /// barrier moves on, and once at end of input with the id the final
    /// committables are tagged with (the last barrier's plus one); never after
    /// end of input.
    ///
    /// `checkpoint_id` grows with every call of one writer, and a restored
    /// writer's first call gets an id larger than the restored checkpoint's:
    /// with [`InitContext::lineage`](crate::InitContext::lineage), the
    /// generation and the subtask, it names the committables uniquely.
    ///
    /// Each returned committable will be committed at most once per attempt, and
    /// again after a crash if the commit was not recorded: it must be
    /// committable idempotently.
    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<Self::Committable>, SinkError>;

    /// Returns the state needed to resume writing after a restore from
    /// checkpoint `checkpoint_id`. Called once per checkpoint, right after
    /// [`prepare_commit`](Self::prepare_commit) (or alone after end of input,
    /// when the writer should have nothing left to snapshot).
    ///
    /// The default returns no state: right only for a writer whose
    /// `prepare_commit` hands out every record written so far (the kit's
    /// crash scenarios catch one that keeps records back and loses them).
    async fn snapshot_state(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<Self::State>, SinkError> {
        let _ = checkpoint_id;
        Ok(Vec::new())
    }

    /// Releases resources and aborts anything not handed out as a committable.
    /// Called once when the job finishes, fails or is cancelled. The default
    /// does nothing.
    async fn close(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
