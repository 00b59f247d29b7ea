//! Runnable examples of the exactly-once sink SDK; see `src/bin/`.
//!
//! This library holds what the programs share, and compiles and runs the
//! code in the project's README as a test (`cargo test -p examples --doc`).

pub mod demo_job;
pub mod demo_line;
pub mod demo_row;
#[cfg(feature = "kafka")]
pub mod kafka_check;
#[cfg(feature = "kafka")]
pub mod kafka_input;
pub mod table_sink;
pub mod timeline;

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
