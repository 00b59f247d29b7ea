//! A user's own counters in the job's metrics, each record counted once
//! across restarts: [`JobCounter`].
//!
//! A count made in a closure of a source (`filter`, `try_map`, a
//! `Transform`) or in a sink's writer belongs to the subtask that runs it,
//! through a task-local cell the subtask's task carries. At each barrier
//! the subtask hands its counts with its part of the checkpoint; the
//! completed checkpoint stores each counter's total as of that checkpoint.
//! A restart starts every counter from its restored checkpoint's total,
//! and what was counted after that checkpoint is dropped with the
//! attempt: the records it counted are read and counted again, once.
//!
//! ```text
//! total now = restored total + Σ subtask counts since this attempt began
//! total in checkpoint n = restored total + Σ subtask counts at barrier n
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sink_api::CounterValue;

tokio::task_local! {
    /// The counts of the subtask whose task runs now.
    static SUBTASK: Arc<SubtaskCounts>;
}

/// A counter of the job's own, bumped from a source's closures or a sink's
/// writer, kept in checkpoints and shown in the job's metrics
/// ([`MetricsSnapshot::counters`](crate::MetricsSnapshot::counters)).
///
/// Made by the user and registered with
/// [`JobBuilder::counter`](crate::JobBuilder::counter) (unregistered, it is
/// shown once it counted something). Cheap to clone; clones are one
/// counter. A count made while a subtask reads or writes (a closure of a
/// source's combinator, a `Transform`, a writer's `write`) is counted once
/// per record across restarts: it is restored from the checkpoint the job
/// restarts from. A count made anywhere else (a committer, another task)
/// is shown but not restored, and counts again when a restart replays it.
///
/// ```
/// # use sink_runtime::{Job, JobCounter, SequenceSource};
/// # use sink_runtime::source::Source;
/// # use sinks_memory::{MemorySink, MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let odd = JobCounter::new("odd_numbers_dropped", "Odd numbers the filter dropped.");
/// let counted = odd.clone();
/// let source = SequenceSource::bounded(10).filter(move |n| {
///     let keep = n % 2 == 0;
///     if !keep {
///         counted.add(1);
///     }
///     keep
/// });
/// let report = Job::builder("evens", source, MemorySink::new(MemoryStore::new()))
///     .counter(&odd)
///     .build()?
///     .run()
///     .await?;
/// assert_eq!(report.metrics.counter("odd_numbers_dropped"), Some(5));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct JobCounter {
    name: Arc<str>,
    help: Arc<str>,
    /// Counts made outside any subtask: shown, never restored.
    outside: Arc<AtomicU64>,
}

impl JobCounter {
    /// A counter named `name` (lower case ASCII letters, digits and
    /// underscores; anything else becomes `_`), described by `help` in one
    /// sentence.
    pub fn new(name: &str, help: &str) -> JobCounter {
        JobCounter {
            name: sink_api::metric_name(name).into(),
            help: help.into(),
            outside: Arc::default(),
        }
    }

