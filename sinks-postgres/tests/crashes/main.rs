//! The PostgreSQL sink certified by the kit and crashed at every crash
//! point, against a real server (`--features postgres-tests`; the crash
//! matrix with `postgres-crash-tests`). Crash points are process-wide, so
//! these tests have an executable of their own.

mod certified;
#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "postgres-crash-tests")]
mod crash;
