//! iceberg-rust's errors, classed for the runtime: what a restart may cure
//! (an unreachable catalog or store, a lost commit race) is transient; what
//! needs a person (a missing namespace or table, a feature the library
//! lacks, a requirement the table does not meet) is permanent.
//!
//! `DataInvalid` stays transient: iceberg-rust's local storage reports
//! every I/O failure with it (a file it could not open, a descriptor
//! limit), and so does a snapshot refused for a clock that stepped back,
//! which waiting cures. The restart strategy bounds the retries of what a
//! restart cannot cure.

use iceberg::{Error, ErrorKind};
use sink_api::SinkError;

/// `error`, met while `doing`, as a [`SinkError`] of the right class, with
/// the cause chain kept.
pub(crate) fn iceberg_error(doing: impl Into<String>, error: Error) -> SinkError {
    let permanent = is_permanent(&error);
    let error = SinkError::other(doing, error);
    if permanent {
        error.permanent()
    } else {
        error
    }
}

/// A start of the job found that a newer start claimed the table: it
/// commits nothing more. Permanent: the newer start owns the output (this
/// one is a zombie, cut off from its successor, or started twice).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this start (generation {generation}) of {app_id} was fenced off the table: a newer start \
     (generation {newer}) claimed it, so this one commits nothing more"
)]
pub struct TableFenced {
    /// The job's name and lineage (`<job>/<lineage>`).
    pub app_id: String,
    /// This start's generation.
    pub generation: u64,
    /// The generation that claimed the table.
    pub newer: u64,
}

fn is_permanent(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::NamespaceNotFound
        | ErrorKind::TableNotFound
        | ErrorKind::FeatureUnsupported
        | ErrorKind::PreconditionFailed => true,
        ErrorKind::Unexpected => refused_credentials(error),
        // A commit race, an unreachable catalog or store, and whatever the
        // library does not class: a restart reads the table again.
        _ => false,
    }
}

/// Whether a REST catalog answered 401 or 403: credentials it refuses,
/// which no restart cures. iceberg-catalog-rest reports any unexpected
/// answer as `Unexpected`, with the status in its context (`status` for a
/// catalog call, `code` for the token endpoint); only the text shows it.
fn refused_credentials(error: &Error) -> bool {
    let text = error.to_string();
    ["status: 401", "status: 403", "code: 401", "code: 403"]
        .iter()
        .any(|answer| text.contains(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_table_is_permanent_and_a_commit_race_is_not() {
        let missing = Error::new(ErrorKind::TableNotFound, "no table db.events");
        let error = iceberg_error("loading db.events", missing);
        assert!(error.is_permanent());
        assert!(error.to_string().contains("no table db.events"), "{error}");
        let race = Error::new(ErrorKind::CatalogCommitConflicts, "metadata moved");
        assert!(!iceberg_error("committing", race).is_permanent());
        // A REST catalog refusing the credentials, at a call or at the
        // token endpoint; a server error stays transient.
        for (key, value, permanent) in [
            ("status", "403 Forbidden", true),
            ("code", "401 Unauthorized", true),
            ("status", "503 Service Unavailable", false),
        ] {
            let answer = Error::new(ErrorKind::Unexpected, "Received unexpected response")
                .with_context(key, value);
            assert_eq!(
                iceberg_error("reading db.events", answer).is_permanent(),
                permanent,
                "{value}"
            );
        }
    }
}
