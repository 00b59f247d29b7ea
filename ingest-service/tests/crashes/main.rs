//! The ingest service's Delta destination certified by the kit, which sets
//! crash points: they are process-wide, so this test has an executable of
//! its own.

#[cfg(feature = "delta")]
mod delta_event_table_certified;
