//! Arrow schemas from serde record types, shared by the sinks that write
//! columns: the Delta and Iceberg sinks, and Parquet parts in the file
//! sink. A user declares the record struct once; its fields become the
//! columns.
//!
//! ```text
//! struct Event { id: i64, ts: i64, note: Option<String> }   (serde Deserialize)
//!    ─traced (serde_arrow)─▶ id Int64, ts Int64, note Utf8 (nullable)
//!    ─declared timestamps (`timestamp("ts", Millisecond)`)─▶ ts Timestamp(µs or ms, UTC)
//!    ─checked against the format (no unsigned integers in Delta or Iceberg)─▶ the fields
//! ```
//!
//! Called by the sinks' builders when they are built, never per record: a
//! field with no column type is an error at start, naming the field and
//! the fix, not a failure at the first record. With the `cast` feature,
//! [`conform`] turns a batch decoded in the records' own types into the
//! table's (a time the records carry in milliseconds, kept in
//! microseconds).

mod trace;
pub use trace::{fields_of, record_types, Format, TraceFields};

#[cfg(feature = "cast")]
mod conform;
#[cfg(feature = "cast")]
pub use conform::conform;

/// The time units, as [`Format`] and the sinks' `timestamp` builders take
/// them (re-exported from `arrow-schema`).
pub use arrow_schema::TimeUnit;
