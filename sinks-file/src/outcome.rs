//! What became of one committable: decided by the committer for a local
//! part (through the position log for a position group's), by the upload
//! commit for an object store part, and signalled on the commit request
//! afterwards.

/// What became of one committable, decided (for a local output, off the
/// async workers) and signalled on the request afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Committed,
    /// An upload not yet complete: tried again later.
    #[cfg(feature = "object-store")]
    RetryLater,
    AlreadyCommitted,
    RecordsLost(u64, String),
    /// Nothing of a position group was applied: a split it advances is
    /// not where it expects (see the `position_commit` module).
    Superseded(String),
    Unknown(String),
}
