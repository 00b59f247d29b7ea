//! The life of one subtask's writer, from first record to exit.
//!
//! ```text
//!  Running ──barrier n──▶ Running            (flush, prepare_commit, summary n, snapshot)
//!     │
//!     └──end of input──▶ Ended { tag }       (flush(true), prepare_commit once, summary `tag`)
//!                          │ barrier m         (snapshot only: no prepare_commit, ever again;
//!                          │                    an empty summary for m unless m is the tag)
//!                          └─final commit done──▶ end of stream to the global committer, exit
//! ```
//!
//! The end-of-input committables are tagged `last barrier + 1`: larger than any
//! checkpoint this writer took part in, and not larger than any it will take
//! part in. End of stream is forwarded to the global committer only once the
//! final commit is done, never at end of input (FLINK-38614).

use sink_api::CheckpointId;

/// What a subtask does when barrier `n` reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierAction {
    /// Before end of input: `flush(false)`, `prepare_commit`, a summary for
    /// `n` with the committables, then `snapshot_state(n)`.
    PrepareAndSnapshot,
    /// After end of input: no `prepare_commit`; an empty summary for `n`, then
    /// `snapshot_state(n)`.
    SnapshotWithEmptySummary,
    /// After end of input, and `n` is the tag of the end-of-input committables,
    /// whose summary was already sent: `snapshot_state(n)` only.
    SnapshotOnly,
}

/// A broken ordering promise in the runtime. Always a bug; the job fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// Barriers must reach a subtask in increasing order.
    #[error(
        "barrier {got} reached the subtask after barrier {last}; barriers must arrive in order"
    )]
    BarrierOutOfOrder {
        /// The barrier that arrived.
        got: CheckpointId,
        /// The last barrier seen.
        last: CheckpointId,
    },
    /// End of input happens once.
    #[error("end of input was signalled twice")]
    EndOfInputTwice,
}

/// The lifecycle of one subtask: which writer calls are allowed now.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubtaskLifecycle {
    last_barrier: CheckpointId,
    end_of_input_tag: Option<CheckpointId>,
    defer_end_of_stream: bool,
    end_of_stream_sent: bool,
    /// A past bug put back (FLINK-23473's shape): `prepare_commit` at every
    /// barrier after end of input too. Only the `testing` feature sets it.
    prepare_after_end_of_input: bool,
}

impl SubtaskLifecycle {
    /// A subtask that starts after checkpoint `restored` (or
    /// [`CheckpointId::NONE`] on a fresh start). `defer_end_of_stream` is the
    /// contract's rule and only a test switches it off.
    pub fn new(restored: CheckpointId, defer_end_of_stream: bool) -> SubtaskLifecycle {
        SubtaskLifecycle {
            last_barrier: restored,
            end_of_input_tag: None,
            defer_end_of_stream,
            end_of_stream_sent: false,
            prepare_after_end_of_input: false,
        }
    }

    /// The same lifecycle with a past bug put back: every barrier after end
    /// of input calls `prepare_commit` again, which opens a transaction no
    /// one will commit (FLINK-23473). For the model checker's tests, which
    /// must find it; never in a job.
    #[cfg(feature = "testing")]
    pub fn with_prepare_after_end_of_input(mut self) -> SubtaskLifecycle {
        self.prepare_after_end_of_input = true;
        self
    }

    /// Barrier `n` reached the subtask.
    pub fn on_barrier(&mut self, n: CheckpointId) -> Result<BarrierAction, LifecycleError> {
        if n <= self.last_barrier {
            return Err(LifecycleError::BarrierOutOfOrder {
                got: n,
                last: self.last_barrier,
            });
        }
        self.last_barrier = n;
        Ok(match self.end_of_input_tag {
            None => BarrierAction::PrepareAndSnapshot,
            Some(_) if self.prepare_after_end_of_input => BarrierAction::PrepareAndSnapshot,
            Some(tag) if tag == n => BarrierAction::SnapshotOnly,
            Some(_) => BarrierAction::SnapshotWithEmptySummary,
        })
    }

    /// The source of this subtask ran out. Returns the checkpoint id that
    /// tags the end-of-input committables.
    pub fn on_end_of_input(&mut self) -> Result<CheckpointId, LifecycleError> {
        if self.end_of_input_tag.is_some() {
            return Err(LifecycleError::EndOfInputTwice);
        }
        let tag = self.last_barrier.next();
        self.end_of_input_tag = Some(tag);
        Ok(tag)
    }

    /// True until end of input: records may be written and `prepare_commit`
    /// may be called.
    pub fn accepts_input(&self) -> bool {
        self.end_of_input_tag.is_none()
    }

    /// The tag of the end-of-input committables, once input ended.
    pub fn end_of_input_tag(&self) -> Option<CheckpointId> {
        self.end_of_input_tag
    }

    /// Whether to tell the global committer now that this subtask's input
    /// ended. Call at end of input with `final_commit_done = false` and after
    /// the final commit with `true`; answers true at most once.
    pub fn take_end_of_stream(&mut self, final_commit_done: bool) -> bool {
        let ready =
            self.end_of_input_tag.is_some() && (final_commit_done || !self.defer_end_of_stream);
        if ready && !self.end_of_stream_sent {
            self.end_of_stream_sent = true;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_commit_happens_only_before_end_of_input() {
        let mut life = SubtaskLifecycle::new(CheckpointId::NONE, true);
        assert_eq!(
            life.on_barrier(CheckpointId(1)),
            Ok(BarrierAction::PrepareAndSnapshot)
        );
        assert_eq!(life.on_end_of_input(), Ok(CheckpointId(2)));
        assert!(!life.accepts_input());
        assert_eq!(
            life.on_barrier(CheckpointId(2)),
            Ok(BarrierAction::SnapshotOnly)
        );
        assert_eq!(
            life.on_barrier(CheckpointId(3)),
            Ok(BarrierAction::SnapshotWithEmptySummary)
        );
        assert_eq!(life.on_end_of_input(), Err(LifecycleError::EndOfInputTwice));
    }

    #[test]
    fn the_end_of_input_tag_follows_the_restored_checkpoint() {
        let mut life = SubtaskLifecycle::new(CheckpointId(41), true);
        assert_eq!(life.on_end_of_input(), Ok(CheckpointId(42)));
    }

    #[test]
    fn barriers_out_of_order_are_refused() {
        let mut life = SubtaskLifecycle::new(CheckpointId::NONE, true);
        life.on_barrier(CheckpointId(2)).unwrap();
        assert!(life.on_barrier(CheckpointId(2)).is_err());
        assert!(life.on_barrier(CheckpointId(1)).is_err());
    }

    #[test]
    fn end_of_stream_waits_for_the_final_commit() {
        let mut life = SubtaskLifecycle::new(CheckpointId::NONE, true);
        assert!(!life.take_end_of_stream(true), "input has not ended");
        life.on_end_of_input().unwrap();
        assert!(
            !life.take_end_of_stream(false),
            "deferred until the final commit"
        );
        assert!(life.take_end_of_stream(true));
        assert!(!life.take_end_of_stream(true), "sent once");
    }

    #[test]
    fn without_deferral_end_of_stream_goes_out_at_end_of_input() {
        let mut life = SubtaskLifecycle::new(CheckpointId::NONE, false);
        life.on_end_of_input().unwrap();
        assert!(life.take_end_of_stream(false));
        assert!(!life.take_end_of_stream(true));
    }
}
