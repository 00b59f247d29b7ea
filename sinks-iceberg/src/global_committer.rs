//! The global committer: one fast append per checkpoint, holding every
//! subtask's data files of that checkpoint, recognised on replay by reading
//! the table (the `table_commit` module decides each commit).
//!
//! On a commit schedule (`IcebergSinkBuilder::commit_every`) the runtime
//! hands it several checkpoints at once: their files go in one fast
//! append, whose marks record the newest; delivered again after a restart,
//! possibly grouped otherwise, only the files of checkpoints newer than the
//! table's mark are appended.
//!
//! Each start of the job claims the table for its generation before its
//! first commit ([`IcebergGlobalCommitter::claim`]): an append with no
//! files that sets the lineage's owner mark. Every later append of that
//! start sets it again and is made only on a table whose owner mark is not
//! newer; the fast append's requirement (the `main` branch still at the
//! snapshot read) makes a claim landing in between refuse it. So once a
//! newer start's claim is in the table, no append of an older start follows
//! it, whatever the older start's checkpoint storage says.
//!
//! At end of input it records that the job's output is complete (the
//! lineage's end-of-input mark, at the last checkpoint committed), in an
//! append with no files; a checkpoint delivered after it fails the job
//! instead of appearing after the table said the output was complete
//! (Flink's FLINK-38614).

use async_trait::async_trait;
use iceberg::TableIdent;
use sink_api::{CheckpointId, CommitSchedule, GlobalCommitter, InitContext, SinkError};
use tracing::info;

use crate::catalog::Connection;
use crate::committable::IcebergDataFile;
use crate::errors::{iceberg_error, TableFenced};
use crate::table_commit::{commit, Commit, Outcome};

/// Commits each checkpoint's data files to the Iceberg table in one fast
/// append.
///
/// Made once per start of the job, with the start's context; called by the
/// runtime as [`GlobalCommitter`] describes.
pub struct IcebergGlobalCommitter {
    connection: Connection,
    ident: TableIdent,
    /// `<job>/<lineage>`: the marks this job's commits are kept under.
    app_id: String,
    /// This start's generation, the owner mark of every append it makes.
    generation: u64,
    /// The checkpoint this start restored: a table whose mark is newer is
    /// refused at the claim.
    restored: Option<u64>,
    /// Whether this start's claim is in the table.
    claimed: bool,
    /// The newest checkpoint committed (or found committed) by this start.
    last_checkpoint: Option<u64>,
    /// When the runtime hands it what completed.
    schedule: CommitSchedule,
}

impl IcebergGlobalCommitter {
    /// The global committer of the start `context` describes, committing
    /// to the table `ident` of `catalog`.
    pub(crate) fn new(
        connection: Connection,
        ident: TableIdent,
        context: &InitContext,
    ) -> IcebergGlobalCommitter {
        IcebergGlobalCommitter::for_start(
            connection,
            ident,
            format!("{}/{}", context.job_name, context.lineage),
            context.generation.0,
            context.restored_checkpoint_id.map(|id| id.0),
        )
    }

    /// The global committer of start `generation` of `app_id`
    /// (`<job>/<lineage>`), which restored checkpoint `restored`: the start
    /// hook claims the table with it.
    pub(crate) fn for_start(
        connection: Connection,
        ident: TableIdent,
        app_id: String,
        generation: u64,
        restored: Option<u64>,
    ) -> IcebergGlobalCommitter {
        IcebergGlobalCommitter {
            connection,
            ident,
            app_id,
            generation,
            restored,
            claimed: false,
            last_checkpoint: None,
            schedule: CommitSchedule::every_checkpoint(),
        }
    }

    /// The same committer, asking the runtime for `schedule`.
    pub(crate) fn on_schedule(mut self, schedule: CommitSchedule) -> IcebergGlobalCommitter {
        self.schedule = schedule;
        self
    }

