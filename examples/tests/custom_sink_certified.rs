//! The custom sink of the examples, certified exactly-once by the kit.

use examples::table_sink::TableSink;
use sink_testkit::{certify, Destination};

struct Table(TableSink);

impl Destination for Table {
    type Sink = TableSink;

    fn sink(&self) -> TableSink {
        self.0.clone()
    }

    fn committed_ids(&self) -> Vec<u64> {
        let table = self.0 .0.lock().expect("the table lock");
        table
            .values()
            .flatten()
            .filter_map(|line| line.strip_prefix("line ")?.parse().ok())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_sink_is_exactly_once() {
    let report = certify(|| Table(TableSink::default()), |id| format!("line {id}")).await;
    println!("{report}");
    report.assert_passed();
}
