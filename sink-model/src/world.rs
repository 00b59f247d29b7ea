//! The small worlds the job model explores, and the past bugs it can put
//! back.
//!
//! A world fixes everything that is not an interleaving: how many subtasks,
//! records and checkpoints, how many crashes and faults at most, the mode,
//! the input, whether a global committer runs, and the parallelisms a
//! restart may choose. The checker then tries every order of every event
//! inside those bounds.

use std::collections::BTreeSet;
use std::fmt;

use sink_runtime::core::admission::JobShape;

/// Whether the source ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// Every split ends after its records: end of input, the final
    /// checkpoint, the job returns.
    Bounded,
    /// The splits hold their records and then wait for more, forever.
    Unbounded,
}

/// How the job is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Streaming, with checkpoints (`true`) or without.
    Streaming {
        /// Periodic checkpoints were configured.
        checkpoints: bool,
    },
    /// Batch: the interval is ignored, one commit at end of input.
    Batch,
}

/// What the destination is, as the contract lets it be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Destination {
    /// Each committable is a transaction named by its committable's name:
    /// applied once, a replay recognised from the destination and answered
    /// "already committed" (PostgreSQL, Kafka, Delta, Iceberg).
    Transactional,
    /// Each record is written under its own key: writing it again changes
    /// nothing, and the committer answers "committed" every time (an
    /// upsert; files named by their content's position).
    Idempotent,
}

/// A past bug of the contract, put back for the checker to find. Each has a
/// test in `tests/past_bugs.rs` that expects the checker to fail with a
/// readable counterexample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PastBug {
    /// End of stream goes to the global committer at end of input, before
    /// the final checkpoint's committables (FLINK-38614). The switch is
    /// `SubtaskLifecycle::new(_, defer_end_of_stream = false)`.
    EndOfStreamBeforeFinalCommit,
    /// Every barrier after end of input calls `prepare_commit` again: a
    /// transaction opened after the finish (FLINK-23473). The switch is
    /// `SubtaskLifecycle::with_prepare_after_end_of_input`.
    TransactionAfterFinish,
    /// A checkpoint is committed once its parts arrived, before it
    /// completed. The switch is `CommitLedger::with_commit_before_completion`.
    CommitBeforeCompletion,
    /// Committables are named without the start's generation: a restart
    /// prepares the checkpoint after the restored one again under the name
    /// the crashed start used. The switch is in the model: every start's
    /// `InitContext` gets generation 1, as when the runtime did not count
    /// starts.
    GenerationLessIds,
    /// A bounded member of a consumer group ends once the partitions it was
    /// dealt are read, not every partition of the input (the 2026-12-06
    /// incident). The switch is in the source model: the member asks
    /// `end::unread` about its own partitions' ends only, which is what the
    /// reader gathered before.
    EndOnOwnPartitions,
}

impl PastBug {
    /// Every past bug, for the command line.
    pub const ALL: [PastBug; 5] = [
        PastBug::EndOfStreamBeforeFinalCommit,
        PastBug::TransactionAfterFinish,
        PastBug::CommitBeforeCompletion,
        PastBug::GenerationLessIds,
        PastBug::EndOnOwnPartitions,
    ];

