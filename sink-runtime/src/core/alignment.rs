//! Barrier alignment for the global committer.
//!
//! Every subtask sends the global committer, in order, what it committed and
//! the barriers it passed. For the global committer's snapshot of checkpoint
//! `n` to hold exactly what the subtasks committed before their barrier `n`
//! (no more, no less, so that nothing is delivered twice or lost after a
//! restore), messages a subtask sends after its barrier `n` wait until barrier
//! `n` arrived from every subtask:
//!
//! ```text
//! subtask 0:  c c B5 c c      ──▶   c c . . . . B5→snapshot(5) c c c
//! subtask 1:  c c c B5 c      ──▶          c c c
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use sink_api::{CheckpointId, SubtaskIndex};

/// What a subtask sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AlignerInput<M> {
    /// Anything but a barrier.
    Message(M),
    /// The subtask passed barrier `n`.
    Barrier(CheckpointId),
}

/// What the global committer processes, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aligned<M> {
    /// Process this message now.
    Message(M),
    /// Every subtask passed barrier `n`: snapshot now.
    Snapshot(CheckpointId),
}

/// A subtask sent a barrier other than the one being aligned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subtask {subtask} sent barrier {got} while barrier {aligning} is being aligned; barriers must arrive in the same order from every subtask")]
pub struct MisalignedBarrier {
    /// The subtask.
    pub subtask: SubtaskIndex,
    /// The barrier it sent.
    pub got: CheckpointId,
    /// The barrier being aligned.
    pub aligning: CheckpointId,
}

/// Holds back each subtask's messages after its barrier until every subtask
/// sent that barrier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BarrierAligner<M> {
    parallelism: usize,
    aligning: Option<CheckpointId>,
    arrived: BTreeSet<SubtaskIndex>,
    held: BTreeMap<SubtaskIndex, VecDeque<AlignerInput<M>>>,
}

impl<M> BarrierAligner<M> {
    /// An aligner over `parallelism` subtasks.
    pub fn new(parallelism: usize) -> BarrierAligner<M> {
        BarrierAligner {
            parallelism,
            aligning: None,
            arrived: BTreeSet::new(),
            held: BTreeMap::new(),
        }
    }

    /// Takes what `subtask` sent; returns what to process now, in order.
    pub fn push(
        &mut self,
        subtask: SubtaskIndex,
        input: AlignerInput<M>,
    ) -> Result<Vec<Aligned<M>>, MisalignedBarrier> {
        let mut out = Vec::new();
        self.feed(subtask, input, &mut out)?;
        Ok(out)
    }

    fn feed(
        &mut self,
        subtask: SubtaskIndex,
        input: AlignerInput<M>,
        out: &mut Vec<Aligned<M>>,
    ) -> Result<(), MisalignedBarrier> {
        if self.arrived.contains(&subtask) {
            self.held.entry(subtask).or_default().push_back(input);
            return Ok(());
        }
        let checkpoint_id = match input {
            AlignerInput::Message(message) => {
                out.push(Aligned::Message(message));
                return Ok(());
            }
            AlignerInput::Barrier(checkpoint_id) => checkpoint_id,
        };
        match self.aligning {
            Some(aligning) if aligning != checkpoint_id => {
                return Err(MisalignedBarrier {
                    subtask,
                    got: checkpoint_id,
                    aligning,
                });
            }
            _ => self.aligning = Some(checkpoint_id),
        }
        self.arrived.insert(subtask);
        if self.arrived.len() == self.parallelism {
            out.push(Aligned::Snapshot(checkpoint_id));
            self.aligning = None;
            self.arrived.clear();
            for (subtask, inputs) in std::mem::take(&mut self.held) {
                for input in inputs {
                    self.feed(subtask, input, out)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use AlignerInput::{Barrier, Message};

    fn cp(n: u64) -> CheckpointId {
        CheckpointId(n)
    }

    #[test]
    fn messages_after_a_barrier_wait_for_the_snapshot() {
        let mut aligner = BarrierAligner::new(2);
        assert_eq!(
            aligner.push(0, Message("a")).unwrap(),
            vec![Aligned::Message("a")]
        );
        assert_eq!(aligner.push(0, Barrier(cp(1))).unwrap(), vec![]);
        assert_eq!(aligner.push(0, Message("b")).unwrap(), vec![], "held back");
        assert_eq!(
            aligner.push(1, Message("c")).unwrap(),
            vec![Aligned::Message("c")]
        );
        assert_eq!(
            aligner.push(1, Barrier(cp(1))).unwrap(),
            vec![Aligned::Snapshot(cp(1)), Aligned::Message("b")]
        );
    }

    #[test]
    fn a_held_back_barrier_starts_the_next_alignment() {
        let mut aligner = BarrierAligner::new(2);
        aligner.push(0, Barrier(cp(1))).unwrap();
        aligner.push(0, Message("a")).unwrap();
        aligner.push(0, Barrier(cp(2))).unwrap();
        aligner.push(0, Message("b")).unwrap();
        assert_eq!(
            aligner.push(1, Barrier(cp(1))).unwrap(),
            vec![Aligned::Snapshot(cp(1)), Aligned::Message("a")]
        );
        assert_eq!(
            aligner.push(1, Barrier(cp(2))).unwrap(),
            vec![Aligned::Snapshot(cp(2)), Aligned::Message("b")]
        );
    }

    #[test]
    fn a_different_barrier_while_aligning_is_an_error() {
        let mut aligner = BarrierAligner::<()>::new(2);
        aligner.push(0, Barrier(cp(1))).unwrap();
        assert_eq!(
            aligner.push(1, Barrier(cp(2))),
            Err(MisalignedBarrier {
                subtask: 1,
                got: cp(2),
                aligning: cp(1)
            })
        );
    }
}
