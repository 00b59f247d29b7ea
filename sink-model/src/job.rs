//! The job model: subtasks, committers, the global committer and the
//! checkpoint coordinator of a job, driven through the runtime's own
//! decision core, with crashes, restarts, rescales and every commit
//! outcome.
//!
//! ```text
//!  Trigger ─▶ barrier n in each subtask's inbox ─▶ Deliver: SubtaskLifecycle::on_barrier,
//!             prepare_commit (named by InitContext::unique_name), CommitLedger::add,
//!             CheckpointTracker::on_ack, the barrier to the global committer
//!  Store n ─▶ CheckpointTracker::on_stored: the storage keeps it; completions in the inboxes
//!  Deliver completion ─▶ CommitLedger::notify_complete, take_ready ─▶ the committer's queue
//!  Commit ─▶ CommitRound over the destination (committed, replay, retry, lost answer,
//!            known failure, unknown) ─▶ the part to the global committer
//!  Global ─▶ BarrierAligner, the global CommitLedger, end of stream
//!  Crash ─▶ a new start: the newest stored checkpoint, placed by core::placement
//! ```
//!
//! Everything the model decides on its own is what the runtime's task loops
//! do (carry messages, call the writer, reach the destination); every
//! decision of the contract is the core's. The destination is modelled
//! transactional by name: a committable's name is its transaction, the
//! committer recognises a replay from the destination, and every name ever
//! prepared is remembered (a name used twice would fence or merge another
//! transaction).
//!
//! Monitors record, as they happen, the facts each property needs
//! ([`Rule`]): the model never asks the core whether the core was right.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use sink_api::{CheckpointId, CommitRequest, Generation, InitContext, Lineage, SubtaskIndex};
use sink_runtime::core::admission::{admit, Admission, Refusal};
use sink_runtime::core::alignment::{Aligned, AlignerInput, BarrierAligner};
use sink_runtime::core::checkpoints::{
    AckStep, CheckpointConfig, CheckpointTracker, FailureVerdict, TaskId,
};
use sink_runtime::core::commit_round::{CommitRound, RoundStep};
use sink_runtime::core::ledger::{CommitLedger, CommittableSummary, ReadyCheckpoint, SubtaskPart};
use sink_runtime::core::lifecycle::{BarrierAction, SubtaskLifecycle};
use sink_runtime::core::placement::{fresh_home, pending_home, Dealer};
use sink_runtime::core::restart::RestartStrategy;
use sink_runtime::core::retry::RetryPolicy;
use stateright::{Model, Property};

use crate::world::{Destination, Input, JobWorld, PastBug};

/// A record: (split, offset).
pub type Rec = (u8, u8);

/// What a writer prepares: one batch per checkpoint, named by
/// `InitContext::unique_name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch {
    /// The name: the batch's transaction at the destination.
    pub id: String,
    /// The records.
    pub records: Vec<Rec>,
}

/// A rule of `docs/semantics.md` that a monitor saw broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// A record visible twice in one lineage.
    ExactlyOnce,
    /// A committable committed before any checkpoint at or after its own
    /// completed.
    CommitAfterCompletion,
    /// A committer committed a checkpoint older than one it committed.
    OldestFirst,
    /// A part reached the global committer after its end of input.
    FinalBeforeEndOfStream,
    /// `prepare_commit` after end of input.
    NoTransactionAfterEndOfInput,
    /// A checkpoint triggered after every subtask ended input completed
    /// without being final, or a checkpoint was triggered after the final
    /// one completed.
    FirstFinalCompletionEnds,
    /// Without periodic checkpoints, a checkpoint triggered before every
    /// subtask ended input.
    CommitAtEndOfInput,
    /// A committable name prepared twice.
    UniqueIds,
    /// The core reported a broken promise (a ledger, lifecycle or
    /// alignment error).
    CoreInvariant,
}

/// A control message from the coordinator to a subtask, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    /// Barrier `n`.
    Barrier(u64),
    /// Checkpoint `n` completed.
    Complete {
        /// The checkpoint.
        checkpoint: u64,
        /// The final checkpoint: commit and exit.
        is_final: bool,
    },
}

/// What a subtask sends the global committer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GlobalMsg {
    /// A part its committer committed.
    Committed(SubtaskPart<Batch>),
    /// Its input ended and its final commit is done.
    EndOfStream,
}

/// What a subtask's acknowledgement of a checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubtaskSnapshot {
    /// The subtask.
    pub subtask: SubtaskIndex,
    /// Its splits: (split, next offset).
    pub splits: Vec<(u8, u8)>,
    /// Its parts not yet committed: with the committer, then in the ledger.
    pub pending: Vec<SubtaskPart<Batch>>,
}

/// A completed checkpoint, as the storage keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stored {
    /// The checkpoint.
    pub checkpoint: u64,
    /// The parallelism it was taken with.
    pub parallelism: usize,
    /// Each subtask's part, by subtask.
    pub subtasks: Vec<SubtaskSnapshot>,
    /// The global committer's received parts not yet committed.
    pub global: Vec<SubtaskPart<Batch>>,
}

/// One subtask of a start.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subtask {
    life: SubtaskLifecycle,
    splits: Vec<(u8, u8)>,
    buffer: Vec<Rec>,
    ledger: CommitLedger<Batch>,
    /// Parts handed to the committer, oldest first, and the round of the
    /// first.
    handed: VecDeque<SubtaskPart<Batch>>,
    round: Option<CommitRound<Batch>>,
    inbox: VecDeque<Control>,
    /// Re-committing what the restored checkpoint holds: nothing else yet.
    recovering: bool,
    /// The model's own record that input ended (monitors do not ask the
    /// lifecycle).
    ended: bool,
    finishing: bool,
    exited: bool,
}

/// The global committer of a start.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Global {
    aligner: BarrierAligner<GlobalMsg>,
    ledger: CommitLedger<Batch>,
    channels: Vec<VecDeque<AlignerInput<GlobalMsg>>>,
    ended: BTreeSet<SubtaskIndex>,
    end_of_input: bool,
}

