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
