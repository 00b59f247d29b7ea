//! The global committer: one Delta transaction per checkpoint, holding
//! every subtask's data files of that checkpoint, recognised on replay by
//! reading the table.
//!
//! ```text
//! commit_checkpoint(n, files)
//!   ├─ read the log: txn(app id) >= n ─▶ already in the table: nothing written (a replay)
//!   └─ commit { add(file)…, txn(app id, version n) }   (conditional create of the next log entry)
//!        ├─ done ─▶ log entry made durable (local tables) ─▶ compaction, if asked for
//!        ├─ another writer took the version ─▶ delta-rs rebases and retries (blind appends do not conflict)
//!        └─ failed or unknown outcome ─▶ read the log again: the txn decides whether it landed
//! ```
//!
//! With a source whose positions are kept in the table, a checkpoint's
//! transaction also moves each split the subtasks read (a `txn` per split,
//! the `positions` module): a subtask's files go in only if every split it
//! read is still where its advance starts; otherwise they are dropped with
//! its advances, and the commit ends superseded once the rest is in the
//! table (`SinkError::superseded`: the runtime restarts the job, or goes on
//! when the checkpoint is the restored one or older, since the subtasks
//! read from the table's positions next).
//!
//! At end of input it records that the job's output is complete: a
//! transaction with no files and the `txn` `<app id>/end-of-input`, whose
//! version is the last checkpoint committed. Nothing may come after it: a
//! checkpoint delivered later (the end of stream overtaking the final
//! committables, Flink's FLINK-38614) fails the job instead of appearing
//! after the table said the output was complete.
//!
//! The application id is the job's name and lineage: a job's checkpoint
//! ids only grow in its lineage, and a run on fresh checkpoint storage gets
//! a new lineage, so `txn` versions are never compared across runs.
//!
//! # Fencing older starts
//!
//! Every start of the job claims the table for its generation before it
//! commits anything ([`DeltaGlobalCommitter::claim`], from the sink's
//! `on_start`): a transaction with no files and the `txn`
//! `<app id>/owner` at the start's generation. Every later transaction of
//! that start carries the same `txn` again, and is written only if the log
//! names no newer owner:
//!
//! ```text
//!  read the log ── txn(<app id>/owner) > our generation ─▶ Fenced (permanent: a newer start owns the table)
//!  commit { …, txn(<app id>/owner, our generation) }
//!        └ a transaction that landed since we read names the same owner id ─▶ delta-rs refuses ours
//!          (a concurrent transaction), and the next attempt reads the log again
//! ```
//!
//! So once a newer start's claim is in the log, no transaction of an older
//! start can follow it: an older start that read the log before the claim
//! conflicts with it (delta-rs' check that no transaction seen by the
//! committer was updated meanwhile), one that read it after finds the newer
//! owner. This holds whatever the older start's checkpoint storage says,
//! for an instance cut off from it (a zombie) as for one started twice.
//! Delta keeps each application's newest `txn` in its log checkpoints, so
//! the mark survives log clean-up (unless the table sets
//! `delta.setTransactionRetentionDuration` shorter than the longest outage).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake_core::kernel::{Action, Transaction};
use deltalake_core::protocol::{DeltaOperation, OutputMode};
use deltalake_core::DeltaTable;
use sink_api::{CheckpointId, Generation, GlobalCommitter, SinkError, SplitKey};
use tracing::{info, warn};

use crate::app_versions::AppVersions;
use crate::committable::{CarriedPositions, DataFile, DeltaCommittable};
use crate::compaction::Compaction;
use crate::errors::delta_error;
use crate::location::TableLocation;
use crate::positions::{self, Sorted};
use crate::table_log::{maintain_log, owner_app_id, without_hooks, Owner};

/// Attempts at one checkpoint's transaction before the job is failed (and
/// restarted, when its strategy allows: the replay is then recognised).
const COMMIT_ATTEMPTS: u32 = 3;

