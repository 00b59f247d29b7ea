//! The Delta sink's tests: local tables, stores the log cannot rely on. One
//! executable, each file a module; the tests that set crash points (the
//! certifications, on local tables and on the S3-compatible server, and the
//! other tests on that server) are in `tests/crashes`.

#[path = "../common/mod.rs"]
mod common;
mod local;
mod stores;
