//! The time a sink sees: the runtime's clock, given to every writer and
//! committer through [`InitContext::clock`](crate::InitContext::clock).
//!
//! Rolling files by age and bucketing records by date need "now". Asking the
//! runtime's [`Clock`] instead of the system lets a test or a simulation
//! move time for the whole job at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch.
///
/// The runtime's is [`SystemClock`] unless the job was built with another;
/// sinks read it from [`InitContext::clock`](crate::InitContext::clock).
/// Implementations must be cheap (called once per batch of records) and
/// should never go backwards by much.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, in milliseconds since 1970-01-01T00:00:00Z.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock: the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock a test sets by hand. Clones share the time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(now_ms)))
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
