//! The factory a sink author implements: it makes writers and committers.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};

use crate::{
    BincodeSerializer, Committer, InitContext, JobStart, SinkError, SinkWriter, VersionedSerializer,
};

/// A two-phase-commit sink: the factory of its writers and committers.
///
/// Given to the job builder by the user; the runtime calls it at every start
/// of the job: the first, every restart after a failure, and every restore
/// from a checkpoint. It is shared by all subtasks, hence `Sync`.
///
/// # What the runtime calls, and when
///
/// - [`on_start`](Self::on_start): once per start, before any writer or
///   committer of that start exists, with what the restored checkpoint
///   holds. Defaults to doing nothing.
/// - [`create_writer`](Self::create_writer): once per subtask and start, with
///   the writer states restored for that subtask (empty on a fresh start).
/// - [`create_committer`](Self::create_committer): once per subtask and start.
/// - [`committable_serializer`](Self::committable_serializer) and
///   [`writer_state_serializer`](Self::writer_state_serializer): once per
///   start, to put committables and writer states into checkpoints and read
///   them back. Both default to [`BincodeSerializer`] at format version 1.
///
/// # Example
///
/// A sink that collects lines in a shared vector (a complete, idempotent sink
/// lives in `examples/src/table_sink.rs`, run by `cargo run -p examples --bin
/// custom-sink`):
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use async_trait::async_trait;
/// use sink_api::*;
///
/// struct VecSink(Arc<Mutex<Vec<String>>>);
/// struct VecWriter(Vec<String>);
/// struct VecCommitter(Arc<Mutex<Vec<String>>>);
///
/// #[async_trait]
/// impl Sink for VecSink {
///     type Input = String;
///     type Committable = Vec<String>;
///     type WriterState = Vec<String>;
///     type Writer = VecWriter;
///     type Committer = VecCommitter;
///     async fn create_writer(&self, _: &InitContext, restored: Vec<Vec<String>>) -> Result<VecWriter, SinkError> {
///         Ok(VecWriter(restored.concat()))
///     }
///     async fn create_committer(&self, _: &InitContext) -> Result<VecCommitter, SinkError> {
///         Ok(VecCommitter(self.0.clone()))
///     }
/// }
///
/// #[async_trait]
/// impl SinkWriter for VecWriter {
///     type Input = String;
///     type Committable = Vec<String>;
///     type State = Vec<String>;
///     async fn write(&mut self, line: String) -> Result<(), SinkError> { self.0.push(line); Ok(()) }
///     async fn flush(&mut self, _end_of_input: bool) -> Result<(), SinkError> { Ok(()) }
///     async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<Vec<String>>, SinkError> {
///         Ok(vec![std::mem::take(&mut self.0)])
///     }
///     async fn snapshot_state(&mut self, _: CheckpointId) -> Result<Vec<Vec<String>>, SinkError> {
///         Ok(vec![self.0.clone()])
///     }
/// }
///
/// #[async_trait]
/// impl Committer for VecCommitter {
///     type Committable = Vec<String>;
///     async fn commit(&mut self, requests: &mut [CommitRequest<Vec<String>>]) -> Result<(), SinkError> {
///         // Not idempotent: a real sink must recognise a replayed committable.
///         for request in requests.iter_mut() {
///             self.0.lock().unwrap().extend(request.committable().iter().cloned());
///             request.signal_committed();
///         }
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// The records the sink accepts.
    type Input: Send + 'static;
    /// What writers hand to committers; stored in checkpoints until committed.
    type Committable: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What writers snapshot at each checkpoint; stored in checkpoints.
    type WriterState: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The writer this sink creates.
    type Writer: SinkWriter<
        Input = Self::Input,
        Committable = Self::Committable,
        State = Self::WriterState,
    >;
    /// The committer this sink creates.
    type Committer: Committer<Committable = Self::Committable>;

    /// Called once per start of the job (the first, every restart, every
    /// restore, with or without a change of parallelism), before any writer
    /// or committer of that start is created, and while none of an earlier
    /// start runs any more in this process.
    ///
    /// The place to clean up what earlier starts of this lineage left in
    /// the destination and no restored checkpoint refers to: prepared
    /// transactions, hidden files, multipart uploads. What `start` lists
    /// ([`JobStart::restored_committables`], [`JobStart::restored_writer_states`])
    /// must be kept: it is committed again or resumed after this call.
    /// Leave alone what belongs to other lineages or other jobs unless the
    /// sink can prove it is abandoned.
    ///
    /// An error fails this start: a transient one is retried under the
    /// job's restart strategy, a [permanent](SinkError::permanent) one fails
    /// the job.
    async fn on_start(
        &self,
        start: &JobStart<'_, Self::Committable, Self::WriterState>,
    ) -> Result<(), SinkError> {
        let _ = start;
        Ok(())
    }

    /// Creates the writer of one subtask. `restored_states` holds the writer
    /// states the runtime assigned to this subtask from the checkpoint the job
    /// resumed from (empty on a fresh start; possibly states of several former
    /// subtasks after a change of parallelism).
    async fn create_writer(
        &self,
        context: &InitContext,
        restored_states: Vec<Self::WriterState>,
    ) -> Result<Self::Writer, SinkError>;

    /// Creates the committer of one subtask.
    async fn create_committer(&self, context: &InitContext) -> Result<Self::Committer, SinkError>;

    /// The serializer for committables in checkpoints.
    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<Self::Committable>> {
        Arc::new(BincodeSerializer::<Self::Committable>::default())
    }

    /// The serializer for writer states in checkpoints.
    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<Self::WriterState>> {
        Arc::new(BincodeSerializer::<Self::WriterState>::default())
    }
}
