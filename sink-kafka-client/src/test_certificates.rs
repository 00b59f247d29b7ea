//! Certificates made for a test (feature `test-proxy`): a CA, a server
//! certificate it signed for the loopback address, and a client
//! certificate for mTLS. What [`proxy`](crate::proxy) shows its clients,
//! and what they trust.

use crate::proxy::ProxyConfig;
use crate::security::SaslMechanism;

/// A CA made for one test, and two certificates it signed, as PEM.
///
/// Made by tests that put the TLS proxy in front of the test broker; each
/// call makes new keys. Never for anything but tests: the keys are not
/// kept anywhere safe.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The CA's certificate: what a client trusts (`ssl.ca.location`).
    pub ca_pem: String,
    /// The server's certificate (for `127.0.0.1` and `localhost`) and key.
    pub server: (String, String),
    /// A client's certificate (named `eo-client`) and key, for mTLS.
    pub client: (String, String),
}

impl TestCertificates {
    /// A new CA and the certificates it signs.
    ///
    /// # Panics
    /// If the key generation or signing fails (a test's setup).
    pub fn new() -> TestCertificates {
        let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("a CA's parameters");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().expect("a CA's key");
        let ca = ca_params.self_signed(&ca_key).expect("a self-signed CA");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let signed = |names: Vec<String>| {
            let key = rcgen::KeyPair::generate().expect("a key");
            let certificate = rcgen::CertificateParams::new(names)
                .expect("a certificate's parameters")
                .signed_by(&key, &issuer)
                .expect("a certificate the CA signed");
            (certificate.pem(), key.serialize_pem())
        };
        TestCertificates {
            server: signed(vec!["127.0.0.1".to_string(), "localhost".into()]),
            client: signed(vec!["eo-client".to_string()]),
            ca_pem: ca.pem(),
        }
    }

    /// A proxy in front of `upstream` that takes TLS with the server's
    /// certificate and SASL with `mechanism` for one `user`.
    pub fn sasl_ssl_proxy(
        &self,
        upstream: String,
        mechanism: SaslMechanism,
        user: &str,
        password: &str,
    ) -> ProxyConfig {
        ProxyConfig {
            upstream,
            tls: Some(self.server.clone()),
            client_ca: None,
            sasl: Some((mechanism, user.to_string(), password.to_string())),
            not_leader_produces: 0,
            group_fault: None,
        }
    }
}

impl Default for TestCertificates {
    fn default() -> TestCertificates {
        TestCertificates::new()
    }
}
