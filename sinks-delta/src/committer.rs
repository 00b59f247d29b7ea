//! The per-subtask committer: makes the checkpoint's data files durable
//! before the global committer names them in the table's log.
//!
//! ```text
//! DataFile ─ HEAD ─┬─ there, same size ─▶ fsync (local tables) ─▶ committed ─▶ global committer
//!                  ├─ there, other size ─▶ failed (unknown reason): the job stops
//!                  └─ missing ─┬─ the log holds its checkpoint ─▶ already committed
//!                              └─ not yet ─▶ retried 3 times, then its rows are reported lost
//! ```
//!
//! Nothing becomes visible here: readers see a file only once the global
//! committer's transaction names it.

use async_trait::async_trait;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use sink_api::{CommitRequest, Committer, SinkError};
use std::sync::Arc;
use tracing::warn;

use crate::committable::DeltaCommittable;
use crate::errors::store_error;
use crate::location::TableLocation;
use crate::table_log::committed_version;

/// How often a missing data file is looked for again before its rows are
/// reported lost.
const MISSING_FILE_RETRIES: u32 = 3;

/// Makes one subtask's data files durable.
///
/// Made by [`DeltaSink::create_committer`](crate::DeltaSink), one per
/// subtask and start; called by the runtime as [`Committer`] describes.
pub struct DeltaFileCommitter {
    location: TableLocation,
    store: Arc<dyn ObjectStore>,
}

impl DeltaFileCommitter {
    pub(crate) fn new(location: TableLocation) -> DeltaFileCommitter {
        let store = location.table_store();
        DeltaFileCommitter { location, store }
    }
}

#[async_trait]
impl Committer for DeltaFileCommitter {
    type Committable = DeltaCommittable;

    /// Each file: as the module says. Positions: passed on at once (the
    /// global committer moves them with the files they name).
    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<DeltaCommittable>],
    ) -> Result<(), SinkError> {
        let mut present = Vec::new();
        for (index, request) in requests.iter_mut().enumerate() {
            let file = match request.committable() {
                DeltaCommittable::File(file) => file.clone(),
                DeltaCommittable::Positions(_) => {
                    present.push(index);
                    continue;
                }
            };
            let path = object_store::path::Path::from(file.path.as_str());
            match self.store.head(&path).await {
                Ok(meta) if meta.size == file.size => present.push(index),
                Ok(meta) => request.signal_failed_with_unknown_reason(format!(
                    "the data file {} has {} bytes, {} were written: another writer replaced it",
                    file.path, meta.size, file.size
                )),
                Err(object_store::Error::NotFound { .. }) => {
                    let checkpoint = request.checkpoint_id();
                    let version = committed_version(&self.location, &file.app_id).await?;
                    if version.is_some_and(|v| v >= checkpoint.0) {
                        // Committed to the table, then compacted and vacuumed.
                        request.signal_already_committed();
                    } else if request.retry_count() < MISSING_FILE_RETRIES {
                        warn!(file = %file.path, "a data file to commit is missing; looking again");
                        request.retry_later();
                    } else {
                        request.signal_records_lost(
                            file.rows,
                            format!(
                                "the data file {} of checkpoint {checkpoint} is missing from {} \
                                 and the table does not hold it: its {} rows are lost",
                                file.path,
                                self.location.url(),
                                file.rows
                            ),
                        );
                    }
                }
                Err(e) => {
                    return Err(store_error(
                        format!("looking for the data file {}", file.path),
                        e,
                    ))
                }
            }
        }
        let paths = present
            .iter()
            .filter_map(|&i| match requests[i].committable() {
                DeltaCommittable::File(file) => Some(file.path.clone()),
                DeltaCommittable::Positions(_) => None,
            })
            .collect();
        self.location
            .make_durable(paths)
            .await
            .map_err(|e| SinkError::io("making data files durable", e))?;
        for index in present {
            requests[index].signal_committed();
        }
        Ok(())
    }
}
