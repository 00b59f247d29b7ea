//! The ingest service's Apache Iceberg destination (`--sink iceberg`, built
//! with the `iceberg` feature): each event is a row of an Iceberg table
//! with one column, `event`, its JSON text, appended by the Iceberg sink's
//! global committer in one snapshot per checkpoint. The table is in an SQL
//! catalog on SQLite (the one PyIceberg's `SqlCatalog("default", …)`
//! reads, a local file), its files in the data directory or under the
//! `s3://` data location; or in a REST catalog (`--catalog rest:URL`),
//! which places it.
//!
//! [`EventTable`] is the Iceberg sink taking events ([`EventSink`]): each
//! event becomes an [`EventRow`], every other call is passed through, so
//! the sink's guarantees (replays recognised from the table's properties,
//! each start fencing the older ones) hold unchanged. A ticket resolves
//! only after the append, so a 200 means "in the table".

use sink_api::SinkError;
use sinks_iceberg::iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use sinks_iceberg::iceberg::TableIdent;
use sinks_iceberg::{IcebergCatalog, IcebergSink};

use crate::event_sink::{EventRow, EventSink};

/// The table's columns: `event`, a required string.
pub fn schema() -> Result<Schema, SinkError> {
    Schema::builder()
        .with_fields(vec![NestedField::required(
            1,
            "event",
            Type::Primitive(PrimitiveType::String),
        )
        .into()])
        .build()
        .map_err(|e| SinkError::other("describing the events table", e).permanent())
}

/// The Iceberg sink taking the service's events. Made by the service from
/// its data directory, `--catalog` and `--table` ([`EventTable::new`]);
/// given to its pipeline.
pub type EventTable = EventSink<IcebergSink<EventRow>>;

impl EventSink<IcebergSink<EventRow>> {
    /// The sink the service writes with: the table `table` of `catalog`
    /// with [`schema`], the Iceberg sink's defaults otherwise. Called by
    /// `IngestService::start`.
    pub fn new(
        catalog: impl Into<IcebergCatalog>,
        table: TableIdent,
    ) -> Result<EventTable, SinkError> {
        Ok(EventSink(
            IcebergSink::<EventRow>::builder(catalog, table, schema()?).build()?,
        ))
    }
}
