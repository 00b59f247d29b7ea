//! The ingest service's HTTP/1.1 server: its own accept loop over hyper,
//! so that a client cannot hold the server's resources for as long as it
//! likes.
//!
//! - **A cap on open connections** ([`ConnectionLimits::max_connections`]):
//!   past it, a new connection is accepted and closed at once (counted in
//!   `ingest_connections_refused_total`), rather than left in the kernel's
//!   backlog where its client cannot tell it from a slow server.
//! - **A header read timeout** ([`ConnectionLimits::header_read_timeout`]),
//!   which is also the idle timeout: it runs from the moment the server
//!   waits for a request (a new connection, or a kept-alive one after an
//!   answer) until the request's headers are complete. With TLS, the
//!   handshake has as long again before that, on its own timer. A connection that
//!   sends nothing, or its headers a byte at a time, is closed when it
//!   passes (counted in `ingest_connections_timed_out_total`). The body has
//!   its own timeout, in the handler ([`Config::body_read_timeout`](super::Config::body_read_timeout)).
//! - **A write timeout** ([`ConnectionLimits::write_timeout`]): a client
//!   that stops reading its answers (with requests pipelined behind them)
//!   would otherwise hold its connection with no timer running; a write
//!   that cannot proceed for that long closes the connection
//!   (`tokio-io-timeout`).
//! - **TLS** with rustls ([`TlsFiles`]): the certificate chain and key are
//!   read from PEM files, and read again on [`Tls::reload`]; connections
//!   that are open keep the certificate they started with.
//!
//! HTTP/2 is not offered (ALPN says `http/1.1`): an HTTP/1.1 connection
//! carries one request at a time, which is what the timeouts above bound.
//!
//! hyper's own `header_read_timeout` is used on purpose with its HTTP/1
//! builder, not the version-detecting one: the latter reads the first
//! bytes itself, without a timer, so a connection that sends nothing is
//! never timed out (hyper issue 3962).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::files::Access;

/// The largest certificate or key file read, in bytes: a long chain is a
/// few kilobytes.
const MAX_PEM_LEN: u64 = 1 << 20;

/// How long and how many connections may stay open. Part of
/// [`Config`](super::Config); read by the accept loop of
/// [`IngestService::serve`](super::IngestService::serve) for every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The longest the server waits for a request's headers, from the
    /// moment it waits for the request: on a new connection, and on a
    /// kept-alive one after each answer (so this is also the idle timeout).
    /// With TLS the handshake has as long again, before. Default 10 s.
    pub header_read_timeout: Duration,
    /// The longest a write to the client may stay blocked (a client that
    /// does not read its answers). Default 30 s.
    pub write_timeout: Duration,
    /// Connections open at once; past it, new ones are closed at once.
    /// Each takes a file descriptor: keep it below the process's limit
    /// (`ulimit -n`). Default 4096.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
}

/// The certificate chain and private key files of the TLS listener: PEM,
/// the chain leaf first (as a CA issues it), the key PKCS#8, PKCS#1 or
/// SEC1. Part of [`Config::tls`](super::Config::tls).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key of the leaf.
    pub key: PathBuf,
}

/// The TLS configuration in force and the files it comes from. Shared by
/// the accept loop and the reload handle.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads the files; fails with the file and the reason when one is
    /// missing, is not PEM, or the key does not go with the certificate.
    pub async fn open(files: TlsFiles) -> anyhow::Result<Tls> {
        let config = server_config(&files).await?;
        Ok(Tls {
            files,
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again and serves new connections with them. On an
    /// error the old certificate stays in force.
    pub async fn reload(&self) -> anyhow::Result<()> {
        let config = server_config(&self.files).await?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The files.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()),
        ))
    }
}