/// What the coordinator holds of a checkpoint in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Acks {
    subtasks: BTreeMap<SubtaskIndex, SubtaskSnapshot>,
    global: Option<Vec<SubtaskPart<Batch>>>,
}

/// One start of the job: its tasks and its coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Run {
    generation: u64,
    parallelism: usize,
    tracker: CheckpointTracker,
    acks: BTreeMap<u64, Acks>,
    storable: BTreeSet<u64>,
    /// The id the next trigger takes (the model bounds them).
    next_checkpoint: u64,
    /// Monitors: checkpoints triggered once every subtask ended input.
    after_all_ended: BTreeSet<u64>,
    subtasks: Vec<Subtask>,
    global: Option<Global>,
}

impl Run {
    /// Parts with nothing to commit at the head of subtask `i`'s queue go
    /// through at once, to the global committer too: the committer task
    /// makes no call for them, so no interleaving hides there.
    fn pass_empty_parts(&mut self, i: SubtaskIndex) {
        let sub = &mut self.subtasks[i];
        while sub.round.is_none()
            && sub
                .handed
                .front()
                .is_some_and(|p| p.committables.is_empty())
        {
            let Some(part) = sub.handed.pop_front() else {
                break;
            };
            if let Some(global) = &mut self.global {
                global.channels[i].push_back(AlignerInput::Message(GlobalMsg::Committed(part)));
            }
        }
        if sub.handed.is_empty() {
            sub.recovering = false;
        }
    }
}

/// Where the job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Refused at build time.
    Refused(Refusal),
    /// Running.
    Running,
    /// Returned after its final checkpoint.
    Finished,
    /// Failed for good (its restarts used up).
    Failed,
}

/// What outlives a start: the destination, the storage, and what the
/// monitors saw.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobState {
    /// Where the job stands.
    pub status: Status,
    admission: Option<Admission>,
    lineage: u8,
    /// The storage's generation counter: the last start's.
    generation: u64,
    crashes: u8,
    faults: u8,
    fresh_runs: u8,
    storage: Option<Stored>,
    /// (lineage, checkpoint) of every checkpoint stored.
    completed: BTreeSet<(u8, u64)>,
    /// Records visible at the destination, per lineage.
    visible: BTreeMap<(u8, Rec), u8>,
    /// Records a committer reported lost, per lineage.
    lost: BTreeSet<(u8, Rec)>,
    /// Names committed by the committers (staged, with a global committer).
    committed: BTreeSet<String>,
    /// Names the global committer made visible.
    global_committed: BTreeSet<String>,
    /// Every name ever prepared.
    prepared: BTreeSet<String>,
    /// Per (lineage, start, origin subtask): the newest checkpoint a
    /// committer of that start committed.
    newest_commit: BTreeMap<(u8, u64, SubtaskIndex), u64>,
    /// The rules monitors saw broken.
    pub broken: BTreeSet<Rule>,
    run: Option<Run>,
}

/// A commit's answer, as the committer settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Applied (or recognised as applied before): committed or already
    /// committed.
    Committed,
    /// Not applied; try again later.
    RetryLater,
    /// Applied, and the answer lost: retried in place.
    LostAnswer,
    /// Not applied, and never will be: the records are lost, reported.
    KnownFailure,
    /// Applied, then an error the sink does not understand: the job fails.
    Unknown,
}

/// What a stored checkpoint's store answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreAnswer {
    /// Stored and reported.
    Stored,
    /// Not stored: the checkpoint failed.
    Failed,
    /// Stored, but reported failed (the answer lost).
    StoredReportedFailed,
}

/// One step of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The coordinator triggers the next checkpoint.
    Trigger,
    /// A subtask reads a record and writes it.
    Read(SubtaskIndex),
    /// A subtask's splits are all read: end of input.
    EndOfInput(SubtaskIndex),
    /// A subtask takes its next control message.
    Deliver(SubtaskIndex),
    /// A completion notice to a subtask is lost.
    LoseNotice(SubtaskIndex),
    /// A completion notice to a subtask is delayed past the message after
    /// it (the simulation's `NoticeDelivery::Delay`).
    DelayNotice(SubtaskIndex),
    /// The coordinator stores an acknowledged checkpoint.
    Store(u64, StoreAnswer),
    /// A checkpoint in flight times out.
    Expire(u64),
    /// A subtask's committer commits its oldest part.
    Commit(SubtaskIndex, Answer),
    /// A subtask whose final commit is done sends end of stream and exits.
    Finish(SubtaskIndex),
    /// The global committer takes the next message from a subtask.
    Global(SubtaskIndex),
    /// The process dies; the job restarts with this many subtasks.
    Crash(usize),
    /// The job is run again on new checkpoint storage.
    FreshStorage,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Trigger => write!(f, "the coordinator triggers a checkpoint"),
            Action::Read(i) => write!(f, "subtask {i} reads and writes a record"),
            Action::EndOfInput(i) => write!(f, "subtask {i} reaches end of input"),
            Action::Deliver(i) => write!(f, "subtask {i} takes its next control message"),
            Action::LoseNotice(i) => write!(f, "a completion notice to subtask {i} is lost"),
            Action::DelayNotice(i) => {
                write!(
                    f,
                    "a completion notice to subtask {i} is delayed past the next message"
                )
            }
            Action::Store(n, StoreAnswer::Stored) => write!(f, "checkpoint {n} is stored"),
            Action::Store(n, StoreAnswer::Failed) => write!(f, "storing checkpoint {n} fails"),
            Action::Store(n, StoreAnswer::StoredReportedFailed) => {
                write!(f, "checkpoint {n} is stored but reported failed")
            }
            Action::Expire(n) => write!(f, "checkpoint {n} times out"),
            Action::Commit(i, answer) => {
                write!(f, "subtask {i}'s committer commits, answered {answer:?}")
            }
            Action::Finish(i) => write!(f, "subtask {i} finishes"),
            Action::Global(i) => {
                write!(f, "the global committer takes subtask {i}'s next message")
            }
            Action::Crash(p) => write!(f, "CRASH: the job restarts with {p} subtasks"),
            Action::FreshStorage => write!(f, "the job is run again on fresh checkpoint storage"),
        }
    }
}

