//! What the table's log says each application (a `txn` app id) last
//! committed, kept up to date one log entry at a time.
//!
//! delta-rs answers `transaction_version` with a replay of the log since its
//! last checkpoint, and its reader fetches every entry of that stretch ahead
//! of need: on object storage, up to a hundred GETs for one answer. The
//! global committer asks before every transaction (the owner's claim, the
//! checkpoint's replay), and compaction asks again, so the replays were
//! most of the sink's requests. [`AppVersions`] asks delta-rs once per
//! application id and start, then reads only the entries added since:
//!
//! ```text
//! get(table at version v, id)
//!   ├─ cache at v' < v ─▶ read entries v'+1 ..= v once, newest txn of each known id wins
//!   │     └─ an entry missing, or a txn with lastUpdated (it may expire) ─▶ forget everything
//!   ├─ cache at v, id known ─▶ the answer
//!   └─ id unknown ─▶ delta-rs' replay at v, remembered
//! ```
//!
//! Answers equal delta-rs' for the same snapshot: an entry's `txn` actions
//! are the newest for their ids as the log goes forward, and a `txn` that
//! `delta.setTransactionRetentionDuration` could expire (one carrying
//! `lastUpdated`; this sink writes none) sends the question back to
//! delta-rs. A snapshot older than the cache (another table's) starts it
//! over.

use std::collections::HashMap;

use deltalake_core::kernel::Action;
use deltalake_core::logstore::{get_actions, LogStore};
use deltalake_core::table::state::DeltaTableState;
use deltalake_core::DeltaResult;

/// The newest `txn` version of each application id asked about, true at one
/// table version.
///
/// Held by the global committer beside its table (one per start), and lent
/// to compaction and to the owner's check (`table_log.rs`).
#[derive(Debug, Default)]
pub(crate) struct AppVersions {
    /// The table version `versions` is true at.
    as_of: Option<u64>,
    /// Each id asked about: its newest `txn` version, `None` if it has none.
    versions: HashMap<String, Option<i64>>,
}

impl AppVersions {
    /// The newest version `app_id` committed in `snapshot`, as
    /// `DeltaTableState::transaction_version` would answer; reads only the
    /// log entries added since the previous call.
    pub(crate) async fn get(
        &mut self,
        snapshot: &DeltaTableState,
        log_store: &dyn LogStore,
        app_id: &str,
    ) -> DeltaResult<Option<i64>> {
        self.catch_up(log_store, snapshot.version()).await?;
        if let Some(&known) = self.versions.get(app_id) {
            return Ok(known);
        }
        let version = snapshot.transaction_version(log_store, app_id).await?;
        self.versions.insert(app_id.to_string(), version);
        Ok(version)
    }

    /// Brings every known id to table version `to`, or forgets them all.
    async fn catch_up(&mut self, log_store: &dyn LogStore, to: u64) -> DeltaResult<()> {
        let from = match self.as_of {
            Some(as_of) if as_of <= to && !self.versions.is_empty() => as_of,
            _ => {
                self.start_over(to);
                return Ok(());
            }
        };
        for version in from + 1..=to {
            let Some(entry) = log_store.read_commit_entry(version).await? else {
                // Cleaned up meanwhile: delta-rs reads the log checkpoint.
                self.start_over(to);
                return Ok(());
            };
            for action in get_actions(version, &entry)? {
                let Action::Txn(txn) = action else { continue };
                let Some(known) = self.versions.get_mut(&txn.app_id) else {
                    continue;
                };
                if txn.last_updated.is_some() {
                    self.start_over(to);
                    return Ok(());
                }
                *known = Some(txn.version);
            }
        }
        self.as_of = Some(to);
        Ok(())
    }

