//! The pool of transactional ids of each subtask: which slots hold a
//! transaction whose commit is not settled yet, and since when.
//!
//! A writer takes the lowest free slot of its subtask when it opens a
//! transaction, and the slot stays taken while the transaction is open,
//! prepared, checkpointed and committed; the committer gives it back once
//! the commit is settled as committed (or found committed already). A
//! transaction found lost keeps its slot until the next start: so a later
//! transaction committed in a slot proves the earlier one committed (the
//! commit marker's "later" verdict relies on it). A slot is never reused
//! while a transaction in it may still be committed: a new `InitProducerId`
//! on it would abort that transaction.
//!
//! A slot is given back for one transaction only: the committer names the
//! transaction it settled, and a slot that holds another (a commit settled
//! twice, as when an applied commit whose answer was lost is retried in
//! place after the writer took the slot again) stays taken.
//!
//! The writer never waits for a slot: the committer that frees slots is
//! driven by checkpoint completions, which the writer's own task passes on,
//! so waiting could never end. When every slot is taken, or a slot has held
//! its transaction for half the transaction timeout (checkpoints failing,
//! commits falling behind), `take` refuses with a transient error: the job
//! restarts from its last completed checkpoint, commits what that
//! checkpoint holds, aborts the rest and writes those records again, before
//! the broker's timeout could abort a prepared transaction.
//!
//! Kept by the sink, shared by its writers and committers in this process,
//! and set again at every start from what the restored checkpoint holds
//! (its committables' slots are taken until committed; every other
//! transaction of the lineage was aborted by the start).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The transaction a slot holds: its producer id and epoch, or `None`
/// while the writer is beginning it.
pub(crate) type Holder = Option<(i64, i16)>;

#[derive(Debug, Clone, Copy)]
struct Taken {
    holder: Holder,
    since: Instant,
}

/// Why no slot was handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// Every slot holds a transaction whose commit is not settled.
    AllTaken { size: u32 },
    /// A slot has held its transaction this long.
    Stale { slot: u32, age: Duration },
}

/// The taken slots of every subtask, with the transaction each holds.
#[derive(Debug)]
pub(crate) struct Slots {
    size: u32,
    /// A slot held longer fails the next `take`.
    max_age: Duration,
    taken: Mutex<HashMap<usize, BTreeMap<u32, Taken>>>,
}

impl Slots {
    /// A pool of `size` slots per subtask, all free; a slot held longer
    /// than `max_age` makes the next `take` refuse.
    pub(crate) fn new(size: u32, max_age: Duration) -> Slots {
        Slots {
            size,
            max_age,
            taken: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the taken slots to `taken` (subtask, slot, transaction), all
    /// others free. Called at every start of the job.
    pub(crate) fn reset(&self, taken: impl IntoIterator<Item = (usize, u32, Holder)>) {
        let now = Instant::now();
        let mut map = self.lock();
        map.clear();
        for (subtask, slot, holder) in taken {
            map.entry(subtask)
                .or_default()
                .insert(slot, Taken { holder, since: now });
        }
    }

    /// Takes the lowest free slot of `subtask`, or says why none may be
    /// taken now.
    pub(crate) fn take(&self, subtask: usize) -> Result<u32, NoSlot> {
        let now = Instant::now();
        let mut map = self.lock();
        let taken = map.entry(subtask).or_default();
        if let Some((slot, oldest)) = taken.iter().min_by_key(|(_, t)| t.since) {
            let age = now.saturating_duration_since(oldest.since);
            if age > self.max_age {
                return Err(NoSlot::Stale { slot: *slot, age });
            }
        }
        let slot = (0..self.size)
            .find(|s| !taken.contains_key(s))
            .ok_or(NoSlot::AllTaken { size: self.size })?;
        taken.insert(
            slot,
            Taken {
                holder: None,
                since: now,
            },
        );
        Ok(slot)
    }

    /// Records that `slot` of `subtask` holds the transaction `holder`.
    /// Called by the writer once its transaction began.
    pub(crate) fn hold(&self, subtask: usize, slot: u32, holder: Holder) {
        if let Some(taken) = self.lock().get_mut(&subtask).and_then(|t| t.get_mut(&slot)) {
            taken.holder = holder;
        }
    }

    /// Gives `slot` of `subtask` back if it still holds `holder`. Called by
    /// committers once the commit of `holder` is settled as committed, and
    /// by a writer whose transaction could not begin (`None`).
    pub(crate) fn give_back(&self, subtask: usize, slot: u32, holder: Holder) {
        let mut map = self.lock();
        if let Some(taken) = map.get_mut(&subtask) {
            if taken.get(&slot).map(|t| t.holder) == Some(holder) {
                taken.remove(&slot);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, BTreeMap<u32, Taken>>> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_not_handed_out_again_before_it_is_given_back() {
        let slots = Slots::new(2, Duration::from_secs(60));
        slots.reset([(0, 0, Some((7, 1)))]);
        assert_eq!(slots.take(0), Ok(1));
        slots.hold(0, 1, Some((7, 2)));
        assert_eq!(slots.take(1), Ok(0), "subtasks have pools of their own");
        // Both of subtask 0's slots are taken: refused, never waited for.
        assert_eq!(slots.take(0), Err(NoSlot::AllTaken { size: 2 }));
        // A transaction the slot no longer holds gives nothing back.
        slots.give_back(0, 0, Some((7, 0)));
        assert_eq!(slots.take(0), Err(NoSlot::AllTaken { size: 2 }));
        slots.give_back(0, 0, Some((7, 1)));
        assert_eq!(slots.take(0), Ok(0));
    }

    #[test]
    fn a_slot_held_too_long_refuses_the_next_transaction() {
        let slots = Slots::new(4, Duration::from_millis(20));
        assert_eq!(slots.take(0), Ok(0));
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            matches!(slots.take(0), Err(NoSlot::Stale { slot: 0, .. })),
            "slot 0 is past the age"
        );
        slots.give_back(0, 0, None);
        assert_eq!(slots.take(0), Ok(0));
    }
}
