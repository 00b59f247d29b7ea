//! Checkpoints on an object store (S3 and S3-compatible servers, or any
//! [`ObjectStore`]), so that a job's state is not tied to one machine, with
//! fencing of older instances instead of a lock file.
//!
//! ```text
//! PREFIX/
//!   HEAD                                                  the claimed generation, the retained
//!                                                         checkpoints, the older ones kept for
//!                                                         their chunks, the finished marker
//!   checkpoint-00000000000000000007-g00000000000000000003.ckpt   checkpoint 7, stored by generation 3
//!   checkpoint-00000000000000000008-g00000000000000000003.ckpt
//!   LINEAGE                                               the lineage of starts while no checkpoint
//!                                                         carries it: created once (if-none-match),
//!                                                         removed at the first store
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
//!
//! A checkpoint object also holds the chunks of state it stored first (the
//! `shared` module); a later checkpoint names them there. `HEAD` names the
//! older checkpoints kept only for such chunks (`kept`) beside the retained
//! ones, so a start never removes an object a retained checkpoint needs,
//! and a zombie removes only what its own `HEAD` stopped naming, which no
//! checkpoint of a newer instance names either: a newer instance names
//! only the chunks of the checkpoint it restored (which the zombie's `HEAD`
//! named when it was read) and chunks of its own generation.

use object_store::ObjectStoreExt;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};
use sink_api::{
    BincodeSerializer, CheckpointId, Generation, Lineage, SerializerError, VersionedSerializer,
};
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::frame::{self, FinishedMarkerV2, Framed, Kind};
use super::shared::{stored_form, ChunkBook, Holder, References};
use super::{
    CheckpointFile, CheckpointStorage, CompletedCheckpoint, FinishedMarker, StateDirectory,
    StorageError,
};

const HEAD_OBJECT: &str = "HEAD";
const LINEAGE_OBJECT: &str = "LINEAGE";
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
    /// Older checkpoints kept only for the chunks a retained one names
    /// (format 4 on), oldest first.
    kept: Vec<(CheckpointId, Generation)>,
}

impl Head {
    /// Every checkpoint object it names.
    fn named(&self) -> impl Iterator<Item = &(CheckpointId, Generation)> {
        self.checkpoints.iter().chain(&self.kept)
    }
}

impl Framed for Head {
    fn decode(version: u32, payload: &[u8]) -> Result<Self, SerializerError> {
        match version {
            1 | 2 => BincodeSerializer::<HeadV2>::new(version)
                .deserialize(version, payload)
                .map(|old| Head {
                    generation: old.generation,
                    checkpoints: old.checkpoints,
                    finished: old.finished.map(FinishedMarker::from),
                    kept: Vec::new(),
                }),
            3 => BincodeSerializer::<HeadV3>::new(version)
                .deserialize(version, payload)
                .map(|old| Head {
                    generation: old.generation,
                    checkpoints: old.checkpoints,
                    finished: old.finished,
                    kept: Vec::new(),
                }),
            _ => BincodeSerializer::<Self>::new(version).deserialize(version, payload),
        }
    }
}

/// `HEAD` of format 3: no checkpoints kept for their chunks.
#[derive(Serialize, Deserialize)]
struct HeadV3 {
    generation: u64,
    checkpoints: Vec<(CheckpointId, Generation)>,
    finished: Option<FinishedMarker>,
}

/// `HEAD` of formats 1 and 2: its finished marker without what was lost.
#[derive(Serialize, Deserialize)]
struct HeadV2 {
    generation: u64,
    checkpoints: Vec<(CheckpointId, Generation)>,
    finished: Option<FinishedMarkerV2>,
}

/// `HEAD` as this instance last wrote it, with the etag its next
/// conditional write must match.
#[derive(Debug, Clone)]
struct Claim {
    head: Head,
    version: UpdateVersion,
    /// Whether this start removed `LINEAGE` (once a checkpoint carries the
    /// lineage).
    lineage_removed: bool,
    /// Where the chunks of the checkpoints `head` names are held.
    book: ChunkBook,
}

