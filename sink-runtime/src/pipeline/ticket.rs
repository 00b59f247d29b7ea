//! Tickets: the answer a pipeline owes each send, given once the records'
//! checkpoint was committed, or refused when that can no longer happen.
//!
//! A [`Ticket`] is the receiving end of a one-shot channel whose sending end,
//! a [`Waiter`], travels with the records into the subtask that reads them.
//! The reader resolves it after the commit; if the reader is dropped first
//! (the job failed, restarted or was cancelled), the waiter is dropped with it
//! and the ticket fails with [`TicketError::NotCommitted`]. No ticket can
//! therefore wait forever, and none says "committed" before the commit.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use sink_api::CheckpointId;
use tokio::sync::oneshot;

/// A successful answer: the records are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The checkpoint whose commit holds the records.
    pub checkpoint_id: CheckpointId,
    /// True when the send carried an idempotency key that an earlier send
    /// already used: its records were not written again, and the checkpoint
    /// is the one that committed the earlier send.
    pub duplicate: bool,
}

/// Why a ticket did not resolve to an [`Ack`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// The pipeline failed, restarted or stopped before the checkpoint
    /// holding the records was committed. The records may be in the output
    /// or not; send them again, with the same idempotency key so that they
    /// are not written twice.
    #[error(
        "the pipeline stopped or restarted before the records were committed; \
         they may or may not be in the output: send them again with the same idempotency key"
    )]
    NotCommitted,
    /// The commit of the checkpoint holding the records dropped some output
    /// with a known reason (see `CommitRequest::signal_failed_with_known_reason`);
    /// these records may be among it. Their idempotency key was forgotten, so
    /// sending them again with it writes them again.
    #[error(
        "the commit of checkpoint {checkpoint_id} lost part of its output; send the records again"
    )]
    PartlyLost {
        /// The checkpoint whose commit lost output.
        checkpoint_id: CheckpointId,
    },
    /// The records were refused when read and never written (the message
    /// says why).
    #[error("the records were refused and not written: {0}")]
    Refused(String),
    /// The send's idempotency key was used before by a send with another
    /// [`Fingerprint`](super::Fingerprint): this is not a retry of that send
    /// but other content under a used key. Nothing of it was written, and
    /// the earlier send is unaffected. Sending it again with the same key is
    /// refused again (while the key is remembered): use a new key.
    #[error(
        "the idempotency key was already used for different content ({}); nothing of this send \
         was written: send different content under a new key",
        match .committed_in {
            Some(checkpoint) => format!("committed in checkpoint {checkpoint}"),
            None => "not committed yet".to_string(),
        }
    )]
    KeyReused {
        /// The checkpoint that committed the earlier send's records, or
        /// `None` while they wait for their commit.
        committed_in: Option<CheckpointId>,
    },
}

/// What a send returns: a future that resolves once its records are
/// committed.
///
/// "Committed" means durable and visible to the destination's readers
/// (each shipped sink's meaning: `docs/embedding.md`, "What committed
/// means, sink by sink"), unless the pipeline was built with
/// [`acknowledge_before_visible`](crate::PipelineBuilder::acknowledge_before_visible):
/// then durable, visible later.
///
/// Awaiting it is optional: dropping a ticket does not withdraw the records.
#[derive(Debug)]
#[must_use = "a ticket tells whether the records were committed"]
pub struct Ticket {
    answer: oneshot::Receiver<Result<Ack, TicketError>>,
}

impl Future for Ticket {
    type Output = Result<Ack, TicketError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(TicketError::NotCommitted)))
    }
}

/// The sending end of a [`Ticket`], kept by the reader until the commit.
#[derive(Debug)]
pub(crate) struct Waiter {
    answer: oneshot::Sender<Result<Ack, TicketError>>,
    duplicate: bool,
}

/// A new ticket and the waiter that answers it.
pub(crate) fn ticket() -> (Waiter, Ticket) {
    let (answer, receiver) = oneshot::channel();
    (
        Waiter {
            answer,
            duplicate: false,
        },
        Ticket { answer: receiver },
    )
}

impl Waiter {
    /// Marks the send as a repeat of an earlier one with the same key.
    pub(crate) fn duplicate(mut self) -> Waiter {
        self.duplicate = true;
        self
    }

    /// The records are committed in `checkpoint_id`.
    pub(crate) fn committed(self, checkpoint_id: CheckpointId) {
        let duplicate = self.duplicate;
        self.answer(Ok(Ack {
            checkpoint_id,
            duplicate,
        }));
    }

    /// Answers with an error.
    pub(crate) fn fail(self, error: TicketError) {
        self.answer(Err(error));
    }

    fn answer(self, answer: Result<Ack, TicketError>) {
        // A caller that dropped its ticket does not want the answer.
        let _ = self.answer.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_waiter_fails_its_ticket() {
        let (waiter, ticket) = ticket();
        drop(waiter);
        assert_eq!(ticket.await, Err(TicketError::NotCommitted));
    }

    #[tokio::test]
    async fn a_committed_waiter_resolves_with_its_checkpoint() {
        let (waiter, ticket) = ticket();
        waiter.duplicate().committed(CheckpointId(7));
        assert_eq!(
            ticket.await,
            Ok(Ack {
                checkpoint_id: CheckpointId(7),
                duplicate: true
            })
        );
    }
}
