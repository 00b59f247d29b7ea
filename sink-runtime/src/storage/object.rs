//! Checkpoints on an object store (S3 and S3-compatible servers, or any
//! [`ObjectStore`]), so that a job's state is not tied to one machine, with
//! fencing of older instances instead of a lock file.
//!
//! ```text
//! PREFIX/
//!   HEAD                                                  the claimed generation, the retained
//!                                                         checkpoints, the finished marker
//!   checkpoint-00000000000000000007-g00000000000000000003.ckpt   checkpoint 7, stored by generation 3
//!   checkpoint-00000000000000000008-g00000000000000000003.ckpt
//! ```
//!
//! Every object is framed like the files of a local state directory (marker,
//! kind, format version, length, crc32c: the `frame` module), and refused,
//! never skipped, when it cannot be read.
//!
//! # Fencing
//!
//! Object stores have no locks, but they have conditional writes: a put
//! with `If-None-Match: *` creates an object only if it does not exist, one
//! with `If-Match: <etag>` replaces it only if nobody replaced it since it
//! was read. Every change of `HEAD` is such a write:
//!
//! ```text
//!  begin (a start)     read HEAD (etag e) ─▶ put HEAD{generation + 1} if-match e   (if-none-match on the first start)
//!                      └ lost the race: read again and claim the next generation
//!  store checkpoint n  put checkpoint-n-g<ours> if-none-match ─▶ put HEAD{.., n} if-match <our last etag>
//!                      └ HEAD changed: a newer generation started ─▶ Fenced (the job stops, no restart)
//!  mark_finished       put HEAD{finished} if-match <our last etag>, fenced the same way
//! ```
//!
//! A start therefore takes `HEAD` away from whatever instance ran before,
//! even one that is still running (a zombie: cut off, paused, or simply
//! started twice). That instance's next checkpoint fails its conditional
//! write, and since the runtime commits only what a stored checkpoint holds,
//! it commits nothing it had not stored before the new instance started;
//! what it had stored, the new instance restores and commits again, which
//! commits recognise as already done. The fenced instance's job fails with
//! [`StorageError::Fenced`], which is not restarted: a restart would claim
//! `HEAD` back.
//!
//! A checkpoint object's name carries the generation that stored it, so an
//! instance never overwrites another's; objects that no `HEAD` names (a
//! zombie's last attempt, a crash between the two puts) are removed at the
//! next start.

use std::sync::Arc;

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use sink_api::{CheckpointId, Generation};
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::frame::{self, Framed, Kind};
use super::{
    CheckpointFile, CheckpointStorage, CompletedCheckpoint, FinishedMarker, StateDirectory,
    StorageError,
};

const HEAD_OBJECT: &str = "HEAD";
const CHECKPOINT_PREFIX: &str = "checkpoint-";
const CHECKPOINT_SUFFIX: &str = ".ckpt";
/// How often a start tries to claim `HEAD` when other starts keep winning.
const CLAIM_ATTEMPTS: usize = 16;
const CREDENTIALS_HINT: &str = "; the credentials are missing, wrong, or not allowed to use this \
     bucket and prefix (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the storage's options)";

/// Whether `error` says the object does not exist, as opposed to its
/// bucket: S3 answers 404 for both, with `NoSuchBucket` in the body for the
/// bucket.
fn is_absent(error: &object_store::Error) -> bool {
    matches!(error, object_store::Error::NotFound { .. })
        && !error.to_string().contains("NoSuchBucket")
}

/// What `HEAD` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Head {
    /// The last generation started on this storage.
    generation: u64,
    /// The retained checkpoints, oldest first: (checkpoint id, generation
    /// that stored it), which names its object.
    checkpoints: Vec<(CheckpointId, Generation)>,
    /// Set once the job ended with everything committed.
    finished: Option<FinishedMarker>,
}

impl Framed for Head {}

/// `HEAD` as this instance last wrote it, with the etag its next
/// conditional write must match.
#[derive(Debug, Clone)]
struct Claim {
    head: Head,
    version: UpdateVersion,
}

