//! What can go wrong talking to brokers, and which of it is worth a retry.

use std::time::Duration;

use kafka_protocol::error::ResponseError;

/// A failure of the Kafka client under the sink: the connection, the
/// protocol, or an error code in a broker's answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// No TCP connection to the broker.
    #[error("cannot connect to the Kafka broker {address}: {source}")]
    Connect {
        /// `host:port`.
        address: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The broker did not accept a connection in time.
    #[error("the Kafka broker {address} did not accept a connection within {after:?}")]
    ConnectTimeout {
        /// `host:port`.
        address: String,
        /// The time waited.
        after: Duration,
    },
    /// None of the bootstrap brokers could be reached.
    #[error(
        "no Kafka broker of {brokers} could be reached (check the address, and that the broker \
         listens there): {last}"
    )]
    Unreachable {
        /// The bootstrap list.
        brokers: String,
        /// The last broker's failure.
        last: Box<WireError>,
    },
    /// The broker did not answer in time.
    #[error("the Kafka broker {address} did not answer {api} within {after:?}")]
    Timeout {
        /// The request.
        api: &'static str,
        /// `host:port`.
        address: String,
        /// The time waited.
        after: Duration,
    },
    /// The connection broke before the answer came.
    #[error("the connection to the Kafka broker {address} broke: {reason}")]
    Lost {
        /// `host:port`.
        address: String,
        /// Why.
        reason: String,
    },
    /// The connection had broken already.
    #[error("the connection to the Kafka broker {address} is closed")]
    Broken {
        /// `host:port`.
        address: String,
    },
    /// A request could not be encoded (a value out of its field's range).
    #[error("cannot encode the {api} request: {reason}")]
    Encode {
        /// The request.
        api: &'static str,
        /// The encoder's reason.
        reason: String,
    },
    /// A request larger than the protocol allows.
    #[error("a request of {bytes} bytes to {address} is larger than the protocol allows")]
    TooLarge {
        /// `host:port`.
        address: String,
        /// Its size.
        bytes: usize,
    },
    /// An answer that could not be read.
    #[error("the answer of {address} to {api} cannot be read: {reason}")]
    Decode {
        /// The request.
        api: &'static str,
        /// `host:port`.
        address: String,
        /// The decoder's reason.
        reason: String,
    },
    /// The broker speaks no version of a request this crate speaks.
    #[error(
        "the Kafka broker {address} does not support {api} version {min} or later, which the \
         sink needs (Apache Kafka 3.0 or later has every request it sends)"
    )]
    Unsupported {
        /// The request.
        api: &'static str,
        /// The lowest version this crate speaks.
        min: i16,
        /// `host:port`.
        address: String,
    },
    /// An error code in a broker's answer.
    #[error("{api} for {subject} answered {code}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Broker {
        /// The request.
        api: &'static str,
        /// What it was about: a topic partition, a transactional id, a group.
        subject: String,
        /// The error.
        code: ResponseError,
        /// The broker's own words, when it gave some.
        message: Option<String>,
    },
    /// An answer that lacks what was asked for.
    #[error("{0}")]
    Protocol(String),
    /// The TLS handshake failed, or the broker answered in TLS a client
    /// that speaks plaintext: permanent.
    #[error("TLS with {address}: {reason}")]
    Tls {
        /// `host:port`.
        address: String,
        /// What failed, and what to check.
        reason: String,
    },
    /// SASL authentication was refused or failed: permanent.
    #[error("SASL {mechanism} with {address}: {reason}")]
    Sasl {
        /// `host:port`.
        address: String,
        /// The mechanism.
        mechanism: &'static str,
        /// What failed, and what to check (never the secret).
        reason: String,
    },
}

impl WireError {
    /// An error code in an answer to `api` about `subject`; `None` for 0.
    pub fn check(
        api: &'static str,
        subject: impl FnOnce() -> String,
        code: i16,
    ) -> Result<(), WireError> {
        match ResponseError::try_from_code(code) {
            None => Ok(()),
            Some(code) => Err(WireError::Broker {
                api,
                subject: subject(),
                code,
                message: None,
            }),
        }
    }

    /// The broker's error code, if this is one.
    pub fn code(&self) -> Option<ResponseError> {
        match self {
            WireError::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the producer this was about was fenced: a newer producer
    /// of its transactional id exists (Apache Kafka answers
    /// `PRODUCER_FENCED`, older brokers and noida-db
    /// `INVALID_PRODUCER_EPOCH`).
    pub fn is_fenced(&self) -> bool {
        matches!(
            self.code(),
            Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch)
        )
    }

    /// Whether the same request may succeed later, on the same or a new
    /// connection: the connection's failures, and the error codes Kafka
    /// marks retriable (a leader or coordinator moving, a coordinator
    /// loading, concurrent transactions finishing).
    pub fn is_retriable(&self) -> bool {
        match self {
            WireError::Connect { .. }
            | WireError::ConnectTimeout { .. }
            | WireError::Unreachable { .. }
            | WireError::Timeout { .. }
            | WireError::Lost { .. }
            | WireError::Broken { .. } => true,
            WireError::Broker { code, .. } => {
                code.is_retriable() || matches!(code, ResponseError::ConcurrentTransactions)
            }
            _ => false,
        }
    }

    /// Whether the connection it came from should be given up (and the
    /// broker's metadata read again).
    pub fn breaks_connection(&self) -> bool {
        matches!(
            self,
            WireError::Timeout { .. }
                | WireError::Lost { .. }
                | WireError::Broken { .. }
                | WireError::Decode { .. }
        )
    }

    /// Whether the answer says the request went to the wrong broker: a
    /// partition's leader or a coordinator moved.
    pub fn is_misdirected(&self) -> bool {
        matches!(
            self.code(),
            Some(
                ResponseError::NotLeaderOrFollower
                    | ResponseError::NotCoordinator
                    | ResponseError::CoordinatorNotAvailable
                    | ResponseError::LeaderNotAvailable
                    | ResponseError::UnknownTopicOrPartition
            )
        )
    }
}
