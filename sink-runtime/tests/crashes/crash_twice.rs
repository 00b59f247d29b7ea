//! A job crashed twice and finished: once at a crash point its process
//! survives (the restart strategy restarts it, and a stop ends that run),
//! once at a crash point that ends the run (a new job on the same state
//! directory goes on). Shared by the tests whose counts and dead letters
//! must hold across both.

use std::time::Duration;

use sink_api::Sink;
use sink_runtime::source::Source;
use sink_runtime::{Job, JobError, JobReport, JobStatus};

/// Runs the job `job(restarts)` makes (with a restart strategy when
/// `restarts`) three times on its state directory: crashed at the 16th
/// write and restarted in its process, stopped after `stop_after`; crashed
/// at the 11th write of the second run, which ends with it; then to its
/// end. Returns the last run's report.
pub async fn crashed_twice_then_finished<Src, S>(
    job: impl Fn(bool) -> Job<Src, S>,
    stop_after: Duration,
) -> JobReport
where
    Src: Source<Record = sink_api::InputOf<S>>,
    S: Sink,
{
    fail::cfg("after-write", "15*off->1*return->off").unwrap();
    let survived = job(true).start();
    let control = survived.control();
    tokio::time::sleep(stop_after).await;
    control.stop();
    let report = survived.join().await.unwrap();
    assert_eq!(report.status, JobStatus::Stopped);
    assert_eq!(report.metrics.restarts, 1, "one crash survived");
    fail::cfg("after-write", "10*off->1*return->off").unwrap();
    let crashed = job(false).run().await;
    fail::remove("after-write");
    assert!(
        matches!(crashed, Err(JobError::Crash { .. })),
        "the second run crashed: {crashed:?}"
    );
    let report = job(false).run().await.unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    report
}