    /// Claims the table for this start's generation (see the module
    /// documentation); `TableFenced` (permanent) if a newer start did, and
    /// a permanent error if the table holds a checkpoint of the lineage
    /// newer than the one this start restored. The claim and that check
    /// are one append on the table read, so no commit of another start
    /// comes between them.
    pub(crate) async fn claim(&mut self) -> Result<(), SinkError> {
        if self.claimed {
            return Ok(());
        }
        let claim = Commit {
            app_id: &self.app_id,
            generation: self.generation,
            checkpoint: None,
            restored: self.restored,
            files: &[],
            end_of_input: false,
        };
        match commit(
            self.connection.catalog().await?.as_ref(),
            &self.ident,
            &claim,
        )
        .await?
        {
            Outcome::Fenced { newer } => Err(self.fenced(newer)),
            Outcome::Committed(_) | Outcome::Replay => {
                info!(table = %self.ident, app_id = %self.app_id, generation = self.generation, "claimed the table");
                self.claimed = true;
                Ok(())
            }
        }
    }

    fn fenced(&self, newer: u64) -> SinkError {
        SinkError::other(
            format!("committing to the Iceberg table {}", self.ident),
            TableFenced {
                app_id: self.app_id.clone(),
                generation: self.generation,
                newer,
            },
        )
        .permanent()
    }
}

#[async_trait]
impl GlobalCommitter for IcebergGlobalCommitter {
    type Committable = IcebergDataFile;

    async fn commit_checkpoint(
        &mut self,
        checkpoint_id: CheckpointId,
        committables: Vec<IcebergDataFile>,
    ) -> Result<(), SinkError> {
        self.commit_checkpoints(vec![(checkpoint_id, committables)])
            .await
    }

    /// One fast append of every checkpoint's files, its marks at the
    /// newest (see the module documentation).
    async fn commit_checkpoints(
        &mut self,
        checkpoints: Vec<(CheckpointId, Vec<IcebergDataFile>)>,
    ) -> Result<(), SinkError> {
        self.claim().await?;
        let Some(newest) = checkpoints.iter().map(|(id, _)| id.0).max() else {
            return Ok(());
        };
        let files: Vec<(u64, IcebergDataFile)> = checkpoints
            .into_iter()
            .flat_map(|(id, files)| files.into_iter().map(move |file| (id.0, file)))
            .collect();
        if files.is_empty() {
            // Nothing to append: the table's metadata does not grow with
            // checkpoints that wrote nothing.
            return Ok(());
        }
        if let Some((_, other)) = files.iter().find(|(_, file)| file.app_id != self.app_id) {
            return Err(SinkError::msg(format!(
                "the data file {} was written by {}, not by {}: the checkpoint holds another \
                 job's files",
                other.path, other.app_id, self.app_id
            ))
            .permanent());
        }
        let work = Commit {
            app_id: &self.app_id,
            generation: self.generation,
            checkpoint: Some(newest),
            restored: None,
            files: &files,
            end_of_input: false,
        };
        match commit(
            self.connection.catalog().await?.as_ref(),
            &self.ident,
            &work,
        )
        .await?
        {
            Outcome::Fenced { newer } => return Err(self.fenced(newer)),
            Outcome::Replay => {
                info!(table = %self.ident, checkpoint = newest, "checkpoint already in the table: nothing appended");
            }
            Outcome::Committed(table) => {
                let snapshot = table.metadata().current_snapshot_id();
                info!(table = %self.ident, checkpoint = newest, files = files.len(), snapshot, "checkpoint appended");
            }
        }
        self.last_checkpoint = Some(newest);
        Ok(())
    }

    fn schedule(&self) -> CommitSchedule {
        self.schedule
    }