/// Commits each checkpoint's data files to the Delta table in one
/// transaction.
///
/// Brought by [`DeltaSink`](crate::DeltaSink) through
/// `Sink::global_committer`; made once per start of the job and called by
/// the runtime as [`GlobalCommitter`] describes.
pub struct DeltaGlobalCommitter {
    location: TableLocation,
    table: Option<DeltaTable>,
    /// What `table`'s log says each application committed.
    versions: AppVersions,
    compaction: Option<Compaction>,
    /// `<job>/<lineage>`: the Delta application id of this job's commits.
    app_id: String,
    /// This start's generation, carried by every transaction under
    /// `<app id>/owner`.
    generation: Generation,
    /// The newest checkpoint committed (or found committed) by this start.
    last_checkpoint: Option<i64>,
    /// Whether the end of input was recorded.
    ended: bool,
    /// Splits known to be in the table's split registry.
    registered: HashSet<SplitKey>,
    /// Why the latest attempt of the current commit that went to delta-rs
    /// dropped committables, if it did.
    dropped: Vec<String>,
}

/// What one checkpoint's transaction is made of.
#[derive(Clone, Copy)]
struct Work<'a> {
    files: &'a [DataFile],
    groups: &'a [CarriedPositions],
}

impl Work<'_> {
    /// No files and no positions: a marker transaction.
    const NONE: Work<'static> = Work {
        files: &[],
        groups: &[],
    };
}

/// What an attempt at a transaction did.
#[derive(Debug)]
enum Outcome {
    /// The log held it already (a replay): nothing written.
    Replay,
    /// Written, or nothing to write once every moved split's group was
    /// dropped; with why each dropped group was dropped.
    Done { wrote: bool, conflicts: Vec<String> },
}

impl Outcome {
    /// Whether this attempt wrote a transaction.
    fn wrote(&self) -> bool {
        matches!(self, Outcome::Done { wrote: true, .. })
    }
}

impl DeltaGlobalCommitter {
    /// A committer for the table at `location`; `table` is the table as
    /// this start read it, if it did (brought up to date before use).
    pub(crate) fn new(
        location: TableLocation,
        table: Option<DeltaTable>,
        compaction: Option<Compaction>,
        app_id: String,
        generation: Generation,
    ) -> Self {
        DeltaGlobalCommitter {
            location,
            table,
            versions: AppVersions::default(),
            compaction,
            app_id,
            generation,
            last_checkpoint: None,
            ended: false,
            registered: HashSet::new(),
            dropped: Vec::new(),
        }
    }

    /// The `txn` application id that marks the end of input of `app_id`.
    pub fn end_of_input_app_id(app_id: &str) -> String {
        format!("{app_id}/end-of-input")
    }

    /// The `txn` application id under which each transaction of `app_id`
    /// names the generation that wrote it; the newest is the table's owner.
    pub fn owner_app_id(app_id: &str) -> String {
        owner_app_id(app_id)
    }

    /// Claims the table for this start's generation: a transaction with no
    /// files and `txn(<app id>/owner, generation)`, unless the log holds it
    /// already. Called by the sink's `on_start`, before anything of this
    /// start is committed. Fails with a permanent error when a newer
    /// generation owns the table.
    pub(crate) async fn claim(&mut self) -> Result<(), SinkError> {
        let owner = Self::owner_app_id(&self.app_id);
        let generation = i64::try_from(self.generation.0).map_err(|_| {
            SinkError::msg(format!(
                "generation {} exceeds Delta's versions",
                self.generation
            ))
            .permanent()
        })?;
        if self
            .commit_once(&owner, generation, Work::NONE)
            .await?
            .wrote()
        {
            info!(generation, app_id = %self.app_id, "claimed the Delta table for this start");
        }
        Ok(())
    }

    /// The table as this committer last read it.
    pub(crate) fn into_table(self) -> Option<DeltaTable> {
        self.table
    }

    /// The table at its newest version, with what its log says each
    /// application committed.
    async fn newest(&mut self) -> Result<(&mut DeltaTable, &mut AppVersions), SinkError> {
        let url = self.location.url().clone();
        let reading = || format!("reading the Delta table {url}");
        match &mut self.table {
            Some(table) => table
                .update_incremental(None)
                .await
                .map_err(|e| delta_error(reading(), e))?,
            None => {
                let table = self
                    .location
                    .open()
                    .await
                    .map_err(|e| delta_error(reading(), e))?;
                self.table = Some(table.ok_or_else(|| {
                    SinkError::msg(format!(
                        "there is no Delta table at {url}: it was deleted while the job ran"
                    ))
                    .permanent()
                })?);
            }
        }
        let table = self.table.as_mut().expect("set above");
        Ok((table, &mut self.versions))
    }

