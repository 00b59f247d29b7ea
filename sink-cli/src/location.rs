//! Where the project's programs write their output and keep their
//! checkpoints: a local directory, or an `s3://bucket/prefix` URL on S3 or
//! an S3-compatible server (endpoint, region and credentials from the usual
//! `AWS_*` environment variables, the endpoint also from `--endpoint`).
//!
//! S3 locations need the `s3` feature (on by default); a program built
//! without it refuses an `s3://` URL when it parses its flags, naming the
//! feature.

use std::path::{Path, PathBuf};

use anyhow::Context;
use async_trait::async_trait;
use sink_api::{Generation, Lineage};
#[cfg(feature = "s3")]
use sink_runtime::storage::ObjectCheckpointStorage;
use sink_runtime::storage::{
    CheckpointStorage, CompletedCheckpoint, FinishedMarker, StateDirectory, StorageError,
};
use sink_runtime::LocalCheckpointStorage;
#[cfg(feature = "s3")]
use sinks_file::ObjectOutput;
use sinks_file::{BasePathBucketAssigner, Encoder, FileSink, FileSinkBuilder};

/// A local directory or an object store prefix, as given on a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory.
    Local(PathBuf),
    /// An `s3://bucket/prefix` URL, without a trailing `/` or an empty
    /// name.
    S3(String),
}

impl Location {
    /// `text` as a location: an `s3://` URL, or else a local path. Used as
    /// a `clap` value parser.
    pub fn parse(text: &str) -> Result<Location, String> {
        if let Some(rest) = text.strip_prefix("s3://") {
            // Empty names (`//`, a trailing `/`) dropped, as object store
            // paths drop them: one prefix has one spelling.
            if rest.is_empty() || rest.starts_with('/') {
                return Err(format!(
                    "'{text}' names no bucket; write s3://bucket/prefix"
                ));
            }
            let rest = rest
                .split('/')
                .filter(|name| !name.is_empty())
                .collect::<Vec<_>>()
                .join("/");
            if cfg!(not(feature = "s3")) {
                return Err(without_s3(text));
            }
            return Ok(Location::S3(format!("s3://{rest}")));
        }
        if text.contains("://") {
            return Err(format!("'{text}' is neither a local path nor an s3:// URL"));
        }
        Ok(Location::Local(PathBuf::from(text)))
    }

    /// The location `name` inside this one.
    pub fn join(&self, name: &str) -> Location {
        match self {
            Location::Local(dir) => Location::Local(dir.join(name)),
            Location::S3(url) => Location::S3(format!("{url}/{name}")),
        }
    }

    /// The local directory, if it is one.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Location::Local(dir) => Some(dir),
            Location::S3(_) => None,
        }
    }
}

/// Why `what` (an `s3://` URL) is refused by a program built without the
/// `s3` feature, naming the fix.
fn without_s3(what: &str) -> String {
    format!(
        "{what} is on S3, and this program was built without S3 support; \
         build it with `--features s3`"
    )
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(dir) => write!(f, "{}", dir.display()),
            Location::S3(url) => f.write_str(url),
        }
    }
}

/// The client options of an `--endpoint` flag: the endpoint, and plain
/// HTTP allowed when it is an `http://` one (a local test server).
pub fn s3_options(endpoint: Option<&str>) -> Vec<(String, String)> {
    let mut options = Vec::new();
    if let Some(endpoint) = endpoint {
        options.push(("endpoint".to_string(), endpoint.to_string()));
        if endpoint.starts_with("http://") {
            options.push(("allow_http".to_string(), "true".to_string()));
        }
    }
    options
}

/// The object store output at `url`.
#[cfg(feature = "s3")]
pub fn object_output(url: &str, options: &[(String, String)]) -> anyhow::Result<ObjectOutput> {
    ObjectOutput::s3(url, options).with_context(|| format!("configuring the output {url}"))
}

/// A file sink builder writing to `out`.
pub fn file_sink_builder<T, E: Encoder<T>>(
    out: &Location,
    encoder: E,
    options: &[(String, String)],
) -> anyhow::Result<FileSinkBuilder<T, E, BasePathBucketAssigner>> {
    Ok(match out {
        Location::Local(dir) => FileSink::builder(dir, encoder),
        #[cfg(feature = "s3")]
        Location::S3(url) => FileSink::object_store_builder(object_output(url, options)?, encoder),
        #[cfg(not(feature = "s3"))]
        Location::S3(url) => {
            let _ = options; // no S3 client to give them to
            anyhow::bail!(without_s3(url))
        }
    })
}

