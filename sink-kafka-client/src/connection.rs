//! One connection to one broker (TCP, with TLS and SASL when the
//! [`Security`] asks for them): requests framed and pipelined, answers
//! matched to them in order.
//!
//! A broker answers the requests of one connection in the order they came
//! (the protocol guarantees it), so the connection keeps a queue of the
//! callers waiting, in the order their requests were written: a reader task
//! hands each answer to the head of the queue, after checking its
//! correlation id. Many requests may be in flight at once (the producer
//! pipelines its `Produce` requests); a caller that stops waiting (its
//! timeout) drops its place, and the answer, when it comes, is thrown away.
//!
//! Any I/O error, a frame over [`MAX_FRAME`], or an answer that does not
//! match its request breaks the connection: every waiting caller gets the
//! error, and the [`Cluster`](super::Cluster) opens a new one on the next
//! request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::api::Call;
use crate::error::WireError;
use crate::security::Security;

/// A stream to a broker: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// The largest answer read: a `Fetch` answer holds at most what was asked
/// for (the reader asks for a few MiB), anything larger is a broken stream.
pub const MAX_FRAME: usize = 256 << 20;

/// The longest a request waits to be queued behind others on a connection.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests written but not answered yet, oldest first, and why the
/// connection broke, once it did.
type Waiting = Arc<Mutex<Queue>>;

#[derive(Debug, Default)]
struct Queue {
    pending: VecDeque<Pending>,
    broken: Option<String>,
}

#[derive(Debug)]
struct Pending {
    correlation_id: i32,
    response_header_version: i16,
    reply: oneshot::Sender<Result<Bytes, WireError>>,
}

struct Outgoing {
    api_key: i16,
    version: i16,
    request_header_version: i16,
    response_header_version: i16,
    body: BytesMut,
    reply: oneshot::Sender<Result<Bytes, WireError>>,
}

/// A connection to one broker. Cheap to share: requests go to a task that
/// owns the socket's writing half.
#[derive(Debug)]
pub struct Connection {
    /// `host:port`, for messages.
    pub address: String,
    outgoing: mpsc::Sender<Outgoing>,
    waiting: Waiting,
}

impl Connection {
    /// Opens a connection to `address` within `timeout`, secured as
    /// `security` says (TLS, then SASL, within the same `timeout`). The
    /// tasks it starts end when the connection breaks or the last handle is
    /// dropped.
    pub async fn open(
        address: &str,
        client_id: &str,
        timeout: Duration,
        security: &Security,
    ) -> Result<Connection, WireError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(address))
            .await
            .map_err(|_| WireError::ConnectTimeout {
                address: address.to_string(),
                after: timeout,
            })?
            .map_err(|source| WireError::Connect {
                address: address.to_string(),
                source,
            })?;
        // Requests are written whole; waiting for more bytes would only add
        // latency to the commit's small requests.
        stream
            .set_nodelay(true)
            .map_err(|source| WireError::Connect {
                address: address.to_string(),
                source,
            })?;
        let secured = tokio::time::timeout(timeout, secure(stream, address, client_id, security))
            .await
            .map_err(|_| WireError::ConnectTimeout {
                address: address.to_string(),
                after: timeout,
            })??;
        let (read, write) = tokio::io::split(secured);
        let waiting: Waiting = Arc::default();
        let (outgoing, requests) = mpsc::channel(64);
        let client_id = StrBytes::from_string(client_id.to_string());
        tokio::spawn(write_requests(
            write,
            requests,
            waiting.clone(),
            client_id,
            address.to_string(),
        ));
        tokio::spawn(read_answers(read, waiting.clone(), address.to_string()));
        Ok(Connection {
            address: address.to_string(),
            outgoing,
            waiting,
        })
    }

    /// Whether the connection broke: no request sent on it will be
    /// answered.
    pub fn is_broken(&self) -> bool {
        self.outgoing.is_closed() || lock(&self.waiting).broken.is_some()
    }

    /// Sends `request` at `version` and waits for its answer, at most
    /// `timeout`.
    pub async fn call<R: Call>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, WireError> {
        self.send(request, version).await?.wait(timeout).await
    }

    /// Sends `request` at `version`: once this returns, the request is
    /// queued behind every request sent before it on this connection, so
    /// requests sent one after the other by one caller reach the broker in
    /// that order (a producer's batches of one partition must). The answer
    /// is waited for separately.
    pub async fn send<R: Call>(&self, request: &R, version: i16) -> Result<Answer<R>, WireError> {
        let mut body = BytesMut::new();
        request
            .encode(&mut body, version)
            .map_err(|e| WireError::Encode {
                api: R::NAME,
                reason: e.to_string(),
            })?;
        let (reply, answer) = oneshot::channel();
        let outgoing = Outgoing {
            api_key: R::KEY,
            version,
            request_header_version: R::request_header_version(version),
            response_header_version: R::response_header_version(version),
            body,
            reply,
        };
        // A broker that stopped reading fills the socket, then this queue:
        // the caller is not held longer than an answer would be.
        match tokio::time::timeout(QUEUE_TIMEOUT, self.outgoing.send(outgoing)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(WireError::Broken {
                    address: self.address.clone(),
                })
            }
            Err(_) => {
                return Err(WireError::Timeout {
                    api: R::NAME,
                    address: self.address.clone(),
                    after: QUEUE_TIMEOUT,
                })
            }
        }
        Ok(Answer {
            answer,
            version,
            address: self.address.clone(),
            _request: std::marker::PhantomData,
        })
    }
}

