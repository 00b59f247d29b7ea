//! What to do when a task fails: restart the whole job from its last
//! completed checkpoint, or give up.
//!
//! A restart is a new start on the same checkpoint storage: a new generation,
//! sources at the stored positions, writers from their states, and the
//! pending committables committed again before new data flows. The tasks of
//! the failed attempt are stopped before the new ones start, so nothing of an
//! older generation commits after a newer one began.
//!
//! A commit **superseded** (its source positions had moved: another owner
//! of a split committed those records, as happens when a consumer group
//! moves partitions) is no fault: the job restarts at once and reads from
//! the destination's positions, whatever the strategy, without using up its
//! restarts ([`SupersededRestarts`]). Only a run of them that commits
//! nothing in between, which no hand-over explains, falls back to the
//! strategy.

use std::time::Duration;

use super::retry::RetryPolicy;

/// When a failed job is restarted. Given to
/// [`JobBuilder::restart_strategy`](crate::JobBuilder::restart_strategy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartStrategy {
    /// Never restart: the first task failure fails the job (a superseded
    /// commit excepted, see the module's header). The default.
    #[default]
    Never,
    /// Restart up to `attempts` times, waiting `delay` before each restart.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Restart up to `policy.max_retries` times, waiting an exponentially
    /// growing, jittered delay (see [`RetryPolicy::backoff`]).
    ExponentialBackoff(RetryPolicy),
}

impl RestartStrategy {
    /// The wait before restart number `restart` (from 1), or `None` when no
    /// more restarts are allowed. `jitter` is a random number in `[0, 1)`.
    pub fn delay_before(&self, restart: u32, jitter: f64) -> Option<Duration> {
        match *self {
            RestartStrategy::Never => None,
            RestartStrategy::FixedDelay { attempts, delay } => {
                (restart <= attempts).then_some(delay)
            }
            RestartStrategy::ExponentialBackoff(policy) => {
                (restart <= policy.max_retries).then(|| policy.backoff(restart, jitter))
            }
        }
    }
}

/// How many superseded commits in a row, with no record committed between
/// them, restart outside the strategy.
pub const SUPERSEDED_IN_A_ROW: u32 = 20;

/// The wait before a restart after a superseded commit.
pub const SUPERSEDED_DELAY: Duration = Duration::from_millis(100);

/// Decides whether a superseded commit restarts the job outside its
/// [`RestartStrategy`]: up to [`SUPERSEDED_IN_A_ROW`] in a row while nothing
/// is committed between them. Kept by the job's restart loop across its
/// attempts.
#[derive(Debug, Default)]
pub struct SupersededRestarts {
    in_a_row: u32,
    /// Records committed by the job when the last superseded failure came.
    committed_then: u64,
}

impl SupersededRestarts {
    /// Called when an attempt failed with a superseded commit, with the
    /// records the job committed so far: whether it restarts at once.
    pub fn restart(&mut self, records_committed: u64) -> bool {
        if self.in_a_row > 0 && records_committed > self.committed_then {
            self.in_a_row = 0;
        }
        self.committed_then = records_committed;
        self.in_a_row += 1;
        self.in_a_row <= SUPERSEDED_IN_A_ROW
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superseded_commits_restart_while_records_are_committed_between_them() {
        let mut restarts = SupersededRestarts::default();
        for _ in 0..SUPERSEDED_IN_A_ROW {
            assert!(restarts.restart(0));
        }
        assert!(!restarts.restart(0), "a run that commits nothing ends");
        assert!(restarts.restart(5), "a record committed since: a new run");
        for n in 0..3 * SUPERSEDED_IN_A_ROW as u64 {
            assert!(restarts.restart(10 + n), "progress between each");
        }
    }

    #[test]
    fn restarts_are_bounded_and_delayed() {
        assert_eq!(RestartStrategy::Never.delay_before(1, 0.5), None);
        let fixed = RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::from_secs(1),
        };
        assert_eq!(fixed.delay_before(1, 0.0), Some(Duration::from_secs(1)));
        assert_eq!(fixed.delay_before(2, 0.9), Some(Duration::from_secs(1)));
        assert_eq!(fixed.delay_before(3, 0.0), None);
        let backoff = RestartStrategy::ExponentialBackoff(RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        });
        assert_eq!(
            backoff.delay_before(1, 1.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            backoff.delay_before(3, 1.0),
            Some(Duration::from_millis(400))
        );
        assert_eq!(backoff.delay_before(4, 1.0), None);
    }
}
