//! The multipart uploads in progress under a key prefix: S3's
//! `ListMultipartUploads`, which `object_store` does not offer, sent with
//! `object_store`'s own HTTP client and request signer (SigV4), to the same
//! bucket endpoint its client uses.
//!
//! Called by the file sink at a start, to abort an upload that a crashed
//! start created but recorded nowhere (it died between creating the upload
//! and writing the upload's id down). Readers never see such an upload, but
//! the bucket keeps and bills it until it is aborted.
//!
//! ```text
//! GET <bucket endpoint>?uploads&prefix=<key>   (signed like any request of the client)
//!   └─ ListMultipartUploadsResult: Upload { Key, UploadId }…, IsTruncated → next page
//! ```

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer, AwsCredential};
use object_store::client::{HttpClient, HttpConnector, HttpRequest, HttpRequestBody};
use object_store::path::Path;
use object_store::{ClientConfigKey, ClientOptions, CredentialProvider};
use serde::Deserialize;

/// The pages a listing follows before it gives up (1000 uploads a page).
const MAX_PAGES: usize = 1000;

/// Lists the multipart uploads in progress in one bucket.
///
/// Made by [`s3`](crate::s3) with the client ([`S3Prefix::uploads`](crate::S3Prefix));
/// `None` there for an S3 Express bucket, whose endpoint it does not derive.
#[derive(Clone)]
pub struct S3Uploads {
    /// The bucket's endpoint, as `object_store` derives it: the configured
    /// endpoint (with the bucket in its path unless requests are
    /// virtual-hosted), or AWS's regional one.
    bucket_url: String,
    region: String,
    credentials: Arc<dyn CredentialProvider<Credential = AwsCredential>>,
    skip_signature: bool,
    client: HttpClient,
}

