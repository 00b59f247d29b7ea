//! The Delta sink certified by the kit on local tables and on the
//! S3-compatible server, with the other tests on that server. The kit sets
//! crash points, which are process-wide, so these tests have an executable
//! of their own.

mod certify;
#[path = "../common/mod.rs"]
mod common;
mod positions;
mod s3;