/// Durable checkpoint storage on an object store, shared by the instances
/// that run one job over time (see the module docs for the layout and the
/// fencing).
///
/// Made by the user with [`new`](Self::new) (any [`ObjectStore`]) or, with
/// the `s3` feature, `ObjectCheckpointStorage::s3`, and given to
/// `JobBuilder::checkpoint_storage`. Clones share the claim of the instance.
#[derive(Debug, Clone)]
pub struct ObjectCheckpointStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// How the storage is named in messages, such as `s3://bucket/state`.
    location: String,
    retained: usize,
    /// Set by `begin`; `None` before the first start of this instance.
    claim: Mutex<Option<Claim>>,
}

impl ObjectCheckpointStorage {
    /// Checkpoint storage under `prefix` of `store`, keeping the newest 3
    /// checkpoints; `location` names it in messages (such as
    /// `s3://bucket/state`). Nothing is read or written before the job
    /// starts.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        location: impl Into<String>,
    ) -> ObjectCheckpointStorage {
        ObjectCheckpointStorage {
            inner: Arc::new(Inner {
                store,
                prefix,
                location: location.into(),
                retained: 3,
                claim: Mutex::new(None),
            }),
        }
    }

    /// Checkpoint storage at an `s3://bucket/prefix` URL. Endpoint, region
    /// and credentials come from the usual AWS environment variables
    /// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...), then
    /// from `options` (keys of `object_store::aws::AmazonS3ConfigKey`, such
    /// as `endpoint` or `allow_http`), which win.
    #[cfg(feature = "s3")]
    pub fn s3(
        url: &str,
        options: &[(String, String)],
    ) -> Result<ObjectCheckpointStorage, StorageError> {
        let (store, prefix) = s3_store(url, options)?;
        Ok(ObjectCheckpointStorage::new(
            store,
            prefix,
            url.trim_end_matches('/'),
        ))
    }

    /// Keeps the newest `retained` (at least 1) checkpoints instead of 3.
    pub fn retaining(self, retained: usize) -> ObjectCheckpointStorage {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            store: shared.store.clone(),
            prefix: shared.prefix.clone(),
            location: shared.location.clone(),
            retained: shared.retained,
            claim: Mutex::new(None),
        });
        ObjectCheckpointStorage {
            inner: Arc::new(Inner {
                retained: retained.max(1),
                ..inner
            }),
        }
    }

    /// Where the storage is, as named in messages.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// The object store it keeps its objects in.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.inner.store.clone()
    }

    /// The prefix its objects are under.
    pub fn prefix(&self) -> &Path {
        &self.inner.prefix
    }

    /// Forgets the job's progress, so that the next job started on this
    /// storage starts from the beginning: `HEAD` keeps its generation (names
    /// derived from generations never repeat) and loses its checkpoints and
    /// finished marker, by a conditional write; then the checkpoint objects
    /// go.
    ///
    /// Called by a program that starts a job over (the file sink demo's
    /// `--fresh`) before the job is built. A job still running on this
    /// storage is fenced by it, as by a start.
    pub async fn start_over(&self) -> Result<(), StorageError> {
        let inner = &self.inner;
        for _ in 0..CLAIM_ATTEMPTS {
            let (head, version) = inner.read_head().await?;
            let Some(head) = head else {
                return inner.remove_unnamed(&Head::default()).await;
            };
            let cleared = Head {
                generation: head.generation,
                checkpoints: Vec::new(),
                finished: None,
            };
            match inner.put_head(&cleared, version).await? {
                Some(_) => return inner.remove_unnamed(&cleared).await,
                None => continue,
            }
        }
        Err(inner.contended())
    }

    /// Reads everything under the storage's prefix without claiming
    /// anything (a running job may be writing it): for inspection tools.
    /// `locked` is always false: object storage has no locks.
    pub async fn inspect(&self) -> Result<StateDirectory, StorageError> {
        let inner = &self.inner;
        let (head, _) = inner.read_head().await?;
        let head = head.unwrap_or_default();
        let mut checkpoints = Vec::new();
        for &(checkpoint_id, generation) in &head.checkpoints {
            let path = inner.checkpoint_path(checkpoint_id, generation);
            let location = inner.url_of(&path);
            let (size_bytes, content) = match inner.get(&path).await {
                Ok(Some(bytes)) => (
                    bytes.len() as u64,
                    frame::decode_checkpoint(&bytes, checkpoint_id, &location),
                ),
                Ok(None) => (0, Err(inner.missing_checkpoint(checkpoint_id, &location))),
                Err(error) => (0, Err(error)),
            };
            checkpoints.push(CheckpointFile {
                checkpoint_id,
                path: location.into(),
                size_bytes,
                content,
            });
        }
        Ok(StateDirectory {
            generation: (head.generation > 0).then_some(Generation(head.generation)),
            finished: head.finished,
            checkpoints,
            locked: false,
        })
    }
}

