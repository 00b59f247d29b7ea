//! The factory a sink author implements: it makes writers and committers.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    BincodeSerializer, CommittedPositions, Committer, GlobalCommitterFactory, InitContext,
    JobStart, SinkError, SinkWriter, VersionedSerializer,
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
/// - [`global_committer`](Self::global_committer): once, when the job is
///   built. A sink whose data becomes visible only in a job-wide step (a
///   table format's one commit per checkpoint) returns its global committer
///   there, so no job can run it without one.
///
/// # Example
///
/// A sink that collects lines in a shared vector (a complete, idempotent sink
/// lives in `examples/src/table_sink.rs`, run by `cargo run -p examples --bin
/// custom-sink`). The sink names its writer and committer; their associated
/// types are the sink's. `flush` and `snapshot_state` keep their defaults.
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
///     type Writer = VecWriter;
///     type Committer = VecCommitter;
///     async fn create_writer(&self, _: &InitContext, _: Vec<()>) -> Result<VecWriter, SinkError> {
///         Ok(VecWriter(Vec::new()))
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
///     type State = (); // prepare_commit takes everything: nothing to snapshot
///     async fn write(&mut self, line: String) -> Result<(), SinkError> { self.0.push(line); Ok(()) }
///     async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<Vec<String>>, SinkError> {
///         Ok(vec![std::mem::take(&mut self.0)])
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
    /// The writer this sink creates; its associated types are the sink's
    /// (see [`InputOf`], [`CommittableOf`], [`WriterStateOf`]).
    type Writer: SinkWriter;
    /// The committer this sink creates, of the writer's committables. A sink
    /// without a second phase names [`NoCommitter`](crate::NoCommitter).
    type Committer: Committer<Committable = CommittableOf<Self>>;

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
        start: &JobStart<'_, CommittableOf<Self>, WriterStateOf<Self>>,
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
        restored_states: Vec<WriterStateOf<Self>>,
    ) -> Result<Self::Writer, SinkError>;

    /// Creates the committer of one subtask.
    async fn create_committer(&self, context: &InitContext) -> Result<Self::Committer, SinkError>;

    /// Why some records may still be out of the destination's readers'
    /// sight after their commit returned, in a job that promises
    /// [visible commits](crate::InitContext::visible_commits), with the fix
    /// in words; `None` (the default) when every commit makes what it
    /// covers visible, as a transaction's commit does.
    ///
    /// Read by the job builder of such a job (a pipeline, whose tickets
    /// mean "visible"), which refuses the sink with this message. A sink
    /// that defers visibility only by default (a file sink's rolling
    /// policy left unset) returns `None` and publishes at every commit
    /// when its [context](crate::InitContext::visible_commits) asks; a
    /// sink that wraps another returns the other's.
    fn deferred_visibility(&self) -> Option<String> {
        None
    }

    /// The serializer for committables in checkpoints.
    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<CommittableOf<Self>>> {
        Arc::new(BincodeSerializer::<CommittableOf<Self>>::default())
    }

    /// The global committer this sink needs, or `None` (the default) for a
    /// sink whose committers alone make data visible.
    ///
    /// Called by the job builder once; the factory it returns is called once
    /// per start of the job. A sink that returns one cannot be given another
    /// through the job builder (the build is refused). Return one when
    /// committed data is not visible until a job-wide step acts on every
    /// subtask's committables (the Delta sink's one table transaction per
    /// checkpoint): a job that left it out would commit files no reader
    /// ever sees.
    fn global_committer(&self) -> Option<GlobalCommitterFactory<CommittableOf<Self>>> {
        None
    }

    /// How long the destination keeps data this sink wrote uncommitted,
    /// from the first record of a committable to its commit, before it
    /// drops it by itself (a Kafka transaction's timeout); `None` (the
    /// default): until the sink commits it or cleans it up.
    ///
    /// Called by the job builder once. When it returns a duration, the
    /// build refuses checkpoint settings under which a committable could
    /// wait longer for its commit: the longest checkpoint interval, plus
    /// the checkpoint timeout, plus every backoff of the commit retry
    /// policy. A committable the destination dropped before its commit is
    /// data lost; the build's refusal names the setting to change.
    fn uncommitted_lifetime(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether this sink commits source positions with its data: its
    /// writers take [`SinkWriter::carry_positions`], its committers commit
    /// them atomically with the data only from where the destination has
    /// them (signalling [`superseded`](crate::CommitRequest::signal_superseded)
    /// otherwise), and [`committed_positions`](Self::committed_positions)
    /// reads them back. `false` by default.
    ///
    /// The committers are where data and positions become visible together:
    /// the runtime starts such a source once every subtask's committer
    /// committed the restored checkpoint again, and reads the positions
    /// then. A global committer the sink brings may act on what the
    /// committers committed (merge files, say) but must not be where the
    /// data becomes visible: its commits are not waited for.
    ///
    /// Read by the job builder: a source whose positions must be committed
    /// with the data (one that can move splits between instances of the
    /// job, such as a Kafka consumer group) is refused with a sink that
    /// cannot.
    fn commits_positions(&self) -> bool {
        false
    }

    /// The positions the destination holds for `scope`: each split's next
    /// offset to read, as the last commit that carried it left it.
    ///
    /// Called by the runtime at every start, once the restored checkpoint's
    /// committables are committed again, so that each split is read from
    /// where the destination's data of it ends (whoever committed it); and
    /// by sources when splits are assigned to them while the job runs. Must
    /// read the destination, never a cache: another instance may have
    /// committed since. An unknown split is absent (read from its start).
    ///
    /// The default refuses, naming [`commits_positions`](Self::commits_positions).
    async fn committed_positions(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        Err(SinkError::msg(format!(
            "this sink does not commit source positions, so it cannot say where the data of              {scope:?} ends (Sink::commits_positions is false)"
        ))
        .permanent())
    }

    /// The serializer for writer states in checkpoints.
    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<WriterStateOf<Self>>> {
        Arc::new(BincodeSerializer::<WriterStateOf<Self>>::default())
    }
}

/// The records sink `S` accepts: its writer's input.
pub type InputOf<S> = <<S as Sink>::Writer as SinkWriter>::Input;

/// What sink `S`'s writers hand to its committers, and checkpoints keep
/// until committed: its writer's committable.
pub type CommittableOf<S> = <<S as Sink>::Writer as SinkWriter>::Committable;

/// What sink `S`'s writers snapshot at each checkpoint: its writer's state.
pub type WriterStateOf<S> = <<S as Sink>::Writer as SinkWriter>::State;
