//! The first phase of the two-phase commit: writing and preparing.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};

use crate::{BadRecord, CheckpointId, PositionAdvance, SinkError};

/// What is left of a checkpoint after the writer handed out its committables
/// and its state: work that must be done before the checkpoint may complete,
/// but need not hold up writing (an fsync of the files just closed, of their
/// directory). Returned by [`SinkWriter::durability`]; awaited by the
/// runtime while the writer receives the next checkpoint's records. It owns
/// what it works on: the writer goes on meanwhile.
pub type Durability = Pin<Box<dyn Future<Output = Result<(), SinkError>> + Send + 'static>>;

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
///                  ─▶ at checkpoint n: flush(false) ─▶ prepare_commit(n) ─▶ snapshot_state(n) ─▶ durability(n)
///                                      (its future is awaited off the writer's path: records go on)
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
/// - What [`durability`](Self::durability) returns for checkpoint `n`
///   completes the work `n` needs before it may complete: the runtime
///   acknowledges `n` (so commits it) only after that future resolved.
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

    /// The source positions the records written since the last
    /// `prepare_commit` advance: the committables of the coming
    /// [`prepare_commit`](Self::prepare_commit) must carry them, and the
    /// committer must commit them with the data, in one atomic step, only if
    /// each split is still at the advance's `from` (see the `positions`
    /// module).
    ///
    /// Called right before `prepare_commit` (after `flush`), at every
    /// checkpoint and at end of input, when the job's source commits its
    /// positions with the data and the sink said it can
    /// ([`Sink::commits_positions`](crate::Sink::commits_positions)); with
    /// an empty list when no split moved. The records of the coming
    /// committables are exactly those of the advances: the source hands the
    /// writer nothing else. A writer that returns several committables for
    /// one checkpoint puts the advances where their commit is atomic with
    /// all of them.
    ///
    /// The default refuses: a sink that does not commit positions never has
    /// this called, since the job's build refuses it with such a source.
    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        if advances.is_empty() {
            return Ok(());
        }
        Err(SinkError::msg(
            "this sink does not commit source positions (Sink::commits_positions is false):              use a source that keeps its positions in the job's checkpoints",
        )
        .permanent())
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

    /// The work checkpoint `checkpoint_id` still needs that may run while
    /// the writer goes on writing (Flink calls it the asynchronous part of a
    /// snapshot): typically making durable what
    /// [`prepare_commit`](Self::prepare_commit) and
    /// [`snapshot_state`](Self::snapshot_state) just described, such as an
    /// fsync of the files closed and of their directories, on a thread of
    /// its own.
    ///
    /// Called once per checkpoint, right after `snapshot_state`. The runtime
    /// sends the checkpoint's acknowledgement only once the returned future
    /// resolved, and in checkpoint order; meanwhile it goes on calling
    /// [`write_batch`](Self::write_batch) with the next checkpoint's
    /// records, so the future must own what it needs and not rely on the
    /// writer. An error fails the job (as an error of `prepare_commit`
    /// would) and the checkpoint never completes; a future still pending
    /// when the job stops is dropped.
    ///
    /// Start the work before returning it (spawn it, or have it under way
    /// already) rather than in the future's first poll: the runtime polls
    /// the oldest checkpoint's future first, so work that starts only when
    /// polled runs one checkpoint after the other.
    ///
    /// The default returns `None`: `prepare_commit` and `snapshot_state` did
    /// all the work. A writer that returns a future must not rely on it for
    /// anything its committer needs before the checkpoint completes; nothing
    /// is committed before that.
    fn durability(&mut self, checkpoint_id: CheckpointId) -> Option<Durability> {
        let _ = checkpoint_id;
        None
    }

    /// Releases resources and aborts anything not handed out as a committable.
    /// Called once when the job finishes, fails or is cancelled. The default
    /// does nothing.
    async fn close(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Writes the records of `records` this sink can hold, and returns the
    /// others, refused, each with why and the record itself (its bytes as
    /// the sink would show them, JSON for a table row): a record that does
    /// not fit a table's schema, say. The refused ones are written nowhere;
    /// the job's bad-record policy skips them or sends them to its
    /// dead-letter destination.
    ///
    /// Called by the runtime instead of [`write_batch`](Self::write_batch)
    /// in a job that skips or dead-letters bad records
    /// (`JobBuilder::skip_bad_records`, `JobBuilder::dead_letters`), so
    /// that one record does not fail the others. The default refuses
    /// none: it calls `write_batch`, whose failure fails the job.
    async fn write_batch_refusing(
        &mut self,
        records: Vec<Self::Input>,
    ) -> Result<Vec<BadRecord>, SinkError> {
        self.write_batch(records).await?;
        Ok(Vec::new())
    }

    /// Writes `records`, refused on their way to this sink (a source's
    /// parse step refused them), to the sink's dead-letter destination,
    /// to be committed with the records written around them.
    ///
    /// Called by the runtime only in a job that sends bad records to a
    /// dead-letter destination (`JobBuilder::dead_letters`, whose sink
    /// implements it), between `write_batch` calls, before the barrier
    /// that follows their read. The default refuses with a permanent
    /// error: a sink without a dead-letter destination has nowhere to put
    /// them.
    async fn write_bad_records(&mut self, records: Vec<BadRecord>) -> Result<(), SinkError> {
        let first = records.first().map(ToString::to_string).unwrap_or_default();
        Err(SinkError::msg(format!(
            "this sink has no dead-letter destination for {} bad records ({first}): build the \
             job with JobBuilder::dead_letters",
            records.len()
        ))
        .permanent())
    }
}
