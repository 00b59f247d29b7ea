//! The file committer: makes a pending part visible by an atomic rename,
//! after checking that the part is the one its committable describes.
//!
//! A committable names its files relative to the sink's base directory; the
//! committer resolves them against its own base directory, whose identity
//! marker must be the committable's (see the `identity` module): otherwise the
//! commit fails (the job stops) with an error naming both directories.
//!
//! | pending file | target | outcome |
//! |---|---|---|
//! | present, of the recorded size | absent | renamed; the directories are synced: committed |
//! | present, of another size (truncated, appended to) | absent | not renamed: failed, known reason, its records lost (counted) |
//! | absent | present, of the recorded size | already committed (a replay after recovery) |
//! | absent | present, of another size | failed, known reason, its records lost (counted) |
//! | absent | absent | failed, known reason: the data is lost, its records counted (never a silent success) |
//! | present | present | failed, unknown reason: the job stops rather than overwrite a file |
//!
//! With compaction on (the `compaction` module), the target is the file's
//! name in the current epoch's segment of its bucket, and a replay whose
//! pending file is gone finds its target in the bucket, in any segment of
//! it, or in a merged segment's manifest (the `segments` module). The
//! directories a batch touched are synced once, at its end, before any
//! outcome is reported.
//!
//! On an object store output the commit completes the part's multipart
//! upload instead, with the outcomes of the `upload_commit` module.
//!
//! Committables of a position group (with a source whose positions are
//! committed with the data: `FileCommittable::positions`) are committed a
//! group at a time, with the positions, through the output's position log:
//! the `position_commit` module has their outcomes. A group found committed
//! before is a replay: each of its members is then looked for as above
//! (already committed, or lost if its file is gone).
//!
//! "Records lost" is `CommitRequest::signal_records_lost`: the runtime
//! counts them in the job's lost records. Only sizes are compared, from the
//! files' metadata: nothing is read again at commit time, so a change that
//! keeps a file's size is not detected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sink_api::{CommitRequest, Committer, Lineage, SinkError};

use crate::blocking::{assert_blocking, blocking};
use crate::compaction;
use crate::config::Output;
use crate::hidden_name::lineage_of;
use crate::identity::{self, OutputIdentity};
#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;
use crate::outcome::Outcome;
use crate::placement::{Placed, Placement, Touched};
use crate::position_commit::{
    all_decided, sort_out, GroupOutcome, GroupToCommit, LogTurn, LogWork, SortedOut,
};
use crate::segments::{self, size_of, Found};
use crate::state::FileCommittable;
use crate::stats::FileSinkStats;
#[cfg(feature = "object-store")]
use crate::upload_commit::commit_upload;
#[cfg(feature = "object-store")]
use crate::upload_positions::UploadLog;

/// Commits the file sink's committables. Made by
/// [`FileSink`](crate::FileSink) for the runtime, once per subtask and start.
pub struct FileCommitter {
    pub(crate) stats: Arc<FileSinkStats>,
    /// Where committed files go (with compaction: the segments of this
    /// start's current epoch).
    pub(crate) placement: Placement,
    /// The sink's output: committables are resolved against it.
    pub(crate) output_location: Output,
    /// The base directory's identity, read at the first commit.
    pub(crate) output: Option<OutputIdentity>,
    /// The sink's turn at the position log.
    pub(crate) turn: Arc<LogTurn>,
    /// The job's lineage: names this committer's temporary files.
    pub(crate) lineage: Lineage,
}

/// What one commit call works with on a blocking thread: everything it
/// needs, owned.
struct Work {
    base_path: PathBuf,
    output: Option<OutputIdentity>,
    placement: Placement,
    stats: Arc<FileSinkStats>,
    turn: Arc<LogTurn>,
    lineage: Lineage,
}

impl Work {
    /// Checks that `c` belongs to the base directory; returns its pending
    /// file and target there.
    fn locate(&mut self, c: &FileCommittable) -> Result<(PathBuf, PathBuf), SinkError> {
        self.locate_identity(c)?;
        Ok((
            identity::resolve(&self.base_path, &c.pending)?,
            identity::resolve(&self.base_path, &c.target)?,
        ))
    }