    /// Adds `n`: to the subtask whose task calls it, or, outside every
    /// subtask, to a part that is shown but not restored.
    pub fn add(&self, n: u64) {
        if SUBTASK
            .try_with(|counts| counts.add(&self.name, n))
            .is_err()
        {
            self.outside.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Its name, as cleaned.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One subtask's counts in one attempt, since the attempt began. Made by
/// [`JobCounts::start_attempt`]; its task runs [in](Self::scope) it.
#[derive(Debug, Default)]
pub(crate) struct SubtaskCounts(Mutex<BTreeMap<Arc<str>, u64>>);

impl SubtaskCounts {
    fn add(&self, name: &Arc<str>, n: u64) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match counts.get_mut(name) {
            Some(count) => *count = count.saturating_add(n),
            None => {
                counts.insert(name.clone(), n);
            }
        }
    }

    /// The counts now: what the subtask hands with its part of a
    /// checkpoint, at its barrier.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, u64> {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counts.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Runs `task` (a subtask's task) with these as the counts a
    /// [`JobCounter`] adds to.
    pub(crate) async fn scope<F: std::future::Future>(self: Arc<Self>, task: F) -> F::Output {
        SUBTASK.scope(self, task).await
    }
}

/// A job's counters, over every attempt: the registered counters, the
/// totals the attempt restored, and its subtasks' counts. Held by the
/// job's [`Metrics`](crate::Metrics).
#[derive(Debug, Default)]
pub(crate) struct JobCounts(Mutex<Counts>);

#[derive(Debug, Default)]
struct Counts {
    registered: BTreeMap<String, JobCounter>,
    restored: BTreeMap<String, u64>,
    subtasks: Vec<Arc<SubtaskCounts>>,
}

impl JobCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `counter`, so that it shows (at 0) before it counts.
    pub(crate) fn register(&self, counter: &JobCounter) {
        let mut counts = self.lock();
        counts
            .registered
            .insert(counter.name.to_string(), counter.clone());
    }

    /// A new attempt restored `restored` (the totals its checkpoint holds;
    /// none on a start without one): counts of the attempt before are
    /// dropped. Returns the cells of its `parallelism` subtasks.
    pub(crate) fn start_attempt(
        &self,
        restored: BTreeMap<String, u64>,
        parallelism: usize,
    ) -> Vec<Arc<SubtaskCounts>> {
        let mut counts = self.lock();
        counts.restored = restored;
        counts.subtasks = (0..parallelism).map(|_| Arc::default()).collect();
        counts.subtasks.clone()
    }

    /// The totals of a checkpoint whose subtasks counted `at_barriers`
    /// (summed) since this attempt began.
    pub(crate) fn totals(&self, at_barriers: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        let mut totals = self.lock().restored.clone();
        add_into(&mut totals, at_barriers);
        totals
    }

    /// Every counter now, by name.
    pub(crate) fn read(&self) -> Vec<CounterValue> {
        let counts = self.lock();
        let mut totals = counts.restored.clone();
        for subtask in &counts.subtasks {
            add_into(&mut totals, &subtask.snapshot());
        }
        for (name, counter) in &counts.registered {
            let outside = counter.outside.load(Ordering::Relaxed);
            let total = totals.entry(name.clone()).or_default();
            *total = total.saturating_add(outside);
        }
        totals
            .into_iter()
            .map(|(name, value)| {
                let help = counts
                    .registered
                    .get(&name)
                    .map_or_else(String::new, |c| c.help.to_string());
                CounterValue::new(name, help, value)
            })
            .collect()
    }
}

/// Adds each of `counts` into `totals`.
pub(crate) fn add_into(totals: &mut BTreeMap<String, u64>, counts: &BTreeMap<String, u64>) {
    for (name, count) in counts {
        let total = totals.entry(name.clone()).or_default();
        *total = total.saturating_add(*count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_go_to_the_running_subtask_and_a_new_attempt_drops_them() {
        let job = JobCounts::default();
        let skipped = JobCounter::new("Skipped-Records", "Records skipped.");
        job.register(&skipped);
        let cells = job.start_attempt(BTreeMap::new(), 2);
        let counter = skipped.clone();
        cells[1].clone().scope(async move { counter.add(3) }).await;
        skipped.add(1); // outside every subtask
        assert_eq!(
            cells[1].snapshot(),
            BTreeMap::from([("skipped_records".into(), 3)])
        );
        assert!(cells[0].snapshot().is_empty());
        let read = job.read();
        assert_eq!(
            (read[0].name.as_str(), read[0].value),
            ("skipped_records", 4)
        );
        assert_eq!(read[0].help, "Records skipped.");
        // Checkpoint totals: restored + the subtasks' counts at barriers.
        let at_barriers = BTreeMap::from([("skipped_records".to_string(), 2)]);
        assert_eq!(job.totals(&at_barriers)["skipped_records"], 2);
        // A restart from a checkpoint holding 2: the attempt's 3 are gone.
        let cells = job.start_attempt(BTreeMap::from([("skipped_records".into(), 2)]), 1);
        assert!(cells[0].snapshot().is_empty());
        assert_eq!(job.read()[0].value, 2 + 1);
    }
}
