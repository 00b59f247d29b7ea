//! How the crates of the exactly-once sink SDK reach object storage: an
//! `s3://bucket/prefix` URL and a list of options become an
//! [`object_store`] client and the prefix under it, configured and retried
//! the same way wherever the project stores something (checkpoints in
//! `sink-runtime`, output in `sinks-file`, tables in the programs).
//!
//! Called when a storage, an output or a table is configured, before a job
//! starts: nothing is contacted here, so a missing bucket or wrong
//! credentials are reported by the first request, which the caller makes
//! before any record is written.
//!
//! ```
//! let s3 = sink_object_store::s3(
//!     "s3://bucket/jobs/orders",
//!     &[("endpoint".into(), "http://127.0.0.1:9000".into()), ("allow_http".into(), "true".into())],
//! )
//! .unwrap();
//! assert_eq!(s3.prefix.as_ref(), "jobs/orders");
//! assert!(sink_object_store::s3("gs://bucket/x", &[]).unwrap_err().to_string().contains("s3://"));
//! ```

mod uploads;

use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::RetryConfig;

pub use uploads::{ListUploadsError, S3Uploads, UploadInProgress};

/// How long a request is retried before its error reaches the caller (whose
/// restart strategy then applies): long enough to ride out a server's
/// restart, short enough that a job does not hang on a dead endpoint.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// An S3 client and the prefix its objects are under, made by [`s3`].
#[derive(Debug)]
pub struct S3Prefix {
    /// The client of the URL's bucket.
    pub store: AmazonS3,
    /// The URL's path inside the bucket, without leading or trailing `/`
    /// (empty for the bucket's root).
    pub prefix: Path,
    /// The bucket's multipart uploads in progress, listed with the client's
    /// endpoint and credentials (`None` for S3 Express buckets).
    pub uploads: Option<S3Uploads>,
}

/// Why a URL or an option cannot make a client. The message says what to
/// change; callers put the URL's role in front ("the output URL … is not
/// usable: …").
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct S3UrlError(String);

/// The client and prefix of an `s3://bucket/prefix` URL, on AWS or an
/// S3-compatible server. Endpoint, region and credentials come from the usual
/// AWS environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`,
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`, ...), then
/// from `options` (keys of [`AmazonS3ConfigKey`], such as `endpoint` or
/// `allow_http`), which win. Requests are retried for at most
/// [`RETRY_TIMEOUT`].
///
/// Called by `ObjectCheckpointStorage::s3` and `ObjectOutput::s3`, and by
/// programs that open a Delta table on S3. Contacts nothing.
pub fn s3(url: &str, options: &[(String, String)]) -> Result<S3Prefix, S3UrlError> {
    let invalid = |problem: String| S3UrlError(problem);
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
    let retry = RetryConfig {
        max_retries: 5,
        retry_timeout: RETRY_TIMEOUT,
        ..RetryConfig::default()
    };
    let store = builder
        .clone()
        .with_retry(retry)
        .build()
        .map_err(|e| invalid(e.to_string()))?;
    let bucket = parsed.host_str().unwrap_or_default();
    let uploads = S3Uploads::new(&builder, bucket, store.credentials().clone())
        .map_err(|e| invalid(e.to_string()))?;
    let prefix = Path::from_url_path(parsed.path()).map_err(|e| invalid(e.to_string()))?;
    Ok(S3Prefix {
        store,
        prefix,
        uploads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_the_s3_scheme_and_options_known_keys() {
        assert_eq!(s3("s3://b", &[]).unwrap().prefix.as_ref(), "");
        assert_eq!(s3("s3://b/p/q/", &[]).unwrap().prefix.as_ref(), "p/q");
        assert!(s3("file:///tmp/x", &[])
            .unwrap_err()
            .to_string()
            .contains("must start with s3://"));
        assert!(s3("not a url", &[]).is_err());
        let error = s3("s3://b/p", &[("no_such_key".into(), "1".into())]).unwrap_err();
        assert!(error.to_string().contains("option no_such_key"), "{error}");
    }
}