/// The job model over one [`JobWorld`].
#[derive(Debug, Clone)]
pub struct JobModel {
    /// The world explored.
    pub world: JobWorld,
}

/// The names of the job model's properties: each is a rule of
/// `docs/semantics.md`, which links back to it.
pub mod rules {
    /// Every record committed exactly once once the job finishes.
    pub const EXACTLY_ONCE: &str = "every record is committed exactly once once the job finishes";
    /// Nothing committed before its checkpoint completed.
    pub const AFTER_COMPLETION: &str = "nothing is committed before its checkpoint completed";
    /// Subsumed checkpoints committed, oldest first.
    pub const OLDEST_FIRST: &str = "subsumed checkpoints are committed, oldest first";
    /// The final committables before end of stream (FLINK-38614).
    pub const FINAL_BEFORE_END_OF_STREAM: &str =
        "the final checkpoint's committables are committed before the job returns, and end of \
         stream reaches the global committer only after them";
    /// No transaction after end of input; the first final completion ends
    /// the job (FLINK-23473).
    pub const NOTHING_AFTER_FINISH: &str =
        "no transaction opens after end of input, and the first completion after the finish \
         ends the job";
    /// Without checkpoints, or in batch, everything at end of input.
    pub const AT_END_OF_INPUT: &str =
        "everything is committed at end of input when checkpointing is off or the job is batch";
    /// Unbounded without checkpoints is refused.
    pub const UNBOUNDED_REFUSED: &str = "an unbounded job without checkpoints is refused";
    /// Committable ids never repeat.
    pub const UNIQUE_IDS: &str = "a committable id never repeats across restarts, rescales or \
                                  a run on fresh checkpoint storage";
    /// The core's own promises hold (no ledger, lifecycle or alignment
    /// error).
    pub const CORE_INVARIANTS: &str = "the core reports no broken promise";
    /// A bounded job never stops short of returning: from every state
    /// something can happen (the hang FLINK-23473 fixed was one).
    pub const GOES_ON: &str = "a bounded job always goes on until it returns";
    /// Vacuity: some run finishes (bounded), or commits everything
    /// (unbounded).
    pub const SOMETIMES_DONE: &str = "sometimes every record is committed";
}

const JOB: &str = "job";

fn checkpoint_config(concurrent: usize) -> CheckpointConfig {
    // No clock: a checkpoint may be triggered whenever the tracker allows
    // one (interval zero), and timeouts are an action of their own.
    CheckpointConfig::every(Duration::ZERO)
        .max_concurrent(concurrent)
        .tolerable_failures(u32::MAX)
}

const NOW: Duration = Duration::ZERO;

fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        ..RetryPolicy::default()
    }
}

impl JobModel {
    /// A model of `world`.
    pub fn new(world: JobWorld) -> JobModel {
        JobModel { world }
    }

