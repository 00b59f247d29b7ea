//! Where the table is: the catalog its commits go through, and the table's
//! name in it.
//!
//! ```text
//! IcebergCatalog ─┬─ Sqlite(SqliteCatalog)  iceberg-rust's SQL catalog on a local SQLite file,
//!                 │                          tables in a local directory or an s3:// prefix
//!                 └─ Rest(RestCatalog)      a catalog speaking the Iceberg REST protocol
//!                                            (the `rest` feature), tables where it places them
//! ```
//!
//! Either way a commit is the catalog's compare-and-swap of the table's
//! metadata: the SQL catalog swaps the metadata location in its database,
//! a REST catalog checks the commit's requirements (the `main` branch still
//! at the snapshot the sink read) before it applies the commit. The sink's
//! rules (one attempt per commit, the outcome read from the table, the
//! marks in its properties, the claim) rest on that alone, so they hold on
//! both.

#[cfg(feature = "rest")]
mod rest;
#[cfg(feature = "rest")]
mod sigv4;
mod sqlite;
mod table;

use std::sync::Arc;

use iceberg::Catalog;
use sink_api::SinkError;

#[cfg(feature = "rest")]
pub use rest::RestCatalog;
pub use sqlite::{SqliteCatalog, Warehouse, CATALOG_NAME};
pub use table::{check_table_name, load_or_create, parse_table_name};

/// The catalog a sink's table is in.
///
/// Made by users from a [`SqliteCatalog`] or a `RestCatalog` (`into()`),
/// or by programs from their `--catalog` and `--catalog-property` flags
/// ([`IcebergCatalog::from_flags`]); given to
/// [`IcebergSink::builder`](crate::IcebergSink::builder), which opens it at
/// the job's first start.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum IcebergCatalog {
    /// An SQL catalog on a local SQLite database.
    Sqlite(SqliteCatalog),
    /// A catalog speaking the Iceberg REST protocol.
    #[cfg(feature = "rest")]
    Rest(RestCatalog),
}

impl From<SqliteCatalog> for IcebergCatalog {
    fn from(catalog: SqliteCatalog) -> IcebergCatalog {
        IcebergCatalog::Sqlite(catalog)
    }
}

#[cfg(feature = "rest")]
impl From<RestCatalog> for IcebergCatalog {
    fn from(catalog: RestCatalog) -> IcebergCatalog {
        IcebergCatalog::Rest(catalog)
    }
}

impl IcebergCatalog {
    /// Opens the catalog: the SQL catalog's database is created when
    /// missing; a REST catalog is asked for its configuration (and a token,
    /// with OAuth2 client credentials). Called by the sink at its first
    /// start, and by programs reading the table back.
    pub async fn open(&self) -> Result<Arc<dyn Catalog>, SinkError> {
        match self {
            IcebergCatalog::Sqlite(catalog) => catalog.open().await,
            #[cfg(feature = "rest")]
            IcebergCatalog::Rest(catalog) => catalog.open().await,
        }
    }

