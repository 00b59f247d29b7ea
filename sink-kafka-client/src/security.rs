//! How a connection proves who it is and hides what it says: TLS (rustls)
//! and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER), under the
//! names Kafka's clients use (`security.protocol`, `sasl.mechanism`, …).
//!
//! ```text
//!  TCP ─▶ SSL, SASL_SSL: TLS handshake (the CA file's roots or the system's; the broker's name checked;
//!                        a client certificate for mTLS)
//!      ─▶ SASL_*: SaslHandshake(mechanism) ─▶ SaslAuthenticate … until the broker accepts
//!      ─▶ ApiVersions, then the client's requests
//! ```
//!
//! A refusal (a wrong password, a certificate no trusted CA signed, a
//! plaintext client at a TLS listener) is a permanent error naming TLS or
//! SASL: retrying cannot change it. Secrets never reach a message or a
//! `Debug` output.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// `security.protocol`: whether connections use TLS, SASL, both or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    /// Neither (the default).
    #[default]
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL over plaintext.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Whether connections start with a TLS handshake.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    /// Its name, as `security.protocol` spells it.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }
}

impl std::str::FromStr for SecurityProtocol {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            other => Err(format!(
                "security.protocol {other:?} is none of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
            )),
        }
    }
}

/// `sasl.mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// `PLAIN`: the password itself, over the connection (use TLS).
    Plain,
    /// `SCRAM-SHA-256` (RFC 7677).
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
    /// `OAUTHBEARER` (RFC 7628): a token from a [`TokenProvider`].
    OAuthBearer,
}

impl SaslMechanism {
    /// Its name, as `sasl.mechanism` and the broker spell it.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

impl std::str::FromStr for SaslMechanism {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            "OAUTHBEARER" => Ok(SaslMechanism::OAuthBearer),
            other => Err(format!(
                "sasl.mechanism {other:?} is none of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, \
                 OAUTHBEARER (GSSAPI is not supported)"
            )),
        }
    }
}

/// A secret (a password, a token): its `Debug` and `Display` print `***`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// `value`, kept secret.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the exchange that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// What a token provider's future gives: the token, or why there is none.
pub type TokenFuture<'a> = Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>>;

/// Supplies OAUTHBEARER tokens: called before each connection
/// authenticates, so a provider that refreshes its token hands out the
/// current one. Implemented by the embedding program (its identity
/// provider's client); [`StaticToken`] is one that never changes.
pub trait TokenProvider: Send + Sync + std::fmt::Debug {
    /// The token to present now.
    fn token(&self) -> TokenFuture<'_>;
}

/// A token that never changes (`sasl.oauthbearer.token` in a properties
/// file).
#[derive(Debug, Clone)]
pub struct StaticToken(pub Secret);

impl TokenProvider for StaticToken {
    fn token(&self) -> TokenFuture<'_> {
        let token = self.0.clone();
        Box::pin(async move { Ok(token) })
    }
}

/// The SASL side: the mechanism and its credentials.
#[derive(Debug, Clone)]
pub struct Sasl {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// The user (PLAIN, SCRAM).
    pub username: String,
    /// The password (PLAIN, SCRAM).
    pub password: Secret,
    /// OAUTHBEARER's tokens.
    pub token: Option<Arc<dyn TokenProvider>>,
}

/// The TLS side: whom to trust and, for mTLS, who the client is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// `ssl.ca.location`: a PEM file of the CAs to trust; `None`: the
    /// system's roots.
    pub ca_location: Option<PathBuf>,
    /// `ssl.certificate.location`: the client's certificate chain (PEM),
    /// for brokers that ask for one (mTLS).
    pub certificate_location: Option<PathBuf>,
    /// `ssl.key.location`: the client certificate's private key (PEM).
    pub key_location: Option<PathBuf>,
}

