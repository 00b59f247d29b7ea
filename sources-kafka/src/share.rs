//! What the readers of one start of a job share in its process: which
//! subtask reads each partition, and which partitions were read to their
//! end.
//!
//! ```text
//!  take_over(assigned) ─▶ claim: partitions another subtask of this start reads are skipped
//!  revoke, close        ─▶ release
//!  a partition read to its end ─▶ read_to_end: counted as read by every waiting member of
//!                                 this start (the job commits it before it returns)
//! ```
//!
//! A group may deal one partition to two members (noida-db does after a
//! restart of static members): two subtasks of one instance then read it
//! once, not twice. A subtask that waits for the end of a bounded input
//! counts what the other subtasks of its start read: their records are
//! committed by the same job, at the latest with its final checkpoint, so
//! a job without checkpoints does not wait for commits that only its own
//! end would make. Across instances, the destination decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use sink_api::SubtaskIndex;

/// The readers of one start of a job, in one process. Made by the source
/// when it creates a start's first reader; every reader of that start holds
/// it.
#[derive(Debug, Default)]
pub(crate) struct StartShare(Mutex<Shared>);

#[derive(Debug, Default)]
struct Shared {
    /// Who reads each partition now.
    held: BTreeMap<i32, SubtaskIndex>,
    /// Partitions a reader of this start read to their end.
    read_to_end: BTreeSet<i32>,
}

impl StartShare {
    /// A share for a new start.
    pub(crate) fn new() -> Arc<StartShare> {
        Arc::new(StartShare::default())
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        // Nothing is left half-done under the lock: a panic elsewhere
        // poisons nothing of it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `subtask` was dealt `assigned` (in place of what it was dealt
    /// before): the partitions it reads (none that another subtask of this
    /// start reads), and those it leaves to another, with that subtask.
    pub(crate) fn claim(
        &self,
        subtask: SubtaskIndex,
        assigned: &[i32],
    ) -> (Vec<i32>, Vec<(i32, SubtaskIndex)>) {
        let mut shared = self.shared();
        shared.held.retain(|_, holder| *holder != subtask);
        let mut mine = Vec::new();
        let mut elsewhere = Vec::new();
        for &partition in assigned {
            match shared.held.get(&partition) {
                Some(&other) if other != subtask => elsewhere.push((partition, other)),
                _ => {
                    shared.held.insert(partition, subtask);
                    mine.push(partition);
                }
            }
        }
        (mine, elsewhere)
    }

    /// `subtask` reads none of its partitions any more.
    pub(crate) fn release(&self, subtask: SubtaskIndex) {
        self.shared().held.retain(|_, holder| *holder != subtask);
    }

    /// `partition` was read to its end by a reader of this start.
    pub(crate) fn read_to_end(&self, partition: i32) {
        self.shared().read_to_end.insert(partition);
    }

    /// The partitions the readers of this start read to their end.
    pub(crate) fn read_here(&self) -> BTreeSet<i32> {
        self.shared().read_to_end.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_dealt_to_two_subtasks_is_read_by_the_first_until_it_lets_go() {
        let share = StartShare::new();
        assert_eq!(share.claim(0, &[2, 3]), (vec![2, 3], vec![]));
        assert_eq!(share.claim(1, &[2, 3]), (vec![], vec![(2, 0), (3, 0)]));
        // Dealt again: what its holder was dealt before is let go.
        assert_eq!(share.claim(0, &[3]), (vec![3], vec![]));
        assert_eq!(share.claim(1, &[2, 3]), (vec![2], vec![(3, 0)]));
        share.release(0);
        assert_eq!(share.claim(1, &[0, 1, 2, 3]), (vec![0, 1, 2, 3], vec![]));
        share.read_to_end(2);
        assert_eq!(share.read_here(), [2].into());
    }
}
