//! What every writer and committer of one file sink shares.

use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;
use crate::dir_sync::DirSyncs;
use crate::rolling::RollingPolicy;

/// Everything a file writer needs, shared by the writers of a job.
pub(crate) struct FileSinkConfig<E, B> {
    pub base_path: PathBuf,
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
}
