//! Where a committed part goes, and which directories its rename touched.
//!
//! A commit renames a pending part to its target: its visible name in its
//! bucket, or, with compaction on, its name in the current epoch's segment
//! of the bucket (the `segments` module), under the epoch's read lock, so
//! that no seal comes between. The rename is durable once the directories
//! it touched are synced: [`Touched::sync`], before any outcome is
//! reported. Used by the committer for each committable, and by the
//! position log's roll-forward for the parts of every logged group (the
//! `position_commit` module).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sink_api::{Clock, SinkError};

use crate::blocking::assert_blocking;
use crate::compaction::Compaction;
use crate::dir_sync::{fsync_dir, DirSyncs};
use crate::io_error::io_error;
use crate::segments::size_of;

/// What one sink needs to put committed parts in their place: shared by
/// its committers and its start hook.
#[derive(Clone)]
pub(crate) struct Placement {
    /// The sink's directory fsyncs.
    pub syncs: Arc<DirSyncs>,
    /// With compaction on: the epochs whose segments files are renamed into.
    pub compaction: Option<Arc<Compaction>>,
    /// The sink's clock: when a file went into its epoch.
    pub clock: Arc<dyn Clock>,
}

/// What [`Placement::place`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// The part was renamed into its place.
    Moved,
    /// The pending file was gone by the time of the rename: another
    /// committer placed it meanwhile (the position log's roll-forward runs
    /// in every instance).
    Gone,
    /// Not renamed, for this reason (its target exists, or cannot be
    /// looked at).
    Refused(String),
}

impl Placement {
    /// Renames the pending part `pending` (`size_bytes` long) to `target`,
    /// or with compaction on into the current epoch's segment of
    /// `target`'s bucket, never over an existing file; notes in `touched`
    /// the directories whose entries changed. Blocking.
    pub(crate) fn place(
        &self,
        pending: &Path,
        target: &Path,
        size_bytes: u64,
        touched: &mut Touched,
    ) -> Result<Placed, SinkError> {
        assert_blocking("a commit's rename");
        let (Some(bucket), Some(name)) = (target.parent(), target.file_name()) else {
            return Ok(Placed::Refused(format!(
                "the target {} names no file in a directory",
                target.display()
            )));
        };
        let looked = |path: &Path| {
            size_of(path).map_err(|error| {
                format!(
                    "cannot look at {} or {}: {error}",
                    pending.display(),
                    path.display()
                )
            })
        };
        let placing = self.compaction.as_ref().map(|c| c.segments.placing());
        let epoch = placing.as_ref().and_then(|p| p.epoch());
        let destination = match epoch {
            Some(epoch) => epoch.segment_in(bucket).join(name),
            None => target.to_path_buf(),
        };
        for existing in [target, destination.as_path()] {
            match looked(existing) {
                Err(reason) => return Ok(Placed::Refused(reason)),
                Ok(Some(_)) => {
                    // Placed by another committer between our look at the
                    // pending file and this one?
                    return Ok(match looked(pending) {
                        Ok(None) => Placed::Gone,
                        Ok(Some(_)) => Placed::Refused(format!(
                            "both the pending file {} and its target {} exist; refusing to \
                             overwrite the target",
                            pending.display(),
                            existing.display()
                        )),
                        Err(reason) => Placed::Refused(reason),
                    });
                }
                Ok(None) => {}
            }
        }
        let segment = destination.parent().filter(|_| epoch.is_some());
        if let Some(segment) = segment {
            match std::fs::create_dir(segment) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(io_error(
                        format!("creating the segment {}", segment.display()),
                        e,
                    ))
                }
            }
            // A durable pending file moves into it next: its own name must be
            // durable first, or a power cut between the two leaves neither
            // the pending name nor the segment (found by the power-loss
            // harness). Once per segment and sink, whoever created it.
            if !self.syncs.is_durable(segment) {
                if let Some(parent) = segment.parent() {
                    self.syncs.sync_dir(parent)?;
                }
                self.syncs.durable_dir(segment);
            }
        }
        if let Err(error) = std::fs::rename(pending, &destination) {
            if error.kind() == std::io::ErrorKind::NotFound && matches!(looked(pending), Ok(None)) {
                return Ok(Placed::Gone);
            }
            return Ok(Placed::Refused(format!(
                "renaming {} to {} failed: {error}",
                pending.display(),
                destination.display()
            )));
        }
        if let Some(epoch) = epoch {
            epoch.add(size_bytes, self.clock.now_ms());
        }
        drop(placing);
        touched.buckets.insert(bucket.to_path_buf());
        if let Some(segment) = segment {
            touched.segments.insert(segment.to_path_buf());
        }
        Ok(Placed::Moved)
    }
}

/// The directories a batch of commits changed: segments (which received
/// files) and buckets (which lost pending names, or received files).
#[derive(Debug, Default)]
pub(crate) struct Touched {
    pub segments: BTreeSet<PathBuf>,
    pub buckets: BTreeSet<PathBuf>,
}

impl Touched {
    /// Notes that a file was placed (or found placed) at `file`, whose
    /// pending name was in `bucket`: both directories must be synced.
    pub(crate) fn placed_at(&mut self, bucket: &Path, file: &Path) {
        self.buckets.insert(bucket.to_path_buf());
        if let Some(dir) = file.parent().filter(|dir| *dir != bucket) {
            self.segments.insert(dir.to_path_buf());
        }
    }

    /// Makes the renames durable: each directory synced once, those that
    /// received files before those that lost their pending names.
    /// Blocking.
    pub(crate) fn sync(&self, syncs: &DirSyncs) -> Result<(), SinkError> {
        for segment in &self.segments {
            // Segment directories hold no file a writer created: no
            // bookkeeping (see `DirSyncs`) for them.
            fsync_dir(segment)?;
        }
        for bucket in &self.buckets {
            syncs.sync_dir(bucket)?;
        }
        Ok(())
    }
}
