//! The Kafka sink against a real broker (`--features kafka-tests`, under
//! `scripts/with-kafka`): certified by the kit, and the faults and
//! recoveries of docs/kafka.md, each read back as a `read_committed`
//! consumer sees the topic.

mod certify;
mod common;
mod security;