/// The answer to a request sent with `Connection::send`, to be waited
/// for.
pub struct Answer<R> {
    answer: oneshot::Receiver<Result<Bytes, WireError>>,
    version: i16,
    address: String,
    _request: std::marker::PhantomData<fn() -> R>,
}

impl<R: Call> Answer<R> {
    /// The broker's address it comes from.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Waits for the answer, at most `timeout`.
    pub async fn wait(self, timeout: Duration) -> Result<R::Response, WireError> {
        let mut bytes = match tokio::time::timeout(timeout, self.answer).await {
            Err(_) => {
                return Err(WireError::Timeout {
                    api: R::NAME,
                    address: self.address,
                    after: timeout,
                })
            }
            Ok(Err(_)) => {
                return Err(WireError::Broken {
                    address: self.address,
                })
            }
            Ok(Ok(answer)) => answer?,
        };
        R::Response::decode(&mut bytes, self.version).map_err(|e| WireError::Decode {
            api: R::NAME,
            address: self.address,
            reason: e.to_string(),
        })
    }
}

/// Writes each request with its header and length; registers its caller
/// before the bytes leave, so the reader always finds it.
/// The TLS handshake and SASL authentication `security` asks for, on a
/// new TCP connection to `address`.
async fn secure(
    stream: TcpStream,
    address: &str,
    client_id: &str,
    security: &Security,
) -> Result<Box<dyn Stream>, WireError> {
    let mut stream: Box<dyn Stream> = match security.protocol.tls() {
        false => Box::new(stream),
        true => {
            let tls = |reason: String| WireError::Tls {
                address: address.to_string(),
                reason,
            };
            let config = security.tls_config().map_err(tls)?;
            let host = address
                .rsplit_once(':')
                .map_or(address, |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
                tls(format!(
                    "{host:?} is not a name a certificate can carry: {e}"
                ))
            })?;
            let connector = tokio_rustls::TlsConnector::from(config);
            let secured = connector.connect(name, stream).await.map_err(|e| {
                tls(format!(
                    "the handshake failed: {e}. Check ssl.ca.location (the CA that signed the \
                     broker's certificate), that the broker's certificate names {host}, and \
                     that the listener takes TLS (a plaintext listener closes at the first \
                     message: security.protocol PLAINTEXT or SASL_PLAINTEXT there)"
                ))
            })?;
            Box::new(secured)
        }
    };
    if security.protocol.sasl() {
        let sasl = security.sasl.as_ref().ok_or_else(|| WireError::Sasl {
            address: address.to_string(),
            mechanism: "(none)",
            reason: format!(
                "security.protocol {} needs sasl.mechanism and credentials",
                security.protocol.name()
            ),
        })?;
        crate::sasl::authenticate(&mut stream, sasl, client_id, address).await?;
    }
    Ok(stream)
}

async fn write_requests(
    mut socket: tokio::io::WriteHalf<Box<dyn Stream>>,
    mut requests: mpsc::Receiver<Outgoing>,
    waiting: Waiting,
    client_id: StrBytes,
    address: String,
) {
    let mut next_id: i32 = 0;
    let mut frame = BytesMut::new();
    while let Some(request) = requests.recv().await {
        next_id = next_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(request.api_key)
            .with_request_api_version(request.version)
            .with_correlation_id(next_id)
            .with_client_id(Some(client_id.clone()));
        frame.clear();
        frame.put_i32(0);
        if let Err(e) = header.encode(&mut frame, request.request_header_version) {
            let _ = request.reply.send(Err(WireError::Encode {
                api: "request header",
                reason: e.to_string(),
            }));
            continue;
        }
        frame.extend_from_slice(&request.body);
        let Ok(length) = i32::try_from(frame.len() - 4) else {
            let _ = request.reply.send(Err(WireError::TooLarge {
                address: address.clone(),
                bytes: frame.len(),
            }));
            continue;
        };
        frame[..4].copy_from_slice(&length.to_be_bytes());
        {
            let mut queue = lock(&waiting);
            if let Some(reason) = &queue.broken {
                let _ = request.reply.send(Err(WireError::Lost {
                    address: address.clone(),
                    reason: reason.clone(),
                }));
                continue;
            }
            queue.pending.push_back(Pending {
                correlation_id: next_id,
                response_header_version: request.response_header_version,
                reply: request.reply,
            });
        }
        if let Err(source) = socket.write_all(&frame).await {
            fail_all(&waiting, &address, &source.to_string());
            return;
        }
    }
}

