//! The committer of a [`DeadLettered`](super::DeadLettered) sink: a
//! checkpoint's dead letters first, then its main output.

use async_trait::async_trait;
use sink_api::{CommitOutcome, CommitRequest, Committer, SinkError};

use super::Routed;

/// Commits a subtask's dead letters with the dead-letter sink's committer,
/// then its main output with the main sink's. Made by the sink for the
/// runtime.
#[derive(Debug)]
pub struct DeadLetteredCommitter<M, D> {
    main: M,
    dead: D,
}

impl<M, D> DeadLetteredCommitter<M, D> {
    pub(super) fn new(main: M, dead: D) -> DeadLetteredCommitter<M, D> {
        DeadLetteredCommitter { main, dead }
    }
}

/// Whether a dead letter's commit lets the main output of its checkpoint
/// go: it is committed, or dropped with a known reason (a loss the runtime
/// reports). Not while it waits for a retry, nor after an unknown outcome
/// (the job restarts and commits both again).
fn lets_main_go(outcome: &CommitOutcome) -> bool {
    matches!(
        outcome,
        CommitOutcome::Committed
            | CommitOutcome::AlreadyCommitted
            | CommitOutcome::FailedWithKnownReason(_)
    )
}

#[async_trait]
impl<M, D> Committer for DeadLetteredCommitter<M, D>
where
    M: Committer,
    D: Committer,
    M::Committable: Clone,
    D::Committable: Clone,
{
    type Committable = Routed<M::Committable, D::Committable>;

    /// The dead letters of every request first. Only once all of them are
    /// committed (or dropped with a known reason) are the main requests
    /// committed: until then they wait for the runtime's retry, so that no
    /// main output (with its positions) is visible before the dead letters
    /// read with it.
    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<Self::Committable>],
    ) -> Result<(), SinkError> {
        let (mut dead, mut dead_places) = (Vec::new(), Vec::new());
        let (mut main, mut main_places) = (Vec::new(), Vec::new());
        for (at, request) in requests.iter().enumerate() {
            let (checkpoint, retries) = (request.checkpoint_id(), request.retry_count());
            match request.committable() {
                Routed::DeadLetter(c) => {
                    dead.push(CommitRequest::new(c.clone(), checkpoint, retries));
                    dead_places.push(at);
                }
                Routed::Main(c) => {
                    main.push(CommitRequest::new(c.clone(), checkpoint, retries));
                    main_places.push(at);
                }
            }
        }
        if !dead.is_empty() {
            self.dead.commit(&mut dead).await?;
        }
        let dead_settled = dead.iter().all(|r| lets_main_go(r.outcome()));
        for (at, done) in dead_places.into_iter().zip(dead) {
            requests[at].settle_as(done, Routed::DeadLetter);
        }
        if !dead_settled {
            for at in main_places {
                requests[at].retry_later();
            }
            return Ok(());
        }
        if !main.is_empty() {
            self.main.commit(&mut main).await?;
        }
        for (at, done) in main_places.into_iter().zip(main) {
            requests[at].settle_as(done, Routed::Main);
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), SinkError> {
        let main = self.main.close().await;
        let dead = self.dead.close().await;
        main.and(dead)
    }
}
