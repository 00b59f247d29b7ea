//! The PostgreSQL sink certified exactly-once by the conformance kit,
//! against the test server: every property, each scenario a table and a job
//! of its own. Alone in its test binary, so that counting open transactions
//! by application name sees only this certification's connections.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};

use common::{client, fresh_table, open_transactions, url_for, Row};
use sink_api::async_trait;
use sink_testkit::{certify, Destination};
use sinks_postgres::PostgresSink;
use tokio_postgres::Client;

/// One scenario's table, and the application name its sinks connect with.
struct Table {
    db: Client,
    table: String,
}

impl Table {
    async fn new() -> Table {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let table = format!("certified_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let db = client(&common::url()).await;
        fresh_table(&db, &table).await;
        Table { db, table }
    }
}

#[async_trait]
impl Destination for Table {
    type Sink = PostgresSink<Row>;

    async fn sink(&self) -> PostgresSink<Row> {
        PostgresSink::connect(&url_for(&self.table), &self.table, 3)
            .await
            .unwrap_or_else(|e| panic!("connecting the sink to {}: {e}", self.table))
    }

    async fn committed_ids(&self) -> Vec<u64> {
        let rows = self
            .db
            .query(&format!("SELECT id FROM {}", self.table), &[])
            .await
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.table));
        rows.iter()
            .map(|row| u64::try_from(row.get::<_, i64>(0)).expect("ids are not negative"))
            .collect()
    }

    /// Transactions begun and not prepared on this table's connections.
    async fn open_transactions(&self) -> Option<usize> {
        let open = open_transactions(&self.db, &self.table).await;
        Some(usize::try_from(open).unwrap_or(0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_sink_is_certified() {
    let report = certify(Table::new, Row::with_id).await;
    println!(
        "postgres sink, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    // One prepared transaction per checkpoint and subtask: a commit call
    // holds one request, and no batch can be half-applied.
    report
        .allow_unchecked([
            "unknown-outcome/middle-of-batch",
            "unknown-outcome/last-of-batch",
        ])
        .assert_passed();
}