    /// Commits every committable (see the module's table), on a blocking
    /// thread: those of no position group in order, then each group
    /// through the position log. Makes the renames durable before it
    /// returns: each directory touched synced once, the directories that
    /// received files before those that lost their pending names.
    fn commit_all(&mut self, committables: &[FileCommittable]) -> Result<Vec<Outcome>, SinkError> {
        let SortedOut { plain, groups } = sort_out(committables)?;
        let mut outcomes: Vec<Option<Outcome>> = committables.iter().map(|_| None).collect();
        let last = plain.len().saturating_sub(1);
        let mut touched = Touched::default();
        for (position, &index) in plain.iter().enumerate() {
            outcomes[index] = Some(self.commit_one(&committables[index], &mut touched)?);
            if position < last {
                // A crash with part of the batch committed (crash tests only).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("file-commit-mid-batch", |_| Err(SinkError::msg(
                    "simulated crash at failpoint file-commit-mid-batch"
                )));
            }
        }
        for (group, members) in &groups {
            let decided = self.commit_group(committables, group, members, &mut touched)?;
            for (index, outcome) in members.iter().zip(decided) {
                outcomes[*index] = Some(outcome);
            }
        }
        touched.sync(&self.placement.syncs)?;
        all_decided(outcomes)
    }

    /// Commits the position group `group`, whose members are
    /// `committables[members]`, through the position log; the outcome of
    /// each member, in order.
    fn commit_group(
        &mut self,
        committables: &[FileCommittable],
        group: &GroupToCommit,
        members: &[usize],
        touched: &mut Touched,
    ) -> Result<Vec<Outcome>, SinkError> {
        for &index in members {
            let c = &committables[index];
            match c.pending.as_os_str().is_empty() {
                // Only positions: the identity is checked all the same.
                true => {
                    self.locate_identity(c)?;
                }
                false => {
                    self.locate(c)?;
                }
            }
        }
        let work = LogWork {
            base: &self.base_path,
            placement: &self.placement,
            turn: &self.turn,
            tag: self.lineage.as_str(),
            stats: &self.stats,
        };
        let every = |outcome: Outcome| members.iter().map(|_| outcome.clone()).collect();
        Ok(match work.commit(group)? {
            GroupOutcome::Committed => every(Outcome::Committed),
            GroupOutcome::Superseded(reason) => every(Outcome::Superseded(reason)),
            GroupOutcome::Refused(reason) => every(Outcome::Unknown(reason)),
            GroupOutcome::AlreadyCommitted => {
                let mut outcomes = Vec::with_capacity(members.len());
                for &index in members {
                    let c = &committables[index];
                    if c.pending.as_os_str().is_empty() {
                        outcomes.push(Outcome::AlreadyCommitted);
                        continue;
                    }
                    let (pending, target) = self.locate(c)?;
                    let outcome = match (target.parent(), target.file_name()) {
                        (Some(bucket), Some(name)) => {
                            let name = name.to_string_lossy().into_owned();
                            self.find_committed(c, &pending, bucket, &name, touched)?
                        }
                        _ => Outcome::Unknown(format!(
                            "the committable's target {} names no file in a directory",
                            target.display()
                        )),
                    };
                    outcomes.push(outcome);
                }
                outcomes
            }
        })
    }

    /// Checks that `c` belongs to the base directory.
    fn locate_identity(&mut self, c: &FileCommittable) -> Result<(), SinkError> {
        if self.output.is_none() {
            self.output = identity::read(&self.base_path)?;
        }
        identity::check(
            &self.base_path,
            self.output.as_ref(),
            "a committable",
            &c.output_id,
            &c.output_dir,
        )
    }

    /// Commits `c`: renames its pending file to its target (with compaction,
    /// into the current epoch's segment of the target's bucket, under the
    /// epoch's read lock, so that no seal comes between), noting in
    /// `touched` the directories whose entries changed.
    fn commit_one(
        &mut self,
        c: &FileCommittable,
        touched: &mut Touched,
    ) -> Result<Outcome, SinkError> {
        assert_blocking("a commit's rename");
        let (pending, target) = self.locate(c)?;
        let (Some(bucket), Some(name)) = (target.parent(), target.file_name()) else {
            return Ok(Outcome::Unknown(format!(
                "the committable's target {} names no file in a directory",
                target.display()
            )));
        };
        let name = name.to_string_lossy().into_owned();
        let looked = |path: &Path| {
            size_of(path).map_err(|error| {
                format!(
                    "cannot look at {} or {}: {error}",
                    pending.display(),
                    path.display()
                )
            })
        };
        let pending_size = match looked(&pending) {
            Ok(size) => size,
            Err(reason) => return Ok(Outcome::Unknown(reason)),
        };
        let Some(pending_size) = pending_size else {
            return self.find_committed(c, &pending, bucket, &name, touched);
        };
        if pending_size != c.size_bytes {
            // Truncated (a torn last record) or appended to (a
            // duplicate): committing it would publish a broken file.
            self.stats.failed();
            return Ok(Outcome::RecordsLost(
                c.records,
                format!(
                    "the pending file {} holds {pending_size} bytes instead of the {} bytes recorded in the \
                     checkpoint: it was {} by something else than this sink, so it is not committed \
                     (left hidden where it is) and its {} records are lost",
                    pending.display(),
                    c.size_bytes,
                    if pending_size < c.size_bytes { "truncated" } else { "appended to" },
                    c.records
                ),
            ));
        }
        match self
            .placement
            .place(&pending, &target, c.size_bytes, touched)?
        {
            Placed::Moved => {}
            Placed::Refused(reason) => return Ok(Outcome::Unknown(reason)),
            Placed::Gone => {
                return Ok(Outcome::Unknown(format!(
                    "the pending file {} vanished while it was renamed to {}",
                    pending.display(),
                    target.display()
                )))
            }
        }
        self.stats.committed(c);
        Ok(Outcome::Committed)
    }

    /// The outcome of `c` whose pending file is gone: committed before (a
    /// replay after recovery) if its file is in the bucket or one of its
    /// segments at the recorded size, else lost. Before it says lost, with
    /// compaction on, it looks again under the compaction lock, once no
    /// merge is under way.
    fn find_committed(
        &self,
        c: &FileCommittable,
        pending: &Path,
        bucket: &Path,
        name: &str,
        touched: &mut Touched,
    ) -> Result<Outcome, SinkError> {
        let lineage = lineage_of(pending);
        let look = || segments::find_committed(bucket, name, lineage.as_deref());
        let mut found = look();
        if matches!(found, Ok(Found::Nowhere)) && self.placement.compaction.is_some() {
            let _lock = compaction::lock(&self.base_path)?;
            found = look();
        }
        let found = match found {
            Ok(found) => found,
            Err(error) => {
                return Ok(Outcome::Unknown(format!(
                    "cannot look for {name} in {}: {error}",
                    bucket.display()
                )))
            }
        };
        let (place, size) = match found {
            Found::File(path, size) => (path, size),
            Found::Merged(segment, size) => (segment, size),
            Found::Nowhere => {
                self.stats.failed();
                return Ok(Outcome::RecordsLost(
                    c.records,
                    format!(
                        "neither the pending file {} nor its target {name} exists in {} (or in a segment \
                         of it): its {} records are lost (was the output directory changed by hand?)",
                        pending.display(),
                        bucket.display(),
                        c.records
                    ),
                ));
            }
        };
        if size != c.size_bytes {
            self.stats.failed();
            return Ok(Outcome::RecordsLost(
                c.records,
                format!(
                    "{name} in {} holds {size} bytes instead of the {} bytes committed; it was changed \
                     after its commit, and its {} records are lost",
                    place.display(),
                    c.size_bytes,
                    c.records
                ),
            ));
        }
        // The crash may have come between the rename and the directory
        // sync: make the rename durable now.
        touched.buckets.insert(bucket.to_path_buf());
        if let Some(dir) = place.parent().filter(|dir| *dir != bucket) {
            touched.segments.insert(dir.to_path_buf());
        }
        self.stats.replayed();
        Ok(Outcome::AlreadyCommitted)
    }
}

