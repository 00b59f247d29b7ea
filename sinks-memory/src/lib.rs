//! A transactional in-memory sink that counts every call: the oracle for
//! exactly-once tests.
//!
//! The sink models an external transactional system, a database with
//! prepared transactions, that lives in a shared [`MemoryStore`]. The store
//! outlives jobs: a test keeps a clone, runs a job (or several, with crashes
//! and restarts in between) on a [`MemorySink`] made from it, and then checks
//! what became visible.
//!
//! | type | role |
//! |---|---|
//! | [`MemoryStore`] | the shared "database": transactions, counters, contract checks, views |
//! | [`MemorySink`] | the [`Sink`](sink_api::Sink) factory given to the job builder |
//! | [`MemoryWriter`] | writes into an open transaction; `prepare_commit` prepares it |
//! | [`MemoryCommitter`] | commits prepared transactions, idempotently |
//! | [`MemoryGlobalCommitter`] | records what each checkpoint delivered, job-wide |
//! | [`InjectedCommitFailure`] and `MemoryStore::fail_next_*` | failure injection |
//! | [`MemoryStore::positions`], [`PositionFlaw`] | source positions, committed with a checkpoint's transactions as one (and two ways to keep them wrongly, for the kit's own tests) |
//!
//! ```text
//!  write ─▶ Open ── prepare_commit ─▶ Prepared ── commit ─▶ Committed ─▶ global committer
//!            │                                              (visible, exactly once)
//!            └── close ─▶ Aborted
//! ```
//!
//! # What a test checks
//!
//! - [`MemoryStore::committed`]: the visible output, each record once per
//!   committed transaction, whatever was replayed;
//! - [`MemoryStore::violations`]: broken contracts (a write after end of
//!   input, a second final `prepare_commit`, …), empty in a correct run;
//! - [`MemoryStore::stats`]: every call counted, including replays and
//!   injected failures.
//!
//! # Example
//!
//! Driving a writer and a committer by hand, as a runtime would:
//!
//! ```
//! use sink_api::{CheckpointId, CommitRequest, Committer, Generation, InitContext, Sink, SinkWriter};
//! use sinks_memory::{MemorySink, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), sink_api::SinkError> {
//! let store = MemoryStore::<u32>::new();
//! let sink = MemorySink::new(store.clone());
//! let context = InitContext::new("example", sink_api::Lineage::new("test-lineage"), Generation(1), 0, 1);
//! let mut writer = sink.create_writer(&context, Vec::new()).await?;
//! let mut committer = sink.create_committer(&context).await?;
//!
//! writer.write_batch(vec![1, 2, 3]).await?;
//! writer.flush(false).await?;
//! let committables = writer.prepare_commit(sink_api::CheckpointId(1)).await?;
//! writer.snapshot_state(CheckpointId(1)).await?;
//! assert_eq!(store.pending(), vec![1, 2, 3]);
//!
//! // Checkpoint 1 completes; the commit is replayed once, as after a crash.
//! for _ in 0..2 {
//!     let mut requests: Vec<_> = committables
//!         .iter()
//!         .map(|committable| CommitRequest::new(committable.clone(), CheckpointId(1), 0))
//!         .collect();
//!     committer.commit(&mut requests).await?;
//! }
//! assert_eq!(store.committed(), vec![1, 2, 3]);
//! assert_eq!(store.stats().replays, 1);
//! assert!(store.violations().is_empty());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod committer;
mod failure;
mod global_committer;
mod sink;
mod store;
mod writer;

pub use committer::MemoryCommitter;
pub use failure::InjectedCommitFailure;
pub use global_committer::MemoryGlobalCommitter;
pub use sink::MemorySink;
pub use store::{MemoryStats, MemoryStore, PositionFlaw, TransactionState};
pub use writer::{MemoryCommittable, MemoryWriter, MemoryWriterState};

/// Helpers shared by the unit tests of every module.
#[cfg(test)]
pub(crate) mod test_support {
    use sink_api::{
        CheckpointId, CommitOutcome, CommitRequest, Committer, Generation, InitContext,
    };

    use crate::{MemoryCommittable, MemoryCommitter};

    /// The init context of `subtask` in `generation`, parallelism 2.
    pub(crate) fn context(subtask: usize, generation: u64) -> InitContext {
        InitContext::new(
            "sinks-memory-test".to_owned(),
            sink_api::Lineage::new("test-lineage"),
            Generation(generation),
            subtask,
            2,
        )
    }

    /// Commits `committables` of `checkpoint` in one call and returns the
    /// outcomes, in order.
    pub(crate) async fn commit_all(
        committer: &mut MemoryCommitter<u32>,
        committables: &[MemoryCommittable],
        checkpoint: u64,
    ) -> Vec<CommitOutcome> {
        let mut requests: Vec<_> = committables
            .iter()
            .map(|committable| CommitRequest::new(committable.clone(), CheckpointId(checkpoint), 0))
            .collect();
        committer
            .commit(&mut requests)
            .await
            .expect("the commit call fails only with injected failures");
        requests
            .into_iter()
            .map(|request| request.into_parts().1)
            .collect()
    }
}
