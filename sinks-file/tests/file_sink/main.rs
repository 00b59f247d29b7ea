//! The file sink's tests: part files, commits, relocation, the runtime
//! driving the sink, object stores in memory. One executable, each file a
//! module; the tests that set crash points (the crash matrix, and the
//! certification on the S3-compatible server) are in `tests/crashes`.

mod commit_checks;
#[path = "../common/mod.rs"]
mod common;
mod dead_letters;
mod end_to_end;
mod lifecycle;
mod object_commit;
mod parquet;
mod pipeline_visibility;
mod positions;
mod power_loss;
mod relocation;
