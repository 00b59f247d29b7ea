//! The pool of transactional ids of each subtask: which slots hold a
//! transaction whose commit is not settled yet.
//!
//! A writer takes the lowest free slot of its subtask when it opens a
//! transaction, and the slot stays taken while the transaction is open,
//! prepared, checkpointed and committed; the committer gives it back once
//! the commit is settled (committed, found committed already, or found
//! lost). A slot is never reused while a transaction in it may still be
//! committed: a new `InitProducerId` on it would abort that transaction.
//! When every slot is taken (commits fall behind by the pool's size), the
//! writer waits for one: back-pressure, not a lost transaction.
//!
//! A slot is given back for one transaction only: the committer names the
//! transaction it settled, and a slot that holds another (a commit settled
//! twice, as when an applied commit whose answer was lost is retried in
//! place after the writer took the slot again) stays taken.
//!
//! Kept by the sink, shared by its writers and committers in this process,
//! and set again at every start from what the restored checkpoint holds
//! (its committables' slots are taken until committed; every other
//! transaction of the lineage was aborted by the start).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use tokio::sync::Notify;

/// The transaction a slot holds: its producer id and epoch, or `None`
/// while the writer is beginning it.
pub(crate) type Holder = Option<(i64, i16)>;

/// The taken slots of every subtask, with the transaction each holds.
#[derive(Debug)]
pub(crate) struct Slots {
    size: u32,
    taken: Mutex<HashMap<usize, BTreeMap<u32, Holder>>>,
    freed: Notify,
}

impl Slots {
    /// A pool of `size` slots per subtask, all free.
    pub(crate) fn new(size: u32) -> Slots {
        Slots {
            size,
            taken: Mutex::new(HashMap::new()),
            freed: Notify::new(),
        }
    }

    /// Sets the taken slots to `taken` (subtask, slot, transaction), all
    /// others free. Called at every start of the job.
    pub(crate) fn reset(&self, taken: impl IntoIterator<Item = (usize, u32, Holder)>) {
        let mut map = self.lock();
        map.clear();
        for (subtask, slot, holder) in taken {
            map.entry(subtask).or_default().insert(slot, holder);
        }
        drop(map);
        self.freed.notify_waiters();
    }

    /// Takes the lowest free slot of `subtask`, waiting while none is free.
    pub(crate) async fn take(&self, subtask: usize) -> u32 {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a slot given back between the
            // look and the wait wakes this writer.
            freed.as_mut().enable();
            {
                let mut map = self.lock();
                let taken = map.entry(subtask).or_default();
                if let Some(slot) = (0..self.size).find(|s| !taken.contains_key(s)) {
                    taken.insert(slot, None);
                    return slot;
                }
            }
            freed.await;
        }
    }

    /// Records that `slot` of `subtask` holds the transaction `holder`.
    /// Called by the writer once its transaction began.
    pub(crate) fn hold(&self, subtask: usize, slot: u32, holder: Holder) {
        self.lock().entry(subtask).or_default().insert(slot, holder);
    }

    /// Gives `slot` of `subtask` back if it still holds `holder`. Called by
    /// committers once the commit of `holder` is settled, and by a writer
    /// whose transaction could not begin (`None`).
    pub(crate) fn give_back(&self, subtask: usize, slot: u32, holder: Holder) {
        let mut map = self.lock();
        if let Some(taken) = map.get_mut(&subtask) {
            if taken.get(&slot) == Some(&holder) {
                taken.remove(&slot);
            }
        }
        drop(map);
        self.freed.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, BTreeMap<u32, Holder>>> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_slot_is_not_handed_out_again_before_it_is_given_back() {
        let slots = Arc::new(Slots::new(2));
        slots.reset([(0, 0, Some((7, 1)))]);
        assert_eq!(slots.take(0).await, 1);
        slots.hold(0, 1, Some((7, 2)));
        assert_eq!(slots.take(1).await, 0, "subtasks have pools of their own");
        // Both of subtask 0's slots are taken: the next writer waits.
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(0).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "no slot was free");
        // A transaction the slot no longer holds gives nothing back.
        slots.give_back(0, 0, Some((7, 0)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "slot 0 holds another transaction");
        slots.give_back(0, 0, Some((7, 1)));
        let slot = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken when a slot was given back")
            .expect("the task ran");
        assert_eq!(slot, 0);
    }
}