impl Inner {
    fn head_path(&self) -> Path {
        self.prefix.child(HEAD_OBJECT)
    }

    fn checkpoint_path(&self, id: CheckpointId, generation: Generation) -> Path {
        self.prefix.child(format!(
            "{CHECKPOINT_PREFIX}{:020}-g{:020}{CHECKPOINT_SUFFIX}",
            id.0, generation.0
        ))
    }

    /// `path` as a URL for messages.
    fn url_of(&self, path: &Path) -> String {
        let relative = path
            .prefix_match(&self.prefix)
            .map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>())
            .unwrap_or_default()
            .join("/");
        format!("{}/{relative}", self.location)
    }

    fn remote(&self, doing: &str, path: &Path, error: object_store::Error) -> StorageError {
        let text = error.to_string();
        let (hint, permanent) = match &error {
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => (CREDENTIALS_HINT, true),
            _ if text.contains("InvalidAccessKeyId") || text.contains("SignatureDoesNotMatch") => {
                (CREDENTIALS_HINT, true)
            }
            _ if text.contains("NoSuchBucket") => (
                "; the bucket does not exist: create it, or correct the URL",
                true,
            ),
            _ => ("", false),
        };
        StorageError::Remote {
            context: format!("{doing} {}", self.url_of(path)),
            source: Box::new(error),
            hint,
            permanent,
        }
    }

    /// The object at `path`, or `None` when there is none.
    async fn get(&self, path: &Path) -> Result<Option<bytes::Bytes>, StorageError> {
        match self.store.get(path).await {
            Ok(result) => result
                .bytes()
                .await
                .map(Some)
                .map_err(|e| self.remote("reading", path, e)),
            Err(error) if is_absent(&error) => Ok(None),
            Err(error) => Err(self.remote("reading", path, error)),
        }
    }

    /// `HEAD` and the version a conditional write of it must match (`None`:
    /// there is no `HEAD` yet; write it with `If-None-Match`).
    async fn read_head(&self) -> Result<(Option<Head>, Option<UpdateVersion>), StorageError> {
        let path = self.head_path();
        let result = match self.store.get(&path).await {
            Ok(result) => result,
            Err(error) if is_absent(&error) => return Ok((None, None)),
            Err(error) => return Err(self.remote("reading", &path, error)),
        };
        let version = UpdateVersion {
            e_tag: result.meta.e_tag.clone(),
            version: result.meta.version.clone(),
        };
        let bytes = result
            .bytes()
            .await
            .map_err(|e| self.remote("reading", &path, e))?;
        let head: Head = frame::decode(&bytes, Kind::Head, &self.url_of(&path)).map_err(|e| {
            match e {
                StorageError::Corrupt { path, problem } => StorageError::Message(format!(
                    "the head object {} of the checkpoint storage is unusable: {problem}. It names the \
                     job's generation and newest checkpoints, so the job cannot start from this storage: \
                     restore the object from a backup (or a bucket version), or start the job afresh \
                     on a new prefix",
                    path.display()
                )),
                other => other,
            }
        })?;
        Ok((Some(head), Some(version)))
    }

    /// Writes `head` if `HEAD` is still at `version` (or, with `None`, does
    /// not exist). Returns the new version, or `None` when another writer
    /// changed `HEAD` first.
    async fn put_head(
        &self,
        head: &Head,
        version: Option<UpdateVersion>,
    ) -> Result<Option<UpdateVersion>, StorageError> {
        let path = self.head_path();
        let bytes = frame::encode(Kind::Head, head, HEAD_OBJECT)?;
        let mode = match version {
            Some(version) => PutMode::Update(version),
            None => PutMode::Create,
        };
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&path, PutPayload::from(bytes), options)
            .await
        {
            Ok(result) => Ok(Some(UpdateVersion {
                e_tag: result.e_tag,
                version: result.version,
            })),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Ok(None),
            Err(error) => Err(self.remote("writing", &path, error)),
        }
    }

    /// Replaces `HEAD` by `next` if this instance still holds it; otherwise
    /// the instance is fenced.
    async fn update_claimed(&self, claim: &mut Claim, next: Head) -> Result<(), StorageError> {
        match self.put_head(&next, Some(claim.version.clone())).await? {
            Some(version) => {
                *claim = Claim {
                    head: next,
                    version,
                };
                Ok(())
            }
            None => {
                let (head, _) = self.read_head().await?;
                let newer = head.map(|h| h.generation).unwrap_or(0);
                Err(StorageError::Fenced {
                    location: self.location.clone(),
                    generation: Generation(claim.head.generation),
                    newer: Generation(newer),
                })
            }
        }
    }

    /// Removes every checkpoint object `head` does not name: those of stores
    /// that lost their race, and those left by a crash between the two puts
    /// of a store. Best effort: what cannot be removed now is removed at a
    /// later start.
    async fn remove_unnamed(&self, head: &Head) -> Result<(), StorageError> {
        use futures::TryStreamExt;
        let named: Vec<Path> = head
            .checkpoints
            .iter()
            .map(|&(id, generation)| self.checkpoint_path(id, generation))
            .collect();
        let listed: Vec<object_store::ObjectMeta> = match self
            .store
            .list(Some(&self.prefix))
            .try_collect()
            .await
        {
            Ok(listed) => listed,
            Err(error) => {
                warn!(storage = %self.location, %error, "cannot list the checkpoint storage to remove unused checkpoints");
                return Ok(());
            }
        };
        for meta in listed {
            // Only the prefix's own checkpoint objects: nothing below it in
            // a "directory" of its own is this storage's.
            let own = meta
                .location
                .prefix_match(&self.prefix)
                .is_some_and(|parts| parts.count() == 1);
            let is_checkpoint = own
                && meta.location.filename().is_some_and(|name| {
                    name.starts_with(CHECKPOINT_PREFIX) && name.ends_with(CHECKPOINT_SUFFIX)
                });
            if is_checkpoint && !named.contains(&meta.location) {
                match self.store.delete(&meta.location).await {
                    Ok(()) => {
                        info!(object = %self.url_of(&meta.location), "removed a checkpoint object no HEAD names")
                    }
                    Err(error) => {
                        warn!(object = %self.url_of(&meta.location), %error, "cannot remove an unused checkpoint object")
                    }
                }
            }
        }
        Ok(())
    }

    fn missing_checkpoint(&self, id: CheckpointId, location: &str) -> StorageError {
        StorageError::Corrupt {
            path: location.into(),
            problem: format!(
                "HEAD names checkpoint {id}, but its object is missing (was it deleted, or does a \
                 lifecycle rule expire objects under {}?)",
                self.location
            ),
        }
    }

    fn contended(&self) -> StorageError {
        StorageError::Message(format!(
            "{} kept changing while this instance tried to claim it ({CLAIM_ATTEMPTS} attempts): \
             several instances of the job are starting at once on the same checkpoint storage; \
             run one",
            self.url_of(&self.head_path())
        ))
    }
}

