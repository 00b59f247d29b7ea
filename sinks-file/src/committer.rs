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
//! | present, of the recorded size | absent | renamed; the directory is synced: committed |
//! | present, of another size (truncated, appended to) | absent | not renamed: failed, known reason, its records lost (counted) |
//! | absent | present, of the recorded size | already committed (a replay after recovery) |
//! | absent | present, of another size | failed, known reason, its records lost (counted) |
//! | absent | absent | failed, known reason: the data is lost, its records counted (never a silent success) |
//! | present | present | failed, unknown reason: the job stops rather than overwrite a file |
//!
//! On an object store output the commit completes the part's multipart
//! upload instead, with the outcomes of the `upload_commit` module.
//!
//! "Records lost" is `CommitRequest::signal_records_lost`: the runtime
//! counts them in the job's lost records. Only sizes are compared, from the
//! files' metadata: nothing is read again at commit time, so a change that
//! keeps a file's size is not detected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sink_api::{CommitRequest, Committer, SinkError};

use crate::blocking::{assert_blocking, blocking};
use crate::config::Output;
use crate::dir_sync::DirSyncs;
use crate::identity::{self, OutputIdentity};
use crate::object_output::ObjectOutput;
use crate::part_file::FileCommittable;
use crate::stats::FileSinkStats;
use crate::upload_commit::commit_upload;

/// Commits the file sink's committables. Made by
/// [`FileSink`](crate::FileSink) for the runtime, once per subtask and start.
pub struct FileCommitter {
    pub(crate) stats: Arc<FileSinkStats>,
    /// The sink's directory fsyncs.
    pub(crate) syncs: Arc<DirSyncs>,
    /// The sink's output: committables are resolved against it.
    pub(crate) output_location: Output,
    /// The base directory's identity, read at the first commit.
    pub(crate) output: Option<OutputIdentity>,
}

/// What became of one committable, decided (for a local output, off the
/// async workers) and signalled on the request afterwards.
pub(crate) enum Outcome {
    Committed,
    RetryLater,
    AlreadyCommitted,
    RecordsLost(u64, String),
    Unknown(String),
}

/// What one commit call works with on a blocking thread: everything it
/// needs, owned.
struct Work {
    base_path: PathBuf,
    output: Option<OutputIdentity>,
    syncs: Arc<DirSyncs>,
    stats: Arc<FileSinkStats>,
}

impl Work {
    /// Checks that `c` belongs to the base directory; returns its pending
    /// file and target there.
    fn locate(&mut self, c: &FileCommittable) -> Result<(PathBuf, PathBuf), SinkError> {
        if self.output.is_none() {
            self.output = identity::read(&self.base_path)?;
        }
        identity::check(
            &self.base_path,
            self.output.as_ref(),
            "a committable",
            &c.output_id,
            &c.output_dir,
        )?;
        Ok((
            identity::resolve(&self.base_path, &c.pending)?,
            identity::resolve(&self.base_path, &c.target)?,
        ))
    }

