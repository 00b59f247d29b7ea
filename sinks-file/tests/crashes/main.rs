//! The file sink's tests that set crash points (`--features failpoints`):
//! the crash matrix, locally and on the S3-compatible server, and the sink
//! on that server certified by the kit (`--features s3`). Crash points are
//! process-wide, so these tests have an executable of their own.

#[path = "../common/mod.rs"]
mod common;
mod crash;
mod object_positions;
#[cfg(feature = "s3")]
mod s3;
