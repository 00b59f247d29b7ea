//! Partitioned tables: the spec the sink creates a table with, written as
//! programs take it (`day(ts),bucket(4,id)`), and checked against the spec
//! of a table that exists.
//!
//! ```text
//! "day(ts),bucket(4,id)" ─parse─▶ [PartitionBy { ts, Day }, PartitionBy { id, Bucket(4) }]
//!                        ─bind (the sink's schema)─▶ the spec: ts_day, id_bucket_4
//! ```
//!
//! Writing is iceberg-rust's: each batch of rows is split by partition
//! value, and each partition's rows go to a data file of their own (the
//! `writer` module), whose manifest entry carries that value.

use iceberg::spec::{PartitionSpec, Schema, Transform};
use iceberg::TableIdent;
use sink_api::SinkError;

/// One field of a partition spec: a column, and the transform its values
/// are partitioned by.
///
/// Made by users, or by [`parse_partition_spec`] from a program's flag;
/// given to [`IcebergSinkBuilder::partition_by`](crate::IcebergSinkBuilder::partition_by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionBy {
    /// The source column's name (a top-level column of the table).
    pub column: String,
    /// The transform: `Identity`, `Year`, `Month`, `Day`, `Hour`,
    /// `Bucket(n)` or `Truncate(w)`.
    pub transform: Transform,
}

impl PartitionBy {
    /// The partition field's name, as PyIceberg names it: the column for
    /// `identity`, else `<column>_<transform>` (`ts_day`, `id_bucket_4`,
    /// `name_trunc_10`).
    pub fn field_name(&self) -> String {
        let column = &self.column;
        match self.transform {
            Transform::Identity => column.clone(),
            Transform::Year => format!("{column}_year"),
            Transform::Month => format!("{column}_month"),
            Transform::Day => format!("{column}_day"),
            Transform::Hour => format!("{column}_hour"),
            Transform::Bucket(n) => format!("{column}_bucket_{n}"),
            Transform::Truncate(w) => format!("{column}_trunc_{w}"),
            Transform::Void => format!("{column}_null"),
            Transform::Unknown => format!("{column}_unknown"),
        }
    }

    /// The field as the flag writes it: `day(ts)`, `bucket(4,id)`.
    fn describe(&self) -> String {
        let column = &self.column;
        match self.transform {
            Transform::Bucket(n) => format!("bucket({n},{column})"),
            Transform::Truncate(w) => format!("truncate({w},{column})"),
            other => format!("{other}({column})"),
        }
    }
}

/// Parses a partition spec written as transforms separated by commas:
/// `identity(col)` (or just `col`), `year(col)`, `month(col)`, `day(col)`,
/// `hour(col)`, `bucket(N,col)`, `truncate(W,col)`. An empty text is no
/// partitioning. Called by programs for `--partition-by`.
///
/// # Errors
/// A permanent error naming the field that does not read, and how to write
/// one.
pub fn parse_partition_spec(text: &str) -> Result<Vec<PartitionBy>, SinkError> {
    let mut fields = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut parts = Vec::new();
    for (at, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    if text.trim().is_empty() {
        return Ok(fields);
    }
    for part in parts {
        fields.push(parse_field(part.trim())?);
    }
    Ok(fields)
}

fn parse_field(text: &str) -> Result<PartitionBy, SinkError> {
    let refused = || {
        SinkError::msg(format!(
            "{text:?} is not a partition field: write identity(col) or col, year(col), \
             month(col), day(col), hour(col), bucket(N,col) or truncate(W,col), separated by \
             commas, such as day(ts),bucket(4,id)"
        ))
        .permanent()
    };
    let is_name = |name: &str| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
    };
    let Some((transform, rest)) = text.split_once('(') else {
        return match is_name(text) {
            true => Ok(PartitionBy {
                column: text.to_string(),
                transform: Transform::Identity,
            }),
            false => Err(refused()),
        };
    };
    let arguments = rest.strip_suffix(')').ok_or_else(refused)?;
    let arguments: Vec<&str> = arguments.split(',').map(str::trim).collect();
    let number = |text: &str| text.parse::<u32>().ok().filter(|n| *n > 0);
    let (transform, column) = match (transform.trim(), arguments.as_slice()) {
        ("identity", [column]) => (Transform::Identity, *column),
        ("year", [column]) => (Transform::Year, *column),
        ("month", [column]) => (Transform::Month, *column),
        ("day", [column]) => (Transform::Day, *column),
        ("hour", [column]) => (Transform::Hour, *column),
        ("bucket", [n, column]) => (Transform::Bucket(number(n).ok_or_else(refused)?), *column),
        ("truncate", [w, column]) => (Transform::Truncate(number(w).ok_or_else(refused)?), *column),
        _ => return Err(refused()),
    };
    if !is_name(column) {
        return Err(refused());
    }
    Ok(PartitionBy {
        column: column.to_string(),
        transform,
    })
}

