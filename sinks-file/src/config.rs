//! What every writer and committer of one file sink shares.

use std::path::PathBuf;
use std::sync::Arc;

use crate::bulk::PartMerger;
use crate::clock::Clock;
use crate::compaction::Compaction;
use crate::dir_sync::DirSyncs;
#[cfg(feature = "object-store")]
use crate::object_output::ObjectOutput;
use crate::position_commit::LogTurn;
use crate::rolling::RollingPolicy;

/// Where a file sink writes.
#[derive(Debug, Clone)]
pub(crate) enum Output {
    /// A local base directory: parts are hidden files, committed by rename.
    Local(PathBuf),
    /// A prefix of an object store: parts are multipart uploads, committed
    /// by completing them.
    #[cfg(feature = "object-store")]
    Object(ObjectOutput),
}

impl Output {
    /// The local base directory; `None` for an object store.
    pub fn local(&self) -> Option<&PathBuf> {
        match self {
            Output::Local(base) => Some(base),
            #[cfg(feature = "object-store")]
            Output::Object(_) => None,
        }
    }

    /// How the output is named in messages.
    pub fn describe(&self) -> String {
        match self {
            Output::Local(base) => base.display().to_string(),
            #[cfg(feature = "object-store")]
            Output::Object(object) => object.location.clone(),
        }
    }
}

/// Everything a file writer needs, shared by the writers of a job.
pub(crate) struct FileSinkConfig<E, B> {
    pub output: Output,
    pub encoder: E,
    pub bucket_assigner: B,
    pub rolling: RollingPolicy,
    /// Whether the user chose the rolling policy
    /// ([`FileSinkBuilder::rolling_policy`](crate::FileSinkBuilder::rolling_policy)):
    /// a default one rolls at every checkpoint too in a job that promises
    /// visible commits.
    pub rolling_chosen: bool,
    pub part_prefix: String,
    pub part_suffix: String,
    /// The builder's clock; `None`: the runtime's, from the writer's
    /// context.
    pub clock: Option<Arc<dyn Clock>>,
    /// The directory fsyncs of this sink's writers and committers.
    pub syncs: Arc<DirSyncs>,
    /// The turn of this sink's committers at the output's position log.
    pub turn: Arc<LogTurn>,
    /// On an object store: the size of each uploaded part but the last.
    pub part_size: usize,
    /// On an object store: how many parts of one upload may be on their
    /// way at once.
    pub parts_in_flight: usize,
    /// On a local output: the compaction of committed files, if on.
    pub compaction: Option<Arc<Compaction>>,
    /// With compaction of a bulk format's parts: how they merge (set by
    /// the builder); `None`: merged by concatenating their bytes.
    pub merger: Option<Arc<dyn PartMerger>>,
}

impl<E, B> FileSinkConfig<E, B> {
    /// When a writer's parts roll: the policy, rolling at every checkpoint
    /// too when the job promises visible commits and the user did not
    /// choose the policy (a chosen one that does not roll there was
    /// refused at build: [`deferred_visibility`](Self::deferred_visibility)).
    pub fn rolling_for(&self, visible_commits: bool) -> RollingPolicy {
        let mut rolling = self.rolling;
        if visible_commits && !self.rolling_chosen {
            rolling.roll_on_checkpoint = true;
        }
        rolling
    }

    /// Why a commit may leave records out of sight with the policy the
    /// user chose, and the fix; `None` when every commit publishes them
    /// (the policy rolls at checkpoints, the format is a bulk one, or the
    /// policy is the default, which rolls at checkpoints when asked).
    pub fn deferred_visibility(&self) -> Option<String> {
        if !self.rolling_chosen || self.rolling.roll_on_checkpoint {
            return None;
        }
        Some(format!(
            "the file sink's rolling policy does not roll parts at checkpoints ({:?}): its records \
             stay in a hidden in-progress part, committed but out of sight, until the part rolls \
             by size or time. Roll at every checkpoint (FileSinkBuilder::rolling_policy with \
             RollingPolicy::on_checkpoint(), to which size and time limits may be added), or \
             leave the rolling policy unset: the default rolls at every checkpoint in such a job",
            self.rolling
        ))
    }
}
