//! The protocol checked exhaustively, in the test command: every world of
//! `sink_model::suite::quick` holds every property on today's code, and
//! each past bug, put back, is found with a readable counterexample.
//!
//! Each check writes its figures (states, time, every property's verdict)
//! to `target/tmp/sink-model/`, which `scripts/test-all` prints at its end.

use std::path::PathBuf;

use sink_model::check::Outcome;
use sink_model::job::rules as job_rules;
use sink_model::source::rules as source_rules;
use sink_model::suite::{self, Case};
use sink_model::{Bounds, JobWorld, PastBug, SourceWorld};

/// Keeps `outcome`'s figures for the test command's summary.
fn record(name: &str, outcome: &Outcome) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sink-model");
    std::fs::create_dir_all(&dir).expect("the target's tmp directory is writable");
    std::fs::write(dir.join(format!("{name}.txt")), outcome.to_string())
        .expect("the figures are written");
}

/// Checks the suite's world `name` exhaustively and expects every property
/// to hold and every goal to be met.
fn holds(name: &str) {
    let (_, case) = suite::quick()
        .into_iter()
        .find(|(n, _)| *n == name)
        .expect("a world of the quick suite");
    let outcome = case.check(Bounds::exhaustive());
    record(name, &outcome);
    println!("{outcome}");
    assert!(outcome.holds(), "{outcome}");
    assert!(outcome.states > 0);
}

/// Searches `case` with `bug` put back and expects `property` to fail;
/// returns the counterexample's trace.
fn finds(name: &str, case: Case, property: &'static str) -> String {
    let outcome = case.check(Bounds::until_broken(property));
    record(name, &outcome);
    println!("{outcome}");
    let failure = outcome
        .failure(property)
        .unwrap_or_else(|| panic!("the checker did not find \"{property}\" broken:\n{outcome}"));
    failure.trace.clone()
}

mod holds {
    use super::holds;

    #[test]
    fn bounded_two_subtasks_and_a_crash() {
        holds("bounded_two_subtasks_and_a_crash");
    }

    #[test]
    fn bounded_every_fault_and_a_crash() {
        holds("bounded_every_fault_and_a_crash");
    }

    #[test]
    fn global_committer_two_subtasks_and_a_crash() {
        holds("global_committer_two_subtasks_and_a_crash");
    }

    #[test]
    fn idempotent_destination_faults_and_a_crash() {
        holds("idempotent_destination_faults_and_a_crash");
    }

    #[test]
    fn global_committer_faults_and_a_crash() {
        holds("global_committer_faults_and_a_crash");
    }

    #[test]
    fn global_committer_rescale_from_two_to_one() {
        holds("global_committer_rescale_from_two_to_one");
    }

    #[test]
    fn rescale_from_two_to_one_or_two() {
        holds("rescale_from_two_to_one_or_two");
    }

    #[test]
    fn rescale_twice_from_one() {
        holds("rescale_twice_from_one");
    }

    #[test]
    fn without_checkpoints_at_end_of_input() {
        holds("without_checkpoints_at_end_of_input");
    }

    #[test]
    fn batch_at_end_of_input() {
        holds("batch_at_end_of_input");
    }

    #[test]
    fn unbounded_with_checkpoints() {
        holds("unbounded_with_checkpoints");
    }

    #[test]
    fn unbounded_without_checkpoints_is_refused() {
        holds("unbounded_without_checkpoints_is_refused");
    }

    #[test]
    fn unbounded_batch_is_refused() {
        holds("unbounded_batch_is_refused");
    }

    #[test]
    fn unbounded_without_checkpoints_allowed_commits_nothing() {
        holds("unbounded_without_checkpoints_allowed_commits_nothing");
    }

    #[test]
    fn a_run_on_fresh_checkpoint_storage() {
        holds("a_run_on_fresh_checkpoint_storage");
    }

    #[test]
    fn two_checkpoints_in_flight() {
        holds("two_checkpoints_in_flight");
    }

    #[test]
    fn bounded_group_source() {
        holds("bounded_group_source");
    }

