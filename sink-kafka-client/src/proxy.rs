//! A TLS- and SASL-terminating Kafka proxy, for tests: the test broker
//! (noida-db) enforces neither, so the tests put this in front of it.
//!
//! ```text
//!  client ─TLS (the test's certificate)─▶ proxy ─plaintext─▶ broker
//!     SaslHandshake, SaslAuthenticate: answered here (PLAIN, SCRAM-SHA-256/512 checked
//!         against the one user it knows); any other request before them closes the connection
//!     ApiVersions: forwarded, the SASL requests added to the answer
//!     everything else: forwarded; Metadata and FindCoordinator answers name the proxy
//!         in place of the broker, so that clients come back through it
//!     faults a test asks for (ProxyConfig): Produce answered NOT_LEADER_OR_FOLLOWER,
//!         a consumer group that never settles (GroupFault): answered here
//! ```
//!
//! A wrong password is answered `SASL_AUTHENTICATION_FAILED`, as Kafka
//! answers it; a client that speaks plaintext to the TLS port gets a TLS
//! alert. Test code only (feature `test-proxy`): one upstream broker, one
//! user.

use std::collections::HashMap;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, MetadataResponse, ProduceRequest, ProduceResponse,
    RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::scram::{server_check, ScramHash, ScramKeys};
use crate::security::SaslMechanism;

/// What the proxy enforces.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The broker behind it, `host:port`.
    pub upstream: String,
    /// TLS: the proxy's certificate chain and key (PEM); `None`: plaintext.
    pub tls: Option<(String, String)>,
    /// mTLS: the CA (PEM) that must have signed a client's certificate;
    /// `None`: no client certificate asked for.
    pub client_ca: Option<String>,
    /// SASL: the mechanism, the user and the password it takes (for
    /// OAUTHBEARER, the password is the token it takes); `None`: no SASL.
    pub sasl: Option<(SaslMechanism, String, String)>,
    /// How many `Produce` requests, the first ones, it answers itself with
    /// `NOT_LEADER_OR_FOLLOWER` for every partition, as a broker does whose
    /// partitions' leadership just moved (to the same address, here).
    pub not_leader_produces: usize,
    /// A consumer group that never settles, played here for every group:
    /// `None` forwards the group's requests.
    pub group_fault: Option<GroupFault>,
}

/// How the proxy plays a consumer group that never settles, answering the
/// group's requests itself (the others it forwards): what a member meets
/// when a rebalance never ends, for tests of its bounded waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupFault {
    /// Every `JoinGroup` is answered `REBALANCE_IN_PROGRESS`: joining
    /// never ends.
    JoinRebalancing,
    /// `JoinGroup` is forwarded; every `SyncGroup` is answered
    /// `REBALANCE_IN_PROGRESS`: syncing never ends.
    SyncRebalancing,
    /// `JoinGroup` is forwarded; every `SyncGroup` is answered with an
    /// empty assignment and every `Heartbeat` `REBALANCE_IN_PROGRESS`:
    /// each generation deals the member nothing, and ends at once.
    NothingDealt,
}

