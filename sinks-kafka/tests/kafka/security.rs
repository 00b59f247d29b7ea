//! The Kafka sink over TLS and SASL, against a proxy that enforces both in
//! front of the test broker (`sink_kafka_client::proxy`; noida-db enforces
//! neither): certified by the kit over SASL_SSL with SCRAM-SHA-512, and
//! each refusal (a wrong password, a CA that did not sign the broker's
//! certificate, plaintext to the TLS port) fast, named, and with nothing
//! written.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sink_kafka_client::proxy::{AuthProxy, ProxyConfig};
use sink_kafka_client::{Brokers, ClientProperties, SaslMechanism};
use sink_testkit::certify;
use sinks_kafka::{read_committed, ConnectError, KafkaSink};

use crate::common::{brokers, committed_ids, record, unique, Topic};

/// A CA and a certificate it signs for 127.0.0.1, as PEM: the CA's
/// certificate, the server's chain and key.
fn certificates() -> (String, String, String) {
    let (ca, server, _) = certificates_with_client();
    (ca, server.0, server.1)
}

/// A CA, the server's certificate and key, and a client's (for mTLS), as
/// PEM.
fn certificates_with_client() -> (String, (String, String), (String, String)) {
    let made = sink_kafka_client::test_certificates::TestCertificates::new();
    (made.ca_pem, made.server, made.client)
}

const USER: &str = "alice";
const PASSWORD: &str = "s3cret-Pa55";

/// A SASL_SSL (SCRAM-SHA-512) proxy in front of the test broker, and the
/// CA file that signed its certificate.
struct Secured {
    proxy: AuthProxy,
    dir: tempfile::TempDir,
}

impl Secured {
    async fn start() -> Secured {
        let (ca, chain, key) = certificates();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca).unwrap();
        let proxy = AuthProxy::start(ProxyConfig {
            upstream: brokers(),
            tls: Some((chain, key)),
            client_ca: None,
            sasl: Some((SaslMechanism::ScramSha512, USER.into(), PASSWORD.into())),
            not_leader_produces: 0,
            group_fault: None,
        })
        .await
        .unwrap();
        Secured { proxy, dir }
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The proxy reached with a properties file's settings.
    fn brokers(&self, properties: &str) -> Brokers {
        let properties = ClientProperties::parse(properties).unwrap();
        Brokers::from(self.proxy.address()).secured(Arc::new(properties.security))
    }

