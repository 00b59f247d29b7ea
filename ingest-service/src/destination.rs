//! Where the ingest service's events go: finished JSON-lines files (local or
//! on object storage), a PostgreSQL table (one `jsonb` row per event), a
//! Delta or Iceberg table, or a Kafka topic (one message per event).
//! Chosen by [`Config::destination`](super::Config::destination); both are
//! driven by the same pipeline, so the HTTP contract is the same.

use serde::Serialize;
use serde_json::Value;
use sinks_postgres::{Column, PgRecord, ToSql, Type};

use sink_cli::location::Location;

/// One event as the pipeline carries it: a JSON object from a request.
/// Written as one JSON line by the file sink, as one `jsonb` value by the
/// PostgreSQL sink.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Event(pub Value);

impl PgRecord for Event {
    fn columns() -> Vec<Column> {
        vec![Column::new("event", Type::JSONB)]
    }

    fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>) {
        out.push(&self.0);
    }
}

/// Where the committed events go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Destination {
    /// Finished files under [`Config::data_location`](super::Config::data_location).
    /// The default.
    #[default]
    Files,
    /// A Delta Lake table at [`Config::data_location`](super::Config::data_location)
    /// (a directory or `s3://…`) with one column `event` (the JSON text),
    /// created if missing; needs the `delta` feature.
    Delta,
    /// An Apache Iceberg table with one column `event` (the JSON text),
    /// created if missing: in an SQL catalog on SQLite over the warehouse
    /// [`Config::data_location`](super::Config::data_location) (a
    /// directory or `s3://…`), or in a REST catalog, which places it;
    /// needs the `iceberg` feature.
    Iceberg {
        /// The catalog as `--catalog` names it: `sqlite:PATH` (a local
        /// file; for a local warehouse `sqlite:<warehouse>/catalog.db` when
        /// `None`, needed with one on S3) or `rest:URL`.
        catalog: Option<String>,
        /// A REST catalog's properties (`--catalog-property KEY=VALUE`):
        /// `credential`, `token`, `warehouse`, `s3.*`, … Never printed.
        catalog_properties: Vec<(String, String)>,
        /// The table, as `NAMESPACE.NAME`.
        table: String,
    },
    /// A PostgreSQL table with one `event jsonb NOT NULL` column, created
    /// if missing; the server needs `max_prepared_transactions` of at least
    /// twice the parallelism.
    Postgres {
        /// A libpq-style connection string or `postgresql://` URL.
        url: String,
        /// The table: a plain lower-case SQL name (see [`parse_table_name`]).
        table: String,
    },
    /// A Kafka topic, one message per event (its JSON text), created if
    /// missing; readers use `isolation.level=read_committed`.
    Kafka {
        /// The brokers to start from, `host:port`, comma-separated.
        brokers: String,
        /// The topic.
        topic: String,
        /// A Kafka client properties file (TLS, SASL, compression), read
        /// when the service starts.
        kafka_config: Option<std::path::PathBuf>,
    },
}

impl Destination {
    /// Names the destination for messages, without secrets: the data
    /// location, or the table (never the connection string).
    pub fn describe(&self, data: &Location) -> String {
        match self {
            Destination::Files => data.to_string(),
            Destination::Delta => format!("the Delta table {data}"),
            Destination::Iceberg { table, .. } => format!("the Iceberg table {table} in {data}"),
            Destination::Postgres { table, .. } => format!("the PostgreSQL table {table}"),
            Destination::Kafka { brokers, topic, .. } => {
                format!("the Kafka topic {topic} on {brokers}")
            }
        }
    }
}

/// The SQL that creates the service's table when it is missing.
pub fn create_table_sql(table: &str) -> String {
    format!("CREATE TABLE IF NOT EXISTS {table} (event jsonb NOT NULL)")
}

/// Accepts a table name the service may put into SQL as it is: 1 to 63
/// bytes of `a-z`, `0-9` and `_`, not starting with a digit, optionally
/// prefixed by a schema of the same form (`schema.table`). Used by the
/// `--table` flag.
pub fn parse_table_name(text: &str) -> Result<String, String> {
    let plain = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && !part.starts_with(|c: char| c.is_ascii_digit())
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|part| plain(part)) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "'{text}' is not a plain table name: use lower-case letters, digits and _, \
             at most 63 of them, optionally as schema.table"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_sql_names_or_refused() {
        for good in ["events", "ingest_events", "app.events", "e2"] {
            assert_eq!(parse_table_name(good).as_deref(), Ok(good));
        }
        for bad in [
            "",
            "Events",
            "2e",
            "a;drop table x",
            "a.b.c",
            "a b",
            "\"x\"",
        ] {
            assert!(parse_table_name(bad).is_err(), "{bad} accepted");
        }
    }
}
