//! Where the file sink writes when its output is an object store: the
//! store, the prefix under which objects go, and the store's rules for
//! multipart uploads.
//!
//! The layout under the prefix mirrors a local output directory:
//!
//! ```text
//! PREFIX/.file-sink-id                          the output's identity (created once, by a conditional put)
//! PREFIX/.uploads/<lineage>/<generation>/<writer id>-<n>   one marker per multipart upload in progress: its key and id
//! PREFIX/<bucket>/part-<writer id>-<n><suffix>  finished objects, visible once their upload completes
//! ```

use std::sync::Arc;

use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::ObjectStore;
use sink_api::SinkError;

use crate::upload_listing::ListUploads;

/// What the file sink needs of an object store: plain objects and multipart
/// uploads whose ids survive the process (to complete an upload after a
/// restart). Implemented by every store that implements both traits of
/// `object_store` (S3 and S3-compatible servers, GCS, Azure, in-memory).
pub trait ObjectOutputStore: ObjectStore + MultipartStore {}

impl<S: ObjectStore + MultipartStore> ObjectOutputStore for S {}

#[cfg(feature = "s3")]
use crate::multipart_limits::S3_MINIMUM_PART_SIZE;

/// An object store output of the file sink: given to
/// [`FileSink::object_store_builder`](crate::FileSink::object_store_builder).
#[derive(Clone)]
pub struct ObjectOutput {
    pub(crate) store: Arc<dyn ObjectOutputStore>,
    pub(crate) prefix: Path,
    /// How the output is named in messages and in checkpoints (for
    /// messages only), such as `s3://bucket/out`.
    pub(crate) location: String,
    /// The smallest part the store accepts (but the last).
    pub(crate) minimum_part_size: usize,
    /// How uploads in progress into a key are found, if the store can say.
    pub(crate) upload_listing: Option<Arc<dyn ListUploads>>,
}

impl std::fmt::Debug for ObjectOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectOutput")
            .field("location", &self.location)
            .field("minimum_part_size", &self.minimum_part_size)
            .finish_non_exhaustive()
    }
}

impl ObjectOutput {
    /// Objects under `prefix` of `store`, named `location` in messages
    /// (such as `memory://out`). The store is taken to accept parts of any
    /// size; say otherwise with [`minimum_part_size`](Self::minimum_part_size)
    /// (for an S3 store built by hand: [`S3_MINIMUM_PART_SIZE`](crate::S3_MINIMUM_PART_SIZE)).
    pub fn new(
        store: Arc<dyn ObjectOutputStore>,
        prefix: Path,
        location: impl Into<String>,
    ) -> ObjectOutput {
        ObjectOutput {
            store,
            prefix,
            location: location.into().trim_end_matches('/').to_string(),
            minimum_part_size: 1,
            upload_listing: None,
        }
    }

    /// How this output finds the multipart uploads in progress into a key
    /// (on S3, `ListMultipartUploads`; [`ObjectOutput::s3`] sets it). With
    /// it, a start aborts an upload that a crashed start created but had not
    /// yet recorded; without it, such an upload is left to the bucket's
    /// lifecycle rule, with a warning.
    pub fn with_upload_listing(mut self, listing: Arc<dyn ListUploads>) -> ObjectOutput {
        self.upload_listing = Some(listing);
        self
    }

    /// The smallest part (but the last) the store accepts in a multipart
    /// upload: the sink's part size may not be smaller.
    pub fn minimum_part_size(mut self, bytes: usize) -> ObjectOutput {
        self.minimum_part_size = bytes.max(1);
        self
    }

    /// Objects under an `s3://bucket/prefix` URL, on AWS or an
    /// S3-compatible server. Endpoint, region and credentials come from the
    /// usual AWS environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`...),
    /// then from `options` (keys of `object_store::aws::AmazonS3ConfigKey`,
    /// such as `endpoint`), which win. Requests are retried for at most 30 s
    /// before an error reaches the job (whose restart strategy applies).
    /// Parts must be at least [`S3_MINIMUM_PART_SIZE`].
    ///
    /// Nothing is contacted here: a missing bucket or wrong credentials are
    /// reported when the job starts, before any record is written.
    #[cfg(feature = "s3")]
    pub fn s3(url: &str, options: &[(String, String)]) -> Result<ObjectOutput, SinkError> {
        let s3 = sink_object_store::s3(url, options).map_err(|problem| {
            SinkError::msg(format!("the output URL {url} is not usable: {problem}")).permanent()
        })?;
        let output = ObjectOutput::new(Arc::new(s3.store), s3.prefix, url)
            .minimum_part_size(S3_MINIMUM_PART_SIZE);
        Ok(match s3.uploads {
            Some(uploads) => output.with_upload_listing(Arc::new(uploads)),
            None => output,
        })
    }

    /// The store the output writes to, for readers and tools that need it
    /// directly.
    pub fn store(&self) -> Arc<dyn ObjectOutputStore> {
        self.store.clone()
    }

    /// The prefix the output's objects are under.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The output's name in messages, such as `s3://bucket/out`.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The object path of `relative` (a `/`-separated path under the
    /// prefix).
    pub(crate) fn path(&self, relative: &str) -> Path {
        relative
            .split('/')
            .filter(|part| !part.is_empty())
            .fold(self.prefix.clone(), |path, part| path.join(part))
    }

    /// The path of `location` relative to the prefix, as [`path`](Self::path)
    /// takes it (the whole location if it is not under the prefix).
    pub(crate) fn relative(&self, location: &Path) -> String {
        location
            .prefix_match(&self.prefix)
            .map(|parts| {
                parts
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| location.to_string())
    }

    /// Whether `error` says the object (or upload) does not exist, as
    /// opposed to its bucket: S3 answers 404 for both, with `NoSuchBucket`
    /// in the body for the bucket.
    pub(crate) fn is_absent(error: &object_store::Error) -> bool {
        matches!(error, object_store::Error::NotFound { .. })
            && !error.to_string().contains("NoSuchBucket")
    }

    /// `relative` as a URL, for messages.
    pub(crate) fn url_of(&self, relative: &str) -> String {
        format!("{}/{relative}", self.location)
    }

    /// An error of the store while `doing` something to `relative`, with a
    /// hint; permanent when no retry can help (credentials, a missing
    /// bucket).
    pub(crate) fn error(
        &self,
        doing: &str,
        relative: &str,
        error: object_store::Error,
    ) -> SinkError {
        let text = error.to_string();
        let (hint, permanent) = match &error {
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => (
                " (the credentials are missing, wrong, or not allowed to write there: \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the output's options)",
                true,
            ),
            _ if text.contains("NoSuchBucket") => (
                " (the bucket does not exist: create it, or correct the output URL)",
                true,
            ),
            _ if text.contains("InvalidAccessKeyId") || text.contains("SignatureDoesNotMatch") => (
                " (the credentials are wrong: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
                 the output's options)",
                true,
            ),
            _ => ("", false),
        };
        let error = SinkError::other(format!("{doing} {}{hint}", self.url_of(relative)), error);
        if permanent {
            error.permanent()
        } else {
            error
        }
    }
}