/// The spec `fields` make over `schema`, checked: every column exists and
/// takes its transform (`day` needs a date or a timestamp, `bucket` no
/// float). Called by the sink's builder.
pub(crate) fn bind(schema: &Schema, fields: &[PartitionBy]) -> Result<PartitionSpec, SinkError> {
    let mut builder = PartitionSpec::builder(schema.clone());
    for field in fields {
        builder = builder
            .add_partition_field(&field.column, field.field_name(), field.transform)
            .map_err(|e| {
                SinkError::msg(format!(
                    "the partition field {} does not fit the table's columns: {}",
                    field.describe(),
                    e.message()
                ))
                .permanent()
            })?;
    }
    builder.build().map_err(|e| {
        SinkError::msg(format!("the partition spec is not valid: {}", e.message())).permanent()
    })
}

/// The partition fields `spec` has over `schema`, as [`PartitionBy`]
/// values.
pub(crate) fn fields_of(spec: &PartitionSpec, schema: &Schema) -> Vec<PartitionBy> {
    spec.fields()
        .iter()
        .map(|field| PartitionBy {
            column: schema
                .name_by_field_id(field.source_id)
                .unwrap_or("<a dropped column>")
                .to_string(),
            transform: field.transform,
        })
        .collect()
}

/// Refuses an existing table whose current spec is not the one the sink
/// was given, naming both. Without a spec given, any table's spec is
/// written as it is.
pub(crate) fn check_spec(
    ident: &TableIdent,
    found: &PartitionSpec,
    schema: &Schema,
    wanted: Option<&[PartitionBy]>,
) -> Result<(), SinkError> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    let found = fields_of(found, schema);
    if found != wanted {
        let show = |fields: &[PartitionBy]| match fields.is_empty() {
            true => "none".to_string(),
            false => fields
                .iter()
                .map(PartitionBy::describe)
                .collect::<Vec<_>>()
                .join(","),
        };
        return Err(SinkError::msg(format!(
            "the Iceberg table {ident} is partitioned by {}, but the sink was given {}: give \
             the table's spec (or none, to write the table's own), or another table",
            show(&found),
            show(wanted)
        ))
        .permanent());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    fn schema() -> Schema {
        Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::required(2, "ts", Type::Primitive(PrimitiveType::Timestamptz)).into(),
                NestedField::optional(3, "name", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn a_spec_reads_as_the_flag_writes_it_and_binds_to_the_columns() {
        let fields = parse_partition_spec("day(ts), bucket(4,id),truncate(10, name)").unwrap();
        assert_eq!(
            fields,
            vec![
                PartitionBy {
                    column: "ts".into(),
                    transform: Transform::Day
                },
                PartitionBy {
                    column: "id".into(),
                    transform: Transform::Bucket(4)
                },
                PartitionBy {
                    column: "name".into(),
                    transform: Transform::Truncate(10)
                },
            ]
        );
        let spec = bind(&schema(), &fields).unwrap();
        let names: Vec<_> = spec.fields().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ts_day", "id_bucket_4", "name_trunc_10"]);
        assert_eq!(fields_of(&spec, &schema()), fields);
        assert_eq!(
            parse_partition_spec("id").unwrap()[0].transform,
            Transform::Identity
        );
        assert!(parse_partition_spec("").unwrap().is_empty());
    }

    #[test]
    fn a_field_that_does_not_read_or_fit_is_refused_naming_it() {
        for bad in [
            "day(ts",
            "bucket(ts)",
            "bucket(0,id)",
            "week(ts)",
            "day(a/b)",
            "day(ts),",
        ] {
            let error = parse_partition_spec(bad).unwrap_err();
            assert!(error.is_permanent());
            assert!(
                error.to_string().contains("partition field"),
                "{bad}: {error}"
            );
        }
        for (bad, named) in [("day(id)", "day(id)"), ("hour(missing)", "hour(missing)")] {
            let fields = parse_partition_spec(bad).unwrap();
            let error = bind(&schema(), &fields).unwrap_err().to_string();
            assert!(error.contains(named), "{error}");
        }
    }

    #[test]
    fn a_table_of_another_spec_is_refused_naming_both() {
        let ident = TableIdent::from_strs(["db", "t"]).unwrap();
        let day = parse_partition_spec("day(ts)").unwrap();
        let spec = bind(&schema(), &day).unwrap();
        assert!(check_spec(&ident, &spec, &schema(), Some(&day)).is_ok());
        assert!(check_spec(&ident, &spec, &schema(), None).is_ok());
        let hour = parse_partition_spec("hour(ts)").unwrap();
        let error = check_spec(&ident, &spec, &schema(), Some(&hour))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("day(ts)") && error.contains("hour(ts)"),
            "{error}"
        );
    }
}