    fn records_of_input(&self) -> impl Iterator<Item = Rec> + '_ {
        (0..self.world.subtasks as u8)
            .flat_map(move |split| (0..self.world.records).map(move |offset| (split, offset)))
    }

    /// The name subtask `subtask` of the current start prepares checkpoint
    /// `n` under: the sink's, from its `InitContext`.
    fn name(&self, state: &JobState, subtask: SubtaskIndex, n: u64) -> String {
        let Some(run) = &state.run else {
            return String::new();
        };
        let generation = match self.world.has(PastBug::GenerationLessIds) {
            true => 1,
            false => run.generation,
        };
        InitContext::new(
            JOB,
            Lineage::new(format!("l{}", state.lineage)),
            Generation(generation),
            subtask,
            run.parallelism,
        )
        .unique_name(CheckpointId(n))
    }

    /// A start with `parallelism` subtasks from the newest stored
    /// checkpoint, or fresh.
    fn start(&self, state: &mut JobState, parallelism: usize) {
        state.generation += 1;
        let restored = state.storage.clone();
        let restored_id = restored
            .as_ref()
            .map_or(CheckpointId::NONE, |s| CheckpointId(s.checkpoint));
        let periodic = state.admission == Some(Admission::Checkpoints);
        let with_global = self.world.global_committer;
        let mut subtasks: Vec<Subtask> = (0..parallelism)
            .map(|i| {
                let ledger = CommitLedger::new([i]);
                let ledger = match self.world.has(PastBug::CommitBeforeCompletion) {
                    true => ledger.with_commit_before_completion(),
                    false => ledger,
                };
                let life = SubtaskLifecycle::new(
                    restored_id,
                    !self.world.has(PastBug::EndOfStreamBeforeFinalCommit),
                );
                let life = match self.world.has(PastBug::TransactionAfterFinish) {
                    true => life.with_prepare_after_end_of_input(),
                    false => life,
                };
                Subtask {
                    life,
                    splits: Vec::new(),
                    buffer: Vec::new(),
                    ledger,
                    handed: VecDeque::new(),
                    round: None,
                    inbox: VecDeque::new(),
                    recovering: false,
                    ended: false,
                    finishing: false,
                    exited: false,
                }
            })
            .collect();
        let mut global = with_global.then(|| Global {
            aligner: BarrierAligner::new(parallelism),
            ledger: CommitLedger::new(0..parallelism),
            channels: vec![VecDeque::new(); parallelism],
            ended: BTreeSet::new(),
            end_of_input: false,
        });
        match &restored {
            None => {
                for k in 0..self.world.subtasks {
                    subtasks[fresh_home(k, parallelism)]
                        .splits
                        .push((k as u8, 0));
                }
            }
            Some(stored) => {
                let mut splits = Dealer::new(stored.parallelism, parallelism);
                for snapshot in &stored.subtasks {
                    for &split in &snapshot.splits {
                        subtasks[splits.next(snapshot.subtask)].splits.push(split);
                    }
                    for part in &snapshot.pending {
                        let home = pending_home(part.summary.subtask, parallelism);
                        if subtasks[home].ledger.restore_part(part.clone()).is_err() {
                            state.broken.insert(Rule::CoreInvariant);
                        }
                    }
                }
                for sub in &mut subtasks {
                    sub.ledger.notify_complete(restored_id);
                    while let Some(ready) = sub.ledger.take_ready() {
                        sub.handed.extend(ready.parts);
                    }
                    sub.recovering = !sub.handed.is_empty();
                }
                if let Some(global) = &mut global {
                    global
                        .ledger
                        .expect_until(restored_id, 0..stored.parallelism);
                    // As the runtime's coordinator does: added, so that each
                    // restored checkpoint still expects every subtask of the
                    // parallelism it was taken with.
                    for part in &stored.global {
                        let (summary, committables) = (part.summary, part.committables.clone());
                        if global.ledger.add(summary, committables).is_err() {
                            state.broken.insert(Rule::CoreInvariant);
                        }
                    }
                }
            }
        }
        let mut run = Run {
            generation: state.generation,
            parallelism,
            tracker: CheckpointTracker::new(
                checkpoint_config(self.world.concurrent),
                periodic,
                parallelism,
                with_global,
                restored_id,
            ),
            acks: BTreeMap::new(),
            storable: BTreeSet::new(),
            next_checkpoint: restored_id.0 + 1,
            after_all_ended: BTreeSet::new(),
            subtasks,
            global,
        };
        for i in 0..parallelism {
            run.pass_empty_parts(i);
        }
        state.run = Some(run);
    }

    /// A crash or a failure: the run is gone; the job restarts as the
    /// restart strategy allows.
    fn restart(&self, state: &mut JobState, parallelism: usize) {
        state.crashes += 1;
        state.run = None;
        let strategy = RestartStrategy::FixedDelay {
            attempts: u32::from(self.world.crashes),
            delay: Duration::ZERO,
        };
        match strategy.delay_before(u32::from(state.crashes), 0.0) {
            Some(_) => self.start(state, parallelism),
            None => state.status = Status::Failed,
        }
    }

    fn make_visible(&self, state: &mut JobState, batch: &Batch) {
        for &record in &batch.records {
            let count = state.visible.entry((state.lineage, record)).or_insert(0);
            match self.world.destination {
                // An upsert by the record's key.
                Destination::Idempotent => *count = 1,
                Destination::Transactional => *count += 1,
            }
            if *count > 1 {
                state.broken.insert(Rule::ExactlyOnce);
            }
        }
    }

    /// The checkpoint `n` of the current lineage, or a later one, was
    /// stored.
    fn completed_at_or_after(state: &JobState, n: u64) -> bool {
        state
            .completed
            .range((state.lineage, n)..=(state.lineage, u64::MAX))
            .next()
            .is_some()
    }

    fn on_ack(state: &mut JobState, n: u64, task: TaskId) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        if run.tracker.on_ack(CheckpointId(n), task) == AckStep::AllAcknowledged {
            run.storable.insert(n);
        }
    }

    fn deliver(&self, state: &mut JobState, i: SubtaskIndex) {
        let Some(message) = state
            .run
            .as_mut()
            .and_then(|r| r.subtasks[i].inbox.pop_front())
        else {
            return;
        };
        match message {
            Control::Barrier(n) => self.on_barrier(state, i, n),
            Control::Complete {
                checkpoint,
                is_final,
            } => {
                let Some(run) = state.run.as_mut() else {
                    return;
                };
                let sub = &mut run.subtasks[i];
                sub.ledger.notify_complete(CheckpointId(checkpoint));
                while let Some(ready) = sub.ledger.take_ready() {
                    sub.handed.extend(ready.parts);
                }
                if is_final {
                    sub.finishing = true;
                }
                run.pass_empty_parts(i);
            }
        }
    }

    fn on_barrier(&self, state: &mut JobState, i: SubtaskIndex, n: u64) {
        let name = self.name(state, i, n);
        let Some(run) = state.run.as_mut() else {
            return;
        };
        let sub = &mut run.subtasks[i];
        let action = match sub.life.on_barrier(CheckpointId(n)) {
            Ok(action) => action,
            Err(_) => {
                state.broken.insert(Rule::CoreInvariant);
                return;
            }
        };
        let mut broken = Vec::new();
        match action {
            BarrierAction::PrepareAndSnapshot => {
                if sub.ended {
                    broken.push(Rule::NoTransactionAfterEndOfInput);
                }
                if !state.prepared.insert(name.clone()) {
                    broken.push(Rule::UniqueIds);
                }
                let records = std::mem::take(&mut sub.buffer);
                if add_prepared(&mut sub.ledger, i, n, name, records).is_err() {
                    broken.push(Rule::CoreInvariant);
                }
            }
            BarrierAction::SnapshotWithEmptySummary => {
                if add_prepared(&mut sub.ledger, i, n, String::new(), Vec::new()).is_err() {
                    broken.push(Rule::CoreInvariant);
                }
            }
            BarrierAction::SnapshotOnly => {}
        }
        let snapshot = SubtaskSnapshot {
            subtask: i,
            splits: sub.splits.clone(),
            pending: sub
                .handed
                .iter()
                .cloned()
                .chain(sub.ledger.pending_parts().cloned())
                .collect(),
        };
        if run.tracker.in_flight().contains(&CheckpointId(n)) {
            run.acks.entry(n).or_default().subtasks.insert(i, snapshot);
        }
        if let Some(global) = &mut run.global {
            global.channels[i].push_back(AlignerInput::Barrier(CheckpointId(n)));
        }
        state.broken.extend(broken);
        Self::on_ack(state, n, TaskId::Subtask(i));
    }

    fn end_of_input(&self, state: &mut JobState, i: SubtaskIndex) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        let Ok(tag) = run.subtasks[i].life.on_end_of_input() else {
            state.broken.insert(Rule::CoreInvariant);
            return;
        };
        let name = self.name(state, i, tag.0);
        let Some(run) = state.run.as_mut() else {
            return;
        };
        let sub = &mut run.subtasks[i];
        sub.ended = true;
        if !state.prepared.insert(name.clone()) {
            state.broken.insert(Rule::UniqueIds);
        }
        let records = std::mem::take(&mut sub.buffer);
        if add_prepared(&mut sub.ledger, i, tag.0, name, records).is_err() {
            state.broken.insert(Rule::CoreInvariant);
        }
        run.tracker.on_end_of_input(i);
        if sub.life.take_end_of_stream(false) {
            if let Some(global) = &mut run.global {
                global.channels[i].push_back(AlignerInput::Message(GlobalMsg::EndOfStream));
            }
        }
    }

    fn trigger(&self, state: &mut JobState) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        if run.tracker.final_completed().is_some() {
            state.broken.insert(Rule::FirstFinalCompletionEnds);
        }
        let Some(id) = run.tracker.try_trigger(NOW) else {
            return;
        };
        run.next_checkpoint = id.0 + 1;
        let all_ended = run.subtasks.iter().all(|s| s.ended);
        if all_ended {
            run.after_all_ended.insert(id.0);
        } else if state.admission != Some(Admission::Checkpoints) {
            state.broken.insert(Rule::CommitAtEndOfInput);
        }
        run.acks.insert(id.0, Acks::default());
        for sub in run.subtasks.iter_mut().filter(|s| !s.exited) {
            sub.inbox.push_back(Control::Barrier(id.0));
        }
    }

    fn store(&self, state: &mut JobState, n: u64, answer: StoreAnswer) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        run.storable.remove(&n);
        let acks = run.acks.remove(&n).unwrap_or_default();
        if answer != StoreAnswer::Failed {
            let stored = Stored {
                checkpoint: n,
                parallelism: run.parallelism,
                subtasks: acks.subtasks.into_values().collect(),
                global: acks.global.unwrap_or_default(),
            };
            if state.storage.as_ref().is_none_or(|s| s.checkpoint < n) {
                state.storage = Some(stored);
            }
            state.completed.insert((state.lineage, n));
        }
        if answer != StoreAnswer::Stored {
            if let Some(FailureVerdict::FailJob { .. }) =
                run.tracker.on_failed(CheckpointId(n), NOW)
            {
                let parallelism = run.parallelism;
                self.restart(state, parallelism);
            }
            return;
        }
        let Some(completion) = run.tracker.on_stored(CheckpointId(n), NOW) else {
            return;
        };
        for old in &completion.subsumed {
            run.acks.remove(&old.0);
            run.storable.remove(&old.0);
        }
        if run.after_all_ended.contains(&n) != completion.is_final {
            state.broken.insert(Rule::FirstFinalCompletionEnds);
        }
        if completion.is_final {
            run.acks.clear();
            run.storable.clear();
        }
        for sub in run.subtasks.iter_mut().filter(|s| !s.exited) {
            sub.inbox.push_back(Control::Complete {
                checkpoint: n,
                is_final: completion.is_final,
            });
        }
    }

    fn commit(&self, state: &mut JobState, i: SubtaskIndex, answer: Answer) {
        let lineage = state.lineage;
        let Some(run) = state.run.as_mut() else {
            return;
        };
        let with_global = run.global.is_some();
        let generation = run.generation;
        let sub = &mut run.subtasks[i];
        let Some(part) = sub.handed.front().cloned() else {
            return;
        };
        let checkpoint = part.summary.checkpoint_id.0;
        let round = sub.round.get_or_insert_with(|| {
            CommitRound::new(part.summary.checkpoint_id, part.committables.clone())
        });
        let mut requests = round.take_requests();
        let mut visible = Vec::new();
        let mut lost = Vec::new();
        let idempotent = self.world.destination == Destination::Idempotent;
        for request in &mut requests {
            let batch = request.committable().clone();
            // An idempotent destination keeps no names: it writes again.
            let applied = !idempotent && state.committed.contains(&batch.id);
            let apply = matches!(
                answer,
                Answer::Committed | Answer::LostAnswer | Answer::Unknown
            );
            if apply && !applied {
                state.committed.insert(batch.id.clone());
                if !with_global {
                    visible.push(batch.clone());
                }
            }
            settle(request, answer, applied, &batch);
            if answer == Answer::KnownFailure {
                lost.extend(batch.records.iter().map(|&r| (lineage, r)));
            }
        }
        let mut broken = Vec::new();
        if !requests.is_empty() && !Self::completed_at_or_after(state, checkpoint) {
            broken.push(Rule::CommitAfterCompletion);
        }
        let origin = part.summary.subtask;
        let newest = state
            .newest_commit
            .entry((lineage, generation, origin))
            .or_insert(0);
        if checkpoint < *newest {
            broken.push(Rule::OldestFirst);
        }
        *newest = (*newest).max(checkpoint);
        state.lost.extend(lost);
        for batch in &visible {
            self.make_visible(state, batch);
        }
        state.broken.extend(broken);
        let run = state.run.as_mut().expect("checked above");
        let sub = &mut run.subtasks[i];
        let Some(round) = sub.round.as_mut() else {
            return;
        };
        match round.settle(requests, &retry_policy()) {
            Ok(RoundStep::Retry { .. }) => {}
            Ok(RoundStep::Done) => {
                let Some(round) = sub.round.take() else {
                    return;
                };
                sub.handed.pop_front();
                let (committables, _) = round.into_committed();
                if let Some(global) = &mut run.global {
                    let summary = CommittableSummary {
                        committable_count: committables.len() as u64,
                        ..part.summary
                    };
                    global.channels[i].push_back(AlignerInput::Message(GlobalMsg::Committed(
                        SubtaskPart {
                            summary,
                            committables,
                        },
                    )));
                }
                run.pass_empty_parts(i);
            }
            Err(_) => {
                let parallelism = run.parallelism;
                self.restart(state, parallelism);
            }
        }
    }

    fn finish(&self, state: &mut JobState, i: SubtaskIndex) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        let sub = &mut run.subtasks[i];
        if sub.ledger.pending_committables() > 0 {
            state.broken.insert(Rule::CoreInvariant);
        }
        if sub.life.take_end_of_stream(true) {
            if let Some(global) = &mut run.global {
                global.channels[i].push_back(AlignerInput::Message(GlobalMsg::EndOfStream));
            }
        }
        sub.exited = true;
        self.maybe_finished(state);
    }

    fn maybe_finished(&self, state: &mut JobState) {
        let Some(run) = state.run.as_ref() else {
            return;
        };
        let subtasks_done = run.subtasks.iter().all(|s| s.exited);
        let global_done = run
            .global
            .as_ref()
            .is_none_or(|g| g.end_of_input && g.channels.iter().all(VecDeque::is_empty));
        if subtasks_done && global_done {
            state.status = Status::Finished;
            state.run = None;
        }
    }

    fn global(&self, state: &mut JobState, i: SubtaskIndex) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        let parallelism = run.parallelism;
        let Some(global) = run.global.as_mut() else {
            return;
        };
        let Some(input) = global.channels[i].pop_front() else {
            return;
        };
        let steps = match global.aligner.push(i, input) {
            Ok(steps) => steps,
            Err(_) => {
                state.broken.insert(Rule::CoreInvariant);
                return;
            }
        };
        let mut broken = Vec::new();
        let mut visible = Vec::new();
        let mut acks = Vec::new();
        for step in steps {
            match step {
                Aligned::Snapshot(n) => {
                    let pending: Vec<_> = global.ledger.pending_parts().cloned().collect();
                    if let Some(acked) = run.acks.get_mut(&n.0) {
                        acked.global = Some(pending);
                    }
                    acks.push(n.0);
                }
                Aligned::Message(GlobalMsg::Committed(part)) => {
                    if global.end_of_input {
                        broken.push(Rule::FinalBeforeEndOfStream);
                    }
                    let checkpoint = part.summary.checkpoint_id;
                    if global.ledger.add(part.summary, part.committables).is_err() {
                        broken.push(Rule::CoreInvariant);
                        continue;
                    }
                    global.ledger.notify_complete(checkpoint);
                    while let Some(ReadyCheckpoint { parts, .. }) = global.ledger.take_ready() {
                        for batch in parts.into_iter().flat_map(|p| p.committables) {
                            let new = state.global_committed.insert(batch.id.clone());
                            if new || self.world.destination == Destination::Idempotent {
                                visible.push(batch);
                            }
                        }
                    }
                }
                Aligned::Message(GlobalMsg::EndOfStream) => {
                    global.ended.insert(i);
                    if global.ended.len() == parallelism && !global.end_of_input {
                        if global.ledger.held().is_some() {
                            broken.push(Rule::CoreInvariant);
                        }
                        global.end_of_input = true;
                    }
                }
            }
        }
        for batch in &visible {
            self.make_visible(state, batch);
        }
        state.broken.extend(broken);
        for n in acks {
            Self::on_ack(state, n, TaskId::GlobalCommitter);
        }
        self.maybe_finished(state);
    }

    fn every_record_once(&self, state: &JobState) -> bool {
        self.records_of_input().all(|record| {
            let key = (state.lineage, record);
            match state.visible.get(&key) {
                Some(1) => true,
                None | Some(0) => state.lost.contains(&key),
                Some(_) => false,
            }
        })
    }
}

