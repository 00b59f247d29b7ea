//! What to do when a task fails: restart the whole job from its last
//! completed checkpoint, or give up.
//!
//! A restart is a new start on the same checkpoint storage: a new generation,
//! sources at the stored positions, writers from their states, and the
//! pending committables committed again before new data flows. The tasks of
//! the failed attempt are stopped before the new ones start, so nothing of an
//! older generation commits after a newer one began.

use std::time::Duration;

use super::retry::RetryPolicy;

/// When a failed job is restarted. Given to
/// [`JobBuilder::restart_strategy`](crate::JobBuilder::restart_strategy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartStrategy {
    /// Never restart: the first task failure fails the job. The default.
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

#[cfg(test)]
mod tests {
    use super::*;

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
