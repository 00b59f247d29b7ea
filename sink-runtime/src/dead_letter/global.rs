//! The main sink's global committer under a
//! [`DeadLettered`](super::DeadLettered) sink: it acts on the main
//! output's committables only.

use async_trait::async_trait;
use sink_api::{CheckpointId, CommitSchedule, GlobalCommitter, SinkError};

use super::{split, Routed};

/// Hands the main sink's global committer the main committables of each
/// checkpoint; the dead letters' were committed by their committers.
pub(super) struct MainOnly<M, D> {
    inner: Box<dyn GlobalCommitter<Committable = M>>,
    _dead: std::marker::PhantomData<fn(D)>,
}

impl<M, D> MainOnly<M, D> {
    pub(super) fn new(inner: Box<dyn GlobalCommitter<Committable = M>>) -> MainOnly<M, D> {
        MainOnly {
            inner,
            _dead: std::marker::PhantomData,
        }
    }
}

#[async_trait]
impl<M: Send + 'static, D: Send + 'static> GlobalCommitter for MainOnly<M, D> {
    type Committable = Routed<M, D>;

    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<Routed<M, D>>,
    ) -> Result<(), SinkError> {
        let (main, _) = split(committables);
        self.inner.commit_checkpoint(checkpoint_id, main).await
    }

    async fn commit_checkpoints(
        &mut self,
        checkpoints: Vec<(CheckpointId, Vec<Routed<M, D>>)>,
    ) -> Result<(), SinkError> {
        let main = (checkpoints.into_iter())
            .map(|(checkpoint_id, committables)| (checkpoint_id, split(committables).0))
            .collect();
        self.inner.commit_checkpoints(main).await
    }

    fn schedule(&self) -> CommitSchedule {
        self.inner.schedule()
    }

    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        self.inner.end_of_input().await
    }
}
