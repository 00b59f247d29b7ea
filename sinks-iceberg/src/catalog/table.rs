//! The table's name in its catalog, and the table itself: found, or
//! created with the sink's columns.

use std::collections::HashMap;

use iceberg::spec::{NestedFieldRef, PartitionSpec, Schema, Type};
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};
use sink_api::SinkError;

use crate::errors::iceberg_error;

/// A table's name in its catalog, `namespace.name` (a namespace of several
/// levels as `a.b.name`).
///
/// Parsed by users and the demo from `--table`; names the table to the
/// catalog at every commit.
pub fn parse_table_name(text: &str) -> Result<TableIdent, SinkError> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() < 2 || parts.iter().any(|part| part.is_empty()) {
        return Err(SinkError::msg(format!(
            "{text:?} is not a table name: give it as NAMESPACE.NAME, such as db.events"
        ))
        .permanent());
    }
    let ident = TableIdent::from_strs(parts)
        .map_err(|e| iceberg_error(format!("reading the table name {text:?}"), e))?;
    check_table_name(&ident)?;
    Ok(ident)
}

/// Refuses a table name whose levels could reach outside the table's own
/// place in the warehouse: every level of the namespace and the name must
/// be non-empty, not `.` or `..`, and hold no `/`, `\` or control
/// character (each level is a directory or a key segment of the table's
/// location). Called by [`parse_table_name`] and by the sink's builder, so
/// that a name made in code is checked too.
pub fn check_table_name(ident: &TableIdent) -> Result<(), SinkError> {
    let levels = ident
        .namespace()
        .iter()
        .map(String::as_str)
        .chain([ident.name()]);
    for level in levels {
        let bad = level.is_empty()
            || level == "."
            || level == ".."
            || level
                .chars()
                .any(|c| c == '/' || c == '\\' || c.is_control());
        if bad {
            return Err(SinkError::msg(format!(
                "{level:?} in the table name {ident} is not an Iceberg name level: each level \
                 of a table's name is a directory of its location, so none may be empty, `.` \
                 or `..`, or hold `/`, `\\` or a control character"
            ))
            .permanent());
        }
    }
    Ok(())
}

/// The table `ident` in `catalog`, created (with its namespace) with
/// `schema`, and partitioned by `partition` if given, when missing; an
/// existing table of another schema is refused, naming both (its partition
/// spec is the caller's to check). Called by the sink at start.
pub async fn load_or_create(
    catalog: &dyn Catalog,
    ident: &TableIdent,
    schema: &Schema,
    partition: Option<&PartitionSpec>,
) -> Result<Table, SinkError> {
    let loading = || format!("reading the Iceberg table {ident}");
    let exists = catalog
        .table_exists(ident)
        .await
        .map_err(|e| iceberg_error(loading(), e))?;
    if exists {
        let table = catalog
            .load_table(ident)
            .await
            .map_err(|e| iceberg_error(loading(), e))?;
        check_schema(ident, table.metadata().current_schema(), schema)?;
        return Ok(table);
    }
    let namespace: &NamespaceIdent = ident.namespace();
    let namespace_exists = catalog
        .namespace_exists(namespace)
        .await
        .map_err(|e| iceberg_error(loading(), e))?;
    if !namespace_exists {
        // Another start may create it meanwhile: its error is taken for
        // success if the namespace is there after.
        if let Err(error) = catalog.create_namespace(namespace, HashMap::new()).await {
            let there = catalog.namespace_exists(namespace).await.unwrap_or(false);
            if !there {
                return Err(iceberg_error(
                    format!("creating the namespace {}", namespace.to_url_string()),
                    error,
                ));
            }
        }
    }
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(schema.clone())
        .partition_spec_opt(partition.map(|spec| spec.clone().into_unbound()))
        .build();
    match catalog.create_table(namespace, creation).await {
        Ok(table) => Ok(table),
        Err(error) => {
            // Created by another start meanwhile: use it, if its schema is
            // ours.
            let table = catalog
                .load_table(ident)
                .await
                .map_err(|_| iceberg_error(format!("creating the Iceberg table {ident}"), error))?;
            check_schema(ident, table.metadata().current_schema(), schema)?;
            Ok(table)
        }
    }
}

