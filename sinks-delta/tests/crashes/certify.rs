//! The Delta sink certified by sink-testkit on local tables: every mode,
//! crash point, rescale, lost commit answer (the global committer's
//! included) and simulated scenario, read back from the table.

use crate::common;

use common::{Event, TableDestination};
use sink_testkit::certify;
use sinks_delta::TableLocation;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delta_sink_on_local_tables_is_certified() {
    let report = certify(
        || async {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let location = TableLocation::local(dir.path().join("table")).expect("a table");
            TableDestination {
                location,
                _dir: Some(dir),
            }
        },
        Event::new,
    )
    .await;
    println!(
        "Delta sink on local tables, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}