/// Reads answers and hands each to the oldest waiting caller.
async fn read_answers(
    mut socket: tokio::io::ReadHalf<Box<dyn Stream>>,
    waiting: Waiting,
    address: String,
) {
    let reason = loop {
        let length = match socket.read_i32().await {
            Ok(length) => length,
            Err(e) => {
                // The broker ended the TLS session with an alert (a client
                // certificate it wants, or one it refuses): no retry
                // changes that.
                if let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                    let reason = match tls {
                        rustls::Error::AlertReceived(
                            rustls::AlertDescription::CertificateRequired,
                        ) => format!(
                            "the broker refused the session ({tls}): it asks for a client \
                             certificate: set ssl.certificate.location and ssl.key.location"
                        ),
                        _ => format!(
                            "the broker refused the session ({tls}): check the client \
                             certificate (ssl.certificate.location, ssl.key.location) and the CA \
                             that signed it"
                        ),
                    };
                    fail_all_with(&waiting, || WireError::Tls {
                        address: address.clone(),
                        reason: reason.clone(),
                    });
                    return;
                }
                break e.to_string();
            }
        };
        // A TLS record (an alert: content type 21, version 3.x) where a
        // Kafka answer was due: the listener speaks TLS to a plaintext
        // client. No retry changes that.
        if (length as u32) >> 16 == 0x1503 {
            fail_all_with(&waiting, || WireError::Tls {
                address: address.clone(),
                reason: "the broker answered with a TLS alert: the listener takes TLS; set \
                         security.protocol to SSL or SASL_SSL (and ssl.ca.location)"
                    .into(),
            });
            return;
        }
        let Some(length) = usize::try_from(length).ok().filter(|l| *l <= MAX_FRAME) else {
            break format!("an answer of {length} bytes (at most {MAX_FRAME} are read)");
        };
        // Grown as the bytes arrive, not reserved from the length field.
        let mut body = Vec::with_capacity(length.min(1 << 20));
        match (&mut socket)
            .take(length as u64)
            .read_to_end(&mut body)
            .await
        {
            Ok(read) if read == length => {}
            Ok(read) => {
                break format!("the connection closed {read} bytes into a {length}-byte answer")
            }
            Err(e) => break e.to_string(),
        }
        let mut body = Bytes::from(body);
        let Some(pending) = lock(&waiting).pending.pop_front() else {
            break "an answer to no request".to_string();
        };
        let header = match ResponseHeader::decode(&mut body, pending.response_header_version) {
            Ok(header) => header,
            Err(e) => {
                let _ = pending.reply.send(Err(WireError::Decode {
                    api: "response header",
                    address: address.clone(),
                    reason: e.to_string(),
                }));
                break "an answer whose header cannot be read".to_string();
            }
        };
        if header.correlation_id != pending.correlation_id {
            break format!(
                "an answer to request {} where request {} was next",
                header.correlation_id, pending.correlation_id
            );
        }
        // The caller may have stopped waiting: then nobody reads it.
        let _ = pending.reply.send(Ok(body.copy_to_bytes(body.remaining())));
    };
    fail_all(&waiting, &address, &reason);
}

/// Breaks the connection for everyone waiting on it with `error`, and for
/// every request after.
fn fail_all_with(waiting: &Waiting, error: impl Fn() -> WireError) {
    let mut queue = lock(waiting);
    queue.broken.get_or_insert_with(|| error().to_string());
    for pending in queue.pending.drain(..) {
        let _ = pending.reply.send(Err(error()));
    }
}

/// Breaks the connection for everyone waiting on it, and for every request
/// after.
fn fail_all(waiting: &Waiting, address: &str, reason: &str) {
    let mut queue = lock(waiting);
    queue.broken.get_or_insert_with(|| reason.to_string());
    for pending in queue.pending.drain(..) {
        let _ = pending.reply.send(Err(WireError::Lost {
            address: address.to_string(),
            reason: reason.to_string(),
        }));
    }
}

fn lock(waiting: &Waiting) -> std::sync::MutexGuard<'_, Queue> {
    waiting.lock().unwrap_or_else(|p| p.into_inner())
}
