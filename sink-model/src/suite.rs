//! The worlds checked by the test command (`quick`, about half a minute
//! of one core) and the deeper ones documented with their figures
//! (`deep`, minutes on two cores: `cargo run -p sink-model --release --
//! --suite deep`).

use std::fmt;

use crate::check::{check, Bounds, Outcome};
use crate::job::JobModel;
use crate::source::{SourceModel, SourceWorld};
use crate::world::{Destination, Input, JobWorld, Mode};

/// One world of a suite.
#[derive(Debug, Clone)]
pub enum Case {
    /// A job world.
    Job(JobWorld),
    /// A bounded group source world.
    Source(SourceWorld),
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Case::Job(world) => world.fmt(f),
            Case::Source(world) => world.fmt(f),
        }
    }
}

impl Case {
    /// Checks this world within `bounds`.
    pub fn check(&self, bounds: Bounds) -> Outcome {
        match self {
            Case::Job(world) => check(JobModel::new(world.clone()), world.to_string(), bounds),
            Case::Source(world) => {
                check(SourceModel::new(world.clone()), world.to_string(), bounds)
            }
        }
    }
}

fn job(edit: impl FnOnce(&mut JobWorld)) -> Case {
    let mut world = JobWorld::small();
    edit(&mut world);
    Case::Job(world)
}

/// The worlds the test command checks, each exhaustively: every mode and
/// input, crashes, every fault, a global committer, rescales, a run on
/// fresh storage, two checkpoints in flight, and the bounded group source.
pub fn quick() -> Vec<(&'static str, Case)> {
    vec![
        (
            "bounded_two_subtasks_and_a_crash",
            job(|w| {
                w.records = 1;
                w.faults = 0;
            }),
        ),
        (
            "bounded_every_fault_and_a_crash",
            job(|w| {
                w.subtasks = 1;
                w.faults = 2;
            }),
        ),
        (
            "global_committer_two_subtasks_and_a_crash",
            job(|w| {
                w.records = 1;
                w.checkpoints = 1;
                w.faults = 0;
                w.global_committer = true;
            }),
        ),
        (
            "idempotent_destination_faults_and_a_crash",
            job(|w| {
                w.subtasks = 1;
                w.destination = Destination::Idempotent;
            }),
        ),
        (
            "global_committer_faults_and_a_crash",
            job(|w| {
                w.subtasks = 1;
                w.global_committer = true;
            }),
        ),
        (
            "global_committer_rescale_from_two_to_one",
            job(|w| {
                w.records = 1;
                w.faults = 0;
                w.global_committer = true;
                w.restart_parallelisms = vec![1];
            }),
        ),
        (
            "rescale_from_two_to_one_or_two",
            job(|w| {
                w.records = 1;
                w.faults = 0;
                w.restart_parallelisms = vec![1, 2];
            }),
        ),
        (
            "rescale_twice_from_one",
            job(|w| {
                w.subtasks = 1;
                w.records = 1;
                w.faults = 0;
                w.crashes = 2;
                w.restart_parallelisms = vec![1, 2];
            }),
        ),
        (
            "without_checkpoints_at_end_of_input",
            job(|w| {
                w.records = 1;
                w.mode = Mode::Streaming { checkpoints: false };
            }),
        ),
        (
            "batch_at_end_of_input",
            job(|w| {
                w.records = 1;
                w.mode = Mode::Batch;
            }),
        ),
        (
            "unbounded_with_checkpoints",
            job(|w| {
                w.records = 1;
                w.input = Input::Unbounded;
            }),
        ),
        (
            "unbounded_without_checkpoints_is_refused",
            job(|w| {
                w.input = Input::Unbounded;
                w.mode = Mode::Streaming { checkpoints: false };
            }),
        ),
        (
            "unbounded_batch_is_refused",
            job(|w| {
                w.input = Input::Unbounded;
                w.mode = Mode::Batch;
            }),
        ),
        (
            "unbounded_without_checkpoints_allowed_commits_nothing",
            job(|w| {
                w.records = 1;
                w.input = Input::Unbounded;
                w.mode = Mode::Streaming { checkpoints: false };
                w.allow_uncommitted = true;
            }),
        ),
        (
            "a_run_on_fresh_checkpoint_storage",
            job(|w| {
                w.subtasks = 1;
                w.records = 1;
                w.faults = 0;
                w.fresh_runs = 1;
            }),
        ),
        (
            "two_checkpoints_in_flight",
            job(|w| {
                w.subtasks = 1;
                w.concurrent = 2;
            }),
        ),
        (
            "bounded_group_source",
            Case::Source(SourceWorld {
                deals: 2,
                ..SourceWorld::small()
            }),
        ),
    ]
}

/// Deeper worlds, for a run by hand (`--suite deep`); their figures are in
/// `docs/architecture.md`.
pub fn deep() -> Vec<(&'static str, Case)> {
    vec![
        ("bounded_two_records_a_crash_and_a_fault", job(|_| {})),
        (
            "global_committer_a_crash_and_a_fault",
            job(|w| {
                w.records = 1;
                w.global_committer = true;
            }),
        ),
        (
            "rescale_to_one_two_or_three_and_a_fault",
            job(|w| {
                w.records = 1;
                w.restart_parallelisms = vec![1, 2, 3];
            }),
        ),
        (
            "three_checkpoints_two_in_flight_and_faults",
            job(|w| {
                w.subtasks = 1;
                w.checkpoints = 3;
                w.concurrent = 2;
                w.faults = 2;
            }),
        ),
        (
            "rescale_twice_from_one_two_records",
            job(|w| {
                w.subtasks = 1;
                w.faults = 0;
                w.crashes = 2;
                w.restart_parallelisms = vec![1, 2];
            }),
        ),
        (
            "bounded_group_source_three_deals",
            Case::Source(SourceWorld::small()),
        ),
    ]
}
