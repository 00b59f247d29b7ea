//! A Kafka client properties file (the format of Java's
//! `client.properties`), read into the settings this client has:
//! `--kafka-config FILE` of every program that takes `--brokers`.
//!
//! | property | meaning |
//! |---|---|
//! | `security.protocol` | `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL` |
//! | `sasl.mechanism` | `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER` |
//! | `sasl.username`, `sasl.password` | librdkafka's names of the credentials |
//! | `sasl.jaas.config` | Java's: `… required username="…" password="…";` |
//! | `sasl.oauthbearer.token` | a static OAUTHBEARER token (this client's own name) |
//! | `ssl.ca.location` | the CA file (PEM); absent: the system's roots |
//! | `ssl.certificate.location`, `ssl.key.location` | the client's certificate and key (PEM), for mTLS |
//! | `compression.type` | `none`, `gzip`, `snappy`, `lz4`, `zstd` (the Kafka sink's) |
//! | `client.id` | the client id brokers see |
//! | `bootstrap.servers` | the brokers, where a program's `--brokers` is not given |
//!
//! Other properties (a producer's `acks`, `linger.ms`, …) are listed in
//! [`ClientProperties::ignored`] for the program to warn about; settings
//! that this client cannot honour (Java's key stores, an encrypted key,
//! the server name check turned off) are refused, naming what to use.

use std::path::Path;
use std::sync::Arc;

use crate::security::{Sasl, SaslMechanism, Secret, Security, StaticToken, TlsFiles};
use crate::CompressionType;

/// What a properties file sets. Made by [`ClientProperties::parse`] or
/// [`ClientProperties::read`]; its `Debug` prints no secret.
#[derive(Debug, Clone, Default)]
pub struct ClientProperties {
    /// TLS and SASL.
    pub security: Security,
    /// `compression.type`, if set.
    pub compression: Option<CompressionType>,
    /// `client.id`, if set.
    pub client_id: Option<String>,
    /// `bootstrap.servers`, if set.
    pub bootstrap: Option<String>,
    /// The properties this client does not use, by name.
    pub ignored: Vec<String>,
}

/// The `key=value` pairs of a properties file, in order: comments (`#`,
/// `!`) and blank lines skipped, a line ending in `\` continued, the key
/// ended by the first unescaped `=`, `:` or space, escapes read.
fn pairs(text: &str) -> Vec<(String, String)> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim_start();
        if current.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        let trailing = line.len() - line.trim_end_matches('\\').len();
        if trailing % 2 == 1 {
            current.push_str(&line[..line.len() - 1]);
            continue;
        }
        current.push_str(line);
        logical.push(std::mem::take(&mut current));
    }
    if !current.is_empty() {
        logical.push(current);
    }
    logical
        .into_iter()
        .map(|line| {
            let mut key = String::new();
            let mut chars = line.chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => key.push(unescape(chars.next())),
                    '=' | ':' => break,
                    c if c.is_whitespace() => {
                        while chars.peek().is_some_and(|c| c.is_whitespace()) {
                            chars.next();
                        }
                        if matches!(chars.peek(), Some('=') | Some(':')) {
                            chars.next();
                        }
                        break;
                    }
                    c => key.push(c),
                }
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.push(unescape(chars.next())),
                    c => value.push(c),
                }
            }
            (key, value)
        })
        .collect()
}

fn unescape(c: Option<char>) -> char {
    match c {
        Some('t') => '\t',
        Some('n') => '\n',
        Some('r') => '\r',
        Some(other) => other,
        None => '\\',
    }
}

/// The `username` and `password` of a JAAS line (`sasl.jaas.config`).
fn jaas_credentials(config: &str) -> (Option<String>, Option<String>) {
    let field = |name: &str| {
        let at = config.find(&format!("{name}=\""))? + name.len() + 2;
        let end = config[at..].find('"')?;
        Some(config[at..at + end].to_string())
    };
    (field("username"), field("password"))
}

