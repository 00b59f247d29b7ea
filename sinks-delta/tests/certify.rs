//! The Delta sink certified by sink-testkit on local tables: every mode,
//! crash point, rescale, lost commit answer (the global committer's
//! included) and simulated scenario, read back from the table.

mod common;

use common::{schema, Event};
use sink_api::async_trait;
use sink_testkit::{certify, Destination};
use sinks_delta::{Compaction, DeltaSink, TableLocation};

/// A table of its own in a temporary directory, partitioned by day, with
/// compaction after every checkpoint that leaves two small files in a
/// partition. Compaction is what makes a replayed transaction dangerous in
/// Delta: adding the same file twice is harmless, but adding it again
/// after it was merged into another duplicates its rows.
struct LocalTable {
    _dir: tempfile::TempDir,
    location: TableLocation,
}

#[async_trait]
impl Destination for LocalTable {
    type Sink = DeltaSink<Event>;

    async fn sink(&self) -> DeltaSink<Event> {
        DeltaSink::builder(self.location.clone(), schema())
            .partition_by(["day"])
            .compaction(Compaction {
                min_files: 2,
                ..Compaction::default()
            })
            .build()
            .expect("a valid sink")
    }

    async fn committed_ids(&self) -> Vec<u64> {
        match sinks_delta::read::int64_column(&self.location, "id", None).await {
            Ok(ids) => ids.into_iter().map(|id| id as u64).collect(),
            // No table yet: nothing committed.
            Err(e) if e.to_string().contains("Not a Delta table") => Vec::new(),
            Err(e) => panic!("the table cannot be read: {e}"),
        }
    }

    /// Data files written but named by no version of the table.
    async fn open_transactions(&self) -> Option<usize> {
        match sinks_delta::read::unreferenced_files(&self.location).await {
            Ok(files) => Some(files.len()),
            Err(e) if e.to_string().contains("Not a Delta table") => Some(0),
            Err(e) => panic!("the table cannot be read: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delta_sink_on_local_tables_is_certified() {
    let report = certify(
        || async {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let location = TableLocation::local(dir.path().join("table")).expect("a table");
            LocalTable {
                _dir: dir,
                location,
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
