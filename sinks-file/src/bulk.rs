//! Bulk formats: parts written as a whole, such as Parquet, rather than a
//! row at a time.
//!
//! A row format ([`Encoder::encode`](crate::Encoder::encode)) turns each
//! record into its own bytes, so a part can be cut at any record and resumed
//! after a restore. A bulk format keeps state per part (a Parquet row group
//! being built, the footer still to come): its bytes mean something only
//! once the part is finished. So, as in Flink's `BulkFormat` rule:
//!
//! - every part of a bulk format is finished and rolled at every checkpoint
//!   (the builder sets [`RollingPolicy::roll_on_checkpoint`](crate::RollingPolicy));
//!   a checkpoint never records one in progress;
//! - a part may roll earlier, at the policy's size (its bytes so far and
//!   what the format holds in memory), or by time;
//! - the lifecycle is otherwise the row formats' own: a hidden in-progress
//!   file or multipart upload, pending once finished, visible at its
//!   checkpoint's commit.
//!
//! ```text
//!  first record of a bucket ─▶ BulkFormat::open_part ─▶ BulkPart
//!  each record              ─▶ BulkPart::add: bytes encoded so far (a row group) ─▶ the part
//!  roll (checkpoint, size)  ─▶ BulkPart::finish: the rest and the footer ─▶ the part, closed
//! ```
//!
//! Called by the file writer only, from its task; the bytes go through the
//! same in-progress part as a row format's, locally or as a multipart upload.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use sink_api::SinkError;

/// A format whose parts are written as a whole: returned by an encoder's
/// [`Encoder::bulk`](crate::Encoder::bulk).
///
/// Called by the file writer when a bucket opens a part, and by the
/// sink's builder once.
///
/// # Guarantees
///
/// Each [`open_part`](Self::open_part) starts an independent part: parts of
/// one format never share state that a restart would lose.
pub trait BulkFormat<T>: Send + Sync + 'static {
    /// The writer of one new part.
    fn open_part(&self) -> Result<Box<dyn BulkPart<T>>, SinkError>;

    /// How compaction merges committed parts of this format into one;
    /// `None` when it cannot, and the builder then refuses compaction.
    fn merger(&self) -> Option<Arc<dyn PartMerger>>;
}

/// One part of a bulk format being written. Made by
/// [`BulkFormat::open_part`]; the file writer appends what it hands out to
/// the part's file or upload, in order.
///
/// # Guarantees
///
/// - [`add`](Self::add) takes the record or fails without appending;
///   after an error the part is abandoned (the job restarts from its last
///   checkpoint).
/// - The concatenation of everything appended by `add` and `finish` is one
///   complete file of the format holding every record added.
pub trait BulkPart<T>: Send {
    /// Adds `record`; appends to `out` whatever bytes of the part are
    /// complete (a finished row group), possibly none.
    fn add(&mut self, record: &T, out: &mut Vec<u8>) -> Result<(), SinkError>;

    /// Bytes held in memory for the part, not yet appended: counted with
    /// the part's size for rolling.
    fn buffered_bytes(&self) -> u64;

    /// Ends the part: appends everything still held, then the format's end
    /// (Parquet's footer).
    fn finish(self: Box<Self>, out: &mut Vec<u8>) -> Result<(), SinkError>;
}

/// Merges committed parts of one bulk format into one file: what the
/// compactor runs, on a blocking thread, for a bulk format.
///
/// # Guarantees
///
/// Writes into `merged` one complete file holding every record of
/// `sources`, in their order, and returns how many records that is;
/// refuses a source that is not a complete file of the format. Leaves the
/// sources untouched and syncs nothing (the compactor does).
pub trait PartMerger: Send + Sync + 'static {
    /// Merges `sources` (each with the size it was listed with, refused if
    /// it is not that size any more) into `merged`.
    fn merge(&self, sources: &[(PathBuf, u64)], merged: &mut File) -> Result<u64, SinkError>;
}
