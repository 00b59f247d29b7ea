//! A sink's own counters, in the job's metrics: [`SinkMetrics`], given to
//! sinks through [`InitContext::metrics`](crate::InitContext::metrics) and
//! [`JobStart::metrics`](crate::JobStart::metrics).
//!
//! A sink counts what only it knows (files renamed, transactions rolled
//! back, bytes committed) in [`Counter`]s it registers by name. The runtime
//! shows every registered counter in the job's metrics snapshot, and a
//! service exports them with its own (the ingest service's `/metrics`). The
//! sink may keep the same counters for an API of its own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A monotonic counter. Clones share the count; cheap to bump from any
/// thread.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// A counter at zero.
    pub fn new() -> Counter {
        Counter::default()
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One registered counter, as read now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CounterValue {
    /// Its name: lower case, digits and underscores, unique in the job.
    pub name: String,
    /// What it counts, one sentence.
    pub help: String,
    /// The count.
    pub value: u64,
}

impl CounterValue {
    /// A counter's reading: for a runtime that shows counters of its own
    /// beside a sink's.
    pub fn new(name: impl Into<String>, help: impl Into<String>, value: u64) -> CounterValue {
        CounterValue {
            name: name.into(),
            help: help.into(),
            value,
        }
    }
}

/// Where a sink registers its counters. Made by the runtime, one per job,
/// shared by every start, writer and committer of it (clones share the
/// registry). Holds no process-global state: two jobs have two.
#[derive(Debug, Clone, Default)]
pub struct SinkMetrics(Arc<Mutex<BTreeMap<String, (String, Counter)>>>);

impl SinkMetrics {
    /// An empty registry. Called by the runtime, and by tests of sinks.
    pub fn new() -> SinkMetrics {
        SinkMetrics::default()
    }

    /// The counter registered as `name`, registering a new one with `help`
    /// if there is none. Names are lower case ASCII letters, digits and
    /// underscores; others are made so (anything else becomes `_`).
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        let mut counters = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = counters
            .entry(metric_name(name))
            .or_insert_with(|| (help.to_string(), Counter::new()));
        entry.1.clone()
    }

    /// Registers `counter` as `name` (replacing what was registered so):
    /// for a sink that keeps its counters itself and registers them at each
    /// start.
    pub fn register(&self, name: &str, help: &str, counter: &Counter) {
        let mut counters = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counters.insert(metric_name(name), (help.to_string(), counter.clone()));
    }

    /// Registers each `(name, help, counter)` as [`register`](Self::register)
    /// does: for a sink registering its set of counters at each start.
    pub fn register_all<'a>(
        &self,
        counters: impl IntoIterator<Item = (&'a str, &'a str, &'a Counter)>,
    ) {
        for (name, help, counter) in counters {
            self.register(name, help, counter);
        }
    }

    /// Every registered counter, by name.
    pub fn read(&self) -> Vec<CounterValue> {
        let counters = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counters
            .iter()
            .map(|(name, (help, counter))| CounterValue {
                name: name.clone(),
                help: help.clone(),
                value: counter.get(),
            })
            .collect()
    }
}

/// `name` in lower case, with anything but ASCII letters, digits and `_`
/// as `_`: a name every metrics format accepts. Applied to every counter's
/// name by [`SinkMetrics`], and by the runtime to its job counters, so that
/// both kinds are named alike.
pub fn metric_name(name: &str) -> String {
    name.chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_lowercase(),
            false => '_',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_shared_by_name_and_read_in_order() {
        let metrics = SinkMetrics::new();
        let files = metrics.counter("files_committed", "Files made visible.");
        metrics.counter("files_committed", "ignored").add(2);
        files.add(1);
        let own = Counter::new();
        own.add(7);
        metrics.register("Bytes-Committed", "Bytes made visible.", &own);
        let read = metrics.read();
        let shown: Vec<(&str, u64)> = read.iter().map(|c| (c.name.as_str(), c.value)).collect();
        assert_eq!(shown, vec![("bytes_committed", 7), ("files_committed", 3)]);
        assert_eq!(read[1].help, "Files made visible.");
        assert!(SinkMetrics::new().read().is_empty(), "no global state");
    }
}
