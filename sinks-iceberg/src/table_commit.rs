//! One checkpoint's commit to the table: read the table, decide from its
//! properties, append once, read the table again.
//!
//! ```text
//! commit(n, files) by generation g of <job>/<lineage>
//!   loop (at most COMMIT_ATTEMPTS decisions):
//!     read the table (catalog's current metadata)
//!       ├─ owner > g                 ─▶ Fenced (a newer start claimed the table: it commits nothing more)
//!       ├─ checkpoint >= n           ─▶ Replay (in the table already: nothing written)
//!       ├─ end-of-input, n past it   ─▶ refused (the table said the output is complete)
//!       └─ one fast append on exactly that table (the `one_attempt` module):
//!            files (those of an older partition spec rewritten: the `rewrite` module)
//!            + properties { checkpoint = n, owner = g [, end-of-input = n] } + summary
//!     read the table again: checkpoint >= n ─▶ Committed; otherwise the next decision
//!     (a commit race refused by the catalog's compare-and-swap, or an answer lost)
//! ```
//!
//! The outcome is taken from the table read after the attempt, never from
//! the attempt's answer: a lost answer, a refused race and an untrue
//! success (iceberg-catalog-sql ignores a failed database `COMMIT`) all end
//! in the same read.

use std::collections::HashMap;

use std::time::Duration;

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, ErrorKind, TableIdent};
use sink_api::SinkError;
use tracing::{debug, warn};

use crate::committable::IcebergDataFile;
use crate::errors::iceberg_error;
use crate::marks::{self, Marks};
use crate::one_attempt::OneAttempt;

/// Decisions (read, append, read) for one commit before the job is failed
/// (and restarted, when its strategy allows: a replay is recognised then).
const COMMIT_ATTEMPTS: u32 = 12;

/// The pause after the `n`th attempt is about `n` times this, drawn
/// between a half and one and a half of it: two writers that overtook
/// each other do not come back in step (a CI run saw one job lose five
/// rounds in a row to another with the same fixed pauses).
const BACKOFF: Duration = Duration::from_millis(50);

/// What one commit did.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// It is in the table now, in the metadata read after it.
    Committed(Table),
    /// The table held it already (checkpoint `n` or a later one).
    Replay,
    /// A newer start of the job owns the table.
    Fenced {
        /// The owning generation.
        newer: u64,
    },
}

/// One commit: `files` (none for a claim or a marker) under `app_id`'s
/// checkpoint `checkpoint` by `generation`, recording the end of input
/// when `end_of_input`.
#[derive(Debug, Clone)]
pub(crate) struct Commit<'a> {
    pub app_id: &'a str,
    pub generation: u64,
    /// The checkpoint; `None` for a claim of the table, which moves only
    /// the owner.
    pub checkpoint: Option<u64>,
    /// For a claim: the checkpoint the start restored. A table whose
    /// checkpoint mark is newer is refused: the checkpoint storage is older
    /// than the table, and the start would take newer checkpoints for
    /// replays.
    pub restored: Option<u64>,
    /// The data files, each with the checkpoint that wrote it (several
    /// checkpoints' files in one commit on a commit schedule; `checkpoint`
    /// is then the newest), decoded against the table each append is built
    /// on, and only those of checkpoints the table's mark does not cover
    /// (a replay regrouped after a restart); none with `end_of_input`.
    pub files: &'a [(u64, IcebergDataFile)],
    /// Whether to record the end of input at `checkpoint` (a commit with
    /// no files, after the last checkpoint's).
    pub end_of_input: bool,
}

