//! The Delta log as every writer of the sink touches it: a start's claim on
//! the table ([`Owner`], checked before and carried by each transaction, see
//! the global committer's "Fencing older starts"), commits without
//! delta-rs' post-commit hooks, the log's own maintenance (a log checkpoint
//! every [`LOG_CHECKPOINT_INTERVAL`] versions), and what the log says an
//! application committed. Used by the global committer, the compaction and
//! the committers.

use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::Transaction;
use deltalake_core::DeltaTable;
use sink_api::SinkError;
use tracing::warn;

use crate::app_versions::AppVersions;
use crate::errors::{delta_error, TableFenced};
use crate::location::TableLocation;

/// The `txn` application id under which each transaction of `app_id` names
/// the generation that wrote it; the newest is the table's owner.
pub(crate) fn owner_app_id(app_id: &str) -> String {
    format!("{app_id}/owner")
}

/// A start's claim on the table: the `txn` id `<app id>/owner` and the
/// start's generation, checked before and carried by every transaction the
/// start writes (data, end of input, compaction).
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    /// `<app id>/owner`.
    pub(crate) app_id: String,
    /// The start's generation.
    pub(crate) generation: i64,
    /// The job's application id, for messages.
    job_app_id: String,
}

impl Owner {
    pub(crate) fn new(job_app_id: &str, generation: i64) -> Owner {
        Owner {
            app_id: owner_app_id(job_app_id),
            generation,
            job_app_id: job_app_id.to_string(),
        }
    }

    /// A permanent error if `snapshot` names a newer owner than this start.
    /// `versions` is the cache of the table `snapshot` belongs to.
    pub(crate) async fn check(
        &self,
        snapshot: &deltalake_core::table::state::DeltaTableState,
        log_store: &dyn deltalake_core::logstore::LogStore,
        versions: &mut AppVersions,
        url: &url::Url,
    ) -> Result<(), SinkError> {
        let owner = versions
            .get(snapshot, log_store, &self.app_id)
            .await
            .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?;
        match owner.filter(|&owner| owner > self.generation) {
            Some(newer) => Err(SinkError::other(
                format!("writing to the Delta table {url}"),
                TableFenced {
                    app_id: self.job_app_id.clone(),
                    generation: self.generation,
                    newer,
                },
            )
            .permanent()),
            None => Ok(()),
        }
    }

    /// This start's `txn`, for a transaction's properties.
    pub(crate) fn transaction(&self) -> Transaction {
        Transaction::new(&self.app_id, self.generation)
    }
}

/// Commit properties without delta-rs' post-commit hooks: their failures
/// (a log checkpoint that cannot be written, an old entry that cannot be
/// deleted) would come back as the commit's although the entry landed.
/// The log is maintained by [`maintain_log`] instead.
pub(crate) fn without_hooks() -> CommitProperties {
    CommitProperties::default()
        .with_create_checkpoint(false)
        .with_cleanup_expired_logs(Some(false))
}

/// Every [`LOG_CHECKPOINT_INTERVAL`] versions, writes a Delta log
/// checkpoint (so that readers and this sink replay a bounded log), made
/// durable on local tables. A failure is logged and changes nothing: the
/// log stays readable without it. Old entries are not deleted: that is the
/// table's maintenance (`delta.logRetentionDuration`).
pub(crate) async fn maintain_log(table: &mut DeltaTable, location: &TableLocation, version: u64) {
    if version == 0 || !version.is_multiple_of(LOG_CHECKPOINT_INTERVAL) {
        return;
    }
    let written = async {
        table.update_incremental(None).await?;
        deltalake_core::checkpoints::create_checkpoint(table, None).await
    }
    .await;
    if let Err(e) = written {
        warn!(version, error = %e, "writing a Delta log checkpoint failed; the log stays readable without it");
        return;
    }
    let files = vec![
        format!("_delta_log/{version:020}.checkpoint.parquet"),
        "_delta_log/_last_checkpoint".to_string(),
    ];
    if let Err(e) = location.make_durable(files).await {
        warn!(version, error = %e, "syncing the Delta log checkpoint failed");
    }
}

/// Versions between two Delta log checkpoints (Delta's default).
const LOG_CHECKPOINT_INTERVAL: u64 = 100;

/// The newest checkpoint the application `app_id` committed to the table at
/// `location`, or `None`. Read by the committers for a missing data file.
pub(crate) async fn committed_version(
    location: &TableLocation,
    app_id: &str,
) -> Result<Option<u64>, SinkError> {
    let reading = || format!("reading the Delta table {}", location.url());
    let Some(table) = location
        .open()
        .await
        .map_err(|e| delta_error(reading(), e))?
    else {
        return Ok(None);
    };
    let version = table
        .snapshot()
        .map_err(|e| delta_error(reading(), e))?
        .transaction_version(table.log_store().as_ref(), app_id)
        .await
        .map_err(|e| delta_error(reading(), e))?;
    Ok(version.and_then(|v| u64::try_from(v).ok()))
}
