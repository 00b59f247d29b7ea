//! The Kafka source against a broker (`scripts/with-kafka`): bounded and
//! unbounded reads into the memory sink, hand-overs between instances of
//! one group, and the faults refused with the choice named.

mod common;
mod faults;
mod handover;
mod reads;
