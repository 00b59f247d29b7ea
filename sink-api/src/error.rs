//! The error a sink returns to the runtime.
//!
//! Expected outcomes of a commit (already committed, retry later, a known
//! failure) are not errors: they are values on the
//! [`CommitRequest`](crate::CommitRequest). A [`SinkError`] is for failures
//! that must stop the job; the runtime fails the job with it and, once a
//! restart strategy exists, restarts from the last completed checkpoint.

use std::error::Error as StdError;

use crate::serializer::SerializerError;

/// A failure in a sink that the runtime cannot handle by itself.
///
/// Every message should say what was being done and what the user can do.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the sink was doing, for example "writing part file /out/.part-1".
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A committable or a writer state could not be encoded or decoded.
    #[error(transparent)]
    Serialization(#[from] SerializerError),
    /// Any other failure, described in words.
    #[error("{0}")]
    Message(String),
    /// Any other failure, with its cause.
    #[error("{context}: {source}")]
    Other {
        /// What the sink was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<dyn StdError + Send + Sync + 'static>,
    },
}

impl SinkError {
    /// A failure described only in words.
    pub fn msg(message: impl Into<String>) -> SinkError {
        SinkError::Message(message.into())
    }

    /// An I/O failure, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> SinkError {
        SinkError::Io {
            context: context.into(),
            source,
        }
    }

    /// Any other failure, with what was being done and its cause.
    pub fn other(
        context: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> SinkError {
        SinkError::Other {
            context: context.into(),
            source: source.into(),
        }
    }
}
