//! The hand-over scenarios: the memory sink, which commits source
//! positions with its data, passes them; the same sink keeping its
//! positions wrongly is caught, each flaw by the property that names it.

use sink_api::async_trait;
use sink_testkit::{certify_with, Destination, Knobs, Report, Verdict};
use sinks_memory::{MemorySink, MemoryStore, PositionFlaw};

/// The memory sink's store, with an optional flaw in how it keeps
/// positions.
struct Positions(MemoryStore<u64>, Option<PositionFlaw>);

#[async_trait]
impl Destination for Positions {
    type Sink = MemorySink<u64>;

    async fn sink(&self) -> MemorySink<u64> {
        if let Some(flaw) = self.1 {
            self.0.flaw_positions(flaw);
        }
        MemorySink::new(self.0.clone()).roll_every(16)
    }

    async fn committed_ids(&self) -> Vec<u64> {
        let violations = self.0.violations();
        assert!(violations.is_empty(), "the store saw: {violations:?}");
        self.0.committed()
    }
}

const HANDOVER: [&str; 3] = [
    "handover/new-owner",
    "handover/old-owner-returns",
    "handover/two-owners-at-once",
];

async fn handover(flaw: Option<PositionFlaw>) -> Report {
    let knobs = Knobs {
        only: HANDOVER.iter().map(|name| name.to_string()).collect(),
        ..Knobs::default()
    };
    certify_with(
        knobs,
        || async move { Positions(MemoryStore::new(), flaw) },
        |id| id,
    )
    .await
}

fn verdict<'a>(report: &'a Report, property: &str) -> &'a Verdict {
    report
        .properties
        .iter()
        .find(|p| p.name == property)
        .map(|p| &p.verdict)
        .unwrap_or_else(|| panic!("{property} was not run:\n{report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_committing_positions_with_its_data_hands_splits_over() {
    let report = handover(None).await;
    println!("{report}");
    report.assert_passed();
    assert_eq!(report.properties.len(), 3, "{report}");
}

/// Positions kept only in the job's checkpoints: a new owner on fresh
/// checkpoint storage reads every split from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_kept_only_in_checkpoints_are_caught() {
    let report = handover(Some(PositionFlaw::NotInDestination)).await;
    match verdict(&report, "handover/new-owner") {
        Verdict::Failed(why) => assert!(why.contains("committed_positions"), "{why}"),
        other => panic!("not caught: {other:?}\n{report}"),
    }
}

/// Positions applied without checking where the splits are: the old owner,
/// back from its checkpoint, commits records the new owner committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_committed_without_checking_are_caught() {
    let report = handover(Some(PositionFlaw::Unchecked)).await;
    match verdict(&report, "handover/old-owner-returns") {
        Verdict::Failed(why) => assert!(why.contains("superseded"), "{why}"),
        other => panic!("not caught: {other:?}\n{report}"),
    }
}
