//! The PostgreSQL sink against a real server (`scripts/with-postgres`,
//! `--features postgres-tests`). One executable, each file a module; the
//! certification and the crash tests are in `tests/crashes`.

#[path = "../common/mod.rs"]
mod common;
mod positions;
mod postgres;
