//! The ingest service's Kafka destination (`--sink kafka`): each event is
//! one message of a topic, its value the event's JSON text, committed by
//! the Kafka sink in one transaction per checkpoint and subtask.
//!
//! [`EventTopic`] is the Kafka sink with a writer that turns each [`Event`]
//! into a [`KafkaRecord`] ([`EventSink`]), every other call passed through (the transaction
//! timeout too, so the job's build still refuses checkpoint settings that
//! could outlive it): the sink's guarantees hold unchanged. A 200 means the
//! event's transaction committed; readers see it with
//! `isolation.level=read_committed`.

use sinks_kafka::{KafkaRecord, KafkaSink};

use super::Event;
use crate::event_sink::EventSink;

/// The message of an event: its JSON text, without a key (each subtask
/// spreads its batches over the partitions).
impl From<Event> for KafkaRecord {
    fn from(event: Event) -> KafkaRecord {
        KafkaRecord::new(event.0.to_string())
    }
}

/// The Kafka sink taking the service's events. Made by the service from
/// `--brokers` and `--topic`; given to its pipeline.
pub type EventTopic = EventSink<KafkaSink>;