/// Refuses a table whose columns (names, types, nullability, in order,
/// nested ones included) are not `expected`'s. Field ids are the table's
/// own and are not compared.
fn check_schema(ident: &TableIdent, found: &Schema, expected: &Schema) -> Result<(), SinkError> {
    let (found, expected) = (
        describe_fields(found.as_struct().fields()),
        describe_fields(expected.as_struct().fields()),
    );
    if found != expected {
        return Err(SinkError::msg(format!(
            "the Iceberg table {ident} has the columns [{found}], but the sink writes \
             [{expected}]: give another table, or drop this one"
        ))
        .permanent());
    }
    Ok(())
}

/// `fields` as `name type [not] null`, comma-separated, with the element,
/// key and value types of nested types spelled out (iceberg-rust's own
/// `Display` of a list or a map names no element type).
fn describe_fields(fields: &[NestedFieldRef]) -> String {
    let field = |field: &NestedFieldRef| {
        let null = if field.required { "not null" } else { "null" };
        format!("{} {} {null}", field.name, describe_type(&field.field_type))
    };
    fields.iter().map(field).collect::<Vec<_>>().join(", ")
}

fn describe_type(field_type: &Type) -> String {
    let element = |field: &NestedFieldRef| {
        let null = if field.required { "" } else { " null" };
        format!("{}{null}", describe_type(&field.field_type))
    };
    match field_type {
        Type::Primitive(primitive) => primitive.to_string(),
        Type::Struct(fields) => format!("struct<{}>", describe_fields(fields.fields())),
        Type::List(list) => format!("list<{}>", element(&list.element_field)),
        Type::Map(map) => format!(
            "map<{}, {}>",
            element(&map.key_field),
            element(&map.value_field)
        ),
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;
    use crate::test_table::{fixture, schema};

    #[test]
    fn a_table_name_cannot_reach_outside_its_place_in_the_warehouse() {
        for good in ["demo.events", "a.b.c", "ns.x-1", "ns.événements"] {
            assert!(parse_table_name(good).is_ok(), "{good} refused");
        }
        // A namespace holding a `/` named the metadata directory of the
        // table ns.x (`ns/x.metadata`); an absolute one, a directory
        // outside the warehouse.
        for bad in [
            "ns/x.metadata",
            "/tmp/out.t",
            "ns.a\\b",
            "ns..t",
            "ns.t\n",
            ".t",
            "t",
        ] {
            let error = parse_table_name(bad).expect_err(bad).to_string();
            assert!(error.contains("table name"), "{bad}: {error}");
        }
        let made_in_code = TableIdent::from_strs(["..", "t"]).unwrap();
        assert!(check_table_name(&made_in_code).is_err());
    }

    #[test]
    fn a_table_name_needs_a_namespace_and_no_empty_part() {
        let ident = parse_table_name("db.events").unwrap();
        assert_eq!(ident.name(), "events");
        for bad in ["events", "db.", ".events", "a..b"] {
            let error = parse_table_name(bad).unwrap_err();
            assert!(error.is_permanent());
            assert!(error.to_string().contains("NAMESPACE.NAME"), "{error}");
        }
    }

    #[test]
    fn nested_types_are_compared_with_their_elements_and_nullability() {
        let list_of = |element: PrimitiveType, required: bool| {
            let element = NestedField::list_element(10, Type::Primitive(element), required);
            Schema::builder()
                .with_fields(vec![NestedField::required(
                    1,
                    "tags",
                    Type::List(iceberg::spec::ListType::new(element.into())),
                )
                .into()])
                .build()
                .unwrap()
        };
        let ident = TableIdent::from_strs(["db", "t"]).unwrap();
        let ints = list_of(PrimitiveType::Int, true);
        assert!(check_schema(&ident, &ints, &list_of(PrimitiveType::Int, true)).is_ok());
        let error = check_schema(&ident, &ints, &list_of(PrimitiveType::String, true))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("list<int>") && error.contains("list<string>"),
            "{error}"
        );
        assert!(check_schema(&ident, &ints, &list_of(PrimitiveType::Int, false)).is_err());
    }

    #[tokio::test]
    async fn a_table_of_another_schema_is_refused_naming_both_and_the_same_one_is_opened() {
        let fx = fixture().await;
        load_or_create(fx.catalog.as_ref(), &fx.ident, &schema(), None)
            .await
            .unwrap();
        let other = Schema::builder()
            .with_fields(vec![NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::String),
            )
            .into()])
            .build()
            .unwrap();
        let error = load_or_create(fx.catalog.as_ref(), &fx.ident, &other, None)
            .await
            .unwrap_err();
        assert!(error.is_permanent());
        let text = error.to_string();
        assert!(
            text.contains("id long not null") && text.contains("id string not null"),
            "{text}"
        );
    }
}
