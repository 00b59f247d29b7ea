//! The Iceberg sink certified by sink-testkit on local tables and on the
//! S3-compatible test server (`scripts/with-s3`, which the README's test
//! command uses): every mode, crash point, rescale, lost commit answer (the
//! global committer's included) and simulated scenario, read back from the
//! table. The kit sets crash points, which are process-wide, so these tests
//! have an executable of their own.

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

/// Committing once per 3 checkpoints (`IcebergSinkBuilder::commit_every`):
/// the checkpoints held back in the job's state, delivered again after
/// each crash grouped otherwise, are each in the table once. Every
/// property, with a quarter of the simulation's seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iceberg_sink_committing_every_three_checkpoints_is_certified() {
    let knobs = sink_testkit::Knobs {
        seeds: 4,
        ..sink_testkit::Knobs::default()
    };
    let report = sink_testkit::certify_with(
        knobs,
        || async {
            let mut table = LocalTable::new();
            table.commit_every = 3;
            table
        },
        Event::new,
    )
    .await;
    println!(
        "Iceberg sink committing every 3 checkpoints, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

/// On S3: every property, with a quarter of the simulation's seeds (they
/// vary timing, crash points and parallelism, which the certification on
/// local tables runs in full; here they show those scenarios hold over
/// object storage).
#[cfg(feature = "s3")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iceberg_sink_on_an_s3_compatible_server_is_certified() {
    let Some(server) = sink_testkit::servers::s3() else {
        return;
    };
    let knobs = sink_testkit::Knobs {
        seeds: 4,
        ..sink_testkit::Knobs::default()
    };
    let report = sink_testkit::certify_with(
        knobs,
        || {
            let server = server.clone();
            async move { common::S3Table::new(&server) }
        },
        Event::new,
    )
    .await;
    println!(
        "Iceberg sink on S3, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

/// On the REST catalog of a real S3-compatible store (SeaweedFS,
/// `scripts/with-seaweedfs`): every property, with a quarter of the
/// simulation's seeds, as on S3 above.
#[cfg(feature = "rest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iceberg_sink_on_a_rest_catalog_is_certified() {
    let Some(server) = sink_testkit::servers::iceberg_rest() else {
        return;
    };
    let knobs = sink_testkit::Knobs {
        seeds: 4,
        ..sink_testkit::Knobs::default()
    };
    let report = sink_testkit::certify_with(
        knobs,
        || {
            let server = server.clone();
            async move { common::RestTable::new(&server) }
        },
        Event::new,
    )
    .await;
    println!(
        "Iceberg sink on a REST catalog, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}
