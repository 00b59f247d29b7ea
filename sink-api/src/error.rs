//! The error a sink returns to the runtime, and its class.
//!
//! Expected outcomes of a commit (already committed, retry later, a known
//! failure) are not errors: they are values on the
//! [`CommitRequest`](crate::CommitRequest). A [`SinkError`] is for failures
//! that stop the job. Each has a class:
//!
//! - **transient** (the default): a restart from the last completed
//!   checkpoint may succeed (a lost connection, a server restarting, a full
//!   disk being cleaned). The job's restart strategy applies.
//! - **permanent**: no restart can succeed until someone changes something
//!   (a missing table, bad credentials, a malformed configuration, stored
//!   state that does not decode). The job fails at once, without restarts,
//!   with the whole cause chain in its message.
//! - **superseded**: a commit found its source positions moved in the
//!   destination (another owner of a split committed those records; see
//!   the `positions` module). The job restarts at once, outside its restart
//!   strategy, and reads again from the destination's positions. Returned
//!   by a global committer, which has no
//!   [`CommitRequest`](crate::CommitRequest) to signal it on.
//!
//! The cause is kept as the error's [`source`](std::error::Error::source),
//! and shown in the message: a driver's error is never reduced to words.

use std::error::Error as StdError;
use std::fmt;

use crate::serializer::SerializerError;

/// Whether restarting may help; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A restart from the last completed checkpoint may succeed.
    Transient,
    /// Nothing succeeds until someone changes something; no restart.
    Permanent,
    /// The commit's source positions moved in the destination: the job
    /// restarts at once and reads from the destination's positions.
    Superseded,
}

/// A failure in a sink that the runtime cannot handle by itself.
///
/// Made by the sink with [`msg`](Self::msg), [`io`](Self::io) or
/// [`other`](Self::other) (transient), marked
/// [`permanent`](Self::permanent) when a restart cannot help. Its message
/// says what was being done, followed by every cause in its chain; every
/// message should also say what the user can do.
pub struct SinkError {
    class: ErrorClass,
    context: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl SinkError {
    /// A transient failure described in words.
    pub fn msg(message: impl Into<String>) -> SinkError {
        SinkError {
            class: ErrorClass::Transient,
            context: message.into(),
            source: None,
        }
    }

    /// A transient I/O failure, with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> SinkError {
        SinkError::other(context, source)
    }

    /// A transient failure, with what was being done and its cause, which is
    /// kept as the error's `source()`.
    pub fn other(
        context: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> SinkError {
        SinkError {
            class: ErrorClass::Transient,
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// The same error, marked permanent: the job fails at once, without
    /// restarts.
    pub fn permanent(mut self) -> SinkError {
        self.class = ErrorClass::Permanent;
        self
    }

    /// The same error, marked transient: the restart strategy applies.
    pub fn transient(mut self) -> SinkError {
        self.class = ErrorClass::Transient;
        self
    }

    /// The same error, marked superseded: what it commits carries source
    /// positions another owner moved (typically caused by a
    /// [`PositionConflict`](crate::PositionConflict)). The job restarts at
    /// once from the destination's positions. For global committers; a
    /// committer signals it on its request instead
    /// ([`CommitRequest::signal_superseded`](crate::CommitRequest::signal_superseded)).
    pub fn superseded(mut self) -> SinkError {
        self.class = ErrorClass::Superseded;
        self
    }

    /// Whether it is superseded. Read by the runtime's restart loop.
    pub fn is_superseded(&self) -> bool {
        self.class == ErrorClass::Superseded
    }

    /// Its class.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// Whether it is permanent. Read by the runtime to decide on a restart.
    pub fn is_permanent(&self) -> bool {
        self.class == ErrorClass::Permanent
    }

    /// What was being done, without the causes.
    pub fn context(&self) -> &str {
        &self.context
    }
}

impl fmt::Display for SinkError {
    /// What was being done, then each cause of the chain: `context: cause:
    /// cause of the cause`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)?;
        let mut cause = self
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static));
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkError")
            .field("class", &self.class)
            .field("context", &self.context)
            .field("source", &self.source)
            .finish()
    }
}

impl StdError for SinkError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl From<SerializerError> for SinkError {
    /// A committable or writer state that does not encode or decode: a
    /// restart meets the same bytes, so it is permanent.
    fn from(error: SerializerError) -> SinkError {
        SinkError::other("encoding or decoding the sink's state", error).permanent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Refused;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to db:5432")]
    struct Driver(#[source] Refused);

    #[test]
    fn the_message_carries_the_whole_cause_chain() {
        let error = SinkError::other("opening the table t", Driver(Refused));
        assert_eq!(
            error.to_string(),
            "opening the table t: cannot connect to db:5432: connection refused"
        );
        let source = error.source().expect("the driver's error is kept");
        assert_eq!(source.to_string(), "cannot connect to db:5432");
        assert!(source.source().is_some(), "and its own cause");
    }

    #[test]
    fn errors_are_transient_unless_marked_permanent() {
        assert_eq!(SinkError::msg("x").class(), ErrorClass::Transient);
        let permanent = SinkError::msg("table t does not exist").permanent();
        assert!(permanent.is_permanent());
        assert!(!permanent.transient().is_permanent());
        let decode = SerializerError::BadEnvelope { what: "T", len: 3 };
        assert!(SinkError::from(decode).is_permanent());
    }
}
