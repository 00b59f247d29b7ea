//! Partition columns computed from another column of the record, so that a
//! user partitions a table by the day of an event's time without a field
//! of their own for it: `partition_by_day("day", "ts")`.
//!
//! The records carry the source column only. Each writer decodes them into
//! the table's schema without the derived columns, then adds each derived
//! column, computed with arrow's cast kernel, before the rows go to the
//! Parquet writer, which files them under their partition
//! (`day=2026-12-01/`). A replayed record gets the same value: the
//! derivation depends on the record alone.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use sink_api::SinkError;

/// How a derived column is computed from its source column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Derivation {
    /// The date (UTC for a timestamp with a time zone) of a timestamp or
    /// date column, as a `date` column.
    Day,
}

/// A column of the table computed from another. Made by
/// [`DeltaSinkBuilder::partition_by_day`](crate::DeltaSinkBuilder::partition_by_day).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DerivedColumn {
    pub name: String,
    pub source: String,
    pub derivation: Derivation,
}

impl DerivedColumn {
    /// Its field in the table's schema, given its source's field; or why
    /// the source cannot be derived from.
    pub(crate) fn field(&self, source: &Field) -> Result<Field, String> {
        match (self.derivation, source.data_type()) {
            (Derivation::Day, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64) => Ok(
                Field::new(&self.name, DataType::Date32, source.is_nullable()),
            ),
            (Derivation::Day, other) => Err(format!(
                "the partition column {} is the day of {}, which is of type {other}, not a \
                 timestamp or a date",
                self.name, self.source
            )),
        }
    }
}

/// The derived columns of a table, and the two schemas: the table's, and
/// the records' (the table's without the derived columns, and with the
/// records' own types where they differ: a time in milliseconds where the
/// table keeps microseconds). Shared by the sink's writers.
#[derive(Debug)]
pub(crate) struct Derived {
    columns: Vec<DerivedColumn>,
    table: SchemaRef,
    records: SchemaRef,
}

impl Derived {
    /// The derived `columns` of `table` (which holds them), the records
    /// carrying the fields of `record_types` in those types.
    pub(crate) fn new(
        columns: Vec<DerivedColumn>,
        table: SchemaRef,
        record_types: &[(String, DataType)],
    ) -> Derived {
        let records = Arc::new(Schema::new(
            (table.fields().iter())
                .filter(|f| !columns.iter().any(|c| &c.name == f.name()))
                .map(
                    |f| match record_types.iter().find(|(name, _)| name == f.name()) {
                        Some((_, data_type)) => {
                            Arc::new(f.as_ref().clone().with_data_type(data_type.clone()))
                        }
                        None => f.clone(),
                    },
                )
                .collect::<Vec<_>>(),
        ));
        Derived {
            columns,
            table,
            records,
        }
    }

    /// The schema records are decoded into.
    pub(crate) fn record_schema(&self) -> SchemaRef {
        self.records.clone()
    }

    /// `batch`, of the [record schema](Self::record_schema), with the
    /// derived columns added, then conformed to the table's schema
    /// ([`sink_arrow::conform`]: its column order, and the table's types
    /// where the records carry others; a time past what the table's
    /// microseconds hold is an error naming its column).
    pub(crate) fn complete(&self, batch: RecordBatch) -> Result<RecordBatch, SinkError> {
        let failed = |e| SinkError::other("computing a derived partition column", e).permanent();
        let mut fields: Vec<FieldRef> = batch.schema().fields().iter().cloned().collect();
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        for derived in &self.columns {
            let source = batch.column_by_name(&derived.source).ok_or_else(|| {
                SinkError::msg(format!(
                    "the records have no column {} to derive {} from",
                    derived.source, derived.name
                ))
                .permanent()
            })?;
            let field = self.table.field_with_name(&derived.name).map_err(failed)?;
            columns.push(arrow_cast::cast(source, field.data_type()).map_err(failed)?);
            fields.push(Arc::new(field.clone()));
        }
        let with_derived =
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(failed)?;
        sink_arrow::conform(with_derived, &self.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Date32Array, Int64Array, TimestampMicrosecondArray};
    use arrow_schema::TimeUnit;

    #[test]
    fn the_day_of_a_timestamp_is_added_in_the_tables_column_order() {
        let day = DerivedColumn {
            name: "day".into(),
            source: "ts".into(),
            derivation: Derivation::Day,
        };
        let ts = Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        );
        let table = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            ts.clone(),
            day.field(&ts).unwrap(),
        ]));
        let derived = Derived::new(vec![day.clone()], table.clone(), &[]);
        assert_eq!(derived.record_schema().fields().len(), 2);
        let hour = 3_600_000_000;
        let micros = TimestampMicrosecondArray::from(vec![0, 23 * hour, 24 * hour, 50 * hour])
            .with_timezone("UTC");
        let batch = RecordBatch::try_new(
            derived.record_schema(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(micros),
            ],
        )
        .unwrap();
        let complete = derived.complete(batch).unwrap();
        assert_eq!(complete.schema(), table);
        let days = complete
            .column(2)
            .as_any()
            .downcast_ref::<Date32Array>()
            .unwrap();
        assert_eq!(days.values().to_vec(), vec![0, 0, 1, 2]);
        assert_eq!(days.null_count(), 0);
        let text = Field::new("ts", DataType::Utf8, false);
        assert!(day.field(&text).unwrap_err().contains("not a timestamp"));
    }
}