    /// Commits every committable in order (see the module's table), on a
    /// blocking thread.
    fn commit_all(&mut self, committables: &[FileCommittable]) -> Result<Vec<Outcome>, SinkError> {
        let last = committables.len().saturating_sub(1);
        let mut outcomes = Vec::with_capacity(committables.len());
        for (position, c) in committables.iter().enumerate() {
            outcomes.push(self.commit_one(c)?);
            if position < last {
                // A crash with part of the batch committed (crash tests only).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("file-commit-mid-batch", |_| Err(SinkError::msg(
                    "simulated crash at failpoint file-commit-mid-batch"
                )));
            }
        }
        Ok(outcomes)
    }

    fn commit_one(&mut self, c: &FileCommittable) -> Result<Outcome, SinkError> {
        assert_blocking("a commit's rename");
        let (pending, target) = self.locate(c)?;
        let state = size_of(&pending).and_then(|p| Ok((p, size_of(&target)?)));
        Ok(match state {
            Err(error) => Outcome::Unknown(format!(
                "cannot look at {} or {}: {error}",
                pending.display(),
                target.display()
            )),
            Ok((Some(size), None)) if size == c.size_bytes => {
                match std::fs::rename(&pending, &target) {
                    Ok(()) => {
                        if let Some(dir) = target.parent() {
                            self.syncs.sync_dir(dir)?;
                        }
                        self.stats.committed(c);
                        Outcome::Committed
                    }
                    Err(error) => Outcome::Unknown(format!(
                        "renaming {} to {} failed: {error}",
                        pending.display(),
                        target.display()
                    )),
                }
            }
            Ok((Some(size), None)) => {
                // Truncated (a torn last record) or appended to (a
                // duplicate): committing it would publish a broken file.
                self.stats.failed();
                Outcome::RecordsLost(
                    c.records,
                    format!(
                        "the pending file {} holds {size} bytes instead of the {} bytes recorded in the \
                         checkpoint: it was {} by something else than this sink, so it is not committed \
                         (left hidden where it is) and its {} records are lost",
                        pending.display(),
                        c.size_bytes,
                        if size < c.size_bytes { "truncated" } else { "appended to" },
                        c.records
                    ),
                )
            }
            Ok((None, Some(size))) if size == c.size_bytes => {
                // The crash may have come between the rename and the
                // directory sync: make the rename durable now.
                if let Some(dir) = target.parent() {
                    self.syncs.sync_dir(dir)?;
                }
                self.stats.replayed();
                Outcome::AlreadyCommitted
            }
            Ok((None, Some(size))) => {
                self.stats.failed();
                Outcome::RecordsLost(
                    c.records,
                    format!(
                        "{} exists but holds {size} bytes instead of the {} bytes committed; it was changed \
                         after its commit, and its {} records are lost",
                        target.display(),
                        c.size_bytes,
                        c.records
                    ),
                )
            }
            Ok((None, None)) => {
                self.stats.failed();
                Outcome::RecordsLost(
                    c.records,
                    format!(
                        "neither the pending file {} nor its target {} exists: its {} records are lost \
                         (was the output directory changed by hand?)",
                        pending.display(),
                        target.display(),
                        c.records
                    ),
                )
            }
            Ok((Some(_), Some(_))) => Outcome::Unknown(format!(
                "both the pending file {} and its target {} exist; refusing to overwrite the target",
                pending.display(),
                target.display()
            )),
        })
    }
}

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
        let last = committables.len().saturating_sub(1);
        let mut outcomes = Vec::with_capacity(committables.len());
        for (position, c) in committables.iter().enumerate() {
            identity::check(
                location,
                self.output.as_ref(),
                "a committable",
                &c.output_id,
                &c.output_dir,
            )?;
            let Some(upload) = &c.upload else {
                return Err(SinkError::msg(format!(
                    "the committable of {} names a local file, not an upload, for the object store \
                     output {}: the stored state is corrupt",
                    c.target.display(),
                    object.location
                ))
                .permanent());
            };
            let retry = retries.get(position).copied().unwrap_or(0);
            outcomes.push(commit_upload(object, &self.stats, c, upload, retry).await?);
            if position < last {
                // A crash with part of the batch committed (crash tests only).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("file-commit-mid-batch", |_| Err(SinkError::msg(
                    "simulated crash at failpoint file-commit-mid-batch"
                )));
            }
        }
        Ok(outcomes)
    }
}

/// The size of `path`, or `None` when it does not exist.
fn size_of(path: &Path) -> Result<Option<u64>, std::io::Error> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
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
                    syncs: self.syncs.clone(),
                    stats: self.stats.clone(),
                };
                let (outcomes, output) = blocking(move || {
                    let outcomes = work.commit_all(&committables)?;
                    Ok((outcomes, work.output))
                })
                .await?;
                self.output = output;
                outcomes
            }
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
                Outcome::RetryLater => request.retry_later(),
                Outcome::AlreadyCommitted => request.signal_already_committed(),
                Outcome::RecordsLost(records, reason) => {
                    request.signal_records_lost(records, reason)
                }
                Outcome::Unknown(reason) => request.signal_failed_with_unknown_reason(reason),
            }
        }
        Ok(())
    }
}
