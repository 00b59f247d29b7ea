//! The runtime's tests: commits, checkpoints, restores, end of input, the
//! pipeline, checkpoint storages, the simulation. One executable, each
//! file a module; the tests that set crash points are in `tests/crashes`.

mod bad_records;
mod commit_schedule;
mod commits;
#[path = "../common/mod.rs"]
mod common;
mod core_properties;
mod direct_sink;
mod durability;
mod end_of_input;
mod golden;
mod job_control;
mod object_storage;
mod pipeline;
mod positions;
mod restore;
mod simulation;
mod slow_committer;
mod source_errors;
mod start_hook;
mod state_directory;
mod uncommitted_lifetime;
mod user_transforms;
mod write_up_modes;
