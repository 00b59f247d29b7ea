//! The Delta sink on an S3-compatible server (moto, started by
//! `scripts/with-s3`, which the README's test command uses): log entries
//! made by conditional creates on the server, certified by the kit, two
//! jobs writing one table at once, and a missing bucket or refused
//! credentials failing the job at once with the cause.
//!
//! Without the server (`S3_TEST_ENDPOINT` unset) each test says so and
//! passes: `cargo test --workspace` runs without it; the test command runs
//! them under `scripts/with-s3` and fails on that word.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{compacted_sink, exactly_once, ids, Event, TableDestination};
use object_store::aws::AmazonS3Builder;
use sink_runtime::{CheckpointConfig, Job, JobStatus, SequenceSource, Source};
use sink_testkit::{certify_with, Knobs};
use sinks_delta::read::log_entries;
use sinks_delta::{DeltaSink, TableLocation};
use url::Url;

/// The test server's bucket, or `None` (with the reason printed) when the
/// tests run without it.
fn bucket() -> Option<String> {
    sink_testkit::servers::s3().map(|s3| s3.bucket)
}

/// A new table in `bucket`, through a client configured from the
/// environment (endpoint, credentials, region).
fn table(bucket: &str) -> TableLocation {
    let root = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .build()
        .expect("an S3 client");
    let url = Url::parse(&format!(
        "s3://{bucket}/tables/{}",
        uuid::Uuid::new_v4().simple()
    ))
    .expect("a URL");
    TableLocation::object_store(Arc::new(root), url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delta_sink_on_an_s3_compatible_server_is_certified() {
    let Some(bucket) = bucket() else {
        return;
    };
    // The kit's every property, with a quarter of its simulation's seeds:
    // the seeds vary timing, crash points and parallelism, which the
    // certification on local tables (`certify.rs`) runs in full; here they
    // show that those scenarios hold over S3's conditional writes, which
    // four seeds do (16 took two minutes of the test command's run).
    let knobs = Knobs {
        seeds: 4,
        ..Knobs::default()
    };
    let report = certify_with(
        knobs,
        || {
            let location = table(&bucket);
            async move {
                TableDestination {
                    location,
                    _dir: None,
                }
            }
        },
        Event::new,
    )
    .await;
    println!(
        "Delta sink on an S3-compatible server, certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report.assert_passed();
}

fn job(
    name: &str,
    location: &TableLocation,
    first_id: u64,
    records: u64,
) -> Job<impl Source<Record = Event>, DeltaSink<Event>> {
    let source = SequenceSource::bounded(records)
        .paced(10_000)
        .map(move |id| Event::new(first_id + id));
    Job::builder(name, source, compacted_sink(location))
        .parallelism(2)
        .checkpointing(CheckpointConfig::every(Duration::from_millis(50)))
        .build()
        .expect("a valid job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_write_one_table_on_s3_at_once_and_each_row_is_there_once() {
    let Some(bucket) = bucket() else {
        return;
    };
    let location = table(&bucket);
    let (a, b) = tokio::join!(
        job("first", &location, 0, 3_000).run(),
        job("second", &location, 3_000, 3_000).run()
    );
    assert_eq!(a.expect("the first job runs").status, JobStatus::Finished);
    assert_eq!(b.expect("the second job runs").status, JobStatus::Finished);
    exactly_once(&ids(&location, None).await, 6_000).unwrap();
    let entries = log_entries(&location).await.unwrap();
    let versions: Vec<u64> = entries.iter().map(|e| e.version).collect();
    assert_eq!(
        versions,
        (0..entries.len() as u64).collect::<Vec<_>>(),
        "one log entry per version, none lost or doubled"
    );
    println!(
        "two jobs on one S3 table: {} log entries, 6000 rows once each",
        entries.len()
    );
}

#[tokio::test]
async fn a_missing_bucket_fails_the_job_at_once_naming_it() {
    if bucket().is_none() {
        return;
    }
    let location = table("no-such-bucket-here");
    let source = SequenceSource::bounded(10).map(Event::new);
    let error = Job::builder("nobucket", source, compacted_sink(&location))
        .build()
        .expect("a valid job")
        .run()
        .await
        .expect_err("the job fails");
    let text = error.to_string();
    assert!(
        text.contains("NoSuchBucket") || text.contains("no-such-bucket-here"),
        "{text}"
    );
    assert!(
        !error.is_restartable(),
        "a missing bucket is permanent: {text}"
    );
}

#[tokio::test]
async fn refused_credentials_fail_the_job_at_once_with_the_cause() {
    let (Some(bucket), Ok(refusing)) = (bucket(), std::env::var("S3_TEST_REFUSING_ENDPOINT"))
    else {
        return;
    };
    let root = AmazonS3Builder::from_env()
        .with_bucket_name(&bucket)
        .with_endpoint(refusing)
        .build()
        .expect("an S3 client");
    let url = Url::parse(&format!("s3://{bucket}/tables/refused")).expect("a URL");
    let location = TableLocation::object_store(Arc::new(root), url);
    let source = SequenceSource::bounded(10).map(Event::new);
    let error = Job::builder("refused", source, compacted_sink(&location))
        .build()
        .expect("a valid job")
        .run()
        .await
        .expect_err("the job fails");
    let text = error.to_string();
    assert!(
        text.contains("InvalidAccessKeyId")
            || text.contains("SignatureDoesNotMatch")
            || text.contains("403"),
        "{text}"
    );
    assert!(
        !error.is_restartable(),
        "refused credentials are permanent: {text}"
    );
}