#[async_trait]
impl CheckpointStorage for ObjectCheckpointStorage {
    /// Claims the next generation by a conditional write of `HEAD` (see the
    /// module docs), fencing any instance that ran before, then removes the
    /// checkpoint objects `HEAD` does not name.
    async fn begin(&self) -> Result<Generation, StorageError> {
        let inner = &self.inner;
        let mut claim = inner.claim.lock().await;
        for _ in 0..CLAIM_ATTEMPTS {
            let (head, version) = inner.read_head().await?;
            let head = head.unwrap_or_default();
            let generation = head.generation.checked_add(1).ok_or_else(|| {
                StorageError::Message(format!(
                    "{} holds generation {}, the largest there is: no start can get a new one; \
                     start the job afresh on a new prefix",
                    inner.url_of(&inner.head_path()),
                    head.generation
                ))
            })?;
            let next = Head { generation, ..head };
            if let Some(version) = inner.put_head(&next, version).await? {
                inner.remove_unnamed(&next).await?;
                *claim = Some(Claim {
                    head: next,
                    version,
                });
                return Ok(Generation(generation));
            }
        }
        Err(inner.contended())
    }

    /// Creates the checkpoint's object (never overwriting one), then names
    /// it in `HEAD` by a conditional write, then removes the objects of the
    /// checkpoints no longer retained. Fails with [`StorageError::Fenced`]
    /// when a newer instance has started.
    async fn store(&self, checkpoint: &CompletedCheckpoint) -> Result<(), StorageError> {
        let inner = &self.inner;
        let mut guard = inner.claim.lock().await;
        let Some(claim) = guard.as_mut() else {
            return Err(StorageError::Message(format!(
                "checkpoint {} stored on {} before the job's start claimed the storage (begin was not called)",
                checkpoint.checkpoint_id, inner.location
            )));
        };
        let id = checkpoint.checkpoint_id;
        if let Some(&(newest, _)) = claim.head.checkpoints.last() {
            if newest >= id {
                return Err(StorageError::Message(format!(
                    "checkpoint {id} is not newer than checkpoint {newest} already in {}; checkpoints \
                     are stored in order",
                    inner.location
                )));
            }
        }
        let generation = Generation(claim.head.generation);
        let path = inner.checkpoint_path(id, generation);
        let bytes = frame::encode(Kind::Checkpoint, checkpoint, &inner.url_of(&path))?;
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match inner
            .store
            .put_opts(&path, PutPayload::from(bytes), create)
            .await
        {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(StorageError::Message(format!(
                    "{} already exists: another instance runs with this instance's generation {generation}; \
                     is the storage shared with a copy of this process?",
                    inner.url_of(&path)
                )))
            }
            Err(error) => return Err(inner.remote("writing", &path, error)),
        }
        let mut next = claim.head.clone();
        next.checkpoints.push((id, generation));
        let dropped: Vec<(CheckpointId, Generation)> = {
            let excess = next.checkpoints.len().saturating_sub(inner.retained);
            next.checkpoints.drain(..excess).collect()
        };
        if let Err(error) = inner.update_claimed(claim, next).await {
            // Not named by HEAD: never read; removed now or at a later start.
            let _ = inner.store.delete(&path).await;
            return Err(error);
        }
        // Older checkpoints go only now that HEAD names a newer one.
        for (old, old_generation) in dropped {
            let old_path = inner.checkpoint_path(old, old_generation);
            if let Err(error) = inner.store.delete(&old_path).await {
                warn!(object = %inner.url_of(&old_path), %error, "cannot remove an old checkpoint; it is removed at a later start");
            }
        }
        Ok(())
    }

    /// The newest checkpoint `HEAD` names. Its object missing or unreadable
    /// is [`StorageError::Corrupt`]: never a fallback to an older one.
    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        let inner = &self.inner;
        let (head, _) = inner.read_head().await?;
        let Some(&(id, generation)) = head.as_ref().and_then(|h| h.checkpoints.last()) else {
            return Ok(None);
        };
        let path = inner.checkpoint_path(id, generation);
        let location = inner.url_of(&path);
        match inner.get(&path).await? {
            Some(bytes) => frame::decode_checkpoint(&bytes, id, &location).map(Some),
            None => Err(inner.missing_checkpoint(id, &location)),
        }
    }

    /// Sets the finished marker in `HEAD`, fenced like a store.
    async fn mark_finished(&self, marker: FinishedMarker) -> Result<(), StorageError> {
        let inner = &self.inner;
        let mut guard = inner.claim.lock().await;
        let Some(claim) = guard.as_mut() else {
            return Err(StorageError::Message(format!(
                "the job was marked finished on {} before its start claimed the storage",
                inner.location
            )));
        };
        let next = Head {
            finished: Some(marker),
            ..claim.head.clone()
        };
        inner.update_claimed(claim, next).await
    }

    async fn finished(&self) -> Result<Option<FinishedMarker>, StorageError> {
        let (head, _) = self.inner.read_head().await?;
        Ok(head.and_then(|h| h.finished))
    }
}

