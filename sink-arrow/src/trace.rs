//! A record type's fields traced through its serde `Deserialize`
//! (serde_arrow's `from_type`), as the columns of one format.

use arrow_schema::{DataType, Field, FieldRef, TimeUnit};
use serde::de::DeserializeOwned;
use serde_arrow::schema::{SchemaLike, TracingOptions};
use sink_api::SinkError;

/// What a format stores, as the sink tracing a record type for it says.
/// Made by each sink's builder as a constant.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    /// The format's name, for messages: `"Delta"`, `"Iceberg"`, `"Parquet"`.
    pub name: &'static str,
    /// The method that declares a timestamp field, for messages:
    /// `"DeltaSinkBuilder::timestamp"`.
    pub timestamp_method: &'static str,
    /// The one unit the format keeps times in (Delta's and Iceberg's
    /// microseconds), or `None` for the unit the records carry.
    pub time_unit: Option<TimeUnit>,
    /// Whether the format has unsigned integer columns (Parquet does;
    /// Delta and Iceberg do not).
    pub unsigned: bool,
}

/// [`fields_of`] for one record type, as a function pointer: what a sink's
/// builder keeps from its `builder_from_type::<T>` until `build`, when the
/// timestamps declared meanwhile are known.
pub type TraceFields = fn(&[(String, TimeUnit)], Format) -> Result<Vec<FieldRef>, SinkError>;

/// The columns of the record type `T` in `format`: each field's Rust type
/// gives its column's type, `Option` makes it nullable, and each of
/// `timestamps` (a field holding an integer count of its unit since the
/// epoch) is a UTC timestamp column, in the format's unit.
///
/// Called by sink builders at `build`.
///
/// # Errors
/// A permanent error naming the field and the fix, for a field with no
/// column type: a `chrono::DateTime` (serde shows it as a string: store
/// it as an integer and declare it a timestamp), a value of no fixed form
/// (`serde_json::Value`), an unsigned integer where the format has none,
/// or a timestamp declared for a field that is not there.
pub fn fields_of<T: DeserializeOwned>(
    timestamps: &[(String, TimeUnit)],
    format: Format,
) -> Result<Vec<FieldRef>, SinkError> {
    let type_name = std::any::type_name::<T>();
    let mut options = TracingOptions::default()
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false)
        .bytes_as_large_binary(false)
        .map_as_struct(false);
    for (field, unit) in timestamps {
        let unit = format.time_unit.unwrap_or(*unit);
        let timestamp = Field::new(field, DataType::Timestamp(unit, Some("UTC".into())), false);
        options = options.overwrite(field, timestamp).map_err(|e| {
            SinkError::msg(format!(
                "the timestamp field {field} cannot be declared: {e}"
            ))
            .permanent()
        })?;
    }
    let fields = Vec::<FieldRef>::from_type::<T>(options).map_err(|e| {
        let message = e.to_string();
        if message.contains("unknown paths") {
            return SinkError::msg(format!(
                "{}(…) names no field of the record type {type_name}: {message}",
                format.timestamp_method
            ))
            .permanent();
        }
        let field = field_of(&message).unwrap_or("?");
        SinkError::msg(format!(
            "the record type {type_name} has no {} column type for its field {field}: {message}. \
             A time (chrono::DateTime) needs #[serde(with = \"chrono::serde::ts_milliseconds\")] \
             (or ts_microseconds) and {}(\"{field}\", TimeUnit::…); a value of no fixed form \
             (serde_json::Value) needs a type of its own",
            format.name, format.timestamp_method
        ))
        .permanent()
    })?;
    if !format.unsigned {
        if let Some(field) = fields.iter().find(|f| is_unsigned(f.data_type())) {
            return Err(SinkError::msg(format!(
                "the field {} of the record type {type_name} is an unsigned integer ({}), which \
                 {} has no type for: use a signed one (i64 holds every u32)",
                field.name(),
                field.data_type(),
                format.name,
            ))
            .permanent());
        }
    }
    Ok(fields)
}

/// The fields whose type in the records differs from their column's in
/// `format`: each declared timestamp whose unit is not the format's, as a
/// UTC timestamp of the records' unit. A sink decodes records into its
/// table's schema with these types, then [`conform`](crate::conform)s the
/// batch.
pub fn record_types(timestamps: &[(String, TimeUnit)], format: Format) -> Vec<(String, DataType)> {
    (timestamps.iter())
        .filter(|(_, unit)| format.time_unit.is_some_and(|kept| kept != *unit))
        .map(|(field, unit)| {
            (
                field.clone(),
                DataType::Timestamp(*unit, Some("UTC".into())),
            )
        })
        .collect()
}

fn is_unsigned(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64
    )
}

/// The field a tracing error names (`(path: "$.ts", …)`), if it names one.
fn field_of(message: &str) -> Option<&str> {
    let path = message.split("path: \"$.").nth(1)?;
    path.split('"').next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    const DELTA: Format = Format {
        name: "Delta",
        timestamp_method: "DeltaSinkBuilder::timestamp",
        time_unit: Some(TimeUnit::Microsecond),
        unsigned: false,
    };
    const PARQUET: Format = Format {
        name: "Parquet",
        timestamp_method: "ParquetEncoder::timestamp",
        time_unit: None,
        unsigned: true,
    };

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Event {
        id: i64,
        name: String,
        note: Option<String>,
        ts: i64,
        tags: Vec<String>,
    }

    fn shown(fields: &[FieldRef]) -> Vec<(String, String, bool)> {
        (fields.iter())
            .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
            .collect()
    }

    #[test]
    fn fields_become_columns_and_a_named_field_a_timestamp_of_the_formats_unit() {
        let ts = [("ts".to_string(), TimeUnit::Millisecond)];
        let delta = shown(&fields_of::<Event>(&ts, DELTA).unwrap());
        assert_eq!(delta[0], ("id".into(), "Int64".into(), false));
        assert_eq!(delta[1], ("name".into(), "Utf8".into(), false));
        assert_eq!(delta[2], ("note".into(), "Utf8".into(), true));
        assert_eq!(
            delta[3],
            ("ts".into(), "Timestamp(µs, \"UTC\")".into(), false)
        );
        assert!(delta[4].1.starts_with("List("), "{delta:?}");
        let parquet = shown(&fields_of::<Event>(&ts, PARQUET).unwrap());
        assert_eq!(
            parquet[3],
            ("ts".into(), "Timestamp(ms, \"UTC\")".into(), false)
        );
        assert_eq!(
            record_types(&ts, DELTA),
            vec![(
                "ts".into(),
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
            )]
        );
        assert!(record_types(&ts, PARQUET).is_empty());
    }

    #[test]
    fn what_has_no_column_type_is_refused_naming_the_field() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Unsigned {
            id: i64,
            count: u64,
        }
        let error = fields_of::<Unsigned>(&[], DELTA).unwrap_err().to_string();
        assert!(
            error.contains("field count") && error.contains("signed") && error.contains("Delta"),
            "{error}"
        );
        assert!(fields_of::<Unsigned>(&[], PARQUET).is_ok());
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Loose {
            id: i64,
            extra: serde_json::Value,
        }
        let error = fields_of::<Loose>(&[], PARQUET).unwrap_err().to_string();
        assert!(error.contains("its field extra"), "{error}");
        let missing = [("when".to_string(), TimeUnit::Millisecond)];
        let error = fields_of::<Event>(&missing, DELTA).unwrap_err().to_string();
        assert!(
            error.contains("DeltaSinkBuilder::timestamp(…) names no field")
                && error.contains("when"),
            "{error}"
        );
    }
}