    /// One attempt at the transaction of `app_id` at `version`.
    async fn try_commit(
        &mut self,
        app_id: &str,
        version: i64,
        work: Work<'_>,
    ) -> Result<Outcome, SinkError> {
        let query_id = app_id.to_string();
        let job_app_id = self.app_id.clone();
        let owner_app_id = Self::owner_app_id(&job_app_id);
        let generation = i64::try_from(self.generation.0).unwrap_or(i64::MAX);
        let location = self.location.clone();
        let url = location.url().clone();
        let (table, versions) = self.newest().await?;
        let snapshot = table
            .snapshot()
            .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?;
        let log_store = table.log_store();
        Owner::new(&job_app_id, generation)
            .check(snapshot, log_store.as_ref(), versions, &url)
            .await?;
        let done = versions
            .get(snapshot, log_store.as_ref(), app_id)
            .await
            .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?;
        if done.is_some_and(|done| done >= version) {
            // An earlier attempt (perhaps of a process that then crashed)
            // wrote it: make sure it is on disk before a checkpoint says so.
            let newest = snapshot.version();
            location
                .sync_log_entry_holding(app_id, version, newest)
                .await
                .map_err(|e| SinkError::io("making the Delta log entry durable", e))?;
            return Ok(Outcome::Replay);
        }
        let mut found = HashMap::new();
        for key in positions::keys(work.groups) {
            let version = versions
                .get(snapshot, log_store.as_ref(), &positions::split_app_id(&key))
                .await
                .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?;
            let position = version
                .map(|v| positions::from_version(&key, v))
                .transpose()?;
            found.insert(key, position);
        }
        let Sorted {
            moved,
            dropped_files,
            conflicts,
        } = positions::sort_groups(
            work.groups,
            &found,
            &work.files.iter().map(|f| f.path.as_str()).collect(),
        );
        let files: Vec<&DataFile> = work
            .files
            .iter()
            .filter(|f| !dropped_files.contains(&f.path))
            .collect();
        if files.is_empty() && moved.is_empty() && !work.groups.is_empty() {
            // Every group was dropped: nothing of this checkpoint remains.
            return Ok(Outcome::Done {
                wrote: false,
                conflicts,
            });
        }
        positions::register(&location, &mut self.registered, moved.keys()).await?;
        // An attempt whose transaction lands but answers an error is found
        // a replay by the next: what it dropped must still be reported.
        self.dropped.clone_from(&conflicts);
        let table = self.newest_cached()?;
        let mut properties = owned_properties(app_id, version, &owner_app_id, generation);
        for (key, to) in &moved {
            properties = properties.with_application_transaction(Transaction::new(
                positions::split_app_id(key),
                positions::to_version(key, *to)?,
            ));
        }
        let snapshot = table
            .snapshot()
            .map_err(|e| delta_error(format!("reading the Delta table {url}"), e))?;
        let actions = files.iter().map(|f| Action::Add(f.to_add())).collect();
        let committed = CommitBuilder::from(properties)
            .with_actions(actions)
            .build(
                Some(snapshot),
                table.log_store(),
                DeltaOperation::StreamingUpdate {
                    output_mode: OutputMode::Append,
                    query_id,
                    epoch_id: version,
                },
            )
            .await
            .map_err(|e| delta_error(format!("committing checkpoint {version} to {url}"), e))?;
        let log_entry = format!("_delta_log/{:020}.json", committed.version());
        location
            .make_durable(vec![log_entry])
            .await
            .map_err(|e| SinkError::io("making the Delta log entry durable", e))?;
        info!(
            checkpoint = version,
            table_version = committed.version(),
            files = files.len(),
            splits = moved.len(),
            "committed to the Delta table"
        );
        // The table as the commit left it, instead of reading the entry again.
        table.state = Some(committed.snapshot());
        maintain_log(table, &location, committed.version()).await;
        Ok(Outcome::Done {
            wrote: true,
            conflicts,
        })
    }

    /// The table as last read, without reading it again.
    fn newest_cached(&mut self) -> Result<&mut DeltaTable, SinkError> {
        self.table
            .as_mut()
            .ok_or_else(|| SinkError::msg("the Delta table was not read before a commit"))
    }