    async fn end_of_input(&mut self) -> Result<(), SinkError> {
        self.claim().await?;
        let last = match self.last_checkpoint {
            Some(last) => last,
            // Nothing committed by this start: the table's mark of the
            // lineage (an earlier start's), or 0 for a job that committed
            // nothing at all.
            None => {
                let catalog = self.connection.catalog().await?;
                let table = catalog.load_table(&self.ident).await.map_err(|e| {
                    iceberg_error(format!("reading the Iceberg table {}", self.ident), e)
                })?;
                crate::marks::Marks::read(table.metadata().properties(), &self.app_id)?
                    .checkpoint
                    .unwrap_or(0)
            }
        };
        let end = Commit {
            app_id: &self.app_id,
            generation: self.generation,
            checkpoint: Some(last),
            restored: None,
            files: &[],
            end_of_input: true,
        };
        match commit(self.connection.catalog().await?.as_ref(), &self.ident, &end).await? {
            Outcome::Fenced { newer } => Err(self.fenced(newer)),
            Outcome::Committed(_) | Outcome::Replay => {
                info!(table = %self.ident, checkpoint = last, "end of input recorded");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use sink_api::{Generation, Lineage};

    use super::*;
    use crate::test_table::{file, fixture, Fixture};

    /// The global committer of start `generation`, which restored
    /// checkpoint `restored`.
    fn committer(fx: &Fixture, generation: u64, restored: Option<u64>) -> IcebergGlobalCommitter {
        let context =
            InitContext::new("job", Lineage::new("lineage"), Generation(generation), 0, 1)
                .restored_from(restored.map(CheckpointId));
        IcebergGlobalCommitter::new(
            Connection::of(fx.catalog.clone()),
            fx.ident.clone(),
            &context,
        )
    }

    async fn carried(fx: &Fixture, name: &str) -> IcebergDataFile {
        file(&fx.table().await, name)
    }

    #[tokio::test]
    async fn a_checkpoint_delivered_again_is_appended_once_and_nothing_follows_the_end_of_input() {
        let fx = fixture().await;
        let mut first = committer(&fx, 1, None);
        let files = vec![carried(&fx, "a").await, carried(&fx, "b").await];
        first
            .commit_checkpoint(CheckpointId(1), files.clone())
            .await
            .unwrap();
        // The next start, restored from checkpoint 1, delivers it again:
        // the replay is recognised.
        let mut again = committer(&fx, 2, Some(1));
        again
            .commit_checkpoint(CheckpointId(1), files)
            .await
            .unwrap();
        assert_eq!(fx.files().await.len(), 2);
        again.end_of_input().await.unwrap();
        let late = again
            .commit_checkpoint(CheckpointId(2), vec![carried(&fx, "c").await])
            .await
            .unwrap_err();
        assert!(late.is_permanent(), "{late}");
        assert_eq!(fx.files().await.len(), 2);
    }

    #[tokio::test]
    async fn a_newer_start_fences_the_older_one_at_its_next_checkpoint() {
        let fx = fixture().await;
        let mut older = committer(&fx, 1, None);
        older
            .commit_checkpoint(CheckpointId(1), vec![carried(&fx, "a").await])
            .await
            .unwrap();
        let mut newer = committer(&fx, 2, Some(1));
        newer.claim().await.unwrap();
        let fenced = older
            .commit_checkpoint(CheckpointId(2), vec![carried(&fx, "b").await])
            .await
            .unwrap_err();
        assert!(fenced.is_permanent());
        assert!(fenced.to_string().contains("generation 2"), "{fenced}");
        // The older start cannot claim the table back either.
        let mut oldest = committer(&fx, 1, Some(1));
        assert!(oldest.claim().await.is_err());
        newer
            .commit_checkpoint(CheckpointId(2), vec![carried(&fx, "b").await])
            .await
            .unwrap();
        assert_eq!(fx.files().await.len(), 2);
    }

    /// A start whose checkpoint storage is older than the table would take
    /// its next checkpoints for replays (the table has their numbers, with
    /// other records) and lose their records: its claim is refused.
    #[tokio::test]
    async fn a_start_restored_from_a_checkpoint_older_than_the_table_is_refused() {
        let fx = fixture().await;
        let mut first = committer(&fx, 1, None);
        for checkpoint in 1..=3 {
            let name = format!("f{checkpoint}");
            first
                .commit_checkpoint(CheckpointId(checkpoint), vec![carried(&fx, &name).await])
                .await
                .unwrap();
        }
        let mut behind = committer(&fx, 2, Some(2));
        let error = behind.claim().await.unwrap_err();
        assert!(error.is_permanent());
        assert!(error.to_string().contains("checkpoint 3"), "{error}");
        let mut current = committer(&fx, 2, Some(3));
        current.claim().await.unwrap();
    }

    /// On a commit schedule: several checkpoints' files in one snapshot,
    /// marked at the newest; delivered again after a restart grouped
    /// otherwise, the files of checkpoints the mark covers are left out and
    /// the others appended, once.
    #[tokio::test]
    async fn checkpoints_committed_together_are_recognised_when_replayed_grouped_otherwise() {
        let fx = fixture().await;
        let (a, b, c) = (
            carried(&fx, "a").await,
            carried(&fx, "b").await,
            carried(&fx, "c").await,
        );
        let mut first = committer(&fx, 1, None);
        first
            .commit_checkpoints(vec![
                (CheckpointId(1), vec![a.clone()]),
                (CheckpointId(2), vec![b.clone()]),
            ])
            .await
            .unwrap();
        assert_eq!(fx.snapshots().await, 2, "the claim and one append");
        assert_eq!(fx.files().await.len(), 2);
        let mut again = committer(&fx, 2, Some(3));
        again
            .commit_checkpoints(vec![(CheckpointId(2), vec![b]), (CheckpointId(3), vec![c])])
            .await
            .unwrap();
        assert_eq!(fx.files().await.len(), 3, "b once, c added");
        let table = fx.table().await;
        let marks =
            crate::marks::Marks::read(table.metadata().properties(), "job/lineage").unwrap();
        assert_eq!(marks.checkpoint, Some(3));
        again
            .commit_checkpoints(vec![(CheckpointId(1), vec![a])])
            .await
            .unwrap();
        assert_eq!(fx.files().await.len(), 3, "a replay of 1 adds nothing");
    }

    /// The end of input recorded at a checkpoint older than the table's
    /// mark does not lower the mark.
    #[tokio::test]
    async fn the_checkpoint_mark_never_goes_down() {
        let fx = fixture().await;
        let mut first = committer(&fx, 1, None);
        first
            .commit_checkpoint(CheckpointId(5), vec![carried(&fx, "a").await])
            .await
            .unwrap();
        let mut later = committer(&fx, 2, Some(5));
        later
            .commit_checkpoint(CheckpointId(4), vec![carried(&fx, "b").await])
            .await
            .unwrap();
        later.end_of_input().await.unwrap();
        let table = fx.table().await;
        let marks =
            crate::marks::Marks::read(table.metadata().properties(), "job/lineage").unwrap();
        assert_eq!((marks.checkpoint, marks.end_of_input), (Some(5), Some(5)));
        assert_eq!(
            fx.files().await.len(),
            1,
            "checkpoint 4 was taken for a replay"
        );
    }

    /// The table dropped while the job runs: the next commit fails the job
    /// (permanent), naming the table; the checkpoint keeps its files for a
    /// run once the table is back.
    #[tokio::test]
    async fn a_table_dropped_while_the_job_runs_fails_the_commit_naming_it() {
        let fx = fixture().await;
        let mut running = committer(&fx, 1, None);
        running
            .commit_checkpoint(CheckpointId(1), vec![carried(&fx, "a").await])
            .await
            .unwrap();
        let late = carried(&fx, "b").await;
        fx.catalog.drop_table(&fx.ident).await.unwrap();
        let error = running
            .commit_checkpoint(CheckpointId(2), vec![late])
            .await
            .unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(error.to_string().contains("db.events"), "{error}");
    }

    /// A column added by another writer while the job runs: the files the
    /// job wrote with the schema before are still appended (Iceberg reads
    /// them by field id), and a replay is still recognised.
    #[tokio::test]
    async fn a_column_added_while_the_job_runs_keeps_its_files_appendable() {
        use iceberg::spec::{PrimitiveType, Type};
        use iceberg::transaction::{AddColumn, ApplyTransactionAction as _, Transaction};

        let fx = fixture().await;
        let mut running = committer(&fx, 1, None);
        let (a, b) = (carried(&fx, "a").await, carried(&fx, "b").await);
        running
            .commit_checkpoint(CheckpointId(1), vec![a.clone()])
            .await
            .unwrap();
        let table = fx.table().await;
        let transaction = Transaction::new(&table);
        let transaction = transaction
            .update_schema()
            .add_column(AddColumn::optional(
                "extra",
                Type::Primitive(PrimitiveType::Int),
            ))
            .apply(transaction)
            .unwrap();
        transaction.commit(fx.catalog.as_ref()).await.unwrap();
        running
            .commit_checkpoint(CheckpointId(2), vec![b])
            .await
            .unwrap();
        running
            .commit_checkpoint(CheckpointId(1), vec![a])
            .await
            .unwrap();
        assert_eq!(fx.files().await.len(), 2);
    }
}