impl GroupFault {
    /// The answer to a request (`key`, whole `frame`) when the fault plays
    /// it; `None`: forward it.
    fn answer(self, key: i16, frame: &Bytes) -> Option<Bytes> {
        const REBALANCE_IN_PROGRESS: i16 = 27;
        let join = key == ApiKey::JoinGroup as i16;
        let sync = key == ApiKey::SyncGroup as i16;
        let heartbeat = key == ApiKey::Heartbeat as i16;
        match self {
            GroupFault::JoinRebalancing if join => {
                let (header, _) = request::<JoinGroupRequest>(frame)?;
                let response = JoinGroupResponse::default().with_error_code(REBALANCE_IN_PROGRESS);
                answer(&header, &response)
            }
            GroupFault::SyncRebalancing if sync => {
                let (header, _) = request::<SyncGroupRequest>(frame)?;
                let response = SyncGroupResponse::default().with_error_code(REBALANCE_IN_PROGRESS);
                answer(&header, &response)
            }
            GroupFault::NothingDealt if sync => {
                let (header, request) = request::<SyncGroupRequest>(frame)?;
                let response = SyncGroupResponse::default()
                    .with_protocol_type(request.protocol_type)
                    .with_protocol_name(request.protocol_name);
                answer(&header, &response)
            }
            GroupFault::NothingDealt if heartbeat => {
                let (header, _) = request::<HeartbeatRequest>(frame)?;
                let response = HeartbeatResponse::default().with_error_code(REBALANCE_IN_PROGRESS);
                answer(&header, &response)
            }
            _ => None,
        }
    }
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct AuthProxy {
    address: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AuthProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AuthProxy {
    /// Starts a proxy on a free loopback port, on the current runtime.
    pub async fn start(config: ProxyConfig) -> std::io::Result<AuthProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let acceptor = match &config.tls {
            None => None,
            Some((chain, key)) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(chain.as_bytes())
                        .collect::<Result<_, _>>()
                        .map_err(std::io::Error::other)?;
                let key =
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(std::io::Error::other)?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .map_err(std::io::Error::other)?;
                let builder = match &config.client_ca {
                    None => builder.with_no_client_auth(),
                    Some(ca) => {
                        let mut roots = rustls::RootCertStore::empty();
                        for certificate in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                            roots
                                .add(certificate.map_err(std::io::Error::other)?)
                                .map_err(std::io::Error::other)?;
                        }
                        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                            Arc::new(roots),
                            provider,
                        )
                        .build()
                        .map_err(std::io::Error::other)?;
                        builder.with_client_cert_verifier(verifier)
                    }
                };
                let server = builder
                    .with_single_cert(chain, key)
                    .map_err(std::io::Error::other)?;
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
            }
        };
        let not_leader = Arc::new(std::sync::atomic::AtomicUsize::new(
            config.not_leader_produces,
        ));
        let config = Arc::new(config);
        let advertised = address.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let config = Arc::clone(&config);
                let not_leader = Arc::clone(&not_leader);
                let acceptor = acceptor.clone();
                let advertised = advertised.clone();
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(client) = acceptor.accept(client).await {
                                serve(client, &config, &advertised, &not_leader).await;
                            }
                        }
                        None => serve(client, &config, &advertised, &not_leader).await,
                    }
                });
            }
        });
        Ok(AuthProxy { address, task })
    }

    /// Where clients reach it, `127.0.0.1:port`.
    pub fn address(&self) -> &str {
        &self.address
    }
}

async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Bytes> {
    let length = stream.read_i32().await.ok()?;
    let length = usize::try_from(length).ok().filter(|l| *l <= 256 << 20)?;
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(Bytes::from(body))
}

async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, body: &[u8]) -> Option<()> {
    let mut frame = BytesMut::with_capacity(body.len() + 4);
    frame.put_i32(i32::try_from(body.len()).ok()?);
    frame.extend_from_slice(body);
    stream.write_all(&frame).await.ok()
}

/// A request's header and body, decoded from its whole `frame`.
fn request<R: Decodable + HeaderVersion>(frame: &Bytes) -> Option<(RequestHeader, R)> {
    let mut body = frame.clone();
    let version = i16::from_be_bytes([*frame.get(2)?, *frame.get(3)?]);
    let header = RequestHeader::decode(&mut body, R::header_version(version)).ok()?;
    let request = R::decode(&mut body, version).ok()?;
    Some((header, request))
}

/// An answer to request `header` of type `A` at the request's version.
fn answer<A: Encodable + HeaderVersion>(header: &RequestHeader, answer: &A) -> Option<Bytes> {
    let version = header.request_api_version;
    let mut body = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(header.correlation_id)
        .encode(&mut body, A::header_version(version))
        .ok()?;
    answer.encode(&mut body, version).ok()?;
    Some(body.freeze())
}