    /// Commits `work` under the application `app_id` at `version`, unless
    /// the log holds it: a few attempts, each reading the log first, since
    /// a failed attempt may have landed (and positions may have moved).
    async fn commit_once(
        &mut self,
        app_id: &str,
        version: i64,
        work: Work<'_>,
    ) -> Result<Outcome, SinkError> {
        let mut attempt = 1;
        self.dropped.clear();
        loop {
            match self.try_commit(app_id, version, work).await {
                // An earlier attempt landed, having dropped committables.
                Ok(Outcome::Replay) if !self.dropped.is_empty() => {
                    return Ok(Outcome::Done {
                        wrote: true,
                        conflicts: std::mem::take(&mut self.dropped),
                    })
                }
                Ok(outcome) => return Ok(outcome),
                Err(e) if e.is_permanent() || attempt >= COMMIT_ATTEMPTS => return Err(e),
                Err(e) => {
                    warn!(version, attempt, error = %e, "commit to the Delta table failed; reading the table again");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    attempt += 1;
                }
            }
        }
    }
}

impl DeltaGlobalCommitter {
    /// Runs compaction, if asked for, over the partitions of checkpoint
    /// `version`'s `files`.
    async fn compact(&mut self, files: &[DataFile], version: i64) -> Result<(), SinkError> {
        let Some(compaction) = self.compaction.clone() else {
            return Ok(());
        };
        let partitions: BTreeSet<_> = files.iter().map(|f| f.partition_values.clone()).collect();
        let location = self.location.clone();
        let owner = Owner::new(
            &self.app_id,
            i64::try_from(self.generation.0).unwrap_or(i64::MAX),
        );
        let (table, versions) = self.newest().await?;
        // Compaction is an optimisation: the data is committed whatever
        // becomes of it.
        if let Err(e) = compaction
            .run(table, versions, &location, &owner, partitions)
            .await
        {
            warn!(error = %e, "compaction after checkpoint {version} failed; the files stay as they are");
        }
        Ok(())
    }
}

/// The properties of a transaction of `app_id` at `version` by the start
/// `generation`: `txn(app_id, version)`, and `txn(owner_app_id,
/// generation)` so that delta-rs refuses it if a transaction naming the
/// same owner id landed since the committer read the log.
fn owned_properties(
    app_id: &str,
    version: i64,
    owner_app_id: &str,
    generation: i64,
) -> CommitProperties {
    let properties =
        without_hooks().with_application_transaction(Transaction::new(app_id, version));
    if app_id == owner_app_id {
        properties
    } else {
        properties.with_application_transaction(Transaction::new(owner_app_id, generation))
    }
}

#[async_trait]
impl GlobalCommitter for DeltaGlobalCommitter {
    type Committable = DeltaCommittable;

