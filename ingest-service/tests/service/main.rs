//! The ingest service, run as a user runs it. One executable, each file a
//! module; the certification of its Delta destination is in
//! `tests/crashes`.

mod ingest_load;
mod ingest_service;
mod power_loss;
#[cfg(feature = "delta")]
mod scale_out;
