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
//! restarts ([`SupersededRestarts`]), up to a bound per window of time,
//! past which the strategy decides.

use std::time::{Duration, Instant};

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

/// How many superseded commits restart the job outside its strategy within
/// [`SUPERSEDED_WINDOW`].
pub const SUPERSEDED_PER_WINDOW: usize = 20;

/// The window [`SUPERSEDED_PER_WINDOW`] counts in.
pub const SUPERSEDED_WINDOW: Duration = Duration::from_secs(600);

/// The wait before a restart after a superseded commit.
pub const SUPERSEDED_DELAY: Duration = Duration::from_millis(100);

/// Decides whether a superseded commit restarts the job outside its
/// [`RestartStrategy`]: at most [`SUPERSEDED_PER_WINDOW`] of them in any
/// [`SUPERSEDED_WINDOW`]. Hand-overs supersede a commit now and then; a
/// sink that reports superseded for a fault of its own (a transaction the
/// destination aborted, a part gone missing) every time would restart the
/// job without end, so past the bound the strategy decides. Kept by the
/// job's restart loop across its attempts.
#[derive(Debug, Default)]
pub struct SupersededRestarts {
    /// When the restarts within the window came, oldest first.
    recent: std::collections::VecDeque<Instant>,
}

impl SupersededRestarts {
    /// Called when an attempt failed with a superseded commit at `now`:
    /// whether it restarts at once, outside the strategy.
    pub fn restart(&mut self, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|&at| now.saturating_duration_since(at) >= SUPERSEDED_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= SUPERSEDED_PER_WINDOW {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superseded_commits_restart_outside_the_strategy_a_bounded_number_of_times_per_window() {
        let mut restarts = SupersededRestarts::default();
        let start = Instant::now();
        for n in 0..SUPERSEDED_PER_WINDOW as u64 {
            assert!(restarts.restart(start + Duration::from_secs(n)));
        }
        let later = start + Duration::from_secs(SUPERSEDED_PER_WINDOW as u64);
        assert!(
            !restarts.restart(later),
            "past the bound: the strategy decides"
        );
        // Once the first fell out of the window, one more is allowed.
        let out = start + SUPERSEDED_WINDOW;
        assert!(restarts.restart(out));
        assert!(!restarts.restart(out));
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