/// The SASL state of one connection.
enum Auth {
    /// Nothing yet, or the handshake named `mechanism`.
    Pending(Option<SaslMechanism>),
    /// SCRAM's first round is done: what the second checks.
    Scram {
        hash: ScramHash,
        client_first_bare: String,
        server_first: String,
    },
    Done,
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    client: S,
    config: &ProxyConfig,
    advertised: &str,
    not_leader: &std::sync::atomic::AtomicUsize,
) {
    let Ok(upstream) = TcpStream::connect(&config.upstream).await else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = upstream.into_split();
    let mut auth = match config.sasl {
        Some(_) => Auth::Pending(None),
        None => Auth::Done,
    };
    // Requests forwarded, by correlation id: their key and version, for
    // the answers to rewrite.
    let sent: Arc<std::sync::Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
    let (local_tx, mut local_rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let answers = {
        let sent = Arc::clone(&sent);
        let advertised = advertised.to_string();
        async move {
            loop {
                tokio::select! {
                    frame = read_frame(&mut up_read) => {
                        let Some(frame) = frame else { break };
                        let frame = rewrite(frame, &sent, &advertised).unwrap_or_default();
                        if frame.is_empty() || write_frame(&mut client_write, &frame).await.is_none() {
                            break;
                        }
                    }
                    local = local_rx.recv() => {
                        let Some(frame) = local else { break };
                        if write_frame(&mut client_write, &frame).await.is_none() {
                            break;
                        }
                    }
                }
            }
            let _ = client_write.shutdown().await;
        }
    };
    let answering = tokio::spawn(answers);
    while let Some(frame) = read_frame(&mut client_read).await {
        let mut peek = frame.clone();
        if peek.remaining() < 8 {
            break;
        }
        let (key, version) = (peek.get_i16(), peek.get_i16());
        let correlation = peek.get_i32();
        let is_sasl = key == ApiKey::SaslHandshake as i16 || key == ApiKey::SaslAuthenticate as i16;
        if is_sasl {
            let Some(reply) = sasl_step(&frame, key, &mut auth, config) else {
                break;
            };
            if local_tx.send(reply).is_err() {
                break;
            }
            continue;
        }
        let allowed = matches!(auth, Auth::Done) || key == ApiKey::ApiVersions as i16;
        if !allowed {
            // Kafka closes a connection that skips authentication.
            break;
        }
        let refuse = key == ApiKey::Produce as i16
            && not_leader
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |left| left.checked_sub(1),
                )
                .is_ok();
        let played = match refuse {
            true => Some(not_leader_answer(&frame)),
            false => config
                .group_fault
                .and_then(|fault| fault.answer(key, &frame).map(Some)),
        };
        if let Some(reply) = played {
            let Some(reply) = reply else {
                break;
            };
            if local_tx.send(reply).is_err() {
                break;
            }
            continue;
        }
        if let Ok(mut sent) = sent.lock() {
            sent.insert(correlation, (key, version));
        }
        if write_frame(&mut up_write, &frame).await.is_none() {
            break;
        }
    }
    drop(local_tx);
    answering.abort();
}

/// `NOT_LEADER_OR_FOLLOWER` for every partition of a `Produce` request.
fn not_leader_answer(frame: &Bytes) -> Option<Bytes> {
    let (header, request) = request::<ProduceRequest>(frame)?;
    let response = ProduceResponse::default().with_responses(
        request
            .topic_data
            .iter()
            .map(|topic| {
                TopicProduceResponse::default()
                    .with_name(topic.name.clone())
                    .with_partition_responses(
                        topic
                            .partition_data
                            .iter()
                            .map(|p| {
                                PartitionProduceResponse::default()
                                    .with_index(p.index)
                                    .with_error_code(6)
                                    .with_base_offset(-1)
                            })
                            .collect(),
                    )
            })
            .collect(),
    );
    answer(&header, &response)
}

