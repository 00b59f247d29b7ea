//! SigV4 for REST catalogs behind AWS's request signing (the Iceberg REST
//! endpoints of Glue and S3 Tables, or any catalog that takes SigV4).
//!
//! iceberg-catalog-rest 0.10.1 sends its requests with a plain `reqwest`
//! client and has no hook to sign them. So a catalog with
//! `rest.sigv4-enabled=true` is given a signing proxy on loopback as its
//! URI: each request it receives is signed with SigV4 (object_store's
//! `AwsAuthorizer`, the signer the project's S3 client uses) and forwarded
//! to the real catalog over HTTPS or HTTP, and the answer is passed back.
//!
//! ```text
//! RestCatalog ──http──▶ 127.0.0.1:<port> (this proxy) ──signed──▶ the catalog's URI
//! ```
//!
//! One proxy per catalog URI and signing settings, started at the first
//! open and kept for the process, on a thread of its own (so that it
//! outlives the runtime that opened it: tests and programs open catalogs
//! from several). It listens on loopback only.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use sink_api::SinkError;

/// The properties that turn signing on and configure it, by PyIceberg's
/// names.
pub(super) const ENABLED: &str = "rest.sigv4-enabled";
const REGION: &str = "rest.signing-region";
const SERVICE: &str = "rest.signing-name";
const ACCESS_KEY_ID: &str = "client.access-key-id";
const SECRET_ACCESS_KEY: &str = "client.secret-access-key";
const SESSION_TOKEN: &str = "client.session-token";

/// Secret properties among those (never printed).
pub(super) const SECRETS: &[&str] = &[SECRET_ACCESS_KEY, SESSION_TOKEN];

/// How requests are signed: the credential, the service name and the
/// region.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Signing {
    key_id: String,
    secret_key: String,
    token: Option<String>,
    service: String,
    region: String,
}