/// How many finished files (or objects) are in `out`.
pub async fn finished_count(out: &Location, options: &[(String, String)]) -> anyhow::Result<usize> {
    Ok(match out {
        Location::Local(dir) => sinks_file::finished_files(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .len(),
        #[cfg(feature = "s3")]
        Location::S3(url) => sinks_file::finished_objects(&object_output(url, options)?)
            .await
            .with_context(|| format!("listing {url}"))?
            .len(),
        #[cfg(not(feature = "s3"))]
        Location::S3(url) => {
            let _ = options; // no S3 client to give them to
            anyhow::bail!(without_s3(url))
        }
    })
}

/// The content of each finished file (or object) in `out`, in the order of
/// their names: what a reader of the output sees. Called by the demos'
/// end checks; reads everything into memory.
pub async fn finished_contents(
    out: &Location,
    options: &[(String, String)],
) -> anyhow::Result<Vec<Vec<u8>>> {
    match out {
        Location::Local(dir) => {
            let dir = dir.clone();
            // Off the async workers: the output may be large.
            tokio::task::spawn_blocking(move || {
                let files = sinks_file::finished_files(&dir)
                    .with_context(|| format!("reading {}", dir.display()))?;
                files
                    .iter()
                    .map(|path| {
                        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
                    })
                    .collect()
            })
            .await?
        }
        #[cfg(feature = "s3")]
        Location::S3(url) => {
            let output = object_output(url, options)?;
            let objects = sinks_file::finished_objects(&output)
                .await
                .with_context(|| format!("listing {url}"))?;
            let mut contents = Vec::with_capacity(objects.len());
            for object in objects {
                let bytes = sinks_file::read_object(&output, &object)
                    .await
                    .with_context(|| format!("reading {object} under {url}"))?;
                contents.push(bytes.to_vec());
            }
            Ok(contents)
        }
        #[cfg(not(feature = "s3"))]
        Location::S3(url) => {
            let _ = options; // no S3 client to give them to
            anyhow::bail!(without_s3(url))
        }
    }
}

/// Checkpoint storage in a local state directory or on an object store:
/// what the programs give to their job or pipeline builders.
///
/// Non-exhaustive: the `s3` feature adds a variant, so matches outside this
/// crate need a wildcard arm.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Storage {
    /// A local state directory, locked while open.
    Local(LocalCheckpointStorage),
    /// An object store prefix, fenced by conditional writes (with the `s3`
    /// feature).
    #[cfg(feature = "s3")]
    Object(ObjectCheckpointStorage),
}

impl Storage {
    /// Opens the checkpoint storage at `location`: a local directory is
    /// created and locked (refused while another instance holds it); an
    /// object store prefix is only configured here, and claimed when the
    /// job starts.
    pub fn open(
        location: &Location,
        options: &[(String, String)],
    ) -> Result<Storage, StorageError> {
        Ok(match location {
            Location::Local(dir) => Storage::Local(LocalCheckpointStorage::open(dir)?),
            #[cfg(feature = "s3")]
            Location::S3(url) => Storage::Object(object_storage(url, options)?),
            #[cfg(not(feature = "s3"))]
            Location::S3(url) => {
                let _ = options; // no S3 client to give them to
                return Err(StorageError::Message(without_s3(url)));
            }
        })
    }

    /// Forgets the job's progress (see the storages' `start_over`).
    pub async fn start_over(&self) -> Result<(), StorageError> {
        match self {
            Storage::Local(storage) => storage.start_over(),
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.start_over().await,
        }
    }
}

/// What the checkpoint storage at `location` holds, read without claiming
/// or locking it (a running job is not disturbed). Called by
/// `sink-inspect`.
pub async fn inspect(
    location: &Location,
    options: &[(String, String)],
) -> Result<StateDirectory, StorageError> {
    match location {
        Location::Local(dir) => LocalCheckpointStorage::inspect(dir),
        #[cfg(feature = "s3")]
        Location::S3(url) => object_storage(url, options)?.inspect().await,
        #[cfg(not(feature = "s3"))]
        Location::S3(url) => {
            let _ = options; // no S3 client to give them to
            Err(StorageError::Message(without_s3(url)))
        }
    }
}