#[cfg(feature = "object-store")]
impl FileCommitter {
    /// Completes the uploads of `committables`, in order, on the object
    /// store output `object`, after checking they belong to it.
    async fn commit_uploads(
        &mut self,
        object: &ObjectOutput,
        committables: &[FileCommittable],
        retries: &[u32],
    ) -> Result<Vec<Outcome>, SinkError> {
        if self.output.is_none() {
            self.output = identity::read_object(object).await?;
        }
        let location = Path::new(&object.location);
        for c in committables {
            identity::check(
                location,
                self.output.as_ref(),
                "a committable",
                &c.output_id,
                &c.output_dir,
            )?;
        }
        let SortedOut { plain, groups } = sort_out(committables)?;
        let mut outcomes: Vec<Option<Outcome>> = committables.iter().map(|_| None).collect();
        let last = plain.len().saturating_sub(1);
        for (position, &index) in plain.iter().enumerate() {
            let c = &committables[index];
            let Some(upload) = &c.upload else {
                return Err(SinkError::msg(format!(
                    "the committable of {} names a local file, not an upload, for the object store \
                     output {}: the stored state is corrupt",
                    c.target.display(),
                    object.location
                ))
                .permanent());
            };
            let retry = retries.get(index).copied().unwrap_or(0);
            outcomes[index] = Some(commit_upload(object, &self.stats, c, upload, retry).await?);
            if position < last {
                // A crash with part of the batch committed (crash tests only).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("file-commit-mid-batch", |_| Err(SinkError::msg(
                    "simulated crash at failpoint file-commit-mid-batch"
                )));
            }
        }
        let log = UploadLog {
            output: object,
            stats: &self.stats,
        };
        for (group, members) in &groups {
            let every = |outcome: Outcome| members.iter().map(|_| outcome.clone()).collect();
            let decided: Vec<Outcome> = match log.commit(group).await? {
                GroupOutcome::Committed => every(Outcome::Committed),
                GroupOutcome::AlreadyCommitted => {
                    let held: Vec<&FileCommittable> =
                        members.iter().map(|&i| &committables[i]).collect();
                    let tries: Vec<u32> = (members.iter())
                        .map(|&i| retries.get(i).copied().unwrap_or(0))
                        .collect();
                    log.replayed(&held, &tries).await?
                }
                GroupOutcome::Superseded(reason) => every(Outcome::Superseded(reason)),
                GroupOutcome::Refused(reason) => every(Outcome::Unknown(reason)),
            };
            for (&index, outcome) in members.iter().zip(decided) {
                outcomes[index] = Some(outcome);
            }
        }
        all_decided(outcomes)
    }
}

