//! The runtime's crash tests, with the crash points compiled in
//! (`--features crash-tests`). Crash points are process-wide, so these
//! tests have an executable of their own: no other test of the runtime
//! meets a crash point that one of them set.

#[path = "../common/mod.rs"]
mod common;
mod crash_matrix;
mod crash_twice;
mod dead_letters;
mod finished_loss;
mod job_counters;
mod pipeline_crashes;
mod recommit_first;
