//! The memory sink factory: makes writers and committers on one shared store.

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};
use sink_api::{InitContext, JobStart, Sink, SinkError};

use crate::{MemoryCommittable, MemoryCommitter, MemoryStore, MemoryWriter, MemoryWriterState};

/// A transactional in-memory sink: every writer and committer it makes works
/// on the same [`MemoryStore`].
///
/// Created by a test with a clone of the store it keeps, and given to the job
/// builder. The runtime calls [`Sink::create_writer`] and
/// [`Sink::create_committer`] once per subtask and per start of the job; both
/// are counted in [`MemoryStats`](crate::MemoryStats). Committables and writer
/// states use the default bincode serializers.
pub struct MemorySink<T> {
    store: MemoryStore<T>,
    roll_every: Option<usize>,
    background_durability: bool,
}

impl<T> MemorySink<T> {
    /// A sink writing to `store`. Called by tests; keep a clone of `store` to
    /// inspect it afterwards.
    pub fn new(store: MemoryStore<T>) -> MemorySink<T> {
        MemorySink {
            store,
            roll_every: None,
            background_durability: false,
        }
    }

    /// Writers make their prepared transactions durable in the background,
    /// through [`SinkWriter::durability`](sink_api::SinkWriter::durability)
    /// (as the file sink's fsyncs), and the store records a violation when
    /// one is committed before that work is done: a runtime that
    /// acknowledged the checkpoint too early.
    pub fn durable_in_background(mut self) -> MemorySink<T> {
        self.background_durability = true;
        self
    }

    /// Writers close a transaction once it holds `records` records and open
    /// the next, so that each checkpoint commits several committables in one
    /// batch. By default a transaction spans a whole checkpoint.
    pub fn roll_every(mut self, records: usize) -> MemorySink<T> {
        self.roll_every = Some(records);
        self
    }

    /// The store this sink writes to.
    pub fn store(&self) -> &MemoryStore<T> {
        &self.store
    }
}

#[async_trait]
impl<T> Sink for MemorySink<T>
where
    T: Clone + Send + Sync + 'static + Serialize + DeserializeOwned,
{
    type Writer = MemoryWriter<T>;
    type Committer = MemoryCommitter<T>;

    /// Registers the store's counters in the job's metrics
    /// (`memory_sink_*`).
    async fn on_start(
        &self,
        start: &JobStart<'_, MemoryCommittable, MemoryWriterState<T>>,
    ) -> Result<(), SinkError> {
        self.store.counters.register(&start.metrics);
        Ok(())
    }

    /// A writer for the context's subtask and generation, resumed from
    /// `restored_states` (largest sequence number, concatenated buffers).
    async fn create_writer(
        &self,
        context: &InitContext,
        restored_states: Vec<MemoryWriterState<T>>,
    ) -> Result<MemoryWriter<T>, SinkError> {
        self.store.lock().stats.writers_created += 1;
        let writer = MemoryWriter::new(
            self.store.clone(),
            context.subtask_index,
            context.generation,
            restored_states,
        )
        .in_lineage(&context.lineage);
        let writer = match self.roll_every {
            Some(records) => writer.with_roll_every(records),
            None => writer,
        };
        Ok(match self.background_durability {
            true => writer.with_background_durability(),
            false => writer,
        })
    }

    /// The store keeps source positions, moved only with the data.
    fn commits_positions(&self) -> bool {
        true
    }

    /// What the store's committed transactions moved `scope` to, unless
    /// the store was told to keep them nowhere
    /// ([`PositionFlaw::NotInDestination`](crate::PositionFlaw)).
    async fn committed_positions(
        &self,
        scope: &str,
    ) -> Result<sink_api::CommittedPositions, SinkError> {
        let state = self.store.lock();
        Ok(match state.position_flaw {
            Some(crate::PositionFlaw::NotInDestination) => sink_api::CommittedPositions::new(),
            _ => state.positions.scope(scope),
        })
    }

    /// A committer for the context's subtask.
    async fn create_committer(
        &self,
        context: &InitContext,
    ) -> Result<MemoryCommitter<T>, SinkError> {
        self.store.lock().stats.committers_created += 1;
        Ok(MemoryCommitter::new(
            self.store.clone(),
            context.subtask_index,
        ))
    }
}

#[cfg(test)]
mod tests {
    use sink_api::{deserialize_versioned, serialize_versioned, Sink};

    use super::*;

    #[test]
    fn committables_and_states_round_trip_through_the_default_serializers() {
        let sink = MemorySink::new(MemoryStore::<String>::new());
        let committable = MemoryCommittable {
            transaction_id: "g3-s1-t4".into(),
            record_count: 2,
        };
        let state = MemoryWriterState {
            next_transaction_seq: 5,
            buffered: vec!["a".to_owned()],
        };

        let committables = sink.committable_serializer();
        let blob = serialize_versioned(committables.as_ref(), &committable).unwrap();
        assert_eq!(
            deserialize_versioned(committables.as_ref(), &blob).unwrap(),
            committable
        );
        let states = sink.writer_state_serializer();
        let blob = serialize_versioned(states.as_ref(), &state).unwrap();
        assert_eq!(
            deserialize_versioned(states.as_ref(), &blob).unwrap(),
            state
        );
    }
}