/// Durable checkpoint storage on an object store, shared by the instances
/// that run one job over time (see the module docs for the layout and the
/// fencing).
///
/// Made by the user with [`new`](Self::new) (any [`ObjectStore`]) or, with
/// the `s3` feature, `ObjectCheckpointStorage::s3`, and given to
/// `JobBuilder::checkpoint_storage`. Clones share the claim: they are one
/// instance, so give each job a storage value of its own.
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
    /// A builder step: call it before the storage is given to a job (a
    /// storage made by it holds no claim).
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
    /// storage starts from the beginning: `HEAD` loses its checkpoints and
    /// finished marker and takes the next generation (so that names derived
    /// from generations never repeat, and an instance still running is
    /// fenced), by a conditional write; then the checkpoint objects go.
    ///
    /// Called by a program that starts a job over (the file sink demo's
    /// `--fresh`) before the job is built. A job still running on this
    /// storage is fenced by it, as by a start.
    ///
    /// [`fence`](Self::fence) first, when the output is cleared too: a crash
    /// between clearing the output and this call then leaves checkpoints a
    /// resume refuses, never an empty storage beside old output.
    pub async fn start_over(&self) -> Result<(), StorageError> {
        let inner = &self.inner;
        for _ in 0..CLAIM_ATTEMPTS {
            let (head, version) = inner.read_head().await?;
            let Some(head) = head else {
                return inner.remove_unnamed(&Head::default()).await;
            };
            let cleared = Head {
                generation: head.generation.saturating_add(1),
                ..Head::default()
            };
            match inner.put_head(&cleared, version).await? {
                Some(_) => {
                    inner.remove_unnamed(&cleared).await?;
                    // A new life: the next start draws a new lineage.
                    if !inner.remove_lineage().await {
                        return Err(StorageError::Message(format!(
                            "cannot remove {} while starting over; remove it, then start again",
                            inner.url_of(&inner.prefix.clone().join(LINEAGE_OBJECT))
                        )));
                    }
                    return Ok(());
                }
                None => continue,
            }
        }
        Err(inner.contended())
    }

    /// Claims the next generation, as a start does, without running a job:
    /// every instance still running on this storage is fenced from now on.
    /// Checkpoints are kept. For programs that clear a job's output before
    /// [`start_over`](Self::start_over).
    pub async fn fence(&self) -> Result<Generation, StorageError> {
        let claim = ObjectCheckpointStorage::new(
            self.inner.store.clone(),
            self.inner.prefix.clone(),
            self.inner.location.clone(),
        );
        claim.begin().await
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
            let this = Holder {
                checkpoint: checkpoint_id,
                generation,
            };
            let location = inner.url_of(&inner.checkpoint_path(checkpoint_id, generation));
            let (size_bytes, content) = match inner.load(this, None).await {
                Ok((size, checkpoint)) => (size, Ok(checkpoint)),
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
        self.prefix.clone().join(HEAD_OBJECT)
    }

    /// Removes `LINEAGE`; whether it is gone (a failure is logged, and tried
    /// again at the next store).
    async fn remove_lineage(&self) -> bool {
        let path = self.prefix.clone().join(LINEAGE_OBJECT);
        match self.store.delete(&path).await {
            Ok(()) => true,
            Err(error) if is_absent(&error) => true,
            Err(error) => {
                warn!(object = %self.url_of(&path), %error, "cannot remove the lineage object; tried again at the next checkpoint");
                false
            }
        }
    }

    fn checkpoint_path(&self, id: CheckpointId, generation: Generation) -> Path {
        self.prefix.clone().join(format!(
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

    /// The checkpoint object at `path`, or `None` when there is none; one
    /// larger than a state file may be is refused before its body is read.
    async fn get(&self, path: &Path) -> Result<Option<bytes::Bytes>, StorageError> {
        match self.store.get(path).await {
            Ok(result) => self.body(path, result).await.map(Some),
            Err(error) if is_absent(&error) => Ok(None),
            Err(error) => Err(self.remote("reading", path, error)),
        }
    }

    /// The body of the state object `result` read from `path`, once its
    /// size (known before the body is read) is one a frame can have.
    async fn body(
        &self,
        path: &Path,
        result: object_store::GetResult,
    ) -> Result<bytes::Bytes, StorageError> {
        if result.meta.size > frame::MAX_FRAME_LEN {
            return Err(StorageError::Corrupt {
                path: self.url_of(path).into(),
                problem: format!(
                    "it is {} bytes, more than the {} a state object may hold; it was not read",
                    result.meta.size,
                    frame::MAX_FRAME_LEN
                ),
            });
        }
        result
            .bytes()
            .await
            .map_err(|e| self.remote("reading", path, e))
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
        let head: Head = match self.body(&path, result).await {
            Ok(bytes) => frame::decode(&bytes, Kind::Head, &self.url_of(&path)),
            Err(error) => Err(error),
        }
        .map_err(|e| {
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
    ///
    /// A write whose answer was lost may have landed: the client's retry
    /// then meets its own write (412), or the next write meets a version
    /// this instance never saw. So after any failed write `HEAD` is read
    /// again: a newer generation fences this instance; this instance's own
    /// generation means `HEAD` is still its own (only a start or a start
    /// over raises the generation), and its content says whether the write
    /// landed (done) or not (written once more, against the version read).
    async fn update_claimed(&self, claim: &mut Claim, next: Head) -> Result<(), StorageError> {
        let ours = claim.head.generation;
        let mut version = claim.version.clone();
        for _ in 0..2 {
            let failure = match self.put_head(&next, Some(version)).await {
                Ok(Some(written)) => {
                    claim.head = next;
                    claim.version = written;
                    return Ok(());
                }
                Ok(None) => None,
                Err(error) => Some(error),
            };
            let (head, read) = match self.read_head().await {
                Ok(read) => read,
                Err(read_error) => return Err(failure.unwrap_or(read_error)),
            };
            match (head, read) {
                (Some(head), _) if head.generation > ours => {
                    return Err(StorageError::Fenced {
                        location: self.location.clone(),
                        generation: Generation(ours),
                        newer: Generation(head.generation),
                    })
                }
                (Some(head), Some(read)) if head.generation == ours => {
                    if head == next {
                        claim.head = head;
                        claim.version = read;
                        return Ok(());
                    }
                    version = read;
                }
                (head, _) => {
                    return Err(StorageError::Message(format!(
                        "{} went back to generation {} below this instance's {ours}: it was replaced by \
                         something else than a start of the job; stop every instance and check the \
                         storage",
                        self.url_of(&self.head_path()),
                        head.map_or(0, |h| h.generation)
                    )))
                }
            }
            if let Some(error) = failure {
                return Err(error);
            }
        }
        Err(self.contended())
    }

    /// The checkpoint object of `this`, its size and its content with the
    /// chunks it names read from the objects that hold them; what it names
    /// is recorded in `book`, if given. Missing or unreadable, it is
    /// [`StorageError::Corrupt`], as is a chunk it names that is gone.
    async fn load(
        &self,
        this: Holder,
        book: Option<&mut ChunkBook>,
    ) -> Result<(u64, CompletedCheckpoint), StorageError> {
        let path = self.checkpoint_path(this.checkpoint, this.generation);
        let location = self.url_of(&path);
        let Some(bytes) = self.get(&path).await? else {
            return Err(self.missing_checkpoint(this.checkpoint, &location));
        };
        let stored = frame::decode_checkpoint(&bytes, this.checkpoint, &location)?;
        let mut held = std::collections::HashMap::new();
        for holder in stored.other_holders(this) {
            let holder_path = self.checkpoint_path(holder.checkpoint, holder.generation);
            // Gone: named in the error of `resolve`.
            if let Some(bytes) = self.get(&holder_path).await? {
                let other = frame::decode_checkpoint(
                    &bytes,
                    holder.checkpoint,
                    &self.url_of(&holder_path),
                )?;
                held.insert(holder, other.into_chunks());
            }
        }
        let (checkpoint, references) = stored.resolve(this, &held, &location)?;
        if let Some(book) = book {
            book.read(this, references);
        }
        Ok((bytes.len() as u64, checkpoint))
    }

    /// What the checkpoint object of `this` names, read without the
    /// chunks it names.
    async fn references(&self, this: Holder) -> Result<References, StorageError> {
        let path = self.checkpoint_path(this.checkpoint, this.generation);
        let location = self.url_of(&path);
        let Some(bytes) = self.get(&path).await? else {
            return Err(self.missing_checkpoint(this.checkpoint, &location));
        };
        let stored = frame::decode_checkpoint(&bytes, this.checkpoint, &location)?;
        Ok(stored.references(this))
    }

    /// Removes every checkpoint object `head` does not name that an older
    /// generation than `head`'s stored: those of stores that lost their
    /// race, and those left by a crash between the two puts of a store.
    /// Objects of `head`'s generation or newer are left alone: a newer
    /// instance may be storing one now. Best effort: what cannot be removed
    /// now is removed at a later start.
    async fn remove_unnamed(&self, head: &Head) -> Result<(), StorageError> {
        use futures::TryStreamExt;
        let named: Vec<Path> = head
            .named()
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
            let older = meta
                .location
                .filename()
                .and_then(stored_by)
                .is_some_and(|generation| generation < head.generation);
            let is_checkpoint = own && older;
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

    /// Refuses a store that ignores conditional writes: without them there
    /// is no fencing. Writes `HEAD` with a version that cannot match, which
    /// must be refused (412, or 404 when there is no `HEAD` yet); the
    /// content written is `next`, so a store that accepts it is left as
    /// the claim would have left it.
    async fn check_conditional_writes(&self, next: &Head) -> Result<(), StorageError> {
        let bogus = UpdateVersion {
            e_tag: Some("\"eo-sink-no-such-version\"".to_string()),
            version: None,
        };
        match self.put_head(next, Some(bogus)).await {
            Ok(None) => Ok(()),
            Err(StorageError::Remote { ref source, .. })
                if source
                    .downcast_ref::<object_store::Error>()
                    .is_some_and(is_absent) =>
            {
                Ok(())
            }
            Err(error) => Err(error),
            Ok(Some(_)) => Err(StorageError::Remote {
                context: format!(
                    "{} accepted a write conditional on a version it does not hold",
                    self.url_of(&self.head_path())
                ),
                source: "conditional writes (If-Match) are ignored".into(),
                hint: "; this store cannot fence an older instance of the job: use one that \
                       honours If-Match and If-None-Match (S3 does; for other servers, check \
                       their conditional-write support)",
                permanent: true,
            }),
        }
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

/// The generation that stored the checkpoint object named `name`, if it is
/// one (`checkpoint-<id>-g<generation>.ckpt`).
fn stored_by(name: &str) -> Option<u64> {
    name.strip_prefix(CHECKPOINT_PREFIX)?
        .strip_suffix(CHECKPOINT_SUFFIX)?
        .split_once("-g")?
        .1
        .parse()
        .ok()
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
            // A restart of this instance (the runtime's restart strategy)
            // after a newer instance started must not take the storage back.
            if let Some(held) = claim.as_ref() {
                if head.generation > held.head.generation {
                    return Err(StorageError::Fenced {
                        location: inner.location.clone(),
                        generation: Generation(held.head.generation),
                        newer: Generation(head.generation),
                    });
                }
            }
            let generation = head.generation.checked_add(1).ok_or_else(|| {
                StorageError::Message(format!(
                    "{} holds generation {}, the largest there is: no start can get a new one; \
                     start the job afresh on a new prefix",
                    inner.url_of(&inner.head_path()),
                    head.generation
                ))
            })?;
            let next = Head { generation, ..head };
            if claim.is_none() {
                inner.check_conditional_writes(&next).await?;
            }
            if let Some(version) = inner.put_head(&next, version).await? {
                inner.remove_unnamed(&next).await?;
                *claim = Some(Claim {
                    head: next,
                    version,
                    lineage_removed: false,
                    book: ChunkBook::default(),
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
    async fn store(&self, checkpoint: CompletedCheckpoint) -> Result<(), StorageError> {
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
        let this = Holder {
            checkpoint: id,
            generation,
        };
        let name = inner.url_of(&path);
        let held = claim.book.held(&checkpoint);
        // Checkpoints hold every writer state (file tails among them):
        // encoded on a blocking thread, not on the async workers.
        let (bytes, references) = tokio::task::spawn_blocking(move || {
            let stored = stored_form(&checkpoint, this, &held);
            let references = stored.references(this);
            frame::encode_written(Kind::Checkpoint, &stored, &name).map(|bytes| (bytes, references))
        })
        .await
        .map_err(|e| {
            StorageError::Message(format!("encoding checkpoint {id} ended abnormally: {e}"))
        })??;
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
        // The book changes only once HEAD names this checkpoint: a store
        // that fails after the put leaves an object nothing names, and the
        // next store stores its chunks again.
        let mut book = claim.book.clone();
        book.read(this, references);
        let mut next = claim.head.clone();
        next.checkpoints.push((id, generation));
        let excess = next.checkpoints.len().saturating_sub(inner.retained);
        next.checkpoints.drain(..excess);
        // Which older checkpoints the retained ones name chunks of: read
        // once per start for those this instance did not store.
        let retained: Vec<Holder> = (next.checkpoints.iter())
            .map(|&(checkpoint, generation)| Holder {
                checkpoint,
                generation,
            })
            .collect();
        for holder in &retained {
            if !book.knows(*holder) {
                match inner.references(*holder).await {
                    Ok(references) => book.read(*holder, references),
                    Err(error) => {
                        warn!(storage = %inner.location, %error, "cannot read a retained checkpoint's references; no older checkpoint is removed");
                    }
                }
            }
        }
        next.kept = match book.keep(&retained) {
            Some(keep) => (keep.into_iter())
                .map(|holder| (holder.checkpoint, holder.generation))
                .filter(|named| !next.checkpoints.contains(named))
                .collect(),
            // Everything HEAD named stays; this checkpoint names only
            // holders the book knew, which HEAD names.
            None => (claim.head.named())
                .filter(|named| !next.checkpoints.contains(named))
                .copied()
                .collect(),
        };
        let dropped: Vec<(CheckpointId, Generation)> = (claim.head.named())
            .filter(|named| !next.named().any(|n| n == *named))
            .copied()
            .collect();
        // On failure the object stays: a write of HEAD whose answer was
        // lost may still name it. One HEAD does not name is removed by the
        // next start.
        inner.update_claimed(claim, next).await?;
        claim.book = book;
        // Older checkpoints go only now that HEAD names a newer one.
        for (old, old_generation) in dropped {
            let old_path = inner.checkpoint_path(old, old_generation);
            if let Err(error) = inner.store.delete(&old_path).await {
                warn!(object = %inner.url_of(&old_path), %error, "cannot remove an old checkpoint; it is removed at a later start");
            }
        }
        // The lineage lives in the checkpoints from now on: a start that
        // finds none (they were removed) must draw a new one, or its
        // checkpoint ids would repeat in the lineage.
        if !claim.lineage_removed {
            claim.lineage_removed = inner.remove_lineage().await;
        }
        Ok(())
    }

    /// The newest checkpoint `HEAD` names. Its object missing or unreadable
    /// is [`StorageError::Corrupt`]: never a fallback to an older one.
    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        let inner = &self.inner;
        let (head, _) = inner.read_head().await?;
        let Some(&(checkpoint, generation)) = head.as_ref().and_then(|h| h.checkpoints.last())
        else {
            return Ok(None);
        };
        let this = Holder {
            checkpoint,
            generation,
        };
        let mut claim = inner.claim.lock().await;
        let book = claim.as_mut().map(|claim| &mut claim.book);
        inner
            .load(this, book)
            .await
            .map(|(_, checkpoint)| Some(checkpoint))
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

    /// `HEAD` read again: a newer generation than this instance's claim
    /// means a newer instance started.
    async fn fenced(&self) -> Result<Option<StorageError>, StorageError> {
        let inner = &self.inner;
        let held = match inner.claim.lock().await.as_ref() {
            Some(claim) => claim.head.generation,
            None => return Ok(None),
        };
        let (head, _) = inner.read_head().await?;
        Ok(head
            .filter(|head| head.generation > held)
            .map(|head| StorageError::Fenced {
                location: inner.location.clone(),
                generation: Generation(held),
                newer: Generation(head.generation),
            }))
    }

    /// The `LINEAGE` object, created with `If-None-Match: *` by the first
    /// start that restores no checkpoint; a start that loses that race reads
    /// the winner's. Never replaced; removed once a stored checkpoint
    /// carries the lineage, and by a start over.
    async fn lineage(&self, fresh: Lineage) -> Result<Lineage, StorageError> {
        let inner = &self.inner;
        let path = inner.prefix.clone().join(LINEAGE_OBJECT);
        let location = inner.url_of(&path);
        let create = || PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        for _ in 0..2 {
            if let Some(bytes) = inner.get(&path).await? {
                return frame::decode(&bytes, Kind::Lineage, &location).map_err(
                    |error| match error {
                        StorageError::Corrupt { problem, .. } => StorageError::Message(format!(
                        "the lineage object {location} is damaged: {problem}. It names the job's \
                         lineage, so that a start finds what earlier starts left behind; remove it \
                         to start a new lineage (what earlier starts left is then left alone)"
                    )),
                        other => other,
                    },
                );
            }
            let bytes = frame::encode(Kind::Lineage, &fresh, &location)?;
            match inner
                .store
                .put_opts(&path, PutPayload::from(bytes), create())
                .await
            {
                Ok(_) => return Ok(fresh),
                // Another start created it first (or this put's lost answer
                // did): read it.
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => continue,
                Err(error) => return Err(inner.remote("writing", &path, error)),
            }
        }
        Err(StorageError::Message(format!(
            "{location} was created by another start and then could not be read; try again"
        )))
    }
}

/// The S3 store and prefix of an `s3://bucket/prefix` URL, made the way
/// every crate of the project makes them ([`sink_object_store::s3`]).
#[cfg(feature = "s3")]
fn s3_store(
    url: &str,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, Path), StorageError> {
    let s3 = sink_object_store::s3(url, options).map_err(|problem| {
        StorageError::Message(format!(
            "the checkpoint storage URL {url} is not usable: {problem}"
        ))
    })?;
    Ok((Arc::new(s3.store), s3.prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::tests::sample_checkpoint as checkpoint;
    use object_store::memory::InMemory;
    use std::sync::atomic::{AtomicBool, Ordering};

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

    /// A chunk is stored once, in the first checkpoint object that holds
    /// it; `HEAD` keeps that object while a retained checkpoint names the
    /// chunk, also through the next start (which removes what `HEAD` does
    /// not name), and it goes once none does.
    #[tokio::test]
    async fn chunks_are_stored_once_and_their_holder_kept_while_named() {
        use crate::storage::tests::{checkpoint_with_chunks as with, chunk_ids};
        use crate::storage::Chunk;
        let store = Arc::new(InMemory::new());
        let first = storage(&store).retaining(2);
        first.begin().await.unwrap();
        let big = Chunk::seal(vec![5; 100_000]);
        for id in 1..=4 {
            let small = Chunk::seal(vec![id as u8; 10]);
            first.store(with(id, &[big.clone(), small])).await.unwrap();
        }
        let checkpoint_objects = |names: Vec<String>| -> Vec<String> {
            names
                .into_iter()
                .filter(|n| n.contains("checkpoint-"))
                .collect()
        };
        let named =
            |id: u64, generation: u64| format!("state/checkpoint-{id:020}-g{generation:020}.ckpt");
        assert_eq!(
            checkpoint_objects(objects(&store).await),
            [named(1, 1), named(3, 1), named(4, 1)]
        );
        let size = |id: u64, generation: u64| {
            let store = store.clone();
            async move {
                let path = Path::from(named(id, generation));
                store.head(&path).await.unwrap().size
            }
        };
        assert!(size(4, 1).await < 1_000);

        // A new instance: its start keeps what HEAD keeps, and it reads
        // the chunk back under its id.
        let next = storage(&store).retaining(2);
        next.begin().await.unwrap();
        assert_eq!(checkpoint_objects(objects(&store).await).len(), 3);
        let restored = next.latest().await.unwrap().unwrap();
        assert_eq!(chunk_ids(&restored)[0], big.id());
        let big_again = restored.subtasks[0]
            .source_splits
            .chunks()
            .next()
            .unwrap()
            .clone();
        next.store(with(5, &[big_again])).await.unwrap();
        assert!(size(5, 2).await < 1_000);
        next.store(with(6, &[])).await.unwrap();
        next.store(with(7, &[])).await.unwrap();
        assert_eq!(
            checkpoint_objects(objects(&store).await),
            [named(6, 2), named(7, 2)]
        );
        // The first instance is fenced: its last object stays for the
        // next start to remove, and it removes nothing of the newer one's.
        assert!(first.store(with(8, &[])).await.is_err());
        assert_eq!(
            checkpoint_objects(objects(&store).await),
            [named(6, 2), named(7, 2), named(8, 1)]
        );
    }

    #[tokio::test]
    async fn stores_reads_and_retains_the_newest() {
        let store = Arc::new(InMemory::new());
        let storage = storage(&store).retaining(2);
        assert_eq!(storage.finished().await.unwrap(), None);
        assert_eq!(storage.begin().await.unwrap(), Generation(1));
        assert_eq!(storage.latest().await.unwrap(), None);
        for id in 1..=4 {
            storage.store(checkpoint(id)).await.unwrap();
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
        assert!(storage.store(checkpoint(4)).await.is_err(), "not newer");
        let marker = FinishedMarker {
            generation: Generation(1),
            last_checkpoint: Some(CheckpointId(4)),
            lost: crate::storage::LostOutput {
                commits_failed: 1,
                records_lost: 5,
                known_failures: vec![crate::KnownCommitFailure::new(
                    CheckpointId(3),
                    0,
                    "gone",
                    Some(5),
                )],
            },
        };
        storage.mark_finished(marker.clone()).await.unwrap();
        let again = self::storage(&store);
        assert_eq!(again.finished().await.unwrap(), Some(marker));
        assert_eq!(again.begin().await.unwrap(), Generation(2));
        assert_eq!(again.latest().await.unwrap(), Some(checkpoint(4)));
    }

    /// A `HEAD` written by a build of format 2 (whose finished marker kept
    /// no loss) is read, its marker with nothing lost.
    #[tokio::test]
    async fn a_head_of_format_2_is_read() {
        let old = HeadV2 {
            generation: 4,
            checkpoints: vec![(CheckpointId(9), Generation(4))],
            finished: Some(FinishedMarkerV2::new(Generation(4), Some(CheckpointId(9)))),
        };
        let bytes = frame::encode_as(Kind::Head, &old, 2);
        let head: Head = frame::decode(&bytes, Kind::Head, "HEAD").unwrap();
        assert_eq!(head.generation, 4);
        assert_eq!(head.checkpoints, vec![(CheckpointId(9), Generation(4))]);
        let finished = head.finished.unwrap();
        assert_eq!(finished.last_checkpoint, Some(CheckpointId(9)));
        assert_eq!(finished.lost, crate::storage::LostOutput::default());
    }

    #[tokio::test]
    async fn a_newer_start_fences_the_older_instance() {
        let store = Arc::new(InMemory::new());
        let older = storage(&store);
        assert_eq!(older.begin().await.unwrap(), Generation(1));
        older.store(checkpoint(1)).await.unwrap();
        let newer = storage(&store);
        assert_eq!(newer.begin().await.unwrap(), Generation(2));
        let error = older.store(checkpoint(2)).await.unwrap_err();
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
            lost: Default::default(),
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
            3,
            "HEAD, checkpoint 1 and the fenced instance's object, named by no HEAD"
        );
        newer.store(checkpoint(2)).await.unwrap();
        assert_eq!(newer.latest().await.unwrap(), Some(checkpoint(2)));
        // A restart of the fenced instance does not take the storage back.
        assert!(matches!(
            older.begin().await,
            Err(StorageError::Fenced {
                generation: Generation(1),
                newer: Generation(2),
                ..
            })
        ));
        // The next start removes the fenced instance's object.
        storage(&store).begin().await.unwrap();
        assert_eq!(objects(&store).await.len(), 3, "HEAD, checkpoints 1 and 2");
    }

    #[tokio::test]
    async fn a_head_write_whose_answer_was_lost_is_recognised_not_fenced() {
        let store = Arc::new(Flaky::default());
        let storage =
            ObjectCheckpointStorage::new(store.clone(), Path::from("state"), "memory://state");
        storage.begin().await.unwrap();
        storage.store(checkpoint(1)).await.unwrap();
        store.lose_next_answer.store(true, Ordering::SeqCst);
        storage.store(checkpoint(2)).await.unwrap();
        assert!(
            !store.lose_next_answer.load(Ordering::SeqCst),
            "the answer was lost"
        );
        assert_eq!(storage.latest().await.unwrap(), Some(checkpoint(2)));
        storage.store(checkpoint(3)).await.unwrap();
        assert_eq!(storage.latest().await.unwrap(), Some(checkpoint(3)));
    }

    #[tokio::test]
    async fn a_store_that_ignores_conditional_writes_is_refused_at_begin() {
        let store = Arc::new(Flaky::default());
        store.ignore_conditions.store(true, Ordering::SeqCst);
        let storage =
            ObjectCheckpointStorage::new(store.clone(), Path::from("state"), "memory://state");
        let error = storage.begin().await.unwrap_err();
        assert!(
            matches!(
                error,
                StorageError::Remote {
                    permanent: true,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("cannot fence"), "{error}");
    }

    /// An in-memory store that can lose the answer of its next write (the
    /// write is applied, an error returned) or ignore conditional writes.
    #[derive(Debug, Default)]
    struct Flaky {
        inner: InMemory,
        lose_next_answer: AtomicBool,
        ignore_conditions: AtomicBool,
    }

    impl std::fmt::Display for Flaky {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Flaky")
        }
    }

    #[async_trait]
    impl ObjectStore for Flaky {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            mut opts: PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            if self.ignore_conditions.load(Ordering::SeqCst) {
                opts.mode = PutMode::Overwrite;
            }
            let result = self.inner.put_opts(location, payload, opts).await?;
            if location.filename() == Some(HEAD_OBJECT)
                && self.lose_next_answer.swap(false, Ordering::SeqCst)
            {
                return Err(object_store::Error::Generic {
                    store: "Flaky",
                    source: "the connection was reset before the answer".into(),
                });
            }
            Ok(result)
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn a_store_before_begin_is_refused() {
        let store = Arc::new(InMemory::new());
        let error = storage(&store).store(checkpoint(1)).await.unwrap_err();
        assert!(
            error.to_string().contains("begin was not called"),
            "{error}"
        );
    }

    /// The lineage of starts without a checkpoint is created once, by a
    /// conditional put, and kept until a checkpoint carries it; a start
    /// over forgets it.
    #[tokio::test]
    async fn the_lineage_is_created_once_and_kept() {
        let store = Arc::new(InMemory::new());
        let first = storage(&store);
        first.begin().await.unwrap();
        let lineage = first.lineage(Lineage::new("first")).await.unwrap();
        assert_eq!(lineage, Lineage::new("first"));
        let second = storage(&store);
        second.begin().await.unwrap();
        assert_eq!(
            second.lineage(Lineage::new("second")).await.unwrap(),
            lineage
        );
        assert!(objects(&store).await.contains(&"state/LINEAGE".to_string()));
        // Once a checkpoint carries it, the checkpoints keep it: a start
        // that finds none must not reuse it (its ids would repeat).
        second.store(checkpoint(1)).await.unwrap();
        assert!(!objects(&store).await.contains(&"state/LINEAGE".to_string()));
        let third = storage(&store);
        third.begin().await.unwrap();
        assert_eq!(
            third.lineage(Lineage::new("third")).await.unwrap(),
            Lineage::new("third")
        );
        third.start_over().await.unwrap();
        assert_eq!(
            storage(&store)
                .lineage(Lineage::new("fourth"))
                .await
                .unwrap(),
            Lineage::new("fourth")
        );
    }

    #[tokio::test]
    async fn an_unreadable_newest_checkpoint_is_refused_never_skipped() {
        let store = Arc::new(InMemory::new());
        let storage = storage(&store);
        storage.begin().await.unwrap();
        storage.store(checkpoint(1)).await.unwrap();
        storage.store(checkpoint(2)).await.unwrap();
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
    async fn starting_over_raises_the_generation_and_fences() {
        let store = Arc::new(InMemory::new());
        let first = storage(&store);
        first.begin().await.unwrap();
        first.store(checkpoint(1)).await.unwrap();
        let other = storage(&store);
        other.start_over().await.unwrap();
        assert_eq!(other.latest().await.unwrap(), None);
        assert_eq!(objects(&store).await, vec!["state/HEAD".to_string()]);
        assert!(matches!(
            first.store(checkpoint(2)).await,
            Err(StorageError::Fenced {
                generation: Generation(1),
                newer: Generation(2),
                ..
            })
        ));
        assert_eq!(other.begin().await.unwrap(), Generation(3));
        let inspected = other.inspect().await.unwrap();
        assert_eq!(inspected.generation, Some(Generation(3)));
        assert!(inspected.checkpoints.is_empty());
    }

    #[tokio::test]
    async fn unnamed_checkpoint_objects_are_removed_at_the_next_start() {
        let store = Arc::new(InMemory::new());
        let first = storage(&store);
        first.begin().await.unwrap();
        first.store(checkpoint(1)).await.unwrap();
        // A crash between the checkpoint's put and HEAD's.
        let stray = Path::from("state/checkpoint-00000000000000000002-g00000000000000000001.ckpt");
        // A newer generation's: left alone (it may be being stored).
        let newer = Path::from("state/checkpoint-00000000000000000002-g00000000000000000009.ckpt");
        store.put(&newer, b"x".to_vec().into()).await.unwrap();
        store.put(&stray, b"x".to_vec().into()).await.unwrap();
        // Not this storage's: in a "directory" below its prefix.
        let other =
            Path::from("state/other/checkpoint-00000000000000000001-g00000000000000000001.ckpt");
        store.put(&other, b"x".to_vec().into()).await.unwrap();
        let second = storage(&store);
        second.begin().await.unwrap();
        assert_eq!(
            objects(&store).await.len(),
            4,
            "HEAD, checkpoint 1, the other directory's object and the newer generation's"
        );
        assert_eq!(second.latest().await.unwrap(), Some(checkpoint(1)));
    }
}
