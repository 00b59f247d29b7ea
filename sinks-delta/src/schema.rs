//! The table's columns from the record type, so that the struct is declared
//! once: [`DeltaSink::builder_from_type`](crate::DeltaSink::builder_from_type).
//!
//! The record type's fields are traced through its serde `Deserialize`
//! (serde_arrow's `from_type`): a field's Rust type gives its column's
//! type, `Option` a nullable column. What has no column type of its own is
//! refused when the sink is built, naming the field and the fix:
//!
//! - a time (`chrono::DateTime`) has no form serde can tell from a string:
//!   store it as an integer (`#[serde(with = "chrono::serde::ts_milliseconds")]`
//!   or `ts_microseconds`) and name its unit with
//!   [`timestamp`](crate::DeltaSinkBuilder::timestamp);
//! - an unsigned integer, which Delta has no type for: use a signed one;
//! - a value whose type says nothing of its form (`serde_json::Value`).

use arrow_schema::{DataType, FieldRef, Schema, TimeUnit};
use serde::de::DeserializeOwned;
use serde_arrow::schema::{SchemaLike, TracingOptions};
use sink_api::SinkError;

/// The fields of `T`, with the named fields made timestamps (UTC, in
/// microseconds, Delta's unit). Called by the builder's `build`.
pub(crate) fn traced<T: DeserializeOwned>(
    timestamps: &[(String, TimeUnit)],
) -> Result<Schema, SinkError> {
    let type_name = std::any::type_name::<T>();
    let mut options = TracingOptions::default()
        .strings_as_large_utf8(false)
        .sequence_as_large_list(false)
        .bytes_as_large_binary(false)
        .map_as_struct(false);
    // The table keeps every time in microseconds, Delta's only unit; the
    // writers convert the records' own (`Derived`).
    for (field, _) in timestamps {
        let timestamp = arrow_schema::Field::new(
            field,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        );
        options = options.overwrite(field, timestamp).map_err(|e| {
            SinkError::msg(format!(
                "the timestamp field {field} cannot be declared: {e}"
            ))
            .permanent()
        })?;
    }
    let fields = Vec::<FieldRef>::from_type::<T>(options).map_err(|e| {
        let message = e.to_string();
        let field = field_of(&message).unwrap_or("?");
        SinkError::msg(format!(
            "the record type {type_name} has no column type for its field {field}: {message}. A \
             time (chrono::DateTime) needs #[serde(with = \"chrono::serde::ts_milliseconds\")] \
             (or ts_microseconds) and DeltaSinkBuilder::timestamp(\"{field}\", TimeUnit::…); a \
             value of no fixed form (serde_json::Value) needs a type of its own"
        ))
        .permanent()
    })?;
    for field in &fields {
        if let DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 =
            field.data_type()
        {
            return Err(SinkError::msg(format!(
                "the field {} of the record type {type_name} is an unsigned integer \
                 ({}), which Delta has no type for: use a signed one (i64 holds every u32)",
                field.name(),
                field.data_type()
            ))
            .permanent());
        }
    }
    Ok(Schema::new(fields))
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

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Event {
        id: i64,
        name: String,
        note: Option<String>,
        ts: i64,
        tags: Vec<String>,
    }

    #[test]
    fn fields_become_columns_and_a_named_field_a_timestamp() {
        let schema = traced::<Event>(&[("ts".into(), TimeUnit::Millisecond)]).unwrap();
        let shown: Vec<(String, String, bool)> = (schema.fields().iter())
            .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
            .collect();
        assert_eq!(shown[0], ("id".into(), "Int64".into(), false));
        assert_eq!(shown[1], ("name".into(), "Utf8".into(), false));
        assert_eq!(shown[2], ("note".into(), "Utf8".into(), true));
        assert_eq!(
            shown[3],
            ("ts".into(), "Timestamp(µs, \"UTC\")".into(), false)
        );
        assert!(shown[4].1.starts_with("List("), "{shown:?}");
    }

    #[test]
    fn what_has_no_column_type_is_refused_naming_the_field() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Unsigned {
            id: i64,
            count: u64,
        }
        let error = traced::<Unsigned>(&[]).unwrap_err().to_string();
        assert!(
            error.contains("field count") && error.contains("signed"),
            "{error}"
        );
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Loose {
            id: i64,
            extra: serde_json::Value,
        }
        let error = traced::<Loose>(&[]).unwrap_err().to_string();
        assert!(error.contains("its field extra"), "{error}");
    }
}
