//! Where the file sink gets the time from: the runtime's clock
//! ([`sink_api::InitContext::clock`]) unless the builder was given another.
//!
//! Rolling by time and date-time buckets need "now". The clock types are
//! `sink-api`'s, re-exported here: a job built with a manual clock moves the
//! file sink's time too.

pub use sink_api::{Clock, ManualClock, SystemClock};
