//! A catalog speaking the Iceberg REST protocol (Polaris, Lakekeeper,
//! Nessie, Unity, Glue's and S3 Tables' REST endpoints, SeaweedFS), through
//! iceberg-rust's `iceberg-catalog-rest`.
//!
//! ```text
//! RestCatalog { uri, properties }  ──open──▶ GET /v1/config (and a token: credential or token)
//!   table files  ─▶ s3:// locations, reached with the project's object_store client,
//!                   configured from the catalog's file IO properties: those it vends
//!                   (its config, the table's load) over those the user gave
//! ```
//!
//! The properties are named as PyIceberg and iceberg-rust name them
//! (`credential`, `token`, `warehouse`, `scope`, `oauth2-server-uri`,
//! `header.*`, `s3.endpoint`, `s3.access-key-id`, …, and for AWS's request
//! signing `rest.sigv4-enabled`, `rest.signing-region`, `rest.signing-name`,
//! `client.access-key-id`, `client.secret-access-key`: the `sigv4`
//! module). Secrets among them are never printed: [`RestCatalog`]'s
//! `Debug` shows their keys only.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_rest::{RestCatalogBuilder, REST_CATALOG_PROP_URI};
use sink_api::SinkError;

use crate::errors::iceberg_error;
use crate::object_storage::ObjectStorageFactory;

use super::sqlite::CATALOG_NAME;

/// Properties whose values are secrets: never printed (and SigV4's,
/// `super::sigv4::SECRETS`).
const SECRETS: &[&str] = &[
    "credential",
    "token",
    "s3.secret-access-key",
    "s3.session-token",
];

/// Whether the property `key` holds a secret.
fn is_secret(key: &str) -> bool {
    SECRETS.contains(&key) || super::sigv4::SECRETS.contains(&key)
}

/// A REST catalog: its URI and its properties.
///
/// Made by users and by programs (`--catalog rest:URL --catalog-property
/// KEY=VALUE`, through [`IcebergCatalog::from_flags`](super::IcebergCatalog::from_flags));
/// opened by the sink at the job's first start. The catalog places new
/// tables (its `warehouse`); their files must be on `s3://` (or `s3a://`)
/// locations.
#[derive(Clone)]
pub struct RestCatalog {
    uri: String,
    properties: BTreeMap<String, String>,
}

impl fmt::Debug for RestCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(key, value)| {
                let shown = if is_secret(key) {
                    "<secret>"
                } else {
                    value.as_str()
                };
                (key.as_str(), shown)
            })
            .collect();
        f.debug_struct("RestCatalog")
            .field("uri", &self.uri)
            .field("properties", &properties)
            .finish()
    }
}

impl RestCatalog {
    /// The catalog at `uri` (`http://` or `https://`, without the `/v1`),
    /// with `properties`. Contacts nothing: a catalog that does not answer,
    /// or refuses the credentials, fails the first start.
    ///
    /// # Errors
    /// A permanent error naming the problem: a URI that is not HTTP, a
    /// property with an empty key, given twice, or naming the URI again.
    pub fn new(
        uri: &str,
        properties: impl IntoIterator<Item = (String, String)>,
    ) -> Result<RestCatalog, SinkError> {
        let refused = |why: String| SinkError::msg(why).permanent();
        let parsed = url::Url::parse(uri)
            .map_err(|e| refused(format!("the REST catalog's URI {uri:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(refused(format!(
                "the REST catalog's URI {uri:?} is not an http:// or https:// URL, such as \
                 rest:http://127.0.0.1:8181"
            )));
        }
        let mut kept = BTreeMap::new();
        for (key, value) in properties {
            if key.is_empty() {
                return Err(refused(
                    "a catalog property has an empty name: give it as KEY=VALUE".into(),
                ));
            }
            if key == REST_CATALOG_PROP_URI {
                return Err(refused(
                    "the catalog property uri is the catalog's URI: give it in --catalog \
                     rest:URL"
                        .into(),
                ));
            }
            if kept.insert(key.clone(), value).is_some() {
                return Err(refused(format!(
                    "the catalog property {key} is given twice"
                )));
            }
        }
        Ok(RestCatalog {
            uri: uri.trim_end_matches('/').to_string(),
            properties: kept,
        })
    }

    /// The catalog's URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The property `key`, unless it is a secret (`credential`, `token`,
    /// `s3.secret-access-key`, `s3.session-token`).
    pub fn property(&self, key: &str) -> Option<&str> {
        if is_secret(key) {
            return None;
        }
        self.properties.get(key).map(String::as_str)
    }

    /// The catalog, to be reached at its first use: then it is asked for
    /// its configuration, and for a token when a `credential` is given (a
    /// catalog that does not answer, or refuses the credentials, fails
    /// that first call, which names the table). Called by the sink at
    /// start and by programs reading the table.
    pub async fn open(&self) -> Result<Arc<dyn Catalog>, SinkError> {
        let mut props: HashMap<String, String> = self.properties.clone().into_iter().collect();
        // With SigV4 the catalog talks to a signing proxy (`sigv4`).
        let uri = match super::sigv4::Signing::from_properties(&self.properties)? {
            Some(signing) => super::sigv4::proxy_for(&self.uri, &signing)?,
            None => self.uri.clone(),
        };
        props.insert(REST_CATALOG_PROP_URI.to_string(), uri);
        let catalog = RestCatalogBuilder::default()
            .with_storage_factory(Arc::new(ObjectStorageFactory::from_properties()))
            .load(CATALOG_NAME, props)
            .await
            .map_err(|e| iceberg_error(format!("opening the REST catalog {}", self.uri), e))?;
        Ok(Arc::new(catalog))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_never_printed_and_bad_settings_are_refused() {
        let catalog = RestCatalog::new(
            "http://127.0.0.1:8181/",
            [
                ("credential".to_string(), "key:hunter2".to_string()),
                ("s3.secret-access-key".to_string(), "hunter3".to_string()),
                ("warehouse".to_string(), "s3://wh".to_string()),
            ],
        )
        .unwrap();
        let shown = format!("{catalog:?}");
        assert!(!shown.contains("hunter"), "{shown}");
        assert!(
            shown.contains("s3://wh") && shown.contains("credential"),
            "{shown}"
        );
        assert_eq!(catalog.uri(), "http://127.0.0.1:8181");
        assert_eq!(catalog.property("credential"), None);
        assert_eq!(catalog.property("warehouse"), Some("s3://wh"));
        for uri in ["127.0.0.1:8181", "ftp://host/x", "http://"] {
            let error = RestCatalog::new(uri, []).unwrap_err();
            assert!(
                error.is_permanent() && error.to_string().contains(uri),
                "{error}"
            );
        }
        let twice = RestCatalog::new(
            "http://h",
            [("token".into(), "a".into()), ("token".into(), "b".into())],
        )
        .unwrap_err();
        assert!(twice.to_string().contains("twice"), "{twice}");
        let uri = RestCatalog::new("http://h", [("uri".into(), "http://g".into())]).unwrap_err();
        assert!(uri.to_string().contains("rest:URL"), "{uri}");
    }
}
