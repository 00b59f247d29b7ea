//! Bounded commit retries with exponential backoff and jitter.
//!
//! A commit request that ends in "retry later" is tried again after a delay
//! that doubles with every retry, up to a ceiling, scaled by a random factor so
//! that many subtasks retrying against one system do not retry in lockstep.
//! After [`RetryPolicy::max_retries`] retries the job fails: a commit that can
//! never succeed must not stall the job silently.

use std::time::Duration;

/// How often and how patiently a commit is retried.
///
/// Given to the job builder; read by each subtask's committer loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries of one committable before the job fails. Default 10.
    pub max_retries: u32,
    /// The delay before the first retry. Default 100 ms.
    pub initial_backoff: Duration,
    /// The longest delay between two retries. Default 10 s.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The longest time all retries of one committable may wait in
    /// backoff, added up: each retry's delay without jitter. Read by the
    /// job builder to bound how long a committable may wait for its
    /// commit.
    pub fn longest_backoff(&self) -> Duration {
        (1..=self.max_retries)
            .map(|retry| self.backoff(retry, 1.0))
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    /// The delay before retry number `retry` (1 for the first retry).
    ///
    /// `jitter` is a random number in `[0, 1)`; the delay is the exponential
    /// value scaled into `[1/2, 1)` of itself ("equal jitter"), so it never
    /// collapses to zero and never exceeds the ceiling.
    pub fn backoff(&self, retry: u32, jitter: f64) -> Duration {
        let exponent = retry.saturating_sub(1).min(31);
        let exponential = self
            .initial_backoff
            .saturating_mul(1u32 << exponent)
            .min(self.max_backoff);
        let factor = 0.5 + 0.5 * jitter.clamp(0.0, 1.0);
        exponential.mul_f64(factor)
    }

    /// True when a request already retried `retries` times may not be retried
    /// again.
    pub fn exhausted(&self, retries: u32) -> bool {
        retries >= self.max_retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling() {
        let policy = RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        let top = |retry| policy.backoff(retry, 1.0);
        assert_eq!(top(1), Duration::from_millis(100));
        assert_eq!(top(2), Duration::from_millis(200));
        assert_eq!(top(4), Duration::from_millis(800));
        assert_eq!(top(5), Duration::from_secs(1));
        assert_eq!(top(60), Duration::from_secs(1));
    }

    #[test]
    fn jitter_keeps_the_delay_between_half_and_all() {
        let policy = RetryPolicy::default();
        for retry in 1..12 {
            let full = policy.backoff(retry, 1.0);
            let low = policy.backoff(retry, 0.0);
            let mid = policy.backoff(retry, 0.5);
            assert_eq!(low, full / 2);
            assert!(low <= mid && mid <= full);
        }
    }

    #[test]
    fn retries_are_bounded() {
        let policy = RetryPolicy {
            max_retries: 3,
            ..RetryPolicy::default()
        };
        assert!(!policy.exhausted(2));
        assert!(policy.exhausted(3));
    }
}
