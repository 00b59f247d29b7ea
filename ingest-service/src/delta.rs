//! The ingest service's Delta Lake destination (`--sink delta`, built with
//! the `delta` feature): each event is a row of a Delta table with one
//! column, `event`, its JSON text, committed by the Delta sink's global
//! committer in one table transaction per checkpoint.
//!
//! The Delta sink takes records whose fields are the table's columns; the
//! service's events are arbitrary JSON objects. [`EventTable`] adapts one
//! to the other ([`EventSink`]): each event becomes an [`EventRow`], and
//! every other call is passed through, so the sink's guarantees (replays
//! recognised from the log, each start fencing the older ones in the
//! table) hold unchanged.
//!
//! A ticket resolves only after the table transaction (the runtime holds
//! a source's commit notices until the global committer committed), so a
//! 200 means "in the table".

use sink_api::SinkError;
use sinks_delta::arrow_schema::{DataType, Field, Schema};
use sinks_delta::{DeltaSink, TableLocation};

use crate::event_sink::{EventRow, EventSink};

/// The table's columns: `event`, a non-null string.
pub fn schema() -> Schema {
    Schema::new(vec![Field::new("event", DataType::Utf8, false)])
}

/// The Delta sink taking the service's events. Made by the service from
/// its data location ([`EventTable::new`]); given to its pipeline.
pub type EventTable = EventSink<DeltaSink<EventRow>>;

impl EventSink<DeltaSink<EventRow>> {
    /// The sink the service writes with: a table at `location` with
    /// [`schema`], the Delta sink's defaults otherwise. Called by
    /// `IngestService::start`, and by the test that certifies it with
    /// sink-testkit. Fails when the sink refuses its configuration.
    pub fn new(location: TableLocation) -> Result<EventTable, SinkError> {
        Ok(EventSink(
            DeltaSink::<EventRow>::builder(location, schema()).build()?,
        ))
    }
}