/// One SASL request answered, or `None`: close the connection.
fn sasl_step(frame: &Bytes, key: i16, auth: &mut Auth, config: &ProxyConfig) -> Option<Bytes> {
    let (mechanism, username, password) = config.sasl.as_ref()?;
    if key == ApiKey::SaslHandshake as i16 {
        let (header, request) = request::<SaslHandshakeRequest>(frame)?;
        let asked = request.mechanism.to_string();
        let ok = asked == mechanism.name();
        *auth = Auth::Pending(ok.then_some(*mechanism));
        let response = SaslHandshakeResponse::default()
            .with_error_code(if ok { 0 } else { 33 })
            .with_mechanisms(vec![StrBytes::from_static_str(mechanism.name())]);
        return answer(&header, &response);
    }
    let (header, request) = request::<SaslAuthenticateRequest>(frame)?;
    let message = String::from_utf8_lossy(&request.auth_bytes).into_owned();
    let failed = |why: &str| {
        SaslAuthenticateResponse::default()
            .with_error_code(58)
            .with_error_message(Some(StrBytes::from_string(format!(
                "Authentication failed: {why}"
            ))))
    };
    let salt = b"eo-proxy-salt-16";
    let (response, next) = match std::mem::replace(auth, Auth::Pending(None)) {
        Auth::Pending(Some(SaslMechanism::OAuthBearer)) => {
            let token = message
                .split('\x01')
                .find_map(|part| part.strip_prefix("auth=Bearer "));
            match token == Some(password.as_str()) {
                true => (SaslAuthenticateResponse::default(), Auth::Done),
                false => (failed("invalid token"), Auth::Pending(None)),
            }
        }
        Auth::Pending(Some(SaslMechanism::Plain)) => {
            let mut parts = message.split('\0').skip(1);
            let ok =
                parts.next() == Some(username.as_str()) && parts.next() == Some(password.as_str());
            match ok {
                true => (SaslAuthenticateResponse::default(), Auth::Done),
                false => (failed("invalid credentials"), Auth::Pending(None)),
            }
        }
        Auth::Pending(Some(m @ (SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512))) => {
            let hash = match m {
                SaslMechanism::ScramSha256 => ScramHash::Sha256,
                _ => ScramHash::Sha512,
            };
            let bare = message.strip_prefix("n,,").unwrap_or(&message).to_string();
            let user = bare
                .split(',')
                .find_map(|p| p.strip_prefix("n="))
                .unwrap_or_default();
            let nonce = bare
                .split(',')
                .find_map(|p| p.strip_prefix("r="))
                .unwrap_or_default();
            if user != username.as_str() || nonce.is_empty() {
                (failed("unknown user"), Auth::Pending(None))
            } else {
                let server_first =
                    format!("r={nonce}proxy7nonce,s={},i=4096", STANDARD.encode(salt));
                (
                    SaslAuthenticateResponse::default()
                        .with_auth_bytes(Bytes::from(server_first.clone())),
                    Auth::Scram {
                        hash,
                        client_first_bare: bare,
                        server_first,
                    },
                )
            }
        }
        Auth::Scram {
            hash,
            client_first_bare,
            server_first,
        } => {
            let keys = ScramKeys::derive(hash, password, salt, 4096);
            match server_check(hash, &keys, &client_first_bare, &server_first, &message) {
                Some(last) => (
                    SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(last)),
                    Auth::Done,
                ),
                None => (failed("invalid credentials"), Auth::Pending(None)),
            }
        }
        _ => (failed("no mechanism agreed"), Auth::Pending(None)),
    };
    *auth = next;
    answer(&header, &response)
}

/// An answer from the broker, rewritten where it names brokers (Metadata,
/// FindCoordinator: the proxy instead) or lists requests (ApiVersions: the
/// SASL ones added); others as they are.
fn rewrite(
    frame: Bytes,
    sent: &std::sync::Mutex<HashMap<i32, (i16, i16)>>,
    advertised: &str,
) -> Option<Bytes> {
    let correlation = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
    let (key, version) = sent.lock().ok()?.remove(&correlation)?;
    let (host, port) = advertised.rsplit_once(':')?;
    let port: i32 = port.parse().ok()?;
    let host = StrBytes::from_string(host.to_string());
    fn redo<A: Decodable + Encodable + HeaderVersion>(
        frame: &Bytes,
        version: i16,
        change: impl FnOnce(&mut A),
    ) -> Option<Bytes> {
        let mut body = frame.clone();
        let header = ResponseHeader::decode(&mut body, A::header_version(version)).ok()?;
        let mut decoded = A::decode(&mut body, version).ok()?;
        change(&mut decoded);
        let mut out = BytesMut::new();
        header.encode(&mut out, A::header_version(version)).ok()?;
        decoded.encode(&mut out, version).ok()?;
        Some(out.freeze())
    }
    if key == ApiKey::Metadata as i16 {
        return redo::<MetadataResponse>(&frame, version, |m| {
            for broker in &mut m.brokers {
                broker.host = host.clone();
                broker.port = port;
            }
        });
    }
    if key == ApiKey::FindCoordinator as i16 {
        return redo::<FindCoordinatorResponse>(&frame, version, |f| {
            f.host = host.clone();
            f.port = port;
            for coordinator in &mut f.coordinators {
                coordinator.host = host.clone();
                coordinator.port = port;
            }
        });
    }
    if key == ApiKey::ApiVersions as i16 {
        return redo::<ApiVersionsResponse>(&frame, version, |a| {
            for (api, max) in [(ApiKey::SaslHandshake, 1), (ApiKey::SaslAuthenticate, 2)] {
                if !a.api_keys.iter().any(|k| k.api_key == api as i16) {
                    a.api_keys.push(
                        ApiVersion::default()
                            .with_api_key(api as i16)
                            .with_min_version(0)
                            .with_max_version(max),
                    );
                }
            }
        });
    }
    Some(frame)
}