    /// Adds every file of checkpoint `checkpoint_id` to the table in one
    /// transaction, with the positions the files' records advance, unless
    /// the table's log already holds it. A subtask whose positions moved
    /// meanwhile has its files dropped: once the rest is in the table, a
    /// superseded error says so (the runtime restarts the job, or goes on
    /// when the checkpoint is a restored one).
    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<DeltaCommittable>,
    ) -> Result<(), SinkError> {
        if self.ended {
            return Err(SinkError::msg(format!(
                "checkpoint {checkpoint_id} reached the Delta global committer after the end of \
                 input was recorded in the table: the runtime did not hold the end of stream back \
                 until the final commit"
            ))
            .permanent());
        }
        if let Some(other) = committables.iter().find(|c| c.app_id() != self.app_id) {
            return Err(SinkError::msg(format!(
                "checkpoint {checkpoint_id} holds a committable of the job {}, this job is {}: \
                 committables were mixed up ({other:?})",
                other.app_id(),
                self.app_id
            ))
            .permanent());
        }
        let (mut files, mut groups) = (Vec::new(), Vec::new());
        for committable in committables {
            match committable {
                DeltaCommittable::File(file) => files.push(file),
                DeltaCommittable::Positions(positions) => groups.push(positions),
            }
        }
        if files.is_empty() && groups.is_empty() {
            return Ok(());
        }
        let version = i64::try_from(checkpoint_id.0).map_err(|_| {
            SinkError::msg(format!(
                "checkpoint id {checkpoint_id} exceeds Delta's versions"
            ))
            .permanent()
        })?;
        let app_id = self.app_id.clone();
        let work = Work {
            files: &files,
            groups: &groups,
        };
        let outcome = self.commit_once(&app_id, version, work).await?;
        let conflicts = match outcome {
            Outcome::Replay => {
                self.last_checkpoint = Some(version);
                info!(
                    checkpoint = version,
                    app_id, "checkpoint already in the Delta table (a replay)"
                );
                return Ok(());
            }
            Outcome::Done { wrote, conflicts } => {
                if wrote {
                    self.last_checkpoint = Some(version);
                    self.compact(&files, version).await?;
                }
                conflicts
            }
        };
        let Some(first) = conflicts.first() else {
            return Ok(());
        };
        Err(SinkError::msg(format!(
            "checkpoint {checkpoint_id}: the files of {} subtask(s) were dropped with their \
             source positions ({first}); the job reads again from the table's positions",
            conflicts.len()
        ))
        .superseded())
    }

    /// Records in the table that this job's output is complete: a
    /// transaction with no files and the `txn` `<app id>/end-of-input` at the
    /// last committed checkpoint (0 if none). Idempotent.
    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        let marker = Self::end_of_input_app_id(&self.app_id);
        let last = self.last_checkpoint.unwrap_or(0);
        self.commit_once(&marker, last, Work::NONE).await?;
        self.ended = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use deltalake_core::kernel::transaction::TransactionError;
    use deltalake_core::DeltaTableError;

    use super::*;

    fn schema() -> arrow_schema::Schema {
        arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "id",
            arrow_schema::DataType::Int64,
            false,
        )])
    }

    /// The fencing rests on delta-rs' conflict check: a transaction built
    /// on a log read before a newer start's claim, and carrying the owner
    /// `txn` as every transaction of this committer does, is refused; the
    /// same transaction without it would land after the claim.
    #[tokio::test]
    async fn a_transaction_read_before_a_newer_claim_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let location = TableLocation::local(dir.path().join("table")).unwrap();
        location.open_or_create(&schema(), &[]).await.unwrap();
        let app_id = "job/lineage";
        let owner = DeltaGlobalCommitter::owner_app_id(app_id);
        let committer = |generation| {
            DeltaGlobalCommitter::new(
                location.clone(),
                None,
                None,
                app_id.into(),
                Generation(generation),
            )
        };
        committer(1).claim().await.unwrap();
        let read_by_the_old_start = location.open().await.unwrap().unwrap();
        committer(2).claim().await.unwrap();

        let commit = |properties: CommitProperties| {
            let table = &read_by_the_old_start;
            async move {
                CommitBuilder::from(properties)
                    .with_actions(Vec::new())
                    .build(
                        Some(table.snapshot().unwrap()),
                        table.log_store(),
                        DeltaOperation::StreamingUpdate {
                            output_mode: OutputMode::Append,
                            query_id: app_id.into(),
                            epoch_id: 7,
                        },
                    )
                    .await
            }
        };
        let refused = commit(owned_properties(app_id, 7, &owner, 1)).await;
        assert!(
            matches!(
                refused,
                Err(DeltaTableError::Transaction {
                    source: TransactionError::CommitConflict(_)
                })
            ),
            "{:?}",
            refused.map(|c| c.version())
        );
        let unfenced = without_hooks().with_application_transaction(Transaction::new(app_id, 7));
        assert!(
            commit(unfenced).await.is_ok(),
            "without the owner txn it lands"
        );
    }

    /// An older start that reads the log after a newer start's claim finds
    /// the newer owner and commits nothing, with a permanent error.
    #[tokio::test]
    async fn an_older_start_commits_nothing_after_a_newer_claim() {
        let dir = tempfile::tempdir().unwrap();
        let location = TableLocation::local(dir.path().join("table")).unwrap();
        location.open_or_create(&schema(), &[]).await.unwrap();
        let committer = |generation| {
            DeltaGlobalCommitter::new(
                location.clone(),
                None,
                None,
                "job/l".into(),
                Generation(generation),
            )
        };
        let mut old = committer(3);
        old.claim().await.unwrap();
        committer(4).claim().await.unwrap();
        let before = location.open().await.unwrap().unwrap().version();
        let error = old
            .commit_once("job/l", 1, Work::NONE)
            .await
            .expect_err("fenced");
        assert!(error.is_permanent(), "{error}");
        assert!(error.to_string().contains("fenced off"), "{error}");
        let error = old
            .claim()
            .await
            .expect_err("an older claim is refused too");
        assert!(error.is_permanent(), "{error}");
        assert_eq!(location.open().await.unwrap().unwrap().version(), before);
        committer(4)
            .claim()
            .await
            .expect("a claim repeated by its own start is a no-op");
        assert_eq!(location.open().await.unwrap().unwrap().version(), before);
    }
}
