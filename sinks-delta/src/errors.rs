//! delta-rs' and object_store's errors, classed for the runtime: what a
//! restart may cure (an unreachable server, a lost commit race) is
//! transient; what needs a person (credentials, a missing bucket, a table
//! of another schema, records the schema cannot hold) is permanent.

use deltalake_core::kernel::transaction::TransactionError;
use deltalake_core::DeltaTableError;
use sink_api::SinkError;

/// `error`, met while `doing`, as a [`SinkError`] of the right class, with
/// the cause chain kept.
pub(crate) fn delta_error(doing: impl Into<String>, error: DeltaTableError) -> SinkError {
    let permanent = is_permanent(&error);
    let error = SinkError::other(doing, error);
    if permanent {
        error.permanent()
    } else {
        error
    }
}

/// An object store's `error`, met while `doing`, classed likewise.
pub(crate) fn store_error(doing: impl Into<String>, error: object_store::Error) -> SinkError {
    let permanent = is_permanent_store(&error);
    let error = SinkError::other(doing, error);
    if permanent {
        error.permanent()
    } else {
        error
    }
}

fn is_permanent(error: &DeltaTableError) -> bool {
    match error {
        DeltaTableError::ObjectStore { source } => is_permanent_store(source),
        DeltaTableError::Transaction { source } => match source {
            TransactionError::ObjectStore { source } => is_permanent_store(source),
            TransactionError::DeltaTableAppendOnly
            | TransactionError::UnsupportedTableFeatures(_)
            | TransactionError::TableFeaturesRequired(_) => true,
            _ => false,
        },
        DeltaTableError::NotATable(_)
        | DeltaTableError::NoSchema
        | DeltaTableError::SchemaMismatch { .. }
        | DeltaTableError::PartitionError { .. }
        | DeltaTableError::InvalidTableLocation(_)
        | DeltaTableError::MissingFeature { .. }
        | DeltaTableError::Arrow { .. }
        | DeltaTableError::InvalidJsonLog { .. } => true,
        // delta-kernel wraps the store's errors in its own, as text.
        other => refused_by_store(&other.to_string()),
    }
}

/// Whether a store's answer, as text, is a refusal no retry can cure: S3
/// answers 404 for a missing bucket as for a missing object, and 403 for
/// bad keys: the code is in the body.
fn refused_by_store(text: &str) -> bool {
    [
        "NoSuchBucket",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
    ]
    .iter()
    .any(|code| text.contains(code))
}

/// Refusals that repeat until someone acts: credentials, permissions, a
/// missing bucket, a configuration the store does not support.
fn is_permanent_store(error: &object_store::Error) -> bool {
    match error {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. }
        | object_store::Error::NotSupported { .. }
        | object_store::Error::NotImplemented { .. }
        | object_store::Error::UnknownConfigurationKey { .. } => true,
        other => refused_by_store(&other.to_string()),
    }
}

/// The cause of the permanent error a start of a job meets once a newer
/// start of the same job claimed the table: it commits nothing more. A
/// service can tell it from other failures by looking for it in the error's
/// chain (`ingest-service` exits with its own status then, so that a
/// supervisor does not start it again and take the table back).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this start (generation {generation}) of {app_id} was fenced off the table: a newer start \
     (generation {newer}) claimed it, so this one commits nothing more"
)]
pub struct TableFenced {
    /// The job's application id (`<job>/<lineage>`).
    pub app_id: String,
    /// This start's generation.
    pub generation: i64,
    /// The generation that claimed the table.
    pub newer: i64,
}
