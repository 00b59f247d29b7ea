//! The per-subtask committer: checks that the checkpoint's data files are
//! there, whole, before the global committer appends them to the table.
//!
//! ```text
//! IcebergDataFile ─ size ─┬─ there, same size ─▶ committed ─▶ global committer
//!                         ├─ there, other size ─▶ failed (unknown reason): the job stops
//!                         └─ missing ─┬─ the table's mark holds its checkpoint ─▶ already committed
//!                                     └─ not yet ─▶ retried 3 times, then its rows are reported lost
//! ```
//!
//! The files are durable already: the writer's storage synced each one,
//! with its directory, when it closed it, before the checkpoint recording
//! it was taken. Nothing becomes visible here: readers see a file only
//! once the global committer's append names it.

use std::sync::Arc;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::{Catalog, TableIdent};
use sink_api::{CommitRequest, Committer, SinkError};
use tracing::warn;

use crate::committable::IcebergDataFile;
use crate::errors::iceberg_error;
use crate::marks::Marks;

/// How often a missing data file is looked for again before its rows are
/// reported lost.
const MISSING_FILE_RETRIES: u32 = 3;

/// Checks one subtask's data files before their append.
///
/// Made by [`IcebergSink::create_committer`](crate::IcebergSink), one per
/// subtask and start; called by the runtime as [`Committer`] describes.
pub struct IcebergFileCommitter {
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    files: FileIO,
}

impl IcebergFileCommitter {
    pub(crate) fn new(
        catalog: Arc<dyn Catalog>,
        ident: TableIdent,
        files: FileIO,
    ) -> IcebergFileCommitter {
        IcebergFileCommitter {
            catalog,
            ident,
            files,
        }
    }

    /// The newest checkpoint of `app_id` the table holds.
    async fn committed_checkpoint(&self, app_id: &str) -> Result<Option<u64>, SinkError> {
        let table =
            self.catalog.load_table(&self.ident).await.map_err(|e| {
                iceberg_error(format!("reading the Iceberg table {}", self.ident), e)
            })?;
        Ok(Marks::read(table.metadata().properties(), app_id)?.checkpoint)
    }
}

#[async_trait]
impl Committer for IcebergFileCommitter {
    type Committable = IcebergDataFile;

    /// Each file: as the module says.
    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<IcebergDataFile>],
    ) -> Result<(), SinkError> {
        for request in requests.iter_mut() {
            let file = request.committable().clone();
            let looking = || format!("looking for the data file {}", file.path);
            let input = self
                .files
                .new_input(&file.path)
                .map_err(|e| iceberg_error(looking(), e))?;
            let there = input
                .exists()
                .await
                .map_err(|e| iceberg_error(looking(), e))?;
            if there {
                let size = input
                    .metadata()
                    .await
                    .map_err(|e| iceberg_error(looking(), e))?
                    .size;
                if size == file.size {
                    request.signal_committed();
                } else {
                    request.signal_failed_with_unknown_reason(format!(
                        "the data file {} has {size} bytes, {} were written: another writer \
                         replaced it",
                        file.path, file.size
                    ));
                }
                continue;
            }
            let checkpoint = request.checkpoint_id();
            let done = self.committed_checkpoint(&file.app_id).await?;
            if done.is_some_and(|done| done >= checkpoint.0) {
                // Appended, then removed (a table maintenance job rewrote it).
                request.signal_already_committed();
            } else if request.retry_count() < MISSING_FILE_RETRIES {
                warn!(file = %file.path, "a data file to commit is missing; looking again");
                request.retry_later();
            } else {
                request.signal_records_lost(
                    file.rows,
                    format!(
                        "the data file {} of checkpoint {checkpoint} is missing and the table {} \
                         does not hold it: its {} rows are lost",
                        file.path, self.ident, file.rows
                    ),
                );
            }
        }
        Ok(())
    }
}