    /// The name on the command line (`--bug`).
    pub fn name(self) -> &'static str {
        match self {
            PastBug::EndOfStreamBeforeFinalCommit => "end-of-stream-before-final-commit",
            PastBug::TransactionAfterFinish => "transaction-after-finish",
            PastBug::CommitBeforeCompletion => "commit-before-completion",
            PastBug::GenerationLessIds => "generation-less-ids",
            PastBug::EndOnOwnPartitions => "end-on-own-partitions",
        }
    }

    /// The bug named `name`, if any.
    pub fn from_name(name: &str) -> Option<PastBug> {
        PastBug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

impl fmt::Display for PastBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One small world of the job model. Made by the tests and the command
/// line; read by [`JobModel`](crate::JobModel) at every step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobWorld {
    /// Subtasks at the first start; also the number of splits.
    pub subtasks: usize,
    /// The parallelisms a restart may choose (rescale): each crash tries
    /// each of them. Empty: the first start's.
    pub restart_parallelisms: Vec<usize>,
    /// Records in each split.
    pub records: u8,
    /// Checkpoints triggered before end of input, at most (by id: a restart
    /// from checkpoint `k` may trigger `k + 1` again). The final
    /// checkpoint is always allowed.
    pub checkpoints: u64,
    /// Checkpoints in flight at once (`CheckpointConfig::max_concurrent`).
    pub concurrent: usize,
    /// Crashes (and job failures, each followed by a restart) at most.
    pub crashes: u8,
    /// Faults at most: a commit answered other than "committed" (retry
    /// later, a lost answer, a known failure, an unknown outcome), a
    /// checkpoint that fails or times out, a stored checkpoint reported
    /// failed, a completion notice lost or delayed past the next message.
    pub faults: u8,
    /// Runs again on fresh checkpoint storage, at most (a new lineage).
    pub fresh_runs: u8,
    /// Bounded or not.
    pub input: Input,
    /// Streaming with or without checkpoints, or batch.
    pub mode: Mode,
    /// `allow_uncommitted_output()` was called.
    pub allow_uncommitted: bool,
    /// A global committer runs after the committers (it makes the output
    /// visible; the committers only stage it).
    pub global_committer: bool,
    /// What the destination is.
    pub destination: Destination,
    /// The past bugs put back.
    pub bugs: BTreeSet<PastBug>,
}

impl JobWorld {
    /// The default world: 2 subtasks with 2 records each, up to 2
    /// checkpoints, 1 crash, 1 fault, bounded streaming with checkpoints,
    /// no global committer.
    pub fn small() -> JobWorld {
        JobWorld {
            subtasks: 2,
            restart_parallelisms: Vec::new(),
            records: 2,
            checkpoints: 2,
            concurrent: 1,
            crashes: 1,
            faults: 1,
            fresh_runs: 0,
            input: Input::Bounded,
            mode: Mode::Streaming { checkpoints: true },
            allow_uncommitted: false,
            global_committer: false,
            destination: Destination::Transactional,
            bugs: BTreeSet::new(),
        }
    }

    /// The same world with `bug` put back.
    pub fn with_bug(mut self, bug: PastBug) -> JobWorld {
        self.bugs.insert(bug);
        self
    }

    /// Whether `bug` is put back.
    pub fn has(&self, bug: PastBug) -> bool {
        self.bugs.contains(&bug)
    }

    /// What `core::admission::admit` is asked about this world.
    pub fn shape(&self) -> JobShape {
        JobShape {
            batch: self.mode == Mode::Batch,
            unbounded: self.input == Input::Unbounded,
            checkpointing: self.mode == (Mode::Streaming { checkpoints: true }),
            allow_uncommitted: self.allow_uncommitted,
        }
    }

    /// The parallelisms a restart may choose.
    pub fn restarts_with(&self) -> Vec<usize> {
        match self.restart_parallelisms.is_empty() {
            true => vec![self.subtasks],
            false => self.restart_parallelisms.clone(),
        }
    }
}

impl fmt::Display for JobWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::Streaming { checkpoints: true } => "streaming with checkpoints",
            Mode::Streaming { checkpoints: false } => "streaming without checkpoints",
            Mode::Batch => "batch",
        };
        write!(
            f,
            "{} subtasks × {} records, {:?} input, {mode}{}, {} checkpoints ({} in flight), \
             {} crashes, {} faults",
            self.subtasks,
            self.records,
            self.input,
            if self.global_committer {
                ", a global committer"
            } else {
                ""
            },
            self.checkpoints,
            self.concurrent,
            self.crashes,
            self.faults,
        )?;
        if self
            .restart_parallelisms
            .iter()
            .any(|&p| p != self.subtasks)
        {
            write!(
                f,
                ", restarts with {:?} subtasks",
                self.restart_parallelisms
            )?;
        }
        if self.fresh_runs > 0 {
            write!(f, ", {} runs on fresh storage", self.fresh_runs)?;
        }
        if self.allow_uncommitted {
            f.write_str(", uncommitted output allowed")?;
        }
        if self.destination == Destination::Idempotent {
            f.write_str(", an idempotent destination")?;
        }
        for bug in &self.bugs {
            write!(f, ", past bug {bug}")?;
        }
        Ok(())
    }
}
