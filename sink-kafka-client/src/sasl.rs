//! SASL on a new connection, before any other request: `SaslHandshake`
//! names the mechanism, `SaslAuthenticate` carries its messages until the
//! broker accepts (Kafka's KIP-152 framing).
//!
//! ```text
//!  PLAIN        [authzid] NUL user NUL password                        one round
//!  SCRAM-SHA-*  client-first ─▶ server-first ─▶ client-final ─▶ server-final (checked)
//!  OAUTHBEARER  n,,\x01auth=Bearer <token>\x01\x01                      one round
//! ```
//!
//! A refusal is [`WireError::Sasl`]: permanent, naming the mechanism and
//! the broker's words, never the secret.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::scram::{ScramClient, ScramHash};
use crate::security::{Sasl, SaslMechanism};
use crate::WireError;

/// `SaslHandshake` v1: the mechanism's messages then go in
/// `SaslAuthenticate` requests.
const HANDSHAKE_VERSION: i16 = 1;
/// `SaslAuthenticate` v1: error messages and session lifetimes, without the
/// flexible encoding (Kafka 1.1 and later).
const AUTHENTICATE_VERSION: i16 = 1;

/// One request and its answer on a connection nothing else uses yet.
struct Exchange<'a, S> {
    stream: &'a mut S,
    client_id: &'a str,
    address: &'a str,
    mechanism: SaslMechanism,
    correlation: i32,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Exchange<'_, S> {
    fn refused(&self, reason: impl Into<String>) -> WireError {
        WireError::Sasl {
            address: self.address.to_string(),
            mechanism: self.mechanism.name(),
            reason: reason.into(),
        }
    }

    async fn call<Q, A>(&mut self, key: ApiKey, version: i16, request: &Q) -> Result<A, WireError>
    where
        Q: Encodable + HeaderVersion,
        A: Decodable + HeaderVersion,
    {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_string(self.client_id.to_string())));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        header
            .encode(&mut frame, Q::header_version(version))
            .map_err(|e| WireError::Encode {
                api: "SASL",
                reason: e.to_string(),
            })?;
        request
            .encode(&mut frame, version)
            .map_err(|e| WireError::Encode {
                api: "SASL",
                reason: e.to_string(),
            })?;
        let length = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&length.to_be_bytes());
        let lost = |e: std::io::Error| WireError::Lost {
            address: self.address.to_string(),
            reason: format!("during SASL authentication: {e}"),
        };
        self.stream.write_all(&frame).await.map_err(lost)?;
        let length = self.stream.read_i32().await.map_err(lost)?;
        let length = usize::try_from(length)
            .ok()
            .filter(|l| *l <= 1 << 20)
            .ok_or_else(|| self.refused(format!("an answer of {length} bytes")))?;
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.map_err(lost)?;
        let mut body = Bytes::from(body);
        let decode = |reason: String| WireError::Decode {
            api: "SASL",
            address: self.address.to_string(),
            reason,
        };
        let answer_header = ResponseHeader::decode(&mut body, A::header_version(version))
            .map_err(|e| decode(e.to_string()))?;
        if answer_header.correlation_id != self.correlation {
            return Err(self.refused("an answer to another request"));
        }
        let answer = A::decode(&mut body, version).map_err(|e| decode(e.to_string()))?;
        if body.has_remaining() {
            return Err(self.refused("an answer longer than its fields"));
        }
        Ok(answer)
    }

    /// One `SaslAuthenticate` round: `bytes` out, the broker's bytes back.
    async fn round(&mut self, bytes: Vec<u8>) -> Result<Bytes, WireError> {
        let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let answer: SaslAuthenticateResponse = self
            .call(ApiKey::SaslAuthenticate, AUTHENTICATE_VERSION, &request)
            .await?;
        if let Some(code) = ResponseError::try_from_code(answer.error_code) {
            let words = answer
                .error_message
                .map(|m| m.to_string())
                .unwrap_or_default();
            return Err(self.refused(format!(
                "the broker refused the credentials ({code}{}): check sasl.username and \
                 sasl.password (or the token), and the mechanism the broker enables for the user",
                if words.is_empty() {
                    String::new()
                } else {
                    format!(": {words}")
                }
            )));
        }
        Ok(answer.auth_bytes)
    }
}

/// A random nonce for SCRAM: printable, without `,`.
fn nonce() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a nonce: {e}"))?;
    Ok(bytes
        .iter()
        .map(|b| {
            const ALPHABET: &[u8] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            ALPHABET[usize::from(*b) % ALPHABET.len()] as char
        })
        .collect())
}

/// Authenticates the connection `stream` to the broker at `address` with
/// `sasl`. Called by `Connection::open` (the `connection` module)
/// before the connection is used.
pub(crate) async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    sasl: &Sasl,
    client_id: &str,
    address: &str,
) -> Result<(), WireError> {
    let mut exchange = Exchange {
        stream,
        client_id,
        address,
        mechanism: sasl.mechanism,
        correlation: 0,
    };
    let handshake = SaslHandshakeRequest::default()
        .with_mechanism(StrBytes::from_static_str(sasl.mechanism.name()));
    let answer: SaslHandshakeResponse = exchange
        .call(ApiKey::SaslHandshake, HANDSHAKE_VERSION, &handshake)
        .await?;
    if let Some(code) = ResponseError::try_from_code(answer.error_code) {
        let enabled: Vec<String> = answer.mechanisms.iter().map(|m| m.to_string()).collect();
        return Err(exchange.refused(format!(
            "the broker does not take this mechanism ({code}); it enables {}: set sasl.mechanism \
             to one of them",
            if enabled.is_empty() {
                "none".to_string()
            } else {
                enabled.join(", ")
            }
        )));
    }
    match sasl.mechanism {
        SaslMechanism::Plain => {
            let mut message = Vec::new();
            message.push(0);
            message.extend_from_slice(sasl.username.as_bytes());
            message.push(0);
            message.extend_from_slice(sasl.password.expose().as_bytes());
            exchange.round(message).await?;
        }
        SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
            let hash = match sasl.mechanism {
                SaslMechanism::ScramSha256 => ScramHash::Sha256,
                _ => ScramHash::Sha512,
            };
            let nonce = nonce().map_err(|e| exchange.refused(e))?;
            let mut client = ScramClient::new(hash, &sasl.username, sasl.password.expose(), &nonce);
            let server_first = exchange.round(client.client_first().into_bytes()).await?;
            let server_first = String::from_utf8_lossy(&server_first).into_owned();
            let client_final = client
                .client_final(&server_first)
                .map_err(|e| exchange.refused(e.to_string()))?;
            let server_final = exchange.round(client_final.into_bytes()).await?;
            client
                .check_server_final(&String::from_utf8_lossy(&server_final))
                .map_err(|e| exchange.refused(e.to_string()))?;
        }
        SaslMechanism::OAuthBearer => {
            let provider = sasl
                .token
                .as_ref()
                .ok_or_else(|| exchange.refused("no token provider"))?;
            let token = provider
                .token()
                .await
                .map_err(|e| exchange.refused(format!("the token provider failed: {e}")))?;
            let message = format!("n,,\x01auth=Bearer {}\x01\x01", token.expose());
            exchange.round(message.into_bytes()).await?;
        }
    }
    Ok(())
}