/// The S3 store and prefix of an `s3://bucket/prefix` URL: the AWS
/// environment variables, then `options`, configure the client; requests are
/// retried for at most 30 s.
#[cfg(feature = "s3")]
fn s3_store(
    url: &str,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path), StorageError> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    let invalid = |problem: String| {
        StorageError::Message(format!(
            "the checkpoint storage URL {url} is not usable: {problem}"
        ))
    };
    let parsed = url::Url::parse(url).map_err(|e| invalid(e.to_string()))?;
    if parsed.scheme() != "s3" {
        return Err(invalid("it must start with s3://".into()));
    }
    let mut builder = AmazonS3Builder::from_env().with_url(url);
    for (key, value) in options {
        let key: AmazonS3ConfigKey = key
            .parse()
            .map_err(|e| invalid(format!("option {key}: {e}")))?;
        builder = builder.with_config(key, value);
    }
    let retry = object_store::RetryConfig {
        max_retries: 5,
        retry_timeout: std::time::Duration::from_secs(30),
        ..object_store::RetryConfig::default()
    };
    let store = builder
        .with_retry(retry)
        .build()
        .map_err(|e| invalid(e.to_string()))?;
    let prefix = Path::from_url_path(parsed.path()).map_err(|e| invalid(e.to_string()))?;
    Ok((Arc::new(store), prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SubtaskSnapshot;
    use object_store::memory::InMemory;

    fn checkpoint(id: u64) -> CompletedCheckpoint {
        CompletedCheckpoint {
            checkpoint_id: CheckpointId(id),
            job_name: "job".into(),
            generation: Generation(1),
            lineage: Some(sink_api::Lineage::new("lineage")),
            parallelism: 1,
            subtasks: vec![SubtaskSnapshot {
                subtask: 0,
                source_splits: vec![1, 2, 3],
                writer_states: vec![vec![4]],
                pending: Vec::new(),
                end_of_input: false,
            }],
            global_committer: None,
            is_final: false,
        }
    }

    fn storage(store: &Arc<InMemory>) -> ObjectCheckpointStorage {
        ObjectCheckpointStorage::new(store.clone(), Path::from("state"), "memory://state")
    }

    async fn objects(store: &InMemory) -> Vec<String> {
        use futures::TryStreamExt;
        let mut names: Vec<String> = store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        names.sort();
        names
    }

    #[tokio::test]
    async fn stores_reads_and_retains_the_newest() {
        let store = Arc::new(InMemory::new());
        let storage = storage(&store).retaining(2);
        assert_eq!(storage.finished().await.unwrap(), None);
        assert_eq!(storage.begin().await.unwrap(), Generation(1));
        assert_eq!(storage.latest().await.unwrap(), None);
        for id in 1..=4 {
            storage.store(&checkpoint(id)).await.unwrap();
        }
        assert_eq!(storage.latest().await.unwrap(), Some(checkpoint(4)));
        assert_eq!(
            objects(&store).await,
            vec![
                "state/HEAD".to_string(),
                "state/checkpoint-00000000000000000003-g00000000000000000001.ckpt".into(),
                "state/checkpoint-00000000000000000004-g00000000000000000001.ckpt".into(),
            ]
        );
        assert!(storage.store(&checkpoint(4)).await.is_err(), "not newer");
        let marker = FinishedMarker {
            generation: Generation(1),
            last_checkpoint: Some(CheckpointId(4)),
        };
        storage.mark_finished(marker).await.unwrap();
        let again = self::storage(&store);
        assert_eq!(again.finished().await.unwrap(), Some(marker));
        assert_eq!(again.begin().await.unwrap(), Generation(2));
        assert_eq!(again.latest().await.unwrap(), Some(checkpoint(4)));
    }

    #[tokio::test]
    async fn a_newer_start_fences_the_older_instance() {
        let store = Arc::new(InMemory::new());
        let older = storage(&store);
        assert_eq!(older.begin().await.unwrap(), Generation(1));
        older.store(&checkpoint(1)).await.unwrap();
        let newer = storage(&store);
        assert_eq!(newer.begin().await.unwrap(), Generation(2));
        let error = older.store(&checkpoint(2)).await.unwrap_err();
        assert!(
            matches!(
                error,
                StorageError::Fenced {
                    generation: Generation(1),
                    newer: Generation(2),
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("generation 2"), "{error}");
        let marker = FinishedMarker {
            generation: Generation(1),
            last_checkpoint: Some(CheckpointId(2)),
        };
        assert!(matches!(
            older.mark_finished(marker).await,
            Err(StorageError::Fenced { .. })
        ));
        assert_eq!(
            newer.latest().await.unwrap(),
            Some(checkpoint(1)),
            "the fenced store is not visible"
        );
        assert_eq!(
            objects(&store).await.len(),
            2,
            "HEAD and checkpoint 1: the fenced instance's object is gone"
        );
        newer.store(&checkpoint(2)).await.unwrap();
        assert_eq!(newer.latest().await.unwrap(), Some(checkpoint(2)));
    }

    #[tokio::test]
    async fn a_store_before_begin_is_refused() {
        let store = Arc::new(InMemory::new());
        let error = storage(&store).store(&checkpoint(1)).await.unwrap_err();
        assert!(
            error.to_string().contains("begin was not called"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn an_unreadable_newest_checkpoint_is_refused_never_skipped() {
        let store = Arc::new(InMemory::new());
        let storage = storage(&store);
        storage.begin().await.unwrap();
        storage.store(&checkpoint(1)).await.unwrap();
        storage.store(&checkpoint(2)).await.unwrap();
        let newest = Path::from("state/checkpoint-00000000000000000002-g00000000000000000001.ckpt");
        let mut bytes = store
            .get(&newest)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        *bytes.last_mut().unwrap() ^= 0xff;
        store.put(&newest, bytes.into()).await.unwrap();
        let error = storage.latest().await.unwrap_err();
        assert!(matches!(error, StorageError::Corrupt { .. }), "{error:?}");
        assert!(error.to_string().contains("checksum"), "{error}");
        assert!(
            error
                .to_string()
                .contains("memory://state/checkpoint-00000000000000000002"),
            "names the object: {error}"
        );
        store.delete(&newest).await.unwrap();
        let error = storage.latest().await.unwrap_err();
        assert!(error.to_string().contains("object is missing"), "{error}");
        store
            .put(&Path::from("state/HEAD"), b"EOSINK garbage".to_vec().into())
            .await
            .unwrap();
        let error = storage.begin().await.unwrap_err();
        assert!(
            error.to_string().contains("head object") && error.to_string().contains("unusable"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn starting_over_keeps_the_generation_and_fences() {
        let store = Arc::new(InMemory::new());
        let first = storage(&store);
        first.begin().await.unwrap();
        first.store(&checkpoint(1)).await.unwrap();
        let other = storage(&store);
        other.start_over().await.unwrap();
        assert_eq!(other.latest().await.unwrap(), None);
        assert_eq!(objects(&store).await, vec!["state/HEAD".to_string()]);
        assert!(matches!(
            first.store(&checkpoint(2)).await,
            Err(StorageError::Fenced { .. })
        ));
        assert_eq!(other.begin().await.unwrap(), Generation(2));
        let inspected = other.inspect().await.unwrap();
        assert_eq!(inspected.generation, Some(Generation(2)));
        assert!(inspected.checkpoints.is_empty());
    }

    #[tokio::test]
    async fn unnamed_checkpoint_objects_are_removed_at_the_next_start() {
        let store = Arc::new(InMemory::new());
        let first = storage(&store);
        first.begin().await.unwrap();
        first.store(&checkpoint(1)).await.unwrap();
        // A crash between the checkpoint's put and HEAD's.
        let stray = Path::from("state/checkpoint-00000000000000000002-g00000000000000000001.ckpt");
        store.put(&stray, b"x".to_vec().into()).await.unwrap();
        // Not this storage's: in a "directory" below its prefix.
        let other =
            Path::from("state/other/checkpoint-00000000000000000001-g00000000000000000001.ckpt");
        store.put(&other, b"x".to_vec().into()).await.unwrap();
        let second = storage(&store);
        second.begin().await.unwrap();
        assert_eq!(
            objects(&store).await.len(),
            3,
            "HEAD, checkpoint 1 and the other directory's object"
        );
        assert_eq!(second.latest().await.unwrap(), Some(checkpoint(1)));
    }
}