/// Adds a prepared part to a subtask's ledger: one batch, or none when
/// nothing was written.
fn add_prepared(
    ledger: &mut CommitLedger<Batch>,
    subtask: SubtaskIndex,
    n: u64,
    id: String,
    records: Vec<Rec>,
) -> Result<(), sink_runtime::core::ledger::LedgerError> {
    let committables = match records.is_empty() {
        true => Vec::new(),
        false => vec![Batch { id, records }],
    };
    let summary = CommittableSummary {
        checkpoint_id: CheckpointId(n),
        subtask,
        committable_count: committables.len() as u64,
        record_count: committables.iter().map(|b| b.records.len() as u64).sum(),
    };
    ledger.add(summary, committables)
}

/// Settles a request as a correct sink would, given the answer the world
/// chose and whether the destination held the batch before.
fn settle(request: &mut CommitRequest<Batch>, answer: Answer, applied_before: bool, batch: &Batch) {
    match answer {
        Answer::Committed if applied_before => request.signal_already_committed(),
        Answer::Committed => request.signal_committed(),
        Answer::RetryLater | Answer::LostAnswer => request.retry_later(),
        Answer::KnownFailure => {
            request.signal_records_lost(batch.records.len() as u64, "the batch is gone")
        }
        Answer::Unknown => request.signal_failed_with_unknown_reason("no answer"),
    }
}