    fn start_over(&mut self, at: u64) {
        self.versions.clear();
        self.as_of = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use deltalake_core::kernel::transaction::CommitBuilder;
    use deltalake_core::kernel::{StructField, Transaction};
    use deltalake_core::operations::create::CreateBuilder;
    use deltalake_core::protocol::{DeltaOperation, OutputMode};
    use deltalake_core::DeltaTable;

    use super::*;
    use crate::location::TableLocation;

    /// A new local table with one column and the given properties.
    async fn table(dir: &std::path::Path, properties: &[(&str, &str)]) -> DeltaTable {
        let location = TableLocation::local(dir.join("table")).unwrap();
        CreateBuilder::new()
            .with_log_store(location.log_store())
            .with_columns([StructField::not_null(
                "id",
                deltalake_core::kernel::DataType::LONG,
            )])
            .with_configuration(properties.iter().map(|&(k, v)| (k, Some(v))))
            .await
            .unwrap()
    }

    /// Commits a transaction with no files and `txns`, and reads the table
    /// again.
    async fn commit(table: &mut DeltaTable, txns: &[Transaction]) {
        let mut properties = deltalake_core::kernel::transaction::CommitProperties::default()
            .with_create_checkpoint(false);
        for txn in txns {
            properties = properties.with_application_transaction(txn.clone());
        }
        CommitBuilder::from(properties)
            .build(
                Some(table.snapshot().unwrap()),
                table.log_store(),
                DeltaOperation::StreamingUpdate {
                    output_mode: OutputMode::Append,
                    query_id: "test".into(),
                    epoch_id: 0,
                },
            )
            .await
            .unwrap();
        table.update_incremental(None).await.unwrap();
    }

    async fn both(
        versions: &mut AppVersions,
        table: &DeltaTable,
        id: &str,
    ) -> (Option<i64>, Option<i64>) {
        let snapshot = table.snapshot().unwrap();
        let log_store = table.log_store();
        let cached = versions
            .get(snapshot, log_store.as_ref(), id)
            .await
            .unwrap();
        let replayed = snapshot
            .transaction_version(log_store.as_ref(), id)
            .await
            .unwrap();
        (cached, replayed)
    }

    /// While the table grows (ids committed in turns, one asked about
    /// first halfway, one never committed), and for an older snapshot
    /// afterwards, every answer is delta-rs' own.
    #[tokio::test]
    async fn every_answer_is_delta_rs_answer_while_the_table_grows() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = table(dir.path(), &[]).await;
        let mut versions = AppVersions::default();
        let ids = ["job/a", "job/a/owner", "job/b", "never"];
        for round in 0..12i64 {
            let txns: Vec<_> = ids[..3]
                .iter()
                .enumerate()
                .filter(|(i, _)| (round + *i as i64) % 3 != 0)
                .map(|(i, id)| Transaction::new(*id, round * 10 + i as i64))
                .collect();
            commit(&mut table, &txns).await;
            for id in ids {
                if id == "job/b" && round < 6 {
                    continue;
                }
                let (cached, replayed) = both(&mut versions, &table, id).await;
                assert_eq!(cached, replayed, "{id} after round {round}");
            }
        }
        assert!(versions.versions.len() == 4 && versions.as_of == Some(table.version().unwrap()));

        let mut older = table.clone();
        older.load_version(4).await.unwrap();
        for id in ids {
            let (cached, replayed) = both(&mut versions, &older, id).await;
            assert_eq!(cached, replayed, "{id} at version 4");
        }
        assert_eq!(
            versions.as_of,
            Some(4),
            "started over at the older snapshot"
        );
    }

    /// An entry the cache would read next was cleaned up (after a log
    /// checkpoint): the cache starts over from delta-rs' answer instead of
    /// skipping the entry and its `txn`.
    #[tokio::test]
    async fn a_cleaned_up_entry_sends_the_question_back_to_delta_rs() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = table(dir.path(), &[]).await;
        let mut versions = AppVersions::default();
        for version in 1..=3 {
            commit(&mut table, &[Transaction::new("job/a", version)]).await;
        }
        assert_eq!(
            both(&mut versions, &table, "job/a").await,
            (Some(3), Some(3))
        );
        commit(&mut table, &[Transaction::new("job/a", 4)]).await;
        commit(&mut table, &[Transaction::new("job/b", 1)]).await;
        deltalake_core::checkpoints::create_checkpoint(&table, None)
            .await
            .unwrap();
        let log = dir.path().join("table/_delta_log");
        for version in 0..table.version().unwrap() {
            std::fs::remove_file(log.join(format!("{version:020}.json"))).unwrap();
        }
        let reopened = TableLocation::local(dir.path().join("table"))
            .unwrap()
            .open()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            both(&mut versions, &reopened, "job/a").await,
            (Some(4), Some(4))
        );
    }

    /// A `txn` with `lastUpdated` may be expired by the table's
    /// `delta.setTransactionRetentionDuration`: the cache does not answer
    /// for it, delta-rs does (here: expired, so the older `txn` counts).
    #[tokio::test]
    async fn a_txn_that_may_expire_is_answered_by_delta_rs() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = table(
            dir.path(),
            &[("delta.setTransactionRetentionDuration", "interval 1 second")],
        )
        .await;
        let mut versions = AppVersions::default();
        commit(&mut table, &[Transaction::new("job/a", 1)]).await;
        assert_eq!(
            both(&mut versions, &table, "job/a").await,
            (Some(1), Some(1))
        );
        // Updated 1 ms after the epoch: long expired.
        commit(
            &mut table,
            &[Transaction::new_with_last_update("job/a", 2, Some(1))],
        )
        .await;
        assert_eq!(
            both(&mut versions, &table, "job/a").await,
            (Some(1), Some(1))
        );
    }
}