/// How a client's connections are secured. Made from a properties file
/// ([`ClientProperties`](crate::ClientProperties)) or in code; shared by
/// every connection of a [`Cluster`](crate::Cluster).
#[derive(Debug, Default)]
pub struct Security {
    /// `security.protocol`.
    pub protocol: SecurityProtocol,
    /// The TLS files, read when the first connection opens.
    pub tls: TlsFiles,
    /// The SASL credentials; required by `SASL_*`.
    pub sasl: Option<Sasl>,
    /// The rustls configuration, made once.
    config: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl Clone for Security {
    fn clone(&self) -> Self {
        Security {
            protocol: self.protocol,
            tls: self.tls.clone(),
            sasl: self.sasl.clone(),
            config: OnceLock::new(),
        }
    }
}

impl Security {
    /// No TLS, no SASL.
    pub fn plaintext() -> Security {
        Security::default()
    }

    /// Connections as `protocol` says, without TLS files or SASL
    /// credentials yet ([`with_tls`](Self::with_tls),
    /// [`with_sasl`](Self::with_sasl)).
    pub fn new(protocol: SecurityProtocol) -> Security {
        Security {
            protocol,
            ..Security::default()
        }
    }

    /// The same, with these TLS files.
    pub fn with_tls(mut self, tls: TlsFiles) -> Security {
        self.tls = tls;
        self.config = OnceLock::new();
        self
    }

    /// The same, with these SASL credentials.
    pub fn with_sasl(mut self, sasl: Sasl) -> Security {
        self.sasl = Some(sasl);
        self
    }

    /// Checks that the settings fit together: SASL credentials where the
    /// protocol asks for them, a key with a client certificate.
    pub fn check(&self) -> Result<(), String> {
        match (&self.sasl, self.protocol.sasl()) {
            (None, true) => {
                return Err(format!(
                    "security.protocol {} needs sasl.mechanism and its credentials \
                     (sasl.username and sasl.password, or an OAUTHBEARER token)",
                    self.protocol.name()
                ))
            }
            (Some(sasl), true) => {
                match sasl.mechanism {
                    SaslMechanism::OAuthBearer if sasl.token.is_none() => return Err(
                        "sasl.mechanism OAUTHBEARER needs a token: sasl.oauthbearer.token, or a \
                         TokenProvider set by the program"
                            .into(),
                    ),
                    SaslMechanism::OAuthBearer => {}
                    mechanism if sasl.username.is_empty() => {
                        return Err(format!(
                            "sasl.mechanism {} needs sasl.username and sasl.password",
                            mechanism.name()
                        ))
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        if self.tls.certificate_location.is_some() != self.tls.key_location.is_some() {
            return Err(
                "a client certificate needs its key: set both ssl.certificate.location and \
                 ssl.key.location, or neither"
                    .into(),
            );
        }
        Ok(())
    }

    /// The rustls configuration of these settings, made on first use: the
    /// roots (the CA file's, or the system's), the client certificate.
    pub(crate) fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.config.get_or_init(|| self.make_tls_config()).clone()
    }

    fn make_tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        match &self.tls.ca_location {
            Some(path) => {
                let certificates: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_file_iter(path)
                        .and_then(|certs| certs.collect::<Result<_, _>>())
                        .map_err(|e| {
                            format!("ssl.ca.location {}: cannot be read: {e}", path.display())
                        })?;
                if certificates.is_empty() {
                    return Err(format!(
                        "ssl.ca.location {}: holds no certificate (PEM)",
                        path.display()
                    ));
                }
                for certificate in certificates {
                    roots
                        .add(certificate)
                        .map_err(|e| format!("ssl.ca.location {}: {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for certificate in found.certs {
                    let _ = roots.add(certificate);
                }
                if roots.is_empty() {
                    return Err(
                        "TLS: the system holds no root certificate; set ssl.ca.location to the \
                         CA file of the brokers"
                            .into(),
                    );
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match (&self.tls.certificate_location, &self.tls.key_location) {
            (Some(chain), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(chain)
                    .and_then(|certs| certs.collect::<Result<_, _>>())
                    .map_err(|e| {
                        format!(
                            "ssl.certificate.location {}: cannot be read: {e}",
                            chain.display()
                        )
                    })?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!("ssl.key.location {}: cannot be read: {e}", key.display())
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("TLS: the client certificate or its key: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }
}
