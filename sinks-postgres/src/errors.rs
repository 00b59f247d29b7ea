//! Driver errors as the sink's errors: what was being done, the SQLSTATE,
//! and whether a restart can help. Used by the writer, the committer, the
//! start hook and the positions module.

use sink_api::SinkError;

/// Turns a driver error met while doing `what` into the sink's error (see
/// [`sink_error`]).
pub(crate) fn failed(what: String) -> impl FnOnce(tokio_postgres::Error) -> SinkError {
    move |error| sink_error(what, error)
}

/// A driver error met while doing `what`, as the sink's error: the SQLSTATE
/// in the message, the driver's error kept as the cause. Permanent when the
/// SQLSTATE says no restart can succeed until someone changes something:
/// authorization (28), syntax or access (42: a missing table or column, no
/// privilege), an unknown database or schema (3D, 3F), bad data (22) or a
/// broken constraint (23). Transient otherwise: connections (08), rolled
/// back transactions (40), resources (53), an operator (57), the system
/// (58), and errors without a server code.
pub(crate) fn sink_error(what: impl std::fmt::Display, error: tokio_postgres::Error) -> SinkError {
    match error.as_db_error().map(|db| db.code().code().to_string()) {
        Some(code) => {
            let permanent = matches!(code.get(..2), Some("28" | "42" | "3D" | "3F" | "22" | "23"));
            let error = SinkError::other(format!("{what} (SQLSTATE {code})"), error);
            if permanent {
                error.permanent()
            } else {
                error
            }
        }
        None => SinkError::other(what.to_string(), error),
    }
}

/// The driver's error with the server's message, detail and SQLSTATE.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(&format!("; {detail}"));
            }
            if let Some(context) = db.where_() {
                text.push_str(&format!("; at {context}"));
            }
            text
        }
        None => error.to_string(),
    }
}
