//! The ingest service's Delta destination (`EventTable`, `--sink delta`)
//! certified by sink-testkit on local tables, as the service builds it:
//! each kit record is an event `{"id": n}`, read back from the table's
//! `event` column.

use ingest_service::delta::EventTable;
use ingest_service::Event;
use sink_testkit::certify;
use sinks_delta::TableLocation;

/// A table of its own for one kit scenario, in a temporary directory kept
/// alive with it.
struct EventTableDestination {
    location: TableLocation,
    _dir: tempfile::TempDir,
}

/// Whether `error` says there is no table yet (nothing committed).
fn no_table(error: &sink_api::SinkError) -> bool {
    error.to_string().contains("Not a Delta table")
}

#[sink_api::async_trait]
impl sink_testkit::Destination for EventTableDestination {
    type Sink = EventTable;

    async fn sink(&self) -> EventTable {
        EventTable::new(self.location.clone()).expect("the service's sink")
    }

    async fn committed_ids(&self) -> Vec<u64> {
        let events = match sinks_delta::read::string_column(&self.location, "event", None).await {
            Ok(events) => events,
            Err(e) if no_table(&e) => return Vec::new(),
            Err(e) => panic!("the table cannot be read: {e}"),
        };
        events
            .iter()
            .map(|text| {
                let event: serde_json::Value =
                    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
                event["id"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("an event without an id: {text}"))
            })
            .collect()
    }

    /// Data files written but named by no version of the table.
    async fn open_transactions(&self) -> Option<usize> {
        match sinks_delta::read::unreferenced_files(&self.location).await {
            Ok(files) => Some(files.len()),
            Err(e) if no_table(&e) => Some(0),
            Err(e) => panic!("the table cannot be read: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_services_delta_destination_is_certified() {
    let report = certify(
        || async {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let location = TableLocation::local(dir.path().join("table")).expect("a table");
            EventTableDestination {
                location,
                _dir: dir,
            }
        },
        |id| Event(serde_json::json!({ "id": id })),
    )
    .await;
    println!(
        "the ingest service's Delta destination, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    // One data file per checkpoint and subtask (the service does not
    // compact its table): a file committer's call holds one request, and no
    // batch can be half-applied. The table transaction's lost answer is
    // checked (`unknown-outcome/global-commit`).
    report
        .allow_unchecked([
            "unknown-outcome/middle-of-batch",
            "unknown-outcome/last-of-batch",
        ])
        .assert_passed();
}