impl Model for JobModel {
    type State = JobState;
    type Action = Action;

    fn init_states(&self) -> Vec<JobState> {
        let admission = admit(self.world.shape());
        let mut state = JobState {
            status: match admission {
                Ok(_) => Status::Running,
                Err(refusal) => Status::Refused(refusal),
            },
            admission: admission.ok(),
            lineage: 0,
            generation: 0,
            crashes: 0,
            faults: 0,
            fresh_runs: 0,
            storage: None,
            completed: BTreeSet::new(),
            visible: BTreeMap::new(),
            lost: BTreeSet::new(),
            committed: BTreeSet::new(),
            global_committed: BTreeSet::new(),
            prepared: BTreeSet::new(),
            newest_commit: BTreeMap::new(),
            broken: BTreeSet::new(),
            run: None,
        };
        if state.status == Status::Running {
            self.start(&mut state, self.world.subtasks);
        }
        vec![state]
    }

    fn actions(&self, state: &JobState, actions: &mut Vec<Action>) {
        let world = &self.world;
        let fault = state.faults < world.faults;
        let crash = state.crashes < world.crashes;
        if state.fresh_runs < world.fresh_runs
            && matches!(state.status, Status::Running | Status::Finished)
        {
            actions.push(Action::FreshStorage);
        }
        let Some(run) = &state.run else {
            return;
        };
        if crash {
            actions.extend(world.restarts_with().into_iter().map(Action::Crash));
        }
        let all_ended = run.subtasks.iter().all(|s| s.ended);
        if let Some(next) = run.tracker.next_trigger_at() {
            // Before end of input, the world's checkpoints; after it, the
            // final one, again after each failure or crash, within a bound:
            // a tracker that never made one final would otherwise trigger
            // without end, and the bound turns that into a job that cannot
            // go on.
            let bound = match all_ended {
                false => world.checkpoints,
                true => {
                    world.checkpoints
                        + world.concurrent as u64
                        + u64::from(world.faults)
                        + u64::from(world.crashes)
                        + 1
                }
            };
            if next <= NOW && run.next_checkpoint <= bound {
                actions.push(Action::Trigger);
            }
        }
        for &n in &run.storable {
            actions.push(Action::Store(n, StoreAnswer::Stored));
            if fault {
                actions.push(Action::Store(n, StoreAnswer::Failed));
                actions.push(Action::Store(n, StoreAnswer::StoredReportedFailed));
            }
        }
        if fault {
            for n in run.tracker.in_flight() {
                if !run.storable.contains(&n.0) {
                    actions.push(Action::Expire(n.0));
                }
            }
        }
        for (i, sub) in run.subtasks.iter().enumerate() {
            if sub.exited {
                continue;
            }
            if !sub.handed.is_empty() {
                let empty = sub
                    .handed
                    .front()
                    .is_some_and(|p| p.committables.is_empty());
                actions.push(Action::Commit(i, Answer::Committed));
                if fault && !empty {
                    actions.push(Action::Commit(i, Answer::RetryLater));
                    actions.push(Action::Commit(i, Answer::LostAnswer));
                    actions.push(Action::Commit(i, Answer::KnownFailure));
                    if crash {
                        actions.push(Action::Commit(i, Answer::Unknown));
                    }
                }
            }
            if sub.recovering {
                continue;
            }
            if !sub.ended && sub.life.accepts_input() {
                if sub.splits.iter().any(|&(_, next)| next < world.records) {
                    actions.push(Action::Read(i));
                } else if world.input == Input::Bounded {
                    actions.push(Action::EndOfInput(i));
                }
            }
            if let Some(message) = sub.inbox.front() {
                actions.push(Action::Deliver(i));
                if fault
                    && matches!(
                        message,
                        Control::Complete {
                            is_final: false,
                            ..
                        }
                    )
                {
                    actions.push(Action::LoseNotice(i));
                    if sub.inbox.len() > 1 {
                        actions.push(Action::DelayNotice(i));
                    }
                }
            }
            if sub.finishing && sub.handed.is_empty() && sub.inbox.is_empty() {
                actions.push(Action::Finish(i));
            }
        }
        if let Some(global) = &run.global {
            for (i, channel) in global.channels.iter().enumerate() {
                if !channel.is_empty() {
                    actions.push(Action::Global(i));
                }
            }
        }
    }

