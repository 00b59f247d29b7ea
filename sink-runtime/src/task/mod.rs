//! The runtime's tasks and the messages between them.
//!
//! ```text
//!                 Control (trigger, complete, cancel)
//!   coordinator ───────────────────────────────────────▶ subtask[i]: source ─▶ writer
//!        ▲                                                    │  ▲ CommitJob / CommitDone
//!        │                                                    │  ▼
//!        │                                                    │ committer[i] (a task of its own)
//!        └──────────── TaskEvent (ack with state, end of input)┤
//!        ▲                                                    │ GlobalMessage (committed, barrier,
//!        │                                                    ▼              end of stream)
//!        └──────────── TaskEvent (ack with state) ───── global committer
//! ```
//!
//! Control and event channels are unbounded on purpose: their traffic is a
//! few messages per checkpoint, bounded by the number of checkpoints in
//! flight, and a bounded channel between two tasks that wait on each other
//! could deadlock. The channel to the global committer carries data and is
//! bounded: the subtasks forward their committed committables through it,
//! so a slow global committer slows the subtasks down (reading and barriers
//! too, as it must: the global committer's snapshots follow the barriers).
//! The channels between a subtask and its committer task carry one message
//! per checkpoint each way and are unbounded; the subtask stops reading
//! past a backlog (see `subtask::MAX_COMMIT_BACKLOG`).

pub(crate) mod calls;
pub(crate) mod committer;
pub(crate) mod global;
pub(crate) mod subtask;

use sink_api::{CheckpointId, SubtaskIndex};

use crate::core::checkpoints::TaskId;
use crate::core::ledger::CommittableSummary;
use crate::storage::{GlobalCommitterSnapshot, SubtaskSnapshot};

/// Capacity of the channel from the committers to the global committer.
pub(crate) const GLOBAL_CHANNEL_CAPACITY: usize = 1024;

/// From the coordinator to a subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Take checkpoint `n`: the barrier.
    Trigger(CheckpointId),
    /// Checkpoint `n` completed: commit everything `<= n`. When `is_final`,
    /// then close and exit.
    Complete {
        checkpoint_id: CheckpointId,
        is_final: bool,
    },
    /// Stop now, committing nothing more.
    Cancel,
    /// End the input now, as if the reader had returned `Finished`: a
    /// stop ([`JobControl::stop`](crate::JobControl::stop)). Ignored once
    /// the input ended.
    EndInput,
}

/// A task's state for one checkpoint.
#[derive(Debug)]
pub(crate) enum TaskState {
    /// A subtask's part, and its job counters' counts at its barrier
    /// ([`JobCounter`](crate::JobCounter)).
    Subtask(SubtaskSnapshot, std::collections::BTreeMap<String, u64>),
    GlobalCommitter(GlobalCommitterSnapshot),
}

/// From a task to the coordinator.
#[derive(Debug)]
pub(crate) enum TaskEvent {
    /// The task took its part of checkpoint `checkpoint_id`.
    Ack {
        task: TaskId,
        checkpoint_id: CheckpointId,
        state: TaskState,
    },
    /// A subtask wrote its first records after its barrier of checkpoint
    /// `since` (sent only when checkpoints are on demand).
    RecordsWritten { since: CheckpointId },
    /// The subtask's input ended; its end-of-input committables wait for the
    /// final checkpoint.
    EndOfInput { subtask: SubtaskIndex },
}

/// From a subtask to the global committer, in order: what its committer
/// task reported committed, and the barriers it passed.
#[derive(Debug)]
pub(crate) enum GlobalMessage<C> {
    /// What the subtask committed for one checkpoint (possibly nothing).
    Committed {
        summary: CommittableSummary,
        committables: Vec<C>,
    },
    /// The subtask passed barrier `n`: everything it committed before is
    /// already in this channel.
    Barrier {
        checkpoint_id: CheckpointId,
        subtask: SubtaskIndex,
    },
    /// The subtask's input ended and its final committables were forwarded.
    EndOfStream { subtask: SubtaskIndex },
    /// The subtask re-committed and forwarded what the restored checkpoint
    /// held for it, and waits to start its reader at the destination's
    /// positions (a source with a position scope) until the global
    /// committer committed every checkpoint up to the restored one.
    Recommitted { subtask: SubtaskIndex },
}
