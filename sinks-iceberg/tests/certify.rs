//! The Iceberg sink certified by sink-testkit on local tables: every mode,
//! crash point, rescale, lost commit answer (the global committer's
//! included) and simulated scenario, read back from the table. The kit sets
//! crash points, which are process-wide, so this test has an executable of
//! its own.

mod common;

use common::{Event, LocalTable};
use sink_testkit::certify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iceberg_sink_on_local_tables_is_certified() {
    let report = certify(|| async { LocalTable::new() }, Event::new).await;
    println!(
        "Iceberg sink on local tables, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}
