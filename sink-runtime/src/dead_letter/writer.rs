//! The writer of a [`DeadLettered`](super::DeadLettered) sink: records to
//! the main writer, bad records to the dead-letter writer, both prepared
//! at every barrier.

use async_trait::async_trait;
use sink_api::{BadRecord, CheckpointId, Durability, PositionAdvance, SinkError, SinkWriter};

use super::Routed;

/// Writes a subtask's records with the main sink's writer and its bad
/// records with the dead-letter sink's. Made by the sink for the runtime.
#[derive(Debug)]
pub struct DeadLetteredWriter<M, D> {
    main: M,
    dead: D,
}

impl<M, D> DeadLetteredWriter<M, D> {
    pub(super) fn new(main: M, dead: D) -> DeadLetteredWriter<M, D> {
        DeadLetteredWriter { main, dead }
    }
}

#[async_trait]
impl<M, D> SinkWriter for DeadLetteredWriter<M, D>
where
    M: SinkWriter,
    D: SinkWriter,
    D::Input: From<BadRecord>,
{
    type Input = M::Input;
    type Committable = Routed<M::Committable, D::Committable>;
    type State = Routed<M::State, D::State>;

    async fn write(&mut self, record: M::Input) -> Result<(), SinkError> {
        self.main.write(record).await
    }

    async fn write_batch(&mut self, records: Vec<M::Input>) -> Result<(), SinkError> {
        self.main.write_batch(records).await
    }

    /// The main writer's refusals; they come back to the runtime, which
    /// hands them to [`write_bad_records`](Self::write_bad_records).
    async fn write_batch_refusing(
        &mut self,
        records: Vec<M::Input>,
    ) -> Result<Vec<BadRecord>, SinkError> {
        self.main.write_batch_refusing(records).await
    }

    /// Each bad record, turned into the dead-letter sink's input, goes to
    /// its writer.
    async fn write_bad_records(&mut self, records: Vec<BadRecord>) -> Result<(), SinkError> {
        let letters = records.into_iter().map(D::Input::from).collect();
        self.dead.write_batch(letters).await
    }

    async fn flush(&mut self, end_of_input: bool) -> Result<(), SinkError> {
        self.dead.flush(end_of_input).await?;
        self.main.flush(end_of_input).await
    }

    fn carry_positions(&mut self, advances: Vec<PositionAdvance>) -> Result<(), SinkError> {
        self.main.carry_positions(advances)
    }

    async fn prepare_commit(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<Self::Committable>, SinkError> {
        let dead = self.dead.prepare_commit(checkpoint_id).await?;
        let main = self.main.prepare_commit(checkpoint_id).await?;
        Ok((dead.into_iter().map(Routed::DeadLetter))
            .chain(main.into_iter().map(Routed::Main))
            .collect())
    }

    async fn snapshot_state(
        &mut self,
        checkpoint_id: CheckpointId,
    ) -> Result<Vec<Self::State>, SinkError> {
        let dead = self.dead.snapshot_state(checkpoint_id).await?;
        let main = self.main.snapshot_state(checkpoint_id).await?;
        Ok((dead.into_iter().map(Routed::DeadLetter))
            .chain(main.into_iter().map(Routed::Main))
            .collect())
    }

    /// Both writers' work for the checkpoint, the dead-letter writer's
    /// first.
    fn durability(&mut self, checkpoint_id: CheckpointId) -> Option<Durability> {
        match (
            self.dead.durability(checkpoint_id),
            self.main.durability(checkpoint_id),
        ) {
            (None, None) => None,
            (dead, main) => Some(Box::pin(async move {
                if let Some(dead) = dead {
                    dead.await?;
                }
                if let Some(main) = main {
                    main.await?;
                }
                Ok(())
            })),
        }
    }

    /// Closes both; the main writer's failure is reported first.
    async fn close(&mut self) -> Result<(), SinkError> {
        let main = self.main.close().await;
        let dead = self.dead.close().await;
        main.and(dead)
    }
}