    /// SASL_SSL, SCRAM-SHA-512, `password`, trusting `ca`.
    fn properties(ca: &Path, password: &str) -> String {
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={USER}\n\
             sasl.password={password}\nssl.ca.location={}\n",
            ca.display()
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_sasl_ssl_with_scram_sha_512_the_kafka_sink_is_certified() {
    let secured = Arc::new(Secured::start().await);
    let brokers = secured.brokers(&Secured::properties(&secured.ca(), PASSWORD));
    let report = certify(
        || {
            let brokers = brokers.clone();
            async move {
                Topic {
                    name: unique("certified-sasl-ssl"),
                    brokers,
                }
            }
        },
        record,
    )
    .await;
    println!(
        "kafka sink over SASL_SSL (SCRAM-SHA-512), certified in {:.1} s:\n{report}",
        report.duration().as_secs_f64()
    );
    report
        .allow_unchecked([
            "unknown-outcome/middle-of-batch",
            "unknown-outcome/last-of-batch",
        ])
        .assert_passed();
    drop(secured);
}

/// Connects a sink of a new topic through `brokers`; the error, how long it
/// took, and whether the topic exists on the broker behind the proxy.
async fn refused(brokers: Brokers) -> (String, Duration, bool) {
    let topic = unique("refused");
    let started = Instant::now();
    let error = match KafkaSink::builder(brokers, &topic).connect().await {
        Ok(_) => panic!("a sink connected where it must be refused"),
        Err(error) => error,
    };
    let took = started.elapsed();
    println!("refused in {took:?}: {error}");
    assert!(matches!(error, ConnectError::Cluster { .. }), "{error:?}");
    let exists = sink_kafka_client::topic::Topic::describe(
        &Brokers::from(brokers_plain()).cluster("check"),
        &topic,
    )
    .await
    .unwrap()
    .is_some();
    (error.to_string(), took, exists)
}

fn brokers_plain() -> String {
    brokers()
}

#[tokio::test]
async fn a_wrong_password_a_wrong_ca_and_plaintext_to_tls_are_each_refused_fast_and_named() {
    let secured = Secured::start().await;
    // Retries would take the request timeout (30 s); a refusal is final.
    let fast = Duration::from_secs(10);

    let (error, took, exists) =
        refused(secured.brokers(&Secured::properties(&secured.ca(), "wrong"))).await;
    assert!(error.contains("SASL SCRAM-SHA-512"), "{error}");
    assert!(error.contains("refused the credentials"), "{error}");
    assert!(!error.contains("wrong") || !error.contains("sasl.password=wrong"));
    assert!(!error.contains(PASSWORD), "the password printed: {error}");
    assert!(took < fast && !exists, "{took:?}, topic created: {exists}");

    // A CA of its own, which did not sign the proxy's certificate.
    let (other_ca, _, _) = certificates();
    let other = secured.dir.path().join("other-ca.pem");
    std::fs::write(&other, other_ca).unwrap();
    let (error, took, exists) =
        refused(secured.brokers(&Secured::properties(&other, PASSWORD))).await;
    assert!(error.contains("TLS with"), "{error}");
    assert!(error.contains("ssl.ca.location"), "{error}");
    assert!(took < fast && !exists, "{took:?}, topic created: {exists}");

    // Plaintext to the TLS port.
    let (error, took, exists) = refused(secured.brokers("security.protocol=PLAINTEXT\n")).await;
    assert!(error.contains("TLS"), "{error}");
    assert!(error.contains("SSL or SASL_SSL"), "{error}");
    assert!(took < fast && !exists, "{took:?}, topic created: {exists}");

    // And the right settings work, reading back what was written.
    let good = secured.brokers(&Secured::properties(&secured.ca(), PASSWORD));
    let topic = unique("secured");
    let mut producer = sinks_kafka::IdempotentProducer::connect(&good, &topic, 1)
        .await
        .unwrap();
    producer
        .send_batch(vec![sinks_kafka::KafkaRecord::new("over TLS")])
        .await
        .unwrap();
    producer.flush().await.unwrap();
    let read = read_committed(&good, &topic).await.unwrap();
    assert_eq!(read.messages.len(), 1);
    assert_eq!(read.messages[0].value_bytes(), b"over TLS");
}

/// A partition's leader that moves while batches are in flight: the
/// broker answers `NOT_LEADER_OR_FOLLOWER`; the producer reads the
/// metadata again and sends those batches to the new leader, in order,
/// in place, without failing, and each record is written once.
#[tokio::test]
async fn batches_answered_not_leader_go_to_the_new_leader_in_place_each_record_once() {
    let proxy = AuthProxy::start(ProxyConfig {
        upstream: brokers(),
        tls: None,
        client_ca: None,
        sasl: None,
        not_leader_produces: 3,
        group_fault: None,
    })
    .await
    .unwrap();
    let topic = unique("leader-moves");
    let mut producer = sinks_kafka::IdempotentProducer::connect(proxy.address(), &topic, 2)
        .await
        .unwrap();
    let records: Vec<sinks_kafka::KafkaRecord> = (0..20_000u64).map(record).collect();
    for chunk in records.chunks(2_000) {
        producer
            .send_batch(chunk.to_vec())
            .await
            .expect("no failure");
    }
    producer.flush().await.expect("no failure");
    let mut ids = committed_ids(&topic).await;
    ids.sort_unstable();
    assert_eq!(ids, (0..20_000).collect::<Vec<_>>());
}

/// A proxy that takes `sasl` (and, with `client_ca`, asks for a client
/// certificate), over TLS; the CA file, in `dir`.
async fn proxy_with(
    dir: &Path,
    sasl: Option<(SaslMechanism, &str, &str)>,
    mtls: bool,
) -> (AuthProxy, PathBuf, (String, String)) {
    let (ca, server, client) = certificates_with_client();
    let ca_file = dir.join(format!("ca-{}.pem", unique("ca")));
    std::fs::write(&ca_file, &ca).unwrap();
    let proxy = AuthProxy::start(ProxyConfig {
        upstream: brokers(),
        tls: Some(server),
        client_ca: mtls.then(|| ca.clone()),
        sasl: sasl.map(|(m, u, p)| (m, u.to_string(), p.to_string())),
        not_leader_produces: 0,
        group_fault: None,
    })
    .await
    .unwrap();
    (proxy, ca_file, client)
}

/// Writes one record through `brokers` and reads it back through them.
async fn round_trip(brokers: &Brokers) -> Result<(), String> {
    let topic = unique("round-trip");
    let mut producer = sinks_kafka::IdempotentProducer::connect(brokers, &topic, 1)
        .await
        .map_err(|e| e.to_string())?;
    producer
        .send_batch(vec![sinks_kafka::KafkaRecord::new("hello")])
        .await
        .map_err(|e| e.to_string())?;
    producer.flush().await.map_err(|e| e.to_string())?;
    let read = read_committed(brokers, &topic)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(read.messages.len(), 1);
    Ok(())
}

/// An OAUTHBEARER token from the program: counts the times it was asked.
#[derive(Debug, Default)]
struct CountingToken(std::sync::atomic::AtomicUsize);

impl sinks_kafka::TokenProvider for CountingToken {
    fn token(&self) -> sinks_kafka::TokenFuture<'_> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(sinks_kafka::Secret::new("tok-3")) })
    }
}

#[tokio::test]
async fn plain_oauthbearer_and_client_certificates_are_each_accepted_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let secured = |address: &str, properties: String| {
        let properties = ClientProperties::parse(&properties).unwrap();
        Brokers::from(address).secured(Arc::new(properties.security))
    };

