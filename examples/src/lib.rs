//! Runnable examples of the exactly-once sink SDK; see `src/bin/`.
//!
//! This library target exists only so that the code in the project's README
//! is compiled and run as a test (`cargo test -p examples --doc`).

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