    fn next_state(&self, last: &JobState, action: Action) -> Option<JobState> {
        let mut state = last.clone();
        match action {
            Action::Trigger => self.trigger(&mut state),
            Action::Read(i) => {
                let run = state.run.as_mut()?;
                let sub = &mut run.subtasks[i];
                let records = self.world.records;
                let split = sub.splits.iter_mut().find(|(_, next)| *next < records)?;
                sub.buffer.push((split.0, split.1));
                split.1 += 1;
            }
            Action::EndOfInput(i) => self.end_of_input(&mut state, i),
            Action::Deliver(i) => self.deliver(&mut state, i),
            Action::LoseNotice(i) => {
                state.faults += 1;
                state.run.as_mut()?.subtasks[i].inbox.pop_front();
            }
            Action::DelayNotice(i) => {
                state.faults += 1;
                state.run.as_mut()?.subtasks[i].inbox.swap(0, 1);
            }
            Action::Store(n, answer) => {
                if answer != StoreAnswer::Stored {
                    state.faults += 1;
                }
                self.store(&mut state, n, answer);
            }
            Action::Expire(n) => {
                state.faults += 1;
                let run = state.run.as_mut()?;
                run.acks.remove(&n);
                if let Some(FailureVerdict::FailJob { .. }) =
                    run.tracker.on_failed(CheckpointId(n), NOW)
                {
                    let parallelism = run.parallelism;
                    self.restart(&mut state, parallelism);
                }
            }
            Action::Commit(i, answer) => {
                if answer != Answer::Committed {
                    state.faults += 1;
                }
                self.commit(&mut state, i, answer);
            }
            Action::Finish(i) => self.finish(&mut state, i),
            Action::Global(i) => self.global(&mut state, i),
            Action::Crash(parallelism) => self.restart(&mut state, parallelism),
            Action::FreshStorage => {
                state.fresh_runs += 1;
                state.lineage += 1;
                state.storage = None;
                state.generation = 0;
                state.status = Status::Running;
                self.start(&mut state, self.world.subtasks);
            }
        }
        Some(state)
    }

    fn format_action(&self, action: &Action) -> String {
        action.to_string()
    }

