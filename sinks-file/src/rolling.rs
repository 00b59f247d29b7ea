//! Rolling policies: when an in-progress part file is closed and the next
//! one started.
//!
//! A part closed by rolling becomes pending: it is committed (made visible)
//! with the next checkpoint. Four rules, combinable, each optional:
//!
//! | rule | default | checked |
//! |---|---|---|
//! | part size reaches `max_part_size_bytes` | 128 MiB | before each record is written, and at each checkpoint |
//! | `rollover_interval` since the part was created | 60 s | once per batch of records, and at each checkpoint |
//! | `inactivity_interval` since the last write to the part | 60 s | likewise |
//! | `roll_on_checkpoint` | off | at each checkpoint |
//!
//! Without rolling at checkpoints, an in-progress part survives a checkpoint
//! as it is: the writer records its path and length in its state, and a
//! restore truncates it back to that length.

use std::time::Duration;

/// What the policy knows of an in-progress part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartInfo {
    /// Bytes written to it so far.
    pub size_bytes: u64,
    /// When it was created, ms since the Unix epoch.
    pub created_ms: u64,
    /// When it was last written to, ms since the Unix epoch.
    pub last_write_ms: u64,
}

/// When in-progress parts roll. Given to the file sink's builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollingPolicy {
    /// Roll before a record would make the part larger than this.
    pub max_part_size_bytes: Option<u64>,
    /// Roll a part this long after its creation.
    pub rollover_interval: Option<Duration>,
    /// Roll a part not written to for this long.
    pub inactivity_interval: Option<Duration>,
    /// Roll every part at every checkpoint.
    pub roll_on_checkpoint: bool,
}

impl Default for RollingPolicy {
    /// 128 MiB, 60 s since creation, 60 s of inactivity, not on checkpoints
    /// (Flink's `DefaultRollingPolicy`).
    fn default() -> RollingPolicy {
        RollingPolicy {
            max_part_size_bytes: Some(128 * 1024 * 1024),
            rollover_interval: Some(Duration::from_secs(60)),
            inactivity_interval: Some(Duration::from_secs(60)),
            roll_on_checkpoint: false,
        }
    }
}

impl RollingPolicy {
    /// Rolls at every checkpoint and never otherwise (Flink's
    /// `OnCheckpointRollingPolicy`): every checkpoint commits everything
    /// written before it.
    pub fn on_checkpoint() -> RollingPolicy {
        RollingPolicy {
            max_part_size_bytes: None,
            rollover_interval: None,
            inactivity_interval: None,
            roll_on_checkpoint: true,
        }
    }

    /// Whether to roll `part` before writing `next_bytes` more to it. An
    /// empty part never rolls for size: a record larger than the limit gets
    /// a part of its own.
    pub fn should_roll_before_write(&self, part: &PartInfo, next_bytes: u64) -> bool {
        self.max_part_size_bytes.is_some_and(|limit| {
            part.size_bytes > 0 && part.size_bytes.saturating_add(next_bytes) > limit
        })
    }

    /// Whether `part` is due to roll by time at `now_ms`.
    pub fn should_roll_on_time(&self, part: &PartInfo, now_ms: u64) -> bool {
        let elapsed = |since: u64| Duration::from_millis(now_ms.saturating_sub(since));
        self.rollover_interval
            .is_some_and(|interval| elapsed(part.created_ms) >= interval)
            || self
                .inactivity_interval
                .is_some_and(|interval| elapsed(part.last_write_ms) >= interval)
    }

    /// Whether to roll `part` at a checkpoint taken at `now_ms`.
    pub fn should_roll_on_checkpoint(&self, part: &PartInfo, now_ms: u64) -> bool {
        self.roll_on_checkpoint
            || self
                .max_part_size_bytes
                .is_some_and(|limit| part.size_bytes >= limit)
            || self.should_roll_on_time(part, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(size_bytes: u64, created_ms: u64, last_write_ms: u64) -> PartInfo {
        PartInfo {
            size_bytes,
            created_ms,
            last_write_ms,
        }
    }

    #[test]
    fn size_rolls_before_the_record_that_would_overflow() {
        let policy = RollingPolicy {
            max_part_size_bytes: Some(100),
            ..RollingPolicy::on_checkpoint()
        };
        assert!(!policy.should_roll_before_write(&part(90, 0, 0), 10));
        assert!(policy.should_roll_before_write(&part(90, 0, 0), 11));
        assert!(
            !policy.should_roll_before_write(&part(0, 0, 0), 1_000),
            "a huge record gets a part of its own"
        );
    }

    #[test]
    fn rollover_counts_from_creation_and_inactivity_from_the_last_write() {
        let policy = RollingPolicy {
            max_part_size_bytes: None,
            rollover_interval: Some(Duration::from_secs(60)),
            inactivity_interval: Some(Duration::from_secs(10)),
            roll_on_checkpoint: false,
        };
        assert!(!policy.should_roll_on_time(&part(1, 0, 55_000), 59_999));
        assert!(
            policy.should_roll_on_time(&part(1, 0, 55_000), 60_000),
            "60 s old"
        );
        assert!(!policy.should_roll_on_time(&part(1, 30_000, 35_000), 44_999));
        assert!(
            policy.should_roll_on_time(&part(1, 30_000, 35_000), 45_000),
            "10 s idle"
        );
    }

    #[test]
    fn checkpoints_roll_when_asked_or_when_a_limit_is_reached() {
        let on_checkpoint = RollingPolicy::on_checkpoint();
        assert!(on_checkpoint.should_roll_on_checkpoint(&part(1, 0, 0), 0));
        assert!(!on_checkpoint.should_roll_on_time(&part(1, 0, 0), u64::MAX));

        let default = RollingPolicy::default();
        assert!(!default.should_roll_on_checkpoint(&part(1, 0, 0), 1_000));
        assert!(default.should_roll_on_checkpoint(&part(128 * 1024 * 1024, 0, 0), 1_000));
        assert!(default.should_roll_on_checkpoint(&part(1, 0, 0), 60_000));
    }
}
