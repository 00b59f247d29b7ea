//! The command line of the exactly-once sink SDK.
//!
//! The binary `sink-inspect` prints what a job's checkpoint storage holds (a
//! state directory or an `s3://` prefix): the generation, whether the job
//! finished, each retained checkpoint with the committables still pending in
//! it. Install it with `cargo install --path sink-cli`.
//!
//! The library holds what the project's programs (the demos, the ingest
//! service, the benchmarks, `sink-inspect`) share, so that a flag means the
//! same in each: [`flags`] (durations, checkpoint intervals, tracing, a job's
//! losses), [`location`] (a local directory or an `s3://` URL, for output
//! and checkpoints) and [`layout`] (where the state may lie relative to the
//! output).

pub mod flags;
pub mod layout;
pub mod location;
