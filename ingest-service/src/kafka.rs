//! The ingest service's Kafka destination (`--sink kafka`): each event is
//! one message of a topic, its value the event's JSON text, committed by
//! the Kafka sink in one transaction per checkpoint and subtask.
//!
//! [`EventTopic`] is the Kafka sink with a writer that turns each [`Event`]
//! into a [`KafkaRecord`], every other call passed through (the transaction
//! timeout too, so the job's build still refuses checkpoint settings that
//! could outlive it): the sink's guarantees hold unchanged. A 200 means the
//! event's transaction committed; readers see it with
//! `isolation.level=read_committed`.

use std::time::Duration;

use sink_api::{async_trait, CheckpointId, InitContext, JobStart, Sink, SinkError, SinkWriter};
use sinks_kafka::{KafkaCommittable, KafkaCommitter, KafkaRecord, KafkaSink, KafkaWriter};

use super::Event;

/// The message of an event: its JSON text, without a key (each subtask
/// spreads its batches over the partitions).
pub fn message(event: Event) -> KafkaRecord {
    KafkaRecord::new(event.0.to_string())
}

/// The Kafka sink taking the service's events. Made by the service from
/// `--brokers` and `--topic`; given to its pipeline.
pub struct EventTopic(pub KafkaSink);

/// The Kafka sink's writer, taking events.
pub struct EventTopicWriter(KafkaWriter);

#[async_trait]
impl SinkWriter for EventTopicWriter {
    type Input = Event;
    type Committable = KafkaCommittable;
    type State = ();

    async fn write(&mut self, event: Event) -> Result<(), SinkError> {
        self.0.write(message(event)).await
    }

    async fn write_batch(&mut self, events: Vec<Event>) -> Result<(), SinkError> {
        self.0
            .write_batch(events.into_iter().map(message).collect())
            .await
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.0.flush(end_of_input).await
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<KafkaCommittable>, SinkError> {
        self.0.prepare_commit(checkpoint_id).await
    }
}

#[async_trait]
impl Sink for EventTopic {
    type Writer = EventTopicWriter;
    type Committer = KafkaCommitter;

    async fn on_start(&self, start: &JobStart<'_, KafkaCommittable, ()>) -> Result<(), SinkError> {
        self.0.on_start(start).await
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        restored: Vec<()>,
    ) -> Result<EventTopicWriter, SinkError> {
        Ok(EventTopicWriter(
            self.0.create_writer(context, restored).await?,
        ))
    }

    async fn create_committer(&self, context: &InitContext) -> Result<KafkaCommitter, SinkError> {
        self.0.create_committer(context).await
    }

    fn uncommitted_lifetime(&self) -> Option<Duration> {
        self.0.uncommitted_lifetime()
    }
}