impl Signing {
    /// The signing settings `properties` give, if `rest.sigv4-enabled` is
    /// `true`: `rest.signing-region` (or `client.region`, or `AWS_REGION`),
    /// `rest.signing-name` (default `execute-api`, as PyIceberg's), and
    /// the credential from `client.access-key-id`,
    /// `client.secret-access-key` and `client.session-token`, else from the
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`
    /// variables.
    ///
    /// # Errors
    /// A permanent error naming what is missing.
    pub(super) fn from_properties(
        properties: &std::collections::BTreeMap<String, String>,
    ) -> Result<Option<Signing>, SinkError> {
        let enabled = properties
            .get(ENABLED)
            .is_some_and(|value| value.eq_ignore_ascii_case("true"));
        if !enabled {
            return Ok(None);
        }
        let get = |key: &str, variable: &str| {
            properties
                .get(key)
                .cloned()
                .or_else(|| std::env::var(variable).ok())
                .filter(|value| !value.is_empty())
        };
        let missing = |what: &str| {
            SinkError::msg(format!(
                "{ENABLED}=true needs {what} to sign the catalog's requests with"
            ))
            .permanent()
        };
        let region = properties
            .get(REGION)
            .or_else(|| properties.get("client.region"))
            .cloned()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .ok_or_else(|| missing(&format!("a region ({REGION}, or AWS_REGION)")))?;
        Ok(Some(Signing {
            key_id: get(ACCESS_KEY_ID, "AWS_ACCESS_KEY_ID").ok_or_else(|| {
                missing(&format!("a key id ({ACCESS_KEY_ID}, or AWS_ACCESS_KEY_ID)"))
            })?,
            secret_key: get(SECRET_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY").ok_or_else(|| {
                missing(&format!(
                    "a secret key ({SECRET_ACCESS_KEY}, or AWS_SECRET_ACCESS_KEY)"
                ))
            })?,
            token: get(SESSION_TOKEN, "AWS_SESSION_TOKEN"),
            service: properties
                .get(SERVICE)
                .cloned()
                .unwrap_or_else(|| "execute-api".to_string()),
            region,
        }))
    }
}

/// The proxies started in this process, by upstream URI and signing.
type Proxies = Mutex<HashMap<(String, Signing), String>>;

/// The URI of the signing proxy in front of `upstream` (started now if
/// none is), to give the REST catalog instead of `upstream`.
pub(super) fn proxy_for(upstream: &str, signing: &Signing) -> Result<String, SinkError> {
    static PROXIES: OnceLock<Proxies> = OnceLock::new();
    let proxies = PROXIES.get_or_init(Proxies::default);
    let mut proxies = proxies.lock().unwrap_or_else(|e| e.into_inner());
    let key = (upstream.to_string(), signing.clone());
    if let Some(local) = proxies.get(&key) {
        return Ok(local.clone());
    }
    let local = start(upstream.to_string(), signing.clone())?;
    proxies.insert(key, local.clone());
    Ok(local)
}

/// Starts a proxy on a thread of its own; its loopback URI.
fn start(upstream: String, signing: Signing) -> Result<String, SinkError> {
    let starting = || format!("starting the SigV4 signing proxy for {upstream}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .map_err(|e| SinkError::io(starting(), e).permanent())?;
    let local = listener
        .local_addr()
        .map_err(|e| SinkError::io(starting(), e).permanent())?;
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| SinkError::other(starting(), e).permanent())?;
    let proxy = Arc::new(Proxy {
        upstream: upstream.trim_end_matches('/').to_string(),
        signing,
        client,
    });
    std::thread::Builder::new()
        .name("sigv4-proxy".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "the SigV4 signing proxy could not start");
                    return;
                }
            };
            runtime.block_on(proxy.serve(listener));
        })
        .map_err(|e| SinkError::io(starting(), e).permanent())?;
    Ok(format!("http://{local}"))
}

/// One proxy: where it forwards to, and how it signs.
struct Proxy {
    upstream: String,
    signing: Signing,
    client: reqwest::Client,
}

impl Proxy {
    async fn serve(self: Arc<Self>, listener: std::net::TcpListener) {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, "the SigV4 signing proxy could not listen");
                return;
            }
        };
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let proxy = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, Infallible>(proxy.forward(request).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(%error, "a connection to the SigV4 signing proxy ended");
                }
            });
        }
    }

    /// Signs `request` and sends it on; the catalog's answer, or a 502
    /// naming why it could not be had.
    async fn forward(&self, request: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        match self.try_forward(request).await {
            Ok(response) => response,
            Err(why) => {
                let mut response = hyper::Response::new(Full::new(Bytes::from(why)));
                *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                response
            }
        }
    }

    async fn try_forward(
        &self,
        request: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<Full<Bytes>>, String> {
        let (parts, body) = request.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("reading the request: {e}"))?
            .to_bytes();
        let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        let url = format!("{}{path}", self.upstream);
        let mut signed = http::Request::builder()
            .method(parts.method.clone())
            .uri(&url)
            .body(object_store::client::HttpRequestBody::from(body.clone()))
            .map_err(|e| format!("forwarding to {url}: {e}"))?;
        for (name, value) in &parts.headers {
            // The proxy's own host, and any bearer token: the signature
            // is the authorization.
            if name != http::header::HOST && name != http::header::AUTHORIZATION {
                signed.headers_mut().append(name, value.clone());
            }
        }
        let credential = AwsCredential {
            key_id: self.signing.key_id.clone(),
            secret_key: self.signing.secret_key.clone(),
            token: self.signing.token.clone(),
        };
        AwsAuthorizer::new(&credential, &self.signing.service, &self.signing.region)
            .authorize(&mut signed, None);
        let (signed_parts, _) = signed.into_parts();
        let outgoing = http::Request::from_parts(signed_parts, body);
        let outgoing = reqwest::Request::try_from(outgoing)
            .map_err(|e| format!("forwarding to {url}: {e}"))?;
        let answer = self
            .client
            .execute(outgoing)
            .await
            .map_err(|e| format!("forwarding to {url}: {e}"))?;
        let mut response = hyper::Response::builder().status(answer.status().as_u16());
        for (name, value) in answer.headers() {
            response = response.header(name.as_str(), value.as_bytes());
        }
        let bytes = answer
            .bytes()
            .await
            .map_err(|e| format!("reading the answer of {url}: {e}"))?;
        response
            .body(Full::new(bytes))
            .map_err(|e| format!("passing on the answer of {url}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn signing_is_off_unless_enabled_and_names_what_it_lacks() {
        let mut properties = BTreeMap::new();
        assert!(Signing::from_properties(&properties).unwrap().is_none());
        properties.insert(ENABLED.to_string(), "true".to_string());
        properties.insert(REGION.to_string(), "eu-west-1".to_string());
        properties.insert(ACCESS_KEY_ID.to_string(), "id".to_string());
        properties.insert(SECRET_ACCESS_KEY.to_string(), "secret".to_string());
        let signing = Signing::from_properties(&properties).unwrap().unwrap();
        assert_eq!(
            (signing.service.as_str(), signing.region.as_str()),
            ("execute-api", "eu-west-1")
        );
        properties.remove(REGION);
        if std::env::var("AWS_REGION").is_err() {
            let error = Signing::from_properties(&properties)
                .err()
                .expect("no region");
            assert!(error.to_string().contains(REGION), "{error}");
        }
    }
}
