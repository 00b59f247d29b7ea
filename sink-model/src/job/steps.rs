//! The job model's steps: what each event does to the world, through the
//! core's own decisions, and the monitors that record what the properties
//! need.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use sink_api::{CheckpointId, CommitRequest, Generation, InitContext, Lineage, SubtaskIndex};
use sink_runtime::core::admission::Admission;
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

use super::*;
use crate::world::{Destination, PastBug};

const JOB: &str = "job";

fn checkpoint_config(concurrent: usize) -> CheckpointConfig {
    // No clock: a checkpoint may be triggered whenever the tracker allows
    // one (interval zero), and timeouts are an action of their own.
    CheckpointConfig::every(Duration::ZERO)
        .max_concurrent(concurrent)
        .tolerable_failures(u32::MAX)
}

/// One retry: a second "retry later" exhausts it and fails the job, so that
/// a world with two faults reaches that path too.
fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 1,
        ..RetryPolicy::default()
    }
}

impl JobModel {
    /// A model of `world`.
    pub fn new(world: JobWorld) -> JobModel {
        JobModel { world }
    }

    pub(super) fn records_of_input(&self) -> impl Iterator<Item = Rec> + '_ {
        (0..self.world.subtasks as u8)
            .flat_map(move |split| (0..self.world.records).map(move |offset| (split, offset)))
    }

    /// The name subtask `subtask` of the current start prepares checkpoint
    /// `n` under: the sink's, from its `InitContext`.
    pub(super) fn name(&self, state: &JobState, subtask: SubtaskIndex, n: u64) -> String {
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
    pub(super) fn start(&self, state: &mut JobState, parallelism: usize) {
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
                    unreported: Vec::new(),
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
    pub(super) fn restart(&self, state: &mut JobState, parallelism: usize) {
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

    pub(super) fn make_visible(&self, state: &mut JobState, batch: &Batch) {
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
    pub(super) fn completed_at_or_after(state: &JobState, n: u64) -> bool {
        state
            .completed
            .range((state.lineage, n)..=(state.lineage, u64::MAX))
            .next()
            .is_some()
    }

    pub(super) fn on_ack(state: &mut JobState, n: u64, task: TaskId) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
        if run.tracker.on_ack(CheckpointId(n), task) == AckStep::AllAcknowledged {
            run.storable.insert(n);
        }
    }

    pub(super) fn deliver(&self, state: &mut JobState, i: SubtaskIndex) {
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

    pub(super) fn on_barrier(&self, state: &mut JobState, i: SubtaskIndex, n: u64) {
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
                .unreported
                .iter()
                .chain(sub.handed.iter())
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

    pub(super) fn end_of_input(&self, state: &mut JobState, i: SubtaskIndex) {
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

    pub(super) fn trigger(&self, state: &mut JobState) {
        let Some(run) = state.run.as_mut() else {
            return;
        };
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

    pub(super) fn store(&self, state: &mut JobState, n: u64, answer: StoreAnswer) {
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

    pub(super) fn commit(&self, state: &mut JobState, i: SubtaskIndex, answer: Answer) {
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
        // A commit that took effect (committed, or applied before its
        // answer was lost) of a checkpoint none at or after which completed.
        let applies = matches!(
            answer,
            Answer::Committed | Answer::LostAnswer | Answer::Unknown
        );
        if applies && !requests.is_empty() && !Self::completed_at_or_after(state, checkpoint) {
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
                let summary = CommittableSummary {
                    committable_count: committables.len() as u64,
                    ..part.summary
                };
                run.part_done(
                    i,
                    SubtaskPart {
                        summary,
                        committables,
                    },
                );
                run.pass_empty_parts(i);
            }
            Err(_) => {
                let parallelism = run.parallelism;
                self.restart(state, parallelism);
            }
        }
    }

    pub(super) fn finish(&self, state: &mut JobState, i: SubtaskIndex) {
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

    pub(super) fn maybe_finished(&self, state: &mut JobState) {
        let Some(run) = state.run.as_ref() else {
            return;
        };
        let subtasks_done = run.subtasks.iter().all(|s| s.exited);
        let global_done = run
            .global
            .as_ref()
            // As the runtime's global task: it returns once every subtask
            // is gone and their messages are taken, whether or not its end
            // of input came; what it holds then is lost, which exactly
            // once sees.
            .is_none_or(|g| g.channels.iter().all(VecDeque::is_empty));
        if subtasks_done && global_done {
            state.status = Status::Finished;
            state.run = None;
        }
    }

    pub(super) fn global(&self, state: &mut JobState, i: SubtaskIndex) {
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
        // As the runtime's global task: a committed part is aligned under
        // the subtask that prepared it (after a rescale, another than the
        // one that forwarded it), a barrier or end of stream under its
        // sender.
        let key = match &input {
            AlignerInput::Message(GlobalMsg::Committed(part)) => part.summary.subtask,
            _ => i,
        };
        let steps = match global.aligner.push(key, input) {
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
                    // Committables after the global committer's end of
                    // input (an empty part says nothing).
                    if global.end_of_input && !part.committables.is_empty() {
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

    pub(super) fn every_record_once(&self, state: &JobState) -> bool {
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