impl Commit<'_> {
    /// What the table's marks say of this commit, if they decide it
    /// without an append.
    ///
    /// What is in the table decides before who owns it: a commit whose
    /// checkpoint is there (ours, or the same checkpoint of another start
    /// of the lineage, with the same files) is done even if a newer start
    /// claimed the table since.
    fn decided(&self, found: &Marks) -> Result<Option<Decided>, SinkError> {
        let fenced = found.owner.filter(|owner| *owner > self.generation);
        let Some(checkpoint) = self.checkpoint else {
            // A claim: done once the owner is ours.
            if let Some(newer) = fenced {
                return Ok(Some(Decided::Fenced(newer)));
            }
            if let Some(done) = found.checkpoint.filter(|done| Some(*done) > self.restored) {
                let restored = self
                    .restored
                    .map_or("none".to_string(), |restored| restored.to_string());
                return Err(SinkError::msg(format!(
                    "the table holds checkpoint {done} of {}, newer than the checkpoint this \
                     start restored ({restored}): the checkpoint storage is older than the \
                     table, so newer checkpoints would be taken for replays and their records \
                     lost; give the job its newest checkpoint storage, or start it on fresh \
                     storage (a new lineage)",
                    self.app_id
                ))
                .permanent());
            }
            return Ok((found.owner == Some(self.generation)).then_some(Decided::InTable));
        };
        if found.checkpoint.is_some_and(|done| done >= checkpoint)
            && (!self.end_of_input || found.end_of_input.is_some())
        {
            return Ok(Some(Decided::InTable));
        }
        if let Some(newer) = fenced {
            return Ok(Some(Decided::Fenced(newer)));
        }
        if let Some(end) = found.end_of_input {
            return Err(SinkError::msg(format!(
                "checkpoint {checkpoint} of {} reached the table after its end of input was \
                 recorded (at checkpoint {end}): the table said the output was complete, so \
                 these files are refused",
                self.app_id
            ))
            .permanent());
        }
        Ok(None)
    }

    /// The properties the append sets on a table whose marks are
    /// `found`; the checkpoint mark never goes down.
    fn properties(&self, found: &Marks) -> HashMap<String, String> {
        let mut set = HashMap::from([(marks::owner_key(self.app_id), self.generation.to_string())]);
        if let Some(checkpoint) = self.checkpoint {
            let mark = found
                .checkpoint
                .map_or(checkpoint, |done| done.max(checkpoint));
            set.insert(marks::checkpoint_key(self.app_id), mark.to_string());
            if self.end_of_input {
                set.insert(marks::end_of_input_key(self.app_id), mark.to_string());
            }
        }
        set
    }

    /// The snapshot summary's own entries.
    fn summary(&self) -> HashMap<String, String> {
        let mut summary =
            HashMap::from([(marks::SUMMARY_LINEAGE.to_string(), self.app_id.to_string())]);
        if let Some(checkpoint) = self.checkpoint {
            summary.insert(
                marks::SUMMARY_CHECKPOINT.to_string(),
                checkpoint.to_string(),
            );
        }
        summary
    }
}

/// How the marks decided a commit.
enum Decided {
    InTable,
    Fenced(u64),
}

/// Runs `commit` against the table `ident` of `catalog`; see the module
/// documentation.
pub(crate) async fn commit(
    catalog: &dyn Catalog,
    ident: &TableIdent,
    commit: &Commit<'_>,
) -> Result<Outcome, SinkError> {
    if commit.end_of_input && !commit.files.is_empty() {
        // A replay of it would add the files again once the checkpoint's
        // mark is there: the end of input is a commit of its own.
        return Err(SinkError::msg(format!(
            "the end of input of {} was to be recorded with files; it is recorded on its own, \
             after the last checkpoint's files",
            commit.app_id
        ))
        .permanent());
    }
    let mut last_error = None;
    for attempt in 1..=COMMIT_ATTEMPTS {
        let table = load(catalog, ident).await?;
        let found = Marks::read(table.metadata().properties(), commit.app_id)?;
        match commit.decided(&found)? {
            Some(Decided::Fenced(newer)) => return Ok(Outcome::Fenced { newer }),
            Some(Decided::InTable) if attempt == 1 => return Ok(Outcome::Replay),
            Some(Decided::InTable) => return Ok(Outcome::Committed(table)),
            None => {}
        }
        // Files of a spec that is no longer the default (it changed while
        // the job ran) are written again under the current one: the fast
        // append takes the default spec's files only.
        let mut files = Vec::with_capacity(commit.files.len());
        let not_in_table = |(checkpoint, _): &&(u64, IcebergDataFile)| {
            found.checkpoint.is_none_or(|done| *checkpoint > done)
        };
        for (_, file) in commit.files.iter().filter(not_in_table) {
            if file.partition_spec_id == table.metadata().default_partition_spec_id() {
                files.push(file.data_file(&table)?);
            } else {
                files.extend(crate::rewrite::under_default_spec(&table, file).await?);
            }
        }
        let transaction = Transaction::new(&table);
        let append = transaction
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(commit.summary())
            // The marks say what is in the table; reading every manifest
            // of the table at each commit to look for the same paths
            // again would cost what the table holds.
            .with_check_duplicate(false);
        let properties = commit
            .properties(&found)
            .into_iter()
            .fold(transaction.update_table_properties(), |action, (k, v)| {
                action.set(k, v)
            });
        let transaction = append
            .apply(transaction)
            .and_then(|transaction| properties.apply(transaction))
            .map_err(|e| iceberg_error(format!("preparing the commit to {ident}"), e))?;
        let answer = transaction.commit(&OneAttempt::new(catalog, &table)).await;
        match answer {
            Ok(_) => debug!(table = %ident, attempt, "commit answered"),
            Err(error) if error.kind() == ErrorKind::CatalogCommitConflicts => {
                debug!(table = %ident, attempt, %error, "another commit came first: reading the table again");
            }
            Err(error) => {
                warn!(table = %ident, attempt, %error, "the commit failed or its answer was lost: reading the table again");
                let error = iceberg_error(format!("committing to {ident}"), error);
                let permanent = error.is_permanent();
                last_error = Some(error);
                if permanent {
                    // No attempt can succeed: the table read below says
                    // whether this one landed anyway.
                    break;
                }
            }
        }
        // The outcome comes from the table, whatever the answer said (the
        // next round reads it: InTable after the first attempt is ours).
        let jitter = 0.5 + fastrand::f64();
        tokio::time::sleep((BACKOFF * attempt).mul_f64(jitter)).await;
    }
    let table = load(catalog, ident).await?;
    let found = Marks::read(table.metadata().properties(), commit.app_id)?;
    match commit.decided(&found)? {
        Some(Decided::Fenced(newer)) => Ok(Outcome::Fenced { newer }),
        Some(Decided::InTable) => Ok(Outcome::Committed(table)),
        None => Err(last_error.unwrap_or_else(|| {
            SinkError::msg(format!(
                "{COMMIT_ATTEMPTS} commits to {ident} were each overtaken by another \
                 writer's: the job fails, and a restart (by its restart strategy, or run again) \
                 commits what is left, recognising what was committed"
            ))
        })),
    }
}