impl ClientProperties {
    /// Reads the properties file at `path`.
    pub fn read(path: &Path) -> Result<ClientProperties, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the Kafka client properties {}: {e}", path.display()))?;
        ClientProperties::parse(&text)
            .map_err(|e| format!("the Kafka client properties {}: {e}", path.display()))
    }

    /// The settings `text` (a properties file) holds, checked.
    pub fn parse(text: &str) -> Result<ClientProperties, String> {
        let mut properties = ClientProperties::default();
        let mut mechanism = None;
        let mut username = None;
        let mut password = None;
        let mut token = None;
        let mut tls = TlsFiles::default();
        for (key, value) in pairs(text) {
            let value = value.trim().to_string();
            match key.as_str() {
                "security.protocol" => properties.security.protocol = value.parse()?,
                "sasl.mechanism" | "sasl.mechanisms" => {
                    mechanism = Some(value.parse::<SaslMechanism>()?)
                }
                "sasl.username" => username = Some(value),
                "sasl.password" => password = Some(value),
                "sasl.jaas.config" => {
                    let (user, pass) = jaas_credentials(&value);
                    username = user.or(username);
                    password = pass.or(password);
                }
                "sasl.oauthbearer.token" => token = Some(value),
                "ssl.ca.location" => tls.ca_location = Some(value.into()),
                "ssl.certificate.location" => tls.certificate_location = Some(value.into()),
                "ssl.key.location" => tls.key_location = Some(value.into()),
                "ssl.endpoint.identification.algorithm" if value.eq_ignore_ascii_case("https") => {}
                "ssl.endpoint.identification.algorithm" => {
                    return Err(format!(
                        "ssl.endpoint.identification.algorithm {value:?}: the broker's name is \
                         always checked against its certificate (https); give the brokers by \
                         the name their certificates carry"
                    ))
                }
                "ssl.truststore.location" | "ssl.keystore.location" => {
                    return Err(format!(
                        "{key}: Java key stores are not read; give PEM files: ssl.ca.location for \
                         the CAs, ssl.certificate.location and ssl.key.location for the client"
                    ))
                }
                "ssl.key.password" => {
                    return Err(
                        "ssl.key.password: encrypted keys are not read; give the key unencrypted \
                         (PEM) in ssl.key.location"
                            .into(),
                    )
                }
                "compression.type" => properties.compression = Some(value.parse()?),
                "client.id" => properties.client_id = Some(value),
                "bootstrap.servers" => properties.bootstrap = Some(value),
                _ => properties.ignored.push(key),
            }
        }
        properties.security.tls = tls;
        if properties.security.protocol.sasl() {
            let mechanism = mechanism.ok_or(
                "sasl.mechanism is not set: Java's default, GSSAPI (Kerberos), is not supported; \
                 set PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
            )?;
            properties.security.sasl = Some(Sasl {
                mechanism,
                username: username.unwrap_or_default(),
                password: Secret::new(password.unwrap_or_default()),
                token: token.map(|t| {
                    Arc::new(StaticToken(Secret::new(t))) as Arc<dyn crate::TokenProvider>
                }),
            });
        }
        properties.security.check()?;
        Ok(properties)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SecurityProtocol;

    #[test]
    fn a_java_client_properties_file_reads_as_its_settings() {
        let text = r#"
# Confluent Cloud, as its console writes it
bootstrap.servers=pkc-1.eu-west-1.aws.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.mechanism = SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="alice" password="s3cr=t";
ssl.ca.location: /etc/ssl/ca.pem
compression.type zstd
acks=all
! a comment
"#;
        let p = ClientProperties::parse(text).unwrap();
        assert_eq!(p.security.protocol, SecurityProtocol::SaslSsl);
        let sasl = p.security.sasl.as_ref().unwrap();
        assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
        assert_eq!(sasl.username, "alice");
        assert_eq!(sasl.password.expose(), "s3cr=t");
        assert_eq!(
            p.security.tls.ca_location.as_deref(),
            Some(Path::new("/etc/ssl/ca.pem"))
        );
        assert_eq!(p.compression, Some(CompressionType::Zstd));
        assert_eq!(
            p.bootstrap.as_deref(),
            Some("pkc-1.eu-west-1.aws.confluent.cloud:9092")
        );
        assert_eq!(p.ignored, vec!["acks"]);
        let shown = format!("{p:?}");
        assert!(!shown.contains("s3cr=t"), "a secret printed: {shown}");
    }

    #[test]
    fn librdkafka_names_work_and_what_cannot_be_honoured_is_refused_naming_the_fix() {
        let p = ClientProperties::parse(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n",
        )
        .unwrap();
        assert_eq!(p.security.sasl.unwrap().password.expose(), "p");
        let refused = |text: &str| ClientProperties::parse(text).unwrap_err();
        assert!(refused("security.protocol=SASL_SSL\n").contains("GSSAPI"));
        assert!(
            refused("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n").contains("sasl.username")
        );
        assert!(
            refused("security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n").contains("token")
        );
        assert!(refused("security.protocol=TLS\n").contains("SASL_SSL"));
        assert!(refused("sasl.mechanism=GSSAPI\n").contains("GSSAPI is not supported"));
        assert!(refused("ssl.truststore.location=/x.jks\n").contains("ssl.ca.location"));
        assert!(refused("ssl.key.password=x\n").contains("unencrypted"));
        assert!(refused("ssl.endpoint.identification.algorithm=\n").contains("always checked"));
        assert!(refused("ssl.certificate.location=/c.pem\n").contains("ssl.key.location"));
        assert!(refused("compression.type=brotli\n").contains("zstd"));
        let token = ClientProperties::parse(
            "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token=t0k\n",
        )
        .unwrap();
        assert!(!format!("{token:?}").contains("t0k"));
    }
}