    // PLAIN over TLS.
    let (proxy, ca, _) =
        proxy_with(dir.path(), Some((SaslMechanism::Plain, "bob", "pw")), false).await;
    let plain = |password: &str| {
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=bob\n\
             sasl.password={password}\nssl.ca.location={}\n",
            ca.display()
        )
    };
    round_trip(&secured(proxy.address(), plain("pw")))
        .await
        .unwrap();
    let refused = round_trip(&secured(proxy.address(), plain("nope")))
        .await
        .unwrap_err();
    assert!(refused.contains("SASL PLAIN"), "{refused}");
    assert!(!refused.contains("nope"), "the password printed: {refused}");

    // OAUTHBEARER, the token from the program, asked for each connection;
    // a static token from a properties file.
    let (proxy, ca, _) = proxy_with(
        dir.path(),
        Some((SaslMechanism::OAuthBearer, "", "tok-3")),
        false,
    )
    .await;
    let provider = Arc::new(CountingToken::default());
    let security = sinks_kafka::Security::new(sinks_kafka::SecurityProtocol::SaslSsl)
        .with_tls(sinks_kafka::TlsFiles {
            ca_location: Some(ca.clone()),
            ..Default::default()
        })
        .with_sasl(sinks_kafka::Sasl {
            mechanism: SaslMechanism::OAuthBearer,
            username: String::new(),
            password: sinks_kafka::Secret::default(),
            token: Some(provider.clone()),
        });
    round_trip(&Brokers::from(proxy.address()).secured(Arc::new(security)))
        .await
        .unwrap();
    assert!(provider.0.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    let token = |token: &str| {
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n\
             sasl.oauthbearer.token={token}\nssl.ca.location={}\n",
            ca.display()
        )
    };
    round_trip(&secured(proxy.address(), token("tok-3")))
        .await
        .unwrap();
    let refused = round_trip(&secured(proxy.address(), token("tok-0")))
        .await
        .unwrap_err();
    assert!(refused.contains("SASL OAUTHBEARER"), "{refused}");

    // mTLS: a client certificate the CA signed, or none.
    let (proxy, ca, (chain, key)) = proxy_with(dir.path(), None, true).await;
    let (chain_file, key_file) = (dir.path().join("client.pem"), dir.path().join("client.key"));
    std::fs::write(&chain_file, chain).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let with_certificate = format!(
        "security.protocol=SSL\nssl.ca.location={}\nssl.certificate.location={}\n\
         ssl.key.location={}\n",
        ca.display(),
        chain_file.display(),
        key_file.display()
    );
    round_trip(&secured(proxy.address(), with_certificate))
        .await
        .unwrap();
    let without = format!("security.protocol=SSL\nssl.ca.location={}\n", ca.display());
    let refused = round_trip(&secured(proxy.address(), without))
        .await
        .unwrap_err();
    assert!(refused.contains("TLS"), "{refused}");
}
