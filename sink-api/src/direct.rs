//! Sinks without a second phase: a writer whose writes are visible at once
//! and safe to repeat (idempotent upserts, or at-least-once delivery) needs
//! no committer. Such a sink names [`NoCommitter`] as its committer and
//! [`NoCommittable`] as its writer's committable; its `prepare_commit`
//! returns nothing, so nothing is ever committed.
//!
//! What such a sink guarantees is the writer's: a record written after the
//! last completed checkpoint is written again after a restore (the source
//! replays it), so the writes must be idempotent for exactly-once output.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::{Arc, Mutex};
//! use sink_api::*;
//!
//! /// Upserts `(key, value)` pairs: a replay writes the same value again.
//! struct Upserts(Arc<Mutex<BTreeMap<u64, String>>>);
//! struct UpsertWriter(Arc<Mutex<BTreeMap<u64, String>>>);
//!
//! #[async_trait]
//! impl Sink for Upserts {
//!     type Writer = UpsertWriter;
//!     type Committer = NoCommitter;
//!     async fn create_writer(&self, _: &InitContext, _: Vec<()>) -> Result<UpsertWriter, SinkError> {
//!         Ok(UpsertWriter(self.0.clone()))
//!     }
//!     async fn create_committer(&self, _: &InitContext) -> Result<NoCommitter, SinkError> {
//!         Ok(NoCommitter)
//!     }
//! }
//!
//! #[async_trait]
//! impl SinkWriter for UpsertWriter {
//!     type Input = (u64, String);
//!     type Committable = NoCommittable;
//!     type State = ();
//!     async fn write(&mut self, (key, value): (u64, String)) -> Result<(), SinkError> {
//!         let mut table = self.0.lock().map_err(|_| SinkError::msg("poisoned"))?;
//!         table.insert(key, value);
//!         Ok(())
//!     }
//!     async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Vec<NoCommittable>, SinkError> {
//!         Ok(Vec::new())
//!     }
//! }
//! ```

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{CommitRequest, Committer, SinkError};

/// The committable of a sink without a second phase: there is none (no
/// value of this type can exist), so a writer returns `Vec::new()` from
/// `prepare_commit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoCommittable {}

/// The committer of a sink without a second phase. Made by the sink's
/// `create_committer` (`Ok(NoCommitter)`); never given a request, since no
/// [`NoCommittable`] can exist.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCommitter;

#[async_trait]
impl Committer for NoCommitter {
    type Committable = NoCommittable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<NoCommittable>],
    ) -> Result<(), SinkError> {
        // Empty: no request can be made of an uninhabited committable.
        match requests.first() {
            None => Ok(()),
            Some(request) => match *request.committable() {},
        }
    }
}
