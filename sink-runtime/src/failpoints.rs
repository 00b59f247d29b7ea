//! Named crash points at every phase boundary, for crash tests.
//!
//! Compiled in only with the `failpoints` cargo feature (which enables the
//! `fail` crate); without it the internal `failpoint!` marks expand to
//! nothing and cost nothing. A crash test configures a point with
//! `fail::cfg(name, "return")` (or `"3*off->return"` to crash at its fourth
//! hit): the task that reaches it fails with
//! [`JobError::Crash`](crate::JobError::Crash), as if the process had died
//! there, and the test starts the job again on the same checkpoint storage.
//! Every hit is also counted (`hits`, with the feature), so a test can assert
//! that each point was reached and a renamed point cannot silently stop being
//! tested.
//!
//! `fail`'s configuration is process-wide: run crash tests one per process,
//! or serialise them.

/// Every crash point of the runtime, in the order a record meets them. The
/// memory sink adds `memory-commit-mid-batch` (its own `failpoints` feature).
/// `after-mark-finished` (after the finished marker, before the report) is
/// not in the list: a restart there finds the job finished, which the crash
/// matrix's scenarios do not expect; `finished_loss` tests it.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub const FAILPOINTS: &[&str] = &[
    "after-write",
    "after-flush",
    "after-prepare-commit",
    "after-snapshot",
    "after-acknowledge",
    "after-checkpoint-stored",
    "after-commit",
    "after-global-commit",
    "during-end-of-input",
    "during-final-checkpoint",
    "during-recovery-recommit",
];

#[cfg(feature = "failpoints")]
mod counting {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    static HITS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

    pub(crate) fn record(name: &'static str) {
        let mut hits = HITS.lock().unwrap_or_else(|e| e.into_inner());
        *hits.entry(name).or_default() += 1;
    }

    /// How often the point `name` was reached in this process.
    pub fn hits(name: &str) -> u64 {
        let hits = HITS.lock().unwrap_or_else(|e| e.into_inner());
        hits.get(name).copied().unwrap_or(0)
    }
}

#[cfg(feature = "failpoints")]
pub use counting::hits;
#[cfg(feature = "failpoints")]
pub(crate) use counting::record;

/// Marks a crash point: counts the hit and, when the test configured it,
/// returns `Err(JobError::Crash)` from the enclosing function.
#[cfg(feature = "failpoints")]
macro_rules! failpoint {
    ($name:literal) => {{
        $crate::failpoints::record($name);
        fail::fail_point!($name, |_| Err($crate::JobError::Crash { failpoint: $name }));
    }};
}

/// Marks a crash point; compiled out without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
macro_rules! failpoint {
    ($name:literal) => {{}};
}

pub(crate) use failpoint;