#[async_trait]
impl Committer for FileCommitter {
    type Committable = FileCommittable;

    /// Checks and renames the batch's files in order on a blocking thread
    /// (on an object store: completes their uploads in order), then signals
    /// each request.
    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<FileCommittable>],
    ) -> Result<(), SinkError> {
        let committables: Vec<FileCommittable> =
            requests.iter().map(|r| r.committable().clone()).collect();
        let outcomes = match &self.output_location {
            Output::Local(base_path) => {
                let mut work = Work {
                    base_path: base_path.clone(),
                    output: self.output.clone(),
                    placement: self.placement.clone(),
                    stats: self.stats.clone(),
                    turn: self.turn.clone(),
                    lineage: self.lineage.clone(),
                };
                let (outcomes, output) = blocking(move || {
                    let outcomes = work.commit_all(&committables)?;
                    Ok((outcomes, work.output))
                })
                .await?;
                self.output = output;
                outcomes
            }
            #[cfg(feature = "object-store")]
            Output::Object(object) => {
                let object = object.clone();
                let retries: Vec<u32> = requests.iter().map(|r| r.retry_count()).collect();
                self.commit_uploads(&object, &committables, &retries)
                    .await?
            }
        };
        for (request, outcome) in requests.iter_mut().zip(outcomes) {
            match outcome {
                Outcome::Committed => request.signal_committed(),
                #[cfg(feature = "object-store")]
                Outcome::RetryLater => request.retry_later(),
                Outcome::AlreadyCommitted => request.signal_already_committed(),
                Outcome::Superseded(reason) => request.signal_superseded(reason),
                Outcome::RecordsLost(records, reason) => {
                    request.signal_records_lost(records, reason)
                }
                Outcome::Unknown(reason) => request.signal_failed_with_unknown_reason(reason),
            }
        }
        Ok(())
    }
}