    /// The catalog a program's flags name: `catalog` is `sqlite:PATH` or
    /// `rest:URL` (the `rest` feature), and `properties` the
    /// `--catalog-property KEY=VALUE` pairs, by the names PyIceberg and
    /// iceberg-rust use (`credential`, `token`, `warehouse`, `s3.endpoint`,
    /// …). An SQL catalog takes no properties; its tables go in `warehouse`
    /// (a local directory, or an `s3://` URL reached with `s3_options`, the
    /// `s3` feature).
    ///
    /// # Errors
    /// A permanent error saying how to write the flag: an unknown scheme,
    /// an empty path or URL, properties given to an SQL catalog, a property
    /// given twice.
    pub fn from_flags(
        catalog: &str,
        properties: &[(String, String)],
        warehouse: Option<&str>,
        s3_options: &[(String, String)],
    ) -> Result<IcebergCatalog, SinkError> {
        let usage = || {
            let rest = if cfg!(feature = "rest") {
                " or rest:URL (a REST catalog, such as rest:http://127.0.0.1:8181)"
            } else {
                ""
            };
            SinkError::msg(format!(
                "--catalog {catalog}: give the catalog as sqlite:PATH (an SQLite database, \
                 created when missing){rest}"
            ))
            .permanent()
        };
        let (scheme, rest) = catalog.split_once(':').ok_or_else(usage)?;
        if rest.is_empty() {
            return Err(usage());
        }
        match scheme {
            "sqlite" => {
                if let Some((key, _)) = properties.first() {
                    return Err(SinkError::msg(format!(
                        "--catalog-property {key}=…: an SQL catalog takes no properties (they \
                         are a REST catalog's); give its tables' place with --warehouse"
                    ))
                    .permanent());
                }
                let database = std::path::Path::new(rest);
                let warehouse = warehouse.ok_or_else(|| {
                    SinkError::msg(format!(
                        "--catalog {catalog} needs a warehouse: the directory or s3:// URL its \
                         tables go in"
                    ))
                    .permanent()
                })?;
                if warehouse.starts_with("s3://") {
                    #[cfg(feature = "s3")]
                    return Ok(SqliteCatalog::s3(database, warehouse, s3_options)?.into());
                    #[cfg(not(feature = "s3"))]
                    return Err(SinkError::msg(format!(
                        "the warehouse {warehouse} is on S3, and this build has no S3: build \
                         with the `s3` feature"
                    ))
                    .permanent());
                }
                let _ = s3_options;
                Ok(SqliteCatalog::new(database, std::path::Path::new(warehouse))?.into())
            }
            #[cfg(feature = "rest")]
            "rest" => Ok(RestCatalog::new(rest, properties.iter().cloned())?.into()),
            _ => Err(usage()),
        }
    }
}

/// The sink's catalog, opened at its first use and then shared by the
/// start hook, the writers, the committers and the global committer (one
/// connection pool, one token). An open that failed is tried again at the
/// next use.
#[derive(Clone)]
pub(crate) struct Connection {
    config: Option<IcebergCatalog>,
    opened: Arc<tokio::sync::OnceCell<Arc<dyn Catalog>>>,
}

impl Connection {
    /// What the catalog was opened from (`None` for one opened already).
    pub(crate) fn config(&self) -> Option<&IcebergCatalog> {
        self.config.as_ref()
    }

    /// The catalog `config` describes, opened when first used.
    pub(crate) fn new(config: IcebergCatalog) -> Connection {
        Connection {
            config: Some(config),
            opened: Arc::default(),
        }
    }

    /// A catalog opened already (tests).
    #[cfg(test)]
    pub(crate) fn of(catalog: Arc<dyn Catalog>) -> Connection {
        Connection {
            config: None,
            opened: Arc::new(tokio::sync::OnceCell::new_with(Some(catalog))),
        }
    }

    /// The catalog, opened now if no earlier call did.
    pub(crate) async fn catalog(&self) -> Result<Arc<dyn Catalog>, SinkError> {
        self.opened
            .get_or_try_init(|| async {
                match &self.config {
                    Some(config) => config.open().await,
                    None => Err(SinkError::msg("no catalog to open").permanent()),
                }
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_flag_names_its_kind_and_refuses_what_does_not_fit() {
        let catalog = IcebergCatalog::from_flags("sqlite:/tmp/c.db", &[], Some("/tmp/wh"), &[]);
        assert!(matches!(catalog, Ok(IcebergCatalog::Sqlite(_))));
        for bad in ["sqlite:", "c.db", "postgres:x", ":x"] {
            let error = IcebergCatalog::from_flags(bad, &[], Some("/tmp/wh"), &[]).unwrap_err();
            assert!(error.is_permanent());
            assert!(error.to_string().contains("sqlite:PATH"), "{bad}: {error}");
        }
        let with_property = IcebergCatalog::from_flags(
            "sqlite:/tmp/c.db",
            &[("token".into(), "t".into())],
            Some("/tmp/wh"),
            &[],
        )
        .unwrap_err();
        assert!(
            with_property.to_string().contains("takes no properties"),
            "{with_property}"
        );
        let no_warehouse = IcebergCatalog::from_flags("sqlite:/tmp/c.db", &[], None, &[]);
        assert!(no_warehouse.is_err());
    }
}
