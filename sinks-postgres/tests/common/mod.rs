//! What the tests against a real server share: the server (from
//! `PG_TEST_URL`, which `scripts/with-postgres` provides), a fresh table per
//! test, the row type, and counts made with SQL.

#![allow(dead_code)]

use std::collections::BTreeMap;

use sinks_postgres::{Column, PgRecord, ToSql, Type};
use tokio_postgres::{Client, NoTls};

/// The tests' server. Never skipped: without it the tests fail and say how
/// to run them.
pub fn url() -> String {
    std::env::var("PG_TEST_URL").unwrap_or_else(|_| {
        panic!(
            "PG_TEST_URL is not set: run these tests through scripts/with-postgres \
             (./scripts/test-all does), which starts a throwaway PostgreSQL server"
        )
    })
}

/// The tests' server, with connections named `app` (`application_name`),
/// so that a test sees and cuts only its own connections.
pub fn url_for(app: &str) -> String {
    format!("{} application_name={app}", url())
}

/// A server with `max_prepared_transactions = 0`.
pub fn url_without_prepared_transactions() -> String {
    std::env::var("PG_TEST_URL_NO_PREPARED").unwrap_or_else(|_| {
        panic!("PG_TEST_URL_NO_PREPARED is not set: run through scripts/with-postgres")
    })
}

pub async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| {
            let url = sinks_postgres::redact_connection_string(url);
            panic!("cannot connect to {url}: {e}")
        });
    tokio::spawn(connection);
    client
}

/// A test's row: an id and a payload.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub payload: String,
}

impl Row {
    pub fn with_id(id: u64) -> Row {
        Row {
            id: i64::try_from(id).expect("a test id fits i64"),
            payload: format!("row {id}"),
        }
    }
}

impl PgRecord for Row {
    fn columns() -> Vec<Column> {
        vec![
            Column::new("id", Type::INT8),
            Column::new("payload", Type::TEXT),
        ]
    }
    fn push_values<'a>(&'a self, out: &mut Vec<&'a (dyn ToSql + Sync)>) {
        out.push(&self.id);
        out.push(&self.payload);
    }
}

/// Drops and creates `table` for the row type.
pub async fn fresh_table(client: &Client, table: &str) {
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id bigint NOT NULL, payload text NOT NULL)"
        ))
        .await
        .expect("creating the test table");
}

/// How many times each id is in `table`.
pub async fn id_counts(client: &Client, table: &str) -> BTreeMap<i64, i64> {
    client
        .query(
            &format!("SELECT id, count(*) FROM {table} GROUP BY id"),
            &[],
        )
        .await
        .expect("counting rows")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Every id of `0..n` in `table` exactly once, counted with SQL.
pub async fn assert_exactly_once(client: &Client, table: &str, n: u64, what: &str) {
    let counts = id_counts(client, table).await;
    let twice: Vec<_> = counts.iter().filter(|(_, &c)| c > 1).take(10).collect();
    assert!(
        twice.is_empty(),
        "{what}: ids in {table} more than once: {twice:?}"
    );
    let missing: Vec<i64> = (0..n as i64)
        .filter(|id| !counts.contains_key(id))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: ids missing from {table}: {missing:?} (of {n}; {} present)",
        counts.len()
    );
    assert_eq!(
        counts.len() as u64,
        n,
        "{what}: ids beyond 0..{n} in {table}"
    );
}

/// The prepared transactions of job `job` on the server (matched by
/// parsing the ids, not with `LIKE`, where `_` is a wildcard).
pub async fn prepared_of(client: &Client, job: &str) -> Vec<String> {
    client
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
            &[],
        )
        .await
        .expect("reading pg_prepared_xacts")
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|gid| sinks_postgres::TransactionId::parse(gid).is_some_and(|id| id.job == job))
        .collect()
}

/// Connections named `app` inside a transaction that is open (not
/// prepared).
pub async fn open_transactions(client: &Client, app: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = $1 AND state LIKE 'idle in transaction%'",
            &[&app],
        )
        .await
        .expect("reading pg_stat_activity")
        .get(0)
}
