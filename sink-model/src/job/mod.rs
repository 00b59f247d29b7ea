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
//! transactional by name (a committable's name is its transaction, the
//! committer recognises a replay from the destination, and every name ever
//! prepared is remembered: a name used twice would fence or merge another
//! transaction), or idempotent (each record written under its own key).
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the state, the events, the properties, what is possible when |
//! | `steps.rs` | what each event does, through the core |
//! | `explain.rs` | each step and state in words, for counterexamples |
//!
//! Monitors record, as they happen, the facts each property needs
//! ([`Rule`]): the model never asks the core whether the core was right.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use sink_api::{CheckpointId, SubtaskIndex};
use sink_runtime::core::admission::{admit, Admission, Refusal};
use sink_runtime::core::alignment::{AlignerInput, BarrierAligner};
use sink_runtime::core::checkpoints::{CheckpointTracker, FailureVerdict};
use sink_runtime::core::commit_round::CommitRound;
use sink_runtime::core::ledger::{CommitLedger, SubtaskPart};
use sink_runtime::core::lifecycle::SubtaskLifecycle;
use stateright::{Model, Property};

use crate::world::{Input, JobWorld};

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
    /// Parts of the checkpoint being committed that are done: the
    /// committer task reports a checkpoint, and the subtask forwards its
    /// parts, only once every part of it is done.
    unreported: Vec<SubtaskPart<Batch>>,
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
        loop {
            let sub = &mut self.subtasks[i];
            let empty = sub.round.is_none()
                && sub
                    .handed
                    .front()
                    .is_some_and(|p| p.committables.is_empty());
            if !empty {
                break;
            }
            let Some(part) = sub.handed.pop_front() else {
                break;
            };
            self.part_done(i, part);
        }
        let sub = &mut self.subtasks[i];
        if sub.handed.is_empty() {
            sub.recovering = false;
        }
    }

    /// The committer of subtask `i` is done with `part` (the oldest it was
    /// handed). Once every part of its checkpoint is done, the checkpoint
    /// is reported and its parts go to the global committer, in order.
    fn part_done(&mut self, i: SubtaskIndex, part: SubtaskPart<Batch>) {
        let checkpoint = part.summary.checkpoint_id;
        let sub = &mut self.subtasks[i];
        sub.unreported.push(part);
        if sub
            .handed
            .front()
            .is_some_and(|next| next.summary.checkpoint_id == checkpoint)
        {
            return;
        }
        let parts = std::mem::take(&mut sub.unreported);
        if let Some(global) = &mut self.global {
            for part in parts {
                global.channels[i].push_back(AlignerInput::Message(GlobalMsg::Committed(part)));
            }
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

impl Action {
    /// Whether this event is the job's own progress, not a fault, a crash
    /// or a run again.
    pub fn is_progress(&self) -> bool {
        !matches!(
            self,
            Action::LoseNotice(_)
                | Action::DelayNotice(_)
                | Action::Store(_, StoreAnswer::Failed | StoreAnswer::StoredReportedFailed)
                | Action::Expire(_)
                | Action::Commit(
                    _,
                    Answer::RetryLater
                        | Answer::LostAnswer
                        | Answer::KnownFailure
                        | Answer::Unknown
                )
                | Action::Crash(_)
                | Action::FreshStorage
        )
    }
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

mod explain;
mod steps;

/// The model has no clock: every event happens "now".
const NOW: Duration = Duration::ZERO;

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
                let allowed_commits_nothing =
                    s.admission != Some(Admission::Uncommitted) || s.visible.is_empty();
                (!pitfall || matches!(s.status, Status::Refused(_))) && allowed_commits_nothing
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
                // Faults and crashes do not count: a job that can only
                // fail or crash is stuck.
                let mut actions = Vec::new();
                model.actions(s, &mut actions);
                actions.iter().any(Action::is_progress)
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
