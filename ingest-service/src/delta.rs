//! The ingest service's Delta Lake destination (`--sink delta`, built with
//! the `delta` feature): each event is a row of a Delta table with one
//! column, `event`, its JSON text, committed by the Delta sink's global
//! committer in one table transaction per checkpoint.
//!
//! The Delta sink takes records whose fields are the table's columns; the
//! service's events are arbitrary JSON objects. [`EventTable`] adapts one
//! to the other: it is the Delta sink with a writer that turns each
//! [`Event`] into an [`EventRow`], and every other call passed through, so
//! the sink's guarantees (replays recognised from the log, each start
//! fencing the older ones in the table) hold unchanged.
//!
//! A ticket resolves only after the table transaction (the runtime holds
//! a source's commit notices until the global committer committed), so a
//! 200 means "in the table".

use std::sync::Arc;

use serde::Serialize;
use sink_api::{
    async_trait, CheckpointId, Durability, GlobalCommitterFactory, InitContext, JobStart, Sink,
    SinkError, SinkWriter, VersionedSerializer,
};
use sinks_delta::arrow_schema::{DataType, Field, Schema};
use sinks_delta::{
    DeltaCommittable, DeltaFileCommitter, DeltaSink, DeltaSinkWriter, NoResume, TableLocation,
};

use super::Event;

/// One row of the service's table: an event as JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

/// The table's columns: `event`, a non-null string.
pub fn schema() -> Schema {
    Schema::new(vec![Field::new("event", DataType::Utf8, false)])
}

/// The Delta sink taking the service's events. Made by the service from
/// its data location ([`EventTable::new`]); given to its pipeline.
pub struct EventTable(pub DeltaSink<EventRow>);

impl EventTable {
    /// The sink the service writes with: a table at `location` with
    /// [`schema`], the Delta sink's defaults otherwise. Called by
    /// `IngestService::start`, and by the test that certifies it with
    /// sink-testkit. Fails when the sink refuses its configuration.
    pub fn new(location: TableLocation) -> Result<EventTable, SinkError> {
        Ok(EventTable(
            DeltaSink::<EventRow>::builder(location, schema()).build()?,
        ))
    }
}

/// The Delta sink's writer, taking events.
pub struct EventTableWriter(DeltaSinkWriter<EventRow>);

#[async_trait]
impl SinkWriter for EventTableWriter {
    type Input = Event;
    type Committable = DeltaCommittable;
    type State = NoResume;

    async fn write(&mut self, record: Event) -> Result<(), SinkError> {
        self.0.write(record.into()).await
    }

    async fn write_batch(&mut self, records: Vec<Event>) -> Result<(), SinkError> {
        self.0
            .write_batch(records.into_iter().map(EventRow::from).collect())
            .await
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.0.flush(end_of_input).await
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<DeltaCommittable>, SinkError> {
        self.0.prepare_commit(checkpoint_id).await
    }

    async fn snapshot_state(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<NoResume>, SinkError> {
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
impl Sink for EventTable {
    type Writer = EventTableWriter;
    type Committer = DeltaFileCommitter;

    async fn on_start(
        &self,
        start: &JobStart<'_, DeltaCommittable, NoResume>,
    ) -> Result<(), SinkError> {
        self.0.on_start(start).await
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<NoResume>,
    ) -> Result<EventTableWriter, SinkError> {
        Ok(EventTableWriter(
            self.0.create_writer(context, restored).await?,
        ))
    }

    async fn create_committer(
        &self,
        context: &InitContext,
    ) -> Result<DeltaFileCommitter, SinkError> {
        self.0.create_committer(context).await
    }

    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<DeltaCommittable>> {
        self.0.committable_serializer()
    }

    fn global_committer(&self) -> Option<GlobalCommitterFactory<DeltaCommittable>> {
        self.0.global_committer()
    }

    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<NoResume>> {
        self.0.writer_state_serializer()
    }
}