/// The table as the catalog has it now.
async fn load(catalog: &dyn Catalog, ident: &TableIdent) -> Result<Table, SinkError> {
    catalog
        .load_table(ident)
        .await
        .map_err(|e| iceberg_error(format!("reading the Iceberg table {ident}"), e))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;
    use iceberg::{Namespace, NamespaceIdent, TableCommit, TableCreation};

    use super::*;
    use crate::test_table::{data_file, file, fixture};

    #[tokio::test]
    async fn a_replayed_checkpoint_is_recognised_from_the_table_and_appends_nothing() {
        let fx = fixture().await;
        let table = fx.table().await;
        let a = file(&table, "a");
        assert!(matches!(
            fx.commit(1, 1, std::slice::from_ref(&a)).await.unwrap(),
            Outcome::Committed(_)
        ));
        assert!(matches!(
            fx.commit(1, 1, std::slice::from_ref(&a)).await.unwrap(),
            Outcome::Replay
        ));
        assert_eq!(fx.snapshots().await, 1);
        assert_eq!(fx.files().await.len(), 1);
        let summary = &fx
            .table()
            .await
            .metadata()
            .current_snapshot()
            .unwrap()
            .summary()
            .clone();
        assert_eq!(
            summary.additional_properties.get(marks::SUMMARY_CHECKPOINT),
            Some(&"1".to_string())
        );
    }

    /// The hazard `one_attempt` exists for: iceberg-rust's commit applies a
    /// transaction built on a table that moved to the newer table. Through
    /// the plain catalog the stale append lands (the test would catch a
    /// sink using it); through `OneAttempt` it is refused.
    #[tokio::test]
    async fn an_append_built_on_a_table_that_moved_is_refused_not_rebuilt() {
        for one_attempt in [false, true] {
            let fx = fixture().await;
            let stale = fx.table().await;
            let other = data_file(&stale, "other");
            let moved = Transaction::new(&stale)
                .fast_append()
                .add_data_files([other])
                .apply(Transaction::new(&stale))
                .unwrap();
            moved.commit(fx.catalog.as_ref()).await.unwrap();
            let ours = Transaction::new(&stale)
                .fast_append()
                .add_data_files([data_file(&stale, "ours")])
                .apply(Transaction::new(&stale))
                .unwrap();
            let answer = match one_attempt {
                true => {
                    ours.commit(&OneAttempt::new(fx.catalog.as_ref(), &stale))
                        .await
                }
                false => ours.commit(fx.catalog.as_ref()).await,
            };
            if one_attempt {
                let error = answer.expect_err("refused");
                assert_eq!(error.kind(), ErrorKind::CatalogCommitConflicts, "{error}");
                assert_eq!(fx.snapshots().await, 1);
            } else {
                answer.expect("iceberg-rust rebuilds the append on the newer table");
                assert_eq!(fx.snapshots().await, 2);
            }
        }
    }

    /// The REST catalog checks the fast append's requirement (the `main`
    /// branch still at the snapshot read) against the table it holds: an
    /// append built on a table that moved is refused, as the SQL catalog
    /// refuses it above, and a commit of the sink then decides anew.
    #[cfg(feature = "rest")]
    #[tokio::test]
    async fn on_a_rest_catalog_an_append_built_on_a_table_that_moved_is_refused() {
        let Some(fx) = crate::test_table::rest_fixture().await else {
            return;
        };
        let stale = fx.table().await;
        let moved = Transaction::new(&stale)
            .fast_append()
            .add_data_files([data_file(&stale, "other")])
            .apply(Transaction::new(&stale))
            .unwrap();
        moved.commit(fx.catalog.as_ref()).await.unwrap();
        let ours = Transaction::new(&stale)
            .fast_append()
            .add_data_files([data_file(&stale, "ours")])
            .apply(Transaction::new(&stale))
            .unwrap();
        let error = ours
            .commit(&OneAttempt::new(fx.catalog.as_ref(), &stale))
            .await
            .expect_err("refused by the catalog");
        assert_eq!(error.kind(), ErrorKind::CatalogCommitConflicts, "{error}");
        assert_eq!(fx.snapshots().await, 1);
        // The sink's commit of a checkpoint on that table: once.
        let table = fx.table().await;
        let files = [file(&table, "a")];
        assert!(matches!(
            fx.commit(1, 1, &files).await.unwrap(),
            Outcome::Committed(_)
        ));
        assert!(matches!(
            fx.commit(1, 1, &files).await.unwrap(),
            Outcome::Replay
        ));
        assert_eq!(fx.snapshots().await, 2);
    }

    #[tokio::test]
    async fn a_newer_start_fences_an_older_one_which_commits_nothing_more() {
        let fx = fixture().await;
        let table = fx.table().await;
        fx.commit(1, 1, &[file(&table, "a")]).await.unwrap();
        let claim = Commit {
            app_id: "job/lineage",
            generation: 2,
            checkpoint: None,
            restored: Some(1),
            files: &[],
            end_of_input: false,
        };
        let claimed = commit(fx.catalog.as_ref(), &fx.ident, &claim)
            .await
            .unwrap();
        assert!(matches!(claimed, Outcome::Committed(_)), "{claimed:?}");
        let older = fx.commit(1, 2, &[file(&table, "b")]).await.unwrap();
        assert!(matches!(older, Outcome::Fenced { newer: 2 }), "{older:?}");
        // Its checkpoint 1, in the table already, is still a replay.
        let replay = fx.commit(1, 1, &[file(&table, "a")]).await.unwrap();
        assert!(matches!(replay, Outcome::Replay), "{replay:?}");
        let newer = fx.commit(2, 2, &[file(&table, "b")]).await.unwrap();
        assert!(matches!(newer, Outcome::Committed(_)), "{newer:?}");
        assert_eq!(fx.files().await.len(), 2);
    }

    #[tokio::test]
    async fn files_after_the_end_of_input_are_refused() {
        let fx = fixture().await;
        let table = fx.table().await;
        fx.commit(1, 1, &[file(&table, "a")]).await.unwrap();
        let end = Commit {
            app_id: "job/lineage",
            generation: 1,
            checkpoint: Some(1),
            restored: None,
            files: &[],
            end_of_input: true,
        };
        let ended = commit(fx.catalog.as_ref(), &fx.ident, &end).await.unwrap();
        assert!(matches!(ended, Outcome::Committed(_)), "{ended:?}");
        let again = commit(fx.catalog.as_ref(), &fx.ident, &end).await.unwrap();
        assert!(matches!(again, Outcome::Replay), "{again:?}");
        let late = fx.commit(1, 2, &[file(&table, "b")]).await.unwrap_err();
        assert!(late.is_permanent());
        assert!(
            late.to_string().contains("after its end of input"),
            "{late}"
        );
        assert_eq!(fx.files().await.len(), 1);
    }

    /// Snapshot expiry drops summaries; the marks are properties, so a
    /// replay of a checkpoint whose snapshot expired is still recognised.
    #[tokio::test]
    async fn a_replay_is_recognised_after_its_snapshot_expired() {
        let fx = fixture().await;
        let table = fx.table().await;
        fx.commit(1, 1, &[file(&table, "a")]).await.unwrap();
        fx.commit(1, 2, &[file(&table, "b")]).await.unwrap();
        let table = fx.table().await;
        let first = table
            .metadata()
            .snapshots()
            .find(|s| s.parent_snapshot_id().is_none())
            .unwrap()
            .snapshot_id();
        let expire = Transaction::new(&table);
        let expire = expire
            .expire_snapshots()
            .expire_snapshot_ids([first])
            .apply(expire)
            .unwrap();
        expire.commit(fx.catalog.as_ref()).await.unwrap();
        assert_eq!(fx.snapshots().await, 1);
        let replay = fx.commit(1, 1, &[file(&table, "a")]).await.unwrap();
        assert!(matches!(replay, Outcome::Replay), "{replay:?}");
        assert_eq!(fx.files().await.len(), 2);
    }

    /// A catalog that applies the next commit and loses its answer.
    #[derive(Debug)]
    struct LosesAnswer {
        inner: Arc<dyn Catalog>,
        lose: AtomicBool,
    }

    #[async_trait]
    impl Catalog for LosesAnswer {
        async fn list_namespaces(
            &self,
            parent: Option<&NamespaceIdent>,
        ) -> iceberg::Result<Vec<NamespaceIdent>> {
            self.inner.list_namespaces(parent).await
        }
        async fn create_namespace(
            &self,
            namespace: &NamespaceIdent,
            properties: HashMap<String, String>,
        ) -> iceberg::Result<Namespace> {
            self.inner.create_namespace(namespace, properties).await
        }
        async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
            self.inner.get_namespace(namespace).await
        }
        async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
            self.inner.namespace_exists(namespace).await
        }
        async fn update_namespace(
            &self,
            namespace: &NamespaceIdent,
            properties: HashMap<String, String>,
        ) -> iceberg::Result<()> {
            self.inner.update_namespace(namespace, properties).await
        }
        async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
            self.inner.drop_namespace(namespace).await
        }
        async fn list_tables(
            &self,
            namespace: &NamespaceIdent,
        ) -> iceberg::Result<Vec<TableIdent>> {
            self.inner.list_tables(namespace).await
        }
        async fn create_table(
            &self,
            namespace: &NamespaceIdent,
            creation: TableCreation,
        ) -> iceberg::Result<Table> {
            self.inner.create_table(namespace, creation).await
        }
        async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
            self.inner.load_table(table).await
        }
        async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
            self.inner.drop_table(table).await
        }
        async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
            self.inner.purge_table(table).await
        }
        async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
            self.inner.table_exists(table).await
        }
        async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
            self.inner.rename_table(src, dest).await
        }
        async fn register_table(
            &self,
            table: &TableIdent,
            metadata_location: String,
        ) -> iceberg::Result<Table> {
            self.inner.register_table(table, metadata_location).await
        }
        async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
            let table = self.inner.update_table(commit).await?;
            if self.lose.swap(false, Ordering::SeqCst) {
                return Err(iceberg::Error::new(
                    ErrorKind::Unexpected,
                    "the connection was reset before the answer",
                )
                .with_retryable(true));
            }
            Ok(table)
        }
    }

    #[tokio::test]
    async fn a_commit_whose_answer_is_lost_is_not_applied_twice() {
        let fx = fixture().await;
        let table = fx.table().await;
        let losing = LosesAnswer {
            inner: fx.catalog.clone(),
            lose: AtomicBool::new(true),
        };
        let files = [(1, file(&table, "a"))];
        let work = Commit {
            app_id: "job/lineage",
            generation: 1,
            checkpoint: Some(1),
            restored: None,
            files: &files,
            end_of_input: false,
        };
        let outcome = commit(&losing, &fx.ident, &work).await.unwrap();
        assert!(matches!(outcome, Outcome::Committed(_)), "{outcome:?}");
        assert!(!losing.lose.load(Ordering::SeqCst), "the answer was lost");
        assert_eq!(fx.snapshots().await, 1);
        assert_eq!(fx.files().await.len(), 1);
    }
}
