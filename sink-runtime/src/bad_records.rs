//! What a job does with a record its source's parse step refuses (a
//! [`BadRecord`] from `try_map` or a `Transform`): fail (the default), skip
//! and count it, or send it to a dead-letter destination.
//!
//! The refusal is made in the reader of a transformed source, on the
//! subtask's task. The task carries its [`Refusals`] (a task-local, as the
//! job counters do), which apply the job's [`BadRecordPolicy`]:
//!
//! The same policy applies to records the sink's writer refuses (a row
//! that does not fit a table's schema): in a job that tolerates bad
//! records, the subtask writes through
//! [`SinkWriter::write_batch_refusing`](sink_api::SinkWriter::write_batch_refusing)
//! and hands what it refused to the policy.
//!
//! - **fail**: the read fails with the refusal, as a permanent error;
//! - **skip**: the record is dropped and counted in the job counter
//!   `bad_records_skipped`, which checkpoints keep (each record counted
//!   once across restarts);
//! - **dead letter**: the record is held until the read returns; the
//!   subtask then hands it to its writer
//!   ([`SinkWriter::write_bad_records`](sink_api::SinkWriter::write_bad_records)),
//!   before the next barrier, so it is committed with the records read
//!   around it ([`DeadLettered`](crate::dead_letter::DeadLettered)), and
//!   counted in `bad_records_dead_lettered`.
//!
//! A refused record's position advances with the others: it is never read
//! again once its checkpoint completed.

use std::sync::{Arc, Mutex};

use sink_api::BadRecord;
use tracing::{debug, warn};

use crate::counters::JobCounter;
use crate::source::SourceError;

/// The job's answer to a refused record. Set with
/// [`JobBuilder::skip_bad_records`](crate::JobBuilder::skip_bad_records) and
/// [`JobBuilder::dead_letters`](crate::JobBuilder::dead_letters); the
/// default fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadRecordPolicy {
    /// The job fails at once, naming the record's position and the reason.
    #[default]
    Fail,
    /// The record is dropped and counted (`bad_records_skipped`).
    Skip,
    /// The record goes to the dead-letter destination, exactly once with
    /// the main output (`bad_records_dead_lettered`).
    DeadLetter,
}

/// The name of the job counter of skipped records.
pub const SKIPPED: &str = "bad_records_skipped";
/// The name of the job counter of dead-lettered records.
pub const DEAD_LETTERED: &str = "bad_records_dead_lettered";
/// Refusals logged at WARN per subtask and attempt; the rest at DEBUG.
const WARNED: u64 = 10;

tokio::task_local! {
    /// The refusals of the subtask whose task runs now.
    static REFUSALS: Arc<Refusals>;
}

/// The counters the policies bump, registered with the job so that they
/// show from its start.
pub(crate) fn counters() -> [JobCounter; 2] {
    [
        JobCounter::new(
            SKIPPED,
            "Bad records (refused by the source's parse step or the sink), skipped.",
        ),
        JobCounter::new(
            DEAD_LETTERED,
            "Bad records (refused by the source's parse step or the sink), sent to the \
             dead-letter destination.",
        ),
    ]
}

/// One subtask's refused records in one attempt, under the job's policy.
#[derive(Debug)]
pub(crate) struct Refusals {
    policy: BadRecordPolicy,
    subtask: usize,
    /// Dead letters held until the read that refused them returns.
    held: Mutex<Vec<BadRecord>>,
    seen: Mutex<u64>,
    skipped: JobCounter,
    dead_lettered: JobCounter,
}

impl Refusals {
    /// The refusals of subtask `subtask` under `policy`.
    pub(crate) fn new(policy: BadRecordPolicy, subtask: usize) -> Refusals {
        let [skipped, dead_lettered] = counters();
        Refusals {
            policy,
            subtask,
            held: Mutex::default(),
            seen: Mutex::default(),
            skipped,
            dead_lettered,
        }
    }

    /// Runs `task` (a subtask's task) with these as the refusals a
    /// transformed reader reports to.
    pub(crate) async fn scope<F: std::future::Future>(self: Arc<Self>, task: F) -> F::Output {
        REFUSALS.scope(self, task).await
    }

    /// The dead letters held since the last call, in the order refused:
    /// taken by the subtask after each read, for its writer.
    pub(crate) fn take_held(&self) -> Vec<BadRecord> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn log(&self, bad: &BadRecord, action: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        *seen += 1;
        if *seen <= WARNED {
            warn!(
                subtask = self.subtask,
                position = bad.position(),
                error = bad.error(),
                "a bad record was {action}{}",
                if *seen == WARNED {
                    " (further ones of this subtask are logged at DEBUG)"
                } else {
                    ""
                }
            );
        } else {
            debug!(
                subtask = self.subtask,
                position = bad.position(),
                error = bad.error(),
                "a bad record was {action}"
            );
        }
    }

    fn refuse(&self, bad: BadRecord) -> Result<(), SourceError> {
        match self.policy {
            BadRecordPolicy::Fail => Err(fail(bad)),
            BadRecordPolicy::Skip => {
                self.log(&bad, "skipped");
                self.skipped.add(1);
                Ok(())
            }
            BadRecordPolicy::DeadLetter => {
                self.log(&bad, "sent to the dead-letter destination");
                self.dead_lettered.add(1);
                self.held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(bad);
                Ok(())
            }
        }
    }
}

/// Applies the running subtask's policy to `bad`, a record a transform
/// refused: `Ok` when it was skipped or held as a dead letter, the
/// permanent error to fail the read with otherwise (and outside any
/// subtask, as in a test that drives a reader by hand). Called by
/// [`TransformedReader`](crate::source::TransformedReader).
pub(crate) fn refuse(bad: BadRecord) -> Result<(), SourceError> {
    let mut bad = Some(bad);
    match REFUSALS.try_with(|refusals| refusals.refuse(bad.take().expect("taken once"))) {
        Ok(result) => result,
        Err(_) => Err(fail(bad.take().expect("not taken outside a subtask"))),
    }
}

impl Refusals {
    /// Whether bad records are skipped or dead-lettered rather than
    /// failing the job: then the subtask has its writer refuse records
    /// one by one (`SinkWriter::write_batch_refusing`).
    pub(crate) fn tolerates(&self) -> bool {
        self.policy != BadRecordPolicy::Fail
    }

    /// Applies the policy to records the sink's writer refused. Called by
    /// the subtask, only when it [tolerates](Self::tolerates) them.
    pub(crate) fn refused_by_sink(&self, refused: Vec<BadRecord>) -> Result<(), SourceError> {
        refused.into_iter().try_for_each(|bad| self.refuse(bad))
    }
}

fn fail(bad: BadRecord) -> SourceError {
    SourceError::new(format!(
        "{bad}. The job fails on bad records by default: to skip and count them, or to send them \
         to a dead-letter destination, build it with JobBuilder::skip_bad_records or \
         JobBuilder::dead_letters"
    ))
    .permanent()
}