/// rustls' server configuration from `files`, with the `ring` provider
/// given explicitly (no process-wide default is installed).
async fn server_config(files: &TlsFiles) -> anyhow::Result<ServerConfig> {
    let cert_pem = crate::files::read(&files.cert, MAX_PEM_LEN, Access::Public)
        .await
        .with_context(|| format!("reading the TLS certificate {}", files.cert.display()))?;
    let key_pem = crate::files::read(&files.key, MAX_PEM_LEN, Access::Public)
        .await
        .with_context(|| format!("reading the TLS key {}", files.key.display()))?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| {
            format!(
                "reading the certificates in {}: not PEM",
                files.cert.display()
            )
        })?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{} holds no certificate: it must hold `-----BEGIN CERTIFICATE-----` sections, the \
         leaf first",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_slice(&key_pem).with_context(|| {
        format!(
            "reading the private key in {}: it must hold one PEM private key (PKCS#8, PKCS#1 or \
             SEC1)",
            files.key.display()
        )
    })?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .context("choosing the TLS versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .with_context(|| {
                format!(
                    "the key in {} does not go with the certificate in {} (or its type is not \
                     supported)",
                    files.key.display(),
                    files.cert.display()
                )
            })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The server's connection metrics, registered with the service's others.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionMetrics {
    open: Gauge,
    refused: Counter,
    timed_out: Counter,
}

impl ConnectionMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "ingest_connections_open",
            "HTTP connections open",
            self.open.clone(),
        );
        registry.register(
            "ingest_connections_refused",
            "Connections closed at once because max_connections were open",
            self.refused.clone(),
        );
        registry.register(
            "ingest_connections_timed_out",
            "Connections closed because a TLS handshake or a request's headers took longer than \
             the header read timeout",
            self.timed_out.clone(),
        );
    }
}

/// Serves `router` on `listener` until `stop` turns true (or its sender is
/// dropped); then accepts no more connections, lets each open one finish
/// the request it is answering (kept-alive idle ones close at once), and
/// returns once all are closed. Errors of single connections are logged at
/// debug level and end only that connection; accept errors (such as
/// running out of file descriptors) are logged and retried.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<Arc<Tls>>,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut connections = JoinSet::new();
    let mut last_warning: Option<tokio::time::Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            () = stopped(&mut stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, this repeats: once a second in
                    // the log is enough.
                    if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                        warn!(%error, "accepting a connection failed; trying again in 100 ms");
                        last_warning = Some(tokio::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            metrics.refused.inc();
            debug!(%peer, max = limits.max_connections, "connection refused: too many open");
            drop(stream);
            continue;
        };
        if let Err(error) = stream.set_nodelay(true) {
            debug!(%peer, %error, "setting TCP_NODELAY failed");
        }
        let (router, tls, metrics, stop) =
            (router.clone(), tls.clone(), metrics.clone(), stop.clone());
        connections.spawn(async move {
            let _open = Open::new(&metrics, permit);
            let timeout = limits.header_read_timeout;
            match tls {
                None => connection(stream, router, limits, &metrics, stop).await,
                Some(tls) => {
                    match tokio::time::timeout(timeout, tls.acceptor().accept(stream)).await {
                        Ok(Ok(stream)) => connection(stream, router, limits, &metrics, stop).await,
                        Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => {
                            metrics.timed_out.inc();
                            debug!(%peer, "TLS handshake timed out");
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// An open connection: counted in the gauge and holding its place under the
/// cap until dropped (also when its task panics).
struct Open {
    gauge: Gauge,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Open {
    fn new(metrics: &ConnectionMetrics, permit: tokio::sync::OwnedSemaphorePermit) -> Open {
        metrics.open.inc();
        Open {
            gauge: metrics.open.clone(),
            _permit: permit,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Completes once `stop` is true, or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: nobody can say "go on" any more.
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Serves one connection until it closes, or until `stop`, after which the
/// request being answered is finished and the connection closed.
async fn connection<I>(
    io: I,
    router: Router,
    limits: ConnectionLimits,
    metrics: &ConnectionMetrics,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut io = tokio_io_timeout::TimeoutStream::new(io);
    io.set_write_timeout(Some(limits.write_timeout));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let served =
        builder.serve_connection(TokioIo::new(Box::pin(io)), TowerToHyperService::new(router));
    tokio::pin!(served);
    let result = tokio::select! {
        result = served.as_mut() => result,
        () = stopped(&mut stop) => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(error) = result {
        if error.is_timeout() {
            metrics.timed_out.inc();
        }
        debug!(%error, "connection ended with an error");
    }
}
