//! Any sink as a sink of the service's events: [`EventSink`] wraps a sink
//! whose records can be made from an [`Event`] (a Delta or Iceberg table's
//! row, a Kafka message) and turns each event into one on its way to the
//! writer. Every other call is passed through unchanged (the committer,
//! the global committer, the serializers, the transaction lifetime, the
//! source positions), so the wrapped sink's guarantees hold as they are.

use std::sync::Arc;
use std::time::Duration;

use sink_api::{
    async_trait, CheckpointId, CommittableOf, CommittedPositions, Durability,
    GlobalCommitterFactory, InitContext, InputOf, JobStart, PositionAdvance, Sink, SinkError,
    SinkWriter, VersionedSerializer, WriterStateOf,
};

use super::Event;

/// One row of a table destination (Delta, Iceberg): an event as JSON text
/// in the one column `event`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EventRow {
    /// The event, as `serde_json` writes it (object keys sorted).
    pub event: String,
}

impl From<Event> for EventRow {
    fn from(event: Event) -> EventRow {
        EventRow {
            event: event.0.to_string(),
        }
    }
}

/// `S`, taking the service's events. Made by the service for a destination
/// whose records are not events (`--sink delta`, `iceberg`, `kafka`);
/// given to its pipeline.
pub struct EventSink<S>(pub S);

/// The wrapped sink's writer, taking events.
pub struct EventWriter<W>(W);

#[async_trait]
impl<W> SinkWriter for EventWriter<W>
where
    W: SinkWriter,
    W::Input: From<Event>,
{
    type Input = Event;
    type Committable = W::Committable;
    type State = W::State;

    async fn write(&mut self, event: Event) -> Result<(), SinkError> {
        self.0.write(event.into()).await
    }

    async fn write_batch(&mut self, events: Vec<Event>) -> Result<(), SinkError> {
        self.0
            .write_batch(events.into_iter().map(Into::into).collect())
            .await
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.0.flush(end_of_input).await
    }

    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        self.0.carry_positions(advances)
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<W::Committable>, SinkError> {
        self.0.prepare_commit(checkpoint_id).await
    }

    async fn snapshot_state(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<W::State>, SinkError> {
        self.0.snapshot_state(checkpoint_id).await
    }

    fn durability(&mut self, checkpoint_id: CheckpointId) -> Option<Durability> {
        self.0.durability(checkpoint_id)
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        self.0.close().await
    }
}

#[async_trait]
impl<S> Sink for EventSink<S>
where
    S: Sink,
    InputOf<S>: From<Event>,
{
    type Writer = EventWriter<S::Writer>;
    type Committer = S::Committer;

    async fn on_start(
        &self,
        start: &JobStart<'_, CommittableOf<S>, WriterStateOf<S>>,
    ) -> Result<(), SinkError> {
        self.0.on_start(start).await
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<WriterStateOf<S>>,
    ) -> Result<EventWriter<S::Writer>, SinkError> {
        Ok(EventWriter(self.0.create_writer(context, restored).await?))
    }

    async fn create_committer(&self, context: &InitContext) -> Result<S::Committer, SinkError> {
        self.0.create_committer(context).await
    }

    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<CommittableOf<S>>> {
        self.0.committable_serializer()
    }

    fn global_committer(&self) -> Option<GlobalCommitterFactory<CommittableOf<S>>> {
        self.0.global_committer()
    }

    fn uncommitted_lifetime(&self) -> Option<Duration> {
        self.0.uncommitted_lifetime()
    }

    fn commits_positions(&self) -> bool {
        self.0.commits_positions()
    }

    async fn committed_positions(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        self.0.committed_positions(scope).await
    }

    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<WriterStateOf<S>>> {
        self.0.writer_state_serializer()
    }
}
