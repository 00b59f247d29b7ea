//! The limits of S3's multipart uploads, which the S3-compatible servers
//! share: the file sink's defaults and checks on an object store output.
//! Plain constants, in builds without object stores too (the builder's
//! default part size).

/// The smallest part S3 accepts in a multipart upload (but the last): the
/// default part size of an object store output.
pub const S3_MINIMUM_PART_SIZE: usize = 5 * 1024 * 1024;

/// The most parts one multipart upload may have.
#[cfg(feature = "object-store")]
pub(crate) const MAX_PARTS: u64 = 10_000;