impl std::fmt::Debug for S3Uploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Uploads")
            .field("bucket_url", &self.bucket_url)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// One multipart upload in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadInProgress {
    /// The key the upload completes into.
    pub key: String,
    /// The upload's id, for `abort_multipart`.
    pub upload_id: String,
}

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum ListUploadsError {
    /// The request did not get an answer (connection, timeout).
    #[error("ListMultipartUploads got no answer")]
    Request(#[source] object_store::client::HttpError),
    /// The server refused it.
    #[error("ListMultipartUploads was answered {status}: {body}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body (S3's error document).
        body: String,
    },
    /// The answer is not a `ListMultipartUploadsResult`.
    #[error("the answer to ListMultipartUploads cannot be read: {0}")]
    Answer(String),
    /// The client's credentials could not be had.
    #[error("the credentials for ListMultipartUploads")]
    Credentials(#[source] object_store::Error),
    /// More pages than a listing follows (1000).
    #[error("ListMultipartUploads returned more than {MAX_PAGES} pages")]
    TooManyPages,
}

impl ListUploadsError {
    /// Whether trying again later may succeed: no answer, or the server
    /// busy or failing (429, 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            ListUploadsError::Request(_) => true,
            ListUploadsError::Refused { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

impl S3Uploads {
    /// The lister of the bucket `bucket` that `builder` (before its
    /// `build`) would reach, signing with `credentials`, the built client's.
    /// `None` for S3 Express.
    pub(crate) fn new(
        builder: &AmazonS3Builder,
        bucket: &str,
        credentials: Arc<dyn CredentialProvider<Credential = AwsCredential>>,
    ) -> Result<Option<S3Uploads>, object_store::Error> {
        let value = |key: AmazonS3ConfigKey| builder.get_config_value(&key);
        let truthy = |key: AmazonS3ConfigKey| {
            value(key).is_some_and(|v| {
                matches!(
                    v.to_ascii_lowercase().as_str(),
                    "true" | "1" | "yes" | "on" | "y"
                )
            })
        };
        if truthy(AmazonS3ConfigKey::S3Express) {
            return Ok(None);
        }
        let region = value(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        let virtual_hosted = truthy(AmazonS3ConfigKey::VirtualHostedStyleRequest);
        let bucket_url = match (value(AmazonS3ConfigKey::Endpoint), virtual_hosted) {
            (Some(endpoint), true) => endpoint,
            (Some(endpoint), false) => format!("{}/{bucket}", endpoint.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let mut options = ClientOptions::new();
        for key in [
            ClientConfigKey::AllowHttp,
            ClientConfigKey::AllowInvalidCertificates,
            ClientConfigKey::ConnectTimeout,
            ClientConfigKey::Timeout,
            ClientConfigKey::ProxyUrl,
            ClientConfigKey::ProxyCaCertificate,
            ClientConfigKey::ProxyExcludes,
            ClientConfigKey::UserAgent,
        ] {
            if let Some(v) = value(AmazonS3ConfigKey::Client(key)) {
                options = options.with_config(key, v);
            }
        }
        let client = object_store::client::ReqwestConnector::default().connect(&options)?;
        Ok(Some(S3Uploads {
            bucket_url,
            region,
            credentials,
            skip_signature: truthy(AmazonS3ConfigKey::SkipSignature),
            client,
        }))
    }

    /// Every upload in progress whose key starts with `prefix`, page after
    /// page.
    pub async fn list(&self, prefix: &Path) -> Result<Vec<UploadInProgress>, ListUploadsError> {
        let mut uploads = Vec::new();
        let mut markers: Option<(String, String)> = None;
        for _ in 0..MAX_PAGES {
            let page = self.page(prefix, markers.as_ref()).await?;
            uploads.extend(page.uploads.into_iter().map(|u| UploadInProgress {
                key: u.key,
                upload_id: u.upload_id,
            }));
            let next = page
                .next_key_marker
                .filter(|m| !m.is_empty())
                .zip(page.next_upload_id_marker.filter(|m| !m.is_empty()));
            match next {
                Some(next) if page.is_truncated => markers = Some(next),
                _ => return Ok(uploads),
            }
        }
        Err(ListUploadsError::TooManyPages)
    }

    async fn page(
        &self,
        prefix: &Path,
        markers: Option<&(String, String)>,
    ) -> Result<ListPage, ListUploadsError> {
        let mut url = url::Url::parse(&self.bucket_url)
            .map_err(|e| ListUploadsError::Answer(format!("the bucket URL: {e}")))?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("uploads", "");
            query.append_pair("prefix", prefix.as_ref());
            if let Some((key, upload_id)) = markers {
                query.append_pair("key-marker", key);
                query.append_pair("upload-id-marker", upload_id);
            }
        }
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.uri_mut() = url
            .as_str()
            .parse()
            .map_err(|e| ListUploadsError::Answer(format!("the request URL {url}: {e}")))?;
        if !self.skip_signature {
            let credential = self
                .credentials
                .get_credential()
                .await
                .map_err(ListUploadsError::Credentials)?;
            AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut request, None);
        }
        let answer = self
            .client
            .execute(request)
            .await
            .map_err(ListUploadsError::Request)?;
        let status = answer.status();
        let body = answer
            .into_body()
            .bytes()
            .await
            .map_err(ListUploadsError::Request)?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(ListUploadsError::Refused {
                status: status.as_u16(),
                body: text.chars().take(512).collect(),
            });
        }
        let text = std::str::from_utf8(&body)
            .map_err(|e| ListUploadsError::Answer(format!("not UTF-8: {e}")))?;
        quick_xml::de::from_str(text).map_err(|e| ListUploadsError::Answer(e.to_string()))
    }
}

/// One page of a `ListMultipartUploadsResult`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListPage {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<UploadElement>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UploadElement {
    key: String,
    upload_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_with_uploads_and_a_next_marker_is_read() {
        let page: ListPage = quick_xml::de::from_str(
            r#"<?xml version="1.0" encoding="UTF-8"?>
            <ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
              <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
              <NextKeyMarker>out/b.txt</NextKeyMarker><NextUploadIdMarker>id-2</NextUploadIdMarker>
              <Prefix>out/</Prefix><MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>
              <Upload><Key>out/a.txt</Key><UploadId>id-1</UploadId><Initiated>2026-12-03T00:00:00.000Z</Initiated></Upload>
              <Upload><Key>out/b.txt</Key><UploadId>id-2</UploadId></Upload>
            </ListMultipartUploadsResult>"#,
        )
        .unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.next_key_marker.as_deref(), Some("out/b.txt"));
        assert_eq!(page.next_upload_id_marker.as_deref(), Some("id-2"));
        let ids: Vec<_> = page.uploads.iter().map(|u| u.upload_id.as_str()).collect();
        assert_eq!(ids, ["id-1", "id-2"]);
    }

    /// No answer, or a busy or failing server, is worth another try; a
    /// refusal (credentials, a missing bucket) or an unreadable answer is
    /// not.
    #[test]
    fn only_a_missing_answer_or_a_busy_server_is_transient() {
        let refused = |status| ListUploadsError::Refused {
            status,
            body: String::new(),
        };
        for (error, transient) in [
            (refused(503), true),
            (refused(500), true),
            (refused(429), true),
            (refused(403), false),
            (refused(404), false),
            (ListUploadsError::Answer("x".into()), false),
            (ListUploadsError::TooManyPages, false),
        ] {
            assert_eq!(error.is_transient(), transient, "{error}");
        }
    }

    #[test]
    fn an_empty_listing_is_read() {
        let page: ListPage = quick_xml::de::from_str(
            "<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>false</IsTruncated>\
             </ListMultipartUploadsResult>",
        )
        .unwrap();
        assert!(!page.is_truncated && page.uploads.is_empty());
    }

    #[test]
    fn the_bucket_endpoint_is_the_clients() {
        let credentials: Arc<dyn CredentialProvider<Credential = AwsCredential>> =
            Arc::new(object_store::StaticCredentialProvider::new(AwsCredential {
                key_id: "k".into(),
                secret_key: "s".into(),
                token: None,
            }));
        let url = |builder: AmazonS3Builder| {
            S3Uploads::new(&builder, "b", credentials.clone())
                .unwrap()
                .map(|u| u.bucket_url)
        };
        let base = AmazonS3Builder::new().with_region("eu-west-1");
        assert_eq!(
            url(base.clone()).as_deref(),
            Some("https://s3.eu-west-1.amazonaws.com/b")
        );
        assert_eq!(
            url(base.clone().with_virtual_hosted_style_request(true)).as_deref(),
            Some("https://b.s3.eu-west-1.amazonaws.com")
        );
        assert_eq!(
            url(base.clone().with_endpoint("http://127.0.0.1:9000/")).as_deref(),
            Some("http://127.0.0.1:9000/b")
        );
        assert_eq!(
            url(base.with_s3_express(true)),
            None,
            "S3 Express is not listed"
        );
    }
}