    #[test]
    fn every_world_of_the_quick_suite_has_a_test() {
        let source = include_str!("model.rs");
        for (name, _) in sink_model::suite::quick() {
            assert!(
                source.contains(&format!("fn {name}()")),
                "the world {name} has no test of its own"
            );
        }
    }
}

mod past_bugs {
    use super::*;

    fn job(edit: impl FnOnce(&mut JobWorld), bug: PastBug) -> Case {
        let mut world = JobWorld::small();
        edit(&mut world);
        Case::Job(world.with_bug(bug))
    }

    /// Checks that the trace names `lines`, in this order.
    fn in_order(trace: &str, lines: &[&str]) {
        let mut rest = trace;
        for line in lines {
            let at = rest.find(line).unwrap_or_else(|| {
                panic!("the counterexample lacks \"{line}\" (in order):\n{trace}")
            });
            rest = &rest[at + line.len()..];
        }
    }

    #[test]
    fn the_final_committables_lost_before_end_of_stream_are_found() {
        let trace = finds(
            "bug_end_of_stream_before_final_commit",
            job(
                |w| {
                    w.records = 1;
                    w.checkpoints = 1;
                    w.crashes = 0;
                    w.faults = 0;
                    w.global_committer = true;
                },
                PastBug::EndOfStreamBeforeFinalCommit,
            ),
            job_rules::FINAL_BEFORE_END_OF_STREAM,
        );
        in_order(
            &trace,
            &[
                "reaches end of input",
                "the global committer takes subtask",
                "end of stream",
                "the global committer takes subtask",
                "s commit of checkpoint",
                "broken: {FinalBeforeEndOfStream",
            ],
        );
    }

    #[test]
    fn a_transaction_opened_after_the_finish_is_found() {
        let trace = finds(
            "bug_transaction_after_finish",
            job(
                |w| {
                    w.records = 1;
                    w.crashes = 0;
                },
                PastBug::TransactionAfterFinish,
            ),
            job_rules::NOTHING_AFTER_FINISH,
        );
        in_order(
            &trace,
            &[
                "reaches end of input",
                "takes barrier",
                "(its input has ended)",
                "NoTransactionAfterEndOfInput",
            ],
        );
    }

    #[test]
    fn a_commit_before_completion_is_found() {
        let trace = finds(
            "bug_commit_before_completion",
            job(|w| w.subtasks = 1, PastBug::CommitBeforeCompletion),
            job_rules::AFTER_COMPLETION,
        );
        in_order(
            &trace,
            &[
                "reaches end of input",
                "committer commits checkpoint",
                "broken: {CommitAfterCompletion}",
            ],
        );
    }

    #[test]
    fn generation_less_ids_are_found() {
        let trace = finds(
            "bug_generation_less_ids",
            job(
                |w| {
                    w.subtasks = 1;
                    w.records = 1;
                },
                PastBug::GenerationLessIds,
            ),
            job_rules::UNIQUE_IDS,
        );
        // A start prepares a name, the job restarts (a crash, or a commit
        // that failed), and the next start prepares the same checkpoint
        // under the same name.
        in_order(
            &trace,
            &["prepare", "restarts", "prepare", "broken: {UniqueIds}"],
        );
    }

    #[test]
    fn a_bounded_group_member_ending_on_its_own_partitions_is_found() {
        let trace = finds(
            "bug_end_on_own_partitions",
            Case::Source(SourceWorld::small().with_bug(PastBug::EndOnOwnPartitions)),
            source_rules::ENDS_ONLY_AT_THE_END,
        );
        in_order(
            &trace,
            &[
                "the group deals",
                "looks whether the input ended",
                "the destination lacks: partition",
            ],
        );
    }

    #[test]
    fn every_past_bug_has_a_test() {
        let source = include_str!("model.rs");
        for bug in PastBug::ALL {
            assert!(
                source.contains(&format!("PastBug::{bug:?}")),
                "the past bug {bug} has no test that expects the checker to find it"
            );
        }
    }
}
