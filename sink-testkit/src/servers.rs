//! The real systems a test certifies a sink against, found the way the
//! project's test command provides them: `scripts/with-s3` (an S3-compatible
//! server), `scripts/with-postgres` (a PostgreSQL server) and
//! `scripts/with-delta-reader` (a Delta reader no one here wrote) each start
//! or install theirs and name it in the environment of the command they run.
//!
//! Called at the start of a test that needs one. Without it the test says
//! `skipped: no …` and returns, so that `cargo test` runs anywhere; the test
//! command fails a run whose output holds that word. A sink author can run
//! their own sink's tests under the same scripts.

/// An S3-compatible test server and the bucket made for the tests
/// (`S3_TEST_ENDPOINT`, `S3_TEST_BUCKET`). Clients configured from the
/// environment reach it: the script also sets `AWS_ENDPOINT_URL`, test
/// credentials, a region and `AWS_ALLOW_HTTP`.
#[derive(Debug, Clone)]
pub struct S3Server {
    /// The server's endpoint, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// A bucket that exists on it.
    pub bucket: String,
}

/// The S3-compatible test server, or `None` after printing that the test is
/// skipped.
pub fn s3() -> Option<S3Server> {
    match (
        std::env::var("S3_TEST_ENDPOINT"),
        std::env::var("S3_TEST_BUCKET"),
    ) {
        (Ok(endpoint), Ok(bucket)) => Some(S3Server { endpoint, bucket }),
        _ => {
            println!("skipped: no S3-compatible test server (run under scripts/with-s3)");
            None
        }
    }
}

/// An Iceberg REST catalog for tests, with its S3-compatible store
/// (`scripts/with-seaweedfs`: `ICEBERG_REST_URI`, `ICEBERG_REST_WAREHOUSE`,
/// `ICEBERG_REST_CREDENTIAL`, `SEAWEEDFS_S3_ENDPOINT`,
/// `SEAWEEDFS_ACCESS_KEY_ID`, `SEAWEEDFS_SECRET_ACCESS_KEY`,
/// `SEAWEEDFS_REGION`).
#[derive(Clone)]
pub struct IcebergRestServer {
    /// The catalog's URI, `http://127.0.0.1:<port>`.
    pub uri: String,
    /// The catalog's warehouse (its table bucket), `s3://…`.
    pub warehouse: String,
    /// The catalog's OAuth2 client credentials, `key:secret`.
    pub credential: String,
    /// The store's S3 endpoint.
    pub s3_endpoint: String,
    /// The store's access key id.
    pub access_key_id: String,
    /// The store's secret key.
    pub secret_access_key: String,
    /// The store's region.
    pub region: String,
}

impl std::fmt::Debug for IcebergRestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergRestServer")
            .field("uri", &self.uri)
            .field("warehouse", &self.warehouse)
            .field("s3_endpoint", &self.s3_endpoint)
            .finish_non_exhaustive()
    }
}

impl IcebergRestServer {
    /// The catalog properties that reach it, by the names PyIceberg and
    /// iceberg-rust use: `credential`, `warehouse` and the store's `s3.*`.
    pub fn properties(&self) -> Vec<(String, String)> {
        [
            ("credential", &self.credential),
            ("warehouse", &self.warehouse),
            ("s3.endpoint", &self.s3_endpoint),
            ("s3.access-key-id", &self.access_key_id),
            ("s3.secret-access-key", &self.secret_access_key),
            ("s3.region", &self.region),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.clone()))
        .collect()
    }
}

/// The Iceberg REST test catalog, or `None` after printing that the test
/// is skipped.
pub fn iceberg_rest() -> Option<IcebergRestServer> {
    let var = |name: &str| std::env::var(name).ok();
    let found = (|| {
        Some(IcebergRestServer {
            uri: var("ICEBERG_REST_URI")?,
            warehouse: var("ICEBERG_REST_WAREHOUSE")?,
            credential: var("ICEBERG_REST_CREDENTIAL")?,
            s3_endpoint: var("SEAWEEDFS_S3_ENDPOINT")?,
            access_key_id: var("SEAWEEDFS_ACCESS_KEY_ID")?,
            secret_access_key: var("SEAWEEDFS_SECRET_ACCESS_KEY")?,
            region: var("SEAWEEDFS_REGION")?,
        })
    })();
    if found.is_none() {
        println!("skipped: no Iceberg REST test catalog (run under scripts/with-seaweedfs)");
    }
    found
}

/// The PostgreSQL test server's connection string (`PG_TEST_URL`), or `None`
/// after printing that the test is skipped.
pub fn postgres() -> Option<String> {
    match std::env::var("PG_TEST_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            println!("skipped: no PostgreSQL test server (run under scripts/with-postgres)");
            None
        }
    }
}

/// The command that reads an Iceberg table with PyIceberg
/// (`ICEBERG_READER`: a program and its arguments, the catalog database,
/// the warehouse and the table's name to be appended), or `None` after
/// printing that the external check is skipped.
pub fn iceberg_reader() -> Option<Vec<String>> {
    match std::env::var("ICEBERG_READER") {
        Ok(command) if !command.trim().is_empty() => {
            Some(command.split_whitespace().map(str::to_string).collect())
        }
        _ => {
            println!("skipped: no external Iceberg reader (run under scripts/with-iceberg-reader)");
            None
        }
    }
}

/// The command that reads a Delta table with the `deltalake` package
/// (`DELTA_READER`: a program and its arguments, the table's location to be
/// appended), or `None` after printing that the external check is skipped.
pub fn delta_reader() -> Option<Vec<String>> {
    match std::env::var("DELTA_READER") {
        Ok(command) if !command.trim().is_empty() => {
            Some(command.split_whitespace().map(str::to_string).collect())
        }
        _ => {
            println!("skipped: no external Delta reader (run under scripts/with-delta-reader)");
            None
        }
    }
}
