//! What a record must tell the sink: its columns, in table order, and its
//! values.

use tokio_postgres::types::{ToSql, Type};

/// A column the sink writes: its name in the table and its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The column's name, as in the table.
    pub name: String,
    /// The type of the values the records give (compared with the table's
    /// column type at start).
    pub ty: Type,
}

impl Column {
    /// A column named `name` of type `ty`.
    pub fn new(name: impl Into<String>, ty: Type) -> Column {
        Column {
            name: name.into(),
            ty,
        }
    }
}

/// A record the PostgreSQL sink can write as one row.
///
/// Implemented by the user for the sink's input type. The sink calls
/// [`columns`](Self::columns) once, when it connects, checks the table has
/// those columns with those types, and calls [`push_values`](Self::push_values)
/// for every record, into a buffer it reuses (no allocation per record); the
/// values must be in the order of the columns and of their types (the rows
/// travel in `COPY ... (FORMAT binary)`).
///
/// ```
/// use sinks_postgres::{Column, PgRecord, ToSql, Type};
///
/// struct Order { id: i64, customer: String }
///
/// impl PgRecord for Order {
///     fn columns() -> Vec<Column> {
///         vec![Column::new("id", Type::INT8), Column::new("customer", Type::TEXT)]
///     }
///     fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>) {
///         out.push(&self.id);
///         out.push(&self.customer);
///     }
/// }
/// ```
pub trait PgRecord: Send + Sync + 'static {
    /// The columns written, in the order of [`push_values`](Self::push_values).
    fn columns() -> Vec<Column>;
    /// Appends this record's values to `out` (given empty), one per column.
    fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>);
}
