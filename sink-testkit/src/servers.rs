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