    fn properties(&self) -> Vec<Property<Self>> {
        use rules::*;
        vec![
            Property::always(EXACTLY_ONCE, |model, s: &JobState| {
                !s.broken.contains(&Rule::ExactlyOnce)
                    && (s.status != Status::Finished || model.every_record_once(s))
            }),
            Property::always(AFTER_COMPLETION, |_, s: &JobState| {
                !s.broken.contains(&Rule::CommitAfterCompletion)
            }),
            Property::always(OLDEST_FIRST, |_, s: &JobState| {
                !s.broken.contains(&Rule::OldestFirst)
            }),
            Property::always(FINAL_BEFORE_END_OF_STREAM, |_, s: &JobState| {
                !s.broken.contains(&Rule::FinalBeforeEndOfStream)
            }),
            Property::always(NOTHING_AFTER_FINISH, |_, s: &JobState| {
                !s.broken.contains(&Rule::NoTransactionAfterEndOfInput)
                    && !s.broken.contains(&Rule::FirstFinalCompletionEnds)
            }),
            Property::always(AT_END_OF_INPUT, |model, s: &JobState| {
                !s.broken.contains(&Rule::CommitAtEndOfInput)
                    && (s.admission != Some(Admission::FinalCheckpointOnly)
                        || s.status != Status::Finished
                        || model.every_record_once(s))
            }),
            Property::always(UNBOUNDED_REFUSED, |model, s: &JobState| {
                let shape = model.world.shape();
                let pitfall = shape.unbounded && !shape.checkpointing && !shape.allow_uncommitted;
                !pitfall || matches!(s.status, Status::Refused(_))
            }),
            Property::always(UNIQUE_IDS, |_, s: &JobState| {
                !s.broken.contains(&Rule::UniqueIds)
            }),
            Property::always(CORE_INVARIANTS, |_, s: &JobState| {
                !s.broken.contains(&Rule::CoreInvariant)
            }),
            Property::always(GOES_ON, |model, s: &JobState| {
                if model.world.input != Input::Bounded || s.status != Status::Running {
                    return true;
                }
                let mut actions = Vec::new();
                model.actions(s, &mut actions);
                !actions.is_empty()
            }),
            Property::sometimes(SOMETIMES_DONE, |model, s: &JobState| {
                match model.world.input {
                    Input::Bounded => s.status == Status::Finished,
                    Input::Unbounded => {
                        model.every_record_once(s) && s.admission == Some(Admission::Checkpoints)
                            || matches!(s.status, Status::Refused(_))
                            || s.admission == Some(Admission::Uncommitted)
                    }
                }
            }),
        ]
    }
}

impl crate::check::Explained for JobModel {
    fn describe(&self, before: &JobState, action: &Action) -> String {
        let Some(run) = &before.run else {
            return action.to_string();
        };
        let batch = |part: &SubtaskPart<Batch>| -> String {
            let batches: Vec<String> = part
                .committables
                .iter()
                .map(|b| {
                    let records: Vec<String> =
                        b.records.iter().map(|(s, o)| format!("{s}#{o}")).collect();
                    format!("{} [{}]", b.id, records.join(" "))
                })
                .collect();
            match batches.is_empty() {
                true => "nothing".to_string(),
                false => batches.join(", "),
            }
        };
        match *action {
            Action::Deliver(i) => match run.subtasks[i].inbox.front() {
                Some(Control::Barrier(n)) => {
                    let after = match run.subtasks[i].ended {
                        true => " (its input has ended)",
                        false => "",
                    };
                    format!("subtask {i} takes barrier {n}{after}")
                }
                Some(Control::Complete {
                    checkpoint,
                    is_final,
                }) => format!(
                    "subtask {i} hears checkpoint {checkpoint} completed{}",
                    if *is_final { " (the final one)" } else { "" }
                ),
                None => action.to_string(),
            },
            Action::Commit(i, answer) => match run.subtasks[i].handed.front() {
                Some(part) => format!(
                    "subtask {i}'s committer commits checkpoint {} of subtask {}: {}, answered {answer:?}{}",
                    part.summary.checkpoint_id,
                    part.summary.subtask,
                    batch(part),
                    match answer {
                        Answer::Unknown => " (applied; the job fails and restarts)",
                        Answer::LostAnswer => " (applied; retried in place)",
                        _ => "",
                    }
                ),
                None => action.to_string(),
            },
            Action::Global(i) => match run.global.as_ref().and_then(|g| g.channels[i].front()) {
                Some(AlignerInput::Barrier(n)) => {
                    format!("the global committer takes barrier {n} from subtask {i}")
                }
                Some(AlignerInput::Message(GlobalMsg::Committed(part))) => format!(
                    "the global committer takes subtask {i}'s commit of checkpoint {}: {}",
                    part.summary.checkpoint_id,
                    batch(part)
                ),
                Some(AlignerInput::Message(GlobalMsg::EndOfStream)) => {
                    format!("the global committer takes subtask {i}'s end of stream")
                }
                None => action.to_string(),
            },
            Action::Read(i) => {
                let records = self.world.records;
                match run.subtasks[i].splits.iter().find(|(_, next)| *next < records) {
                    Some((split, offset)) => {
                        format!("subtask {i} reads and writes record {split}#{offset}")
                    }
                    None => action.to_string(),
                }
            }
            Action::EndOfInput(i) => match run.subtasks[i].life.clone().on_end_of_input() {
                Ok(tag) => format!(
                    "subtask {i} reaches end of input: prepare_commit of what it wrote, tagged \
                     {tag} (its last barrier + 1)"
                ),
                Err(_) => action.to_string(),
            },
            Action::Trigger => format!("the coordinator triggers checkpoint {}", run.next_checkpoint),
            _ => action.to_string(),
        }
    }

    fn explain(&self, state: &JobState) -> String {
        let mut words = format!("the job is {:?}", state.status);
        if !state.broken.is_empty() {
            words.push_str(&format!("; broken: {:?}", state.broken));
        }
        let missing: Vec<String> = self
            .records_of_input()
            .filter(|&r| {
                let key = (state.lineage, r);
                !state.visible.contains_key(&key) && !state.lost.contains(&key)
            })
            .map(|(split, offset)| format!("{split}#{offset}"))
            .collect();
        let twice: Vec<String> = state
            .visible
            .iter()
            .filter(|(_, &count)| count > 1)
            .map(|((_, (split, offset)), count)| format!("{split}#{offset} ×{count}"))
            .collect();
        if !missing.is_empty() {
            words.push_str(&format!("; not in the destination: {}", missing.join(", ")));
        }
        if !twice.is_empty() {
            words.push_str(&format!("; in it twice: {}", twice.join(", ")));
        }
        words
    }
}
