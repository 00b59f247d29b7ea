//! The file committer: makes a pending part visible by an atomic rename.
//!
//! | pending file | target | outcome |
//! |---|---|---|
//! | present | absent | renamed; the directory is synced: committed |
//! | absent | present, of the recorded size | already committed (a replay after recovery) |
//! | absent | present, of another size | failed, known reason (counted) |
//! | absent | absent | failed, known reason: the data is lost (counted, never a silent success) |
//! | present | present | failed, unknown reason: the job stops rather than overwrite a file |

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use sink_api::{CommitRequest, Committer, SinkError};

use crate::part_file::{sync_dir, FileCommittable};
use crate::sink::FileSinkStats;

/// Commits the file sink's committables. Made by
/// [`FileSink`](crate::FileSink) for the runtime.
pub struct FileCommitter {
    pub(crate) stats: Arc<FileSinkStats>,
}

fn exists(path: &Path) -> Result<Option<u64>, std::io::Error> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl Committer for FileCommitter {
    type Committable = FileCommittable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<FileCommittable>],
    ) -> Result<(), SinkError> {
        let last = requests.len().saturating_sub(1);
        for (position, request) in requests.iter_mut().enumerate() {
            let c = request.committable().clone();
            let state = exists(&c.pending).and_then(|p| Ok((p, exists(&c.target)?)));
            match state {
                Err(error) => request.signal_failed_with_unknown_reason(format!(
                    "cannot look at {} or {}: {error}",
                    c.pending.display(),
                    c.target.display()
                )),
                Ok((Some(_), None)) => match std::fs::rename(&c.pending, &c.target) {
                    Ok(()) => {
                        if let Some(dir) = c.target.parent() {
                            sync_dir(dir)?;
                        }
                        self.stats.committed(&c);
                    }
                    Err(error) => request.signal_failed_with_unknown_reason(format!(
                        "renaming {} to {} failed: {error}",
                        c.pending.display(),
                        c.target.display()
                    )),
                },
                Ok((None, Some(size))) if size == c.size_bytes => {
                    // The crash may have come between the rename and the
                    // directory sync: make the rename durable now.
                    if let Some(dir) = c.target.parent() {
                        sync_dir(dir)?;
                    }
                    self.stats.replayed();
                    request.signal_already_committed();
                }
                Ok((None, Some(size))) => {
                    self.stats.failed();
                    request.signal_failed_with_known_reason(format!(
                        "{} exists but holds {size} bytes instead of the {} committed; it was changed after its commit",
                        c.target.display(),
                        c.size_bytes
                    ));
                }
                Ok((None, None)) => {
                    self.stats.failed();
                    request.signal_failed_with_known_reason(format!(
                        "neither the pending file {} nor its target {} exists: its {} records are lost \
                         (was the output directory changed by hand?)",
                        c.pending.display(),
                        c.target.display(),
                        c.records
                    ));
                }
                Ok((Some(_), Some(_))) => request.signal_failed_with_unknown_reason(format!(
                    "both the pending file {} and its target {} exist; refusing to overwrite the target",
                    c.pending.display(),
                    c.target.display()
                )),
            }
            if position < last {
                // A crash with part of the batch committed (crash tests only).
                #[cfg(feature = "failpoints")]
                fail::fail_point!("file-commit-mid-batch", |_| Err(SinkError::msg(
                    "simulated crash at failpoint file-commit-mid-batch"
                )));
            }
        }
        Ok(())
    }
}
