//! Where a start puts what it begins with: the source's splits, the writer
//! states and the pending committables, over `parallelism` subtasks.
//!
//! ```text
//!  fresh start:                 split k          ─▶ subtask k % parallelism
//!  restore, same parallelism:   state, split     ─▶ the subtask that stored it
//!  restore, other parallelism:  states, splits   ─▶ dealt round-robin, each kind on its own
//!  restore, any:                pending part of origin o ─▶ subtask o % parallelism,
//!                                                   keeping its origin
//! ```
//!
//! A pending part keeps the subtask that prepared it (its summary's
//! `subtask`), so that each is committed exactly once and the global
//! committer still receives every original subtask's part of a restored
//! checkpoint (`CommitLedger::expect_until`).

use sink_api::SubtaskIndex;

/// The subtask that reads split `k` of a fresh start.
pub fn fresh_home(k: usize, parallelism: usize) -> SubtaskIndex {
    k % parallelism
}

/// The subtask that commits a restored pending part prepared by `origin`.
pub fn pending_home(origin: SubtaskIndex, parallelism: usize) -> SubtaskIndex {
    origin % parallelism
}

/// Deals one kind of restored item (writer states, or splits) to the
/// subtasks of a start. Made once per kind by the restore plan (and by the
/// model checker); `next` is called for each item, in the order the
/// checkpoint holds them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dealer {
    parallelism: usize,
    rescaled: bool,
    dealt: usize,
}

impl Dealer {
    /// A dealer for a restore of a checkpoint stored with
    /// `stored_parallelism` subtasks into `parallelism` subtasks.
    pub fn new(stored_parallelism: usize, parallelism: usize) -> Dealer {
        Dealer {
            parallelism,
            rescaled: stored_parallelism != parallelism,
            dealt: 0,
        }
    }

    /// Whether the parallelism changed.
    pub fn rescaled(&self) -> bool {
        self.rescaled
    }

    /// The subtask for the next item stored by subtask `origin`: its own
    /// when the parallelism is the same, the next one round-robin
    /// otherwise.
    pub fn next(&mut self, origin: SubtaskIndex) -> SubtaskIndex {
        if !self.rescaled {
            return origin;
        }
        self.dealt += 1;
        (self.dealt - 1) % self.parallelism
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_stay_home_unless_rescaled_then_are_dealt_round_robin() {
        let mut same = Dealer::new(2, 2);
        assert_eq!([same.next(1), same.next(0), same.next(1)], [1, 0, 1]);
        let mut up = Dealer::new(2, 3);
        assert_eq!(
            [up.next(0), up.next(0), up.next(1), up.next(1)],
            [0, 1, 2, 0]
        );
        assert_eq!(pending_home(2, 2), 0);
        assert_eq!(fresh_home(5, 3), 2);
    }
}