/// The checkpoint storage at an `s3://` URL, configured but not claimed.
/// Called by [`Storage::open`] and [`inspect`].
#[cfg(feature = "s3")]
pub fn object_storage(
    url: &str,
    options: &[(String, String)],
) -> Result<ObjectCheckpointStorage, StorageError> {
    ObjectCheckpointStorage::s3(url, options)
}

/// The Delta table at `location`: a local directory (created if missing) or
/// an `s3://` URL, whose client is made as the project makes every S3 client.
/// Called by the Delta demo and the ingest service's Delta destination.
#[cfg(feature = "delta")]
pub fn delta_table(
    location: &Location,
    options: &[(String, String)],
) -> anyhow::Result<sinks_delta::TableLocation> {
    Ok(match location {
        Location::Local(dir) => {
            sink_local_fs::create_dir_all(dir).with_context(|| {
                format!(
                    "creating the table directory {}; pass an --out you can write to",
                    dir.display()
                )
            })?;
            sinks_delta::TableLocation::local(dir)?
        }
        Location::S3(url) => {
            let output = object_output(url, options)?;
            // The client's root is the bucket: the table's path is the URL's.
            let root: std::sync::Arc<dyn object_store::ObjectStore> = output.store();
            let parsed = url::Url::parse(url).with_context(|| format!("parsing {url}"))?;
            sinks_delta::TableLocation::object_store(root, parsed)
        }
    })
}

#[async_trait]
impl CheckpointStorage for Storage {
    async fn begin(&self) -> Result<Generation, StorageError> {
        match self {
            Storage::Local(storage) => storage.begin().await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.begin().await,
        }
    }

    async fn store(&self, checkpoint: CompletedCheckpoint) -> Result<(), StorageError> {
        match self {
            Storage::Local(storage) => storage.store(checkpoint).await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.store(checkpoint).await,
        }
    }

    async fn latest(&self) -> Result<Option<CompletedCheckpoint>, StorageError> {
        match self {
            Storage::Local(storage) => storage.latest().await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.latest().await,
        }
    }

    async fn mark_finished(&self, marker: FinishedMarker) -> Result<(), StorageError> {
        match self {
            Storage::Local(storage) => storage.mark_finished(marker).await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.mark_finished(marker).await,
        }
    }

    async fn finished(&self) -> Result<Option<FinishedMarker>, StorageError> {
        match self {
            Storage::Local(storage) => storage.finished().await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.finished().await,
        }
    }

    async fn lineage(&self, fresh: Lineage) -> Result<Lineage, StorageError> {
        match self {
            Storage::Local(storage) => storage.lineage(fresh).await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.lineage(fresh).await,
        }
    }

    async fn fenced(&self) -> Result<Option<StorageError>, StorageError> {
        match self {
            Storage::Local(storage) => storage.fenced().await,
            #[cfg(feature = "s3")]
            Storage::Object(storage) => storage.fenced().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_locations_parse_and_join() {
        assert_eq!(
            Location::parse("./out").unwrap().join(".state"),
            Location::Local(PathBuf::from("./out/.state"))
        );
        assert!(Location::parse("s3://").is_err());
        assert!(Location::parse("gs://bucket/x").is_err());
    }

    #[cfg(feature = "s3")]
    #[test]
    fn s3_locations_parse_and_join() {
        assert_eq!(
            Location::parse("s3://bucket/out/").unwrap(),
            Location::S3("s3://bucket/out".into())
        );
        assert_eq!(
            Location::parse("s3://bucket//a///b/").unwrap(),
            Location::S3("s3://bucket/a/b".into())
        );
        assert_eq!(
            Location::parse("s3://bucket/out").unwrap().join(".state"),
            Location::S3("s3://bucket/out/.state".into())
        );
    }

    #[test]
    fn an_http_endpoint_allows_plain_http() {
        assert_eq!(
            s3_options(Some("http://127.0.0.1:9000")),
            vec![
                ("endpoint".to_string(), "http://127.0.0.1:9000".to_string()),
                ("allow_http".to_string(), "true".to_string())
            ]
        );
        assert_eq!(s3_options(Some("https://s3.example")).len(), 1);
        assert!(s3_options(None).is_empty());
    }

    #[test]
    fn without_the_s3_feature_an_s3_url_is_refused_naming_it() {
        let error = without_s3("s3://bucket/out");
        assert!(error.contains("s3://bucket/out"), "{error}");
        assert!(error.contains("--features s3"), "{error}");
        if cfg!(not(feature = "s3")) {
            assert_eq!(Location::parse("s3://bucket/out"), Err(error));
        }
    }
}
