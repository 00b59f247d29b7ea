//! A batch decoded in the records' own types, cast to the table's (feature
//! `cast`).

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::SchemaRef;
use sink_api::SinkError;

/// `batch` with the columns of `table` (by name, in its order), each cast
/// to its column's type where the records carry another: a time in
/// milliseconds multiplied into microseconds. Called by writers on every
/// batch, after decoding it in the types of
/// [`record_types`](crate::record_types).
///
/// # Errors
/// A permanent error when `batch` lacks one of `table`'s columns, or when a
/// value does not fit its column's type (a time past what microseconds
/// hold), naming the column.
pub fn conform(batch: RecordBatch, table: &SchemaRef) -> Result<RecordBatch, SinkError> {
    let strict = CastOptions {
        safe: false,
        ..CastOptions::default()
    };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(table.fields().len());
    for field in table.fields() {
        let column = batch.column_by_name(field.name()).ok_or_else(|| {
            SinkError::msg(format!("the records have no column {}", field.name())).permanent()
        })?;
        let column = match column.data_type() == field.data_type() {
            true => column.clone(),
            false => cast_with_options(column, field.data_type(), &strict).map_err(|e| {
                SinkError::msg(format!(
                    "a value of the column {} does not fit its type {}: {e}",
                    field.name(),
                    field.data_type()
                ))
                .permanent()
            })?,
        };
        columns.push(column);
    }
    RecordBatch::try_new(Arc::clone(table), columns)
        .map_err(|e| SinkError::other("making a batch of the table's schema", e).permanent())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, TimestampMicrosecondArray, TimestampMillisecondArray};
    use arrow_schema::{DataType, Field, Schema, TimeUnit};

    #[test]
    fn a_time_in_milliseconds_becomes_microseconds_and_one_past_their_range_is_refused() {
        let utc = Some("UTC".into());
        let table = Arc::new(Schema::new(vec![
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, utc.clone()),
                false,
            ),
            Field::new("id", DataType::Int64, false),
        ]));
        let records = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Millisecond, utc.clone()),
                false,
            ),
        ]));
        let batch = |ms: i64| {
            RecordBatch::try_new(
                records.clone(),
                vec![
                    Arc::new(Int64Array::from(vec![7])),
                    Arc::new(TimestampMillisecondArray::from(vec![ms]).with_timezone("UTC")),
                ],
            )
            .unwrap()
        };
        let conformed = conform(batch(1_700_000_000_123), &table).unwrap();
        assert_eq!(conformed.schema(), table);
        let micros = conformed
            .column(0)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        assert_eq!(micros.value(0), 1_700_000_000_123_000);
        let error = conform(batch(i64::MAX / 10), &table)
            .unwrap_err()
            .to_string();
        assert!(error.contains("column ts"), "{error}");
    }
}
