//! The file sink: records into part files, made visible exactly once.
//!
//! ```text
//!  .part-<id>-<n>.inprogress.<lineage>  ──roll──▶  (same file, closed, fsynced: pending)
//!                                                  │ checkpoint completes: commit = atomic rename
//!                                                  ▼
//!                                           part-<id>-<n><suffix>  (finished, visible)
//! ```
//!
//! | module | holds |
//! |---|---|
//! | [`encoder`] | how a record becomes a row: lines, JSON lines, CSV |
//! | [`bulk`], `parquet` | formats written a part at a time: the contract, and Parquet (feature `parquet`), its parts finished at every checkpoint |
//! | [`bucket`] | which directory a record goes to: the base path, the writer's date-time, a closure |
//! | [`hive`] | Hive-style `key=value` directories from the record itself: its event time, its fields |
//! | [`rolling`] | when a part rolls: size, age, inactivity, every checkpoint |
//! | `part_file` | the life of one part file on disk |
//! | `blocking` | fsyncs, renames and creations on tokio's blocking threads, never on the async workers |
//! | `identity` | the output directory's identity marker (`.file-sink-id`) and paths relative to it |
//! | `orphans` | hidden parts of this lineage no checkpoint refers to, removed at each start |
//! | `segments`, `compaction` | with compaction on: committed files in segment directories, merged a segment at a time and swapped in atomically |
//! | `placement` | where a committed part goes (its target, or with compaction the current epoch's segment of its bucket), and the directories its rename touched |
//! | `position_group`, `position_log`, `group_set`, `position_commit` | with a source whose positions are committed with the data: a writer's checkpoint as one position group; the position log in `<out>/.positions` (entries linked exclusively, snapshots; on an object store, created by conditional puts); the committed groups as ranges per job life and subtask, of its newest start; a group's commit on a local output (replay check, position check, entry, renames) and the roll-forward of groups a crash cut short |
//! | `writer`, `committer`, `sink` | the `sink-api` implementation |
//! | `object_output`, `upload`, `upload_commit`, `upload_orphans`, `upload_listing`, `upload_positions`, `memory_store` | on an object store (feature `object-store`): the output, a part as a multipart upload, its commit, uploads no checkpoint names, the uploads in progress into a key, a position group's commit (its entry, then its uploads completed, and the roll-forward), an in-memory store for tests |
//! | `multipart_limits` | S3's limits on multipart uploads |
//!
//! Everything not yet committed has a hidden name (a leading dot), so a crash
//! at any moment leaves only complete finished files and hidden files:
//! readers of the output directory skip names starting with `.`.
//!
//! Checkpoints name files relative to the base directory, which keeps an
//! identity marker (`.file-sink-id`): a stopped job's directory can be moved
//! or copied, and a state of another directory is refused. The committer
//! commits a pending file only if its size is the recorded one.
//!
//! A source whose positions are committed with the data (a Kafka consumer
//! group) hands each checkpoint's source positions to the writer: every
//! part is rolled, the checkpoint's parts become one position group, and
//! the committer commits the group's files and positions in one step, by an
//! entry in the position log (`<out>/.positions`), only if every split is
//! still where the group expects (`Sink::commits_positions`; on local
//! outputs with compaction or without, and on object stores).
//!
//! ```no_run
//! use sinks_file::{FileSink, LineEncoder, RollingPolicy};
//!
//! let sink = FileSink::builder("/tmp/out", LineEncoder)
//!     .rolling_policy(RollingPolicy::on_checkpoint())
//!     .part_suffix(".txt")
//!     .build()?;
//! # let _: &FileSink<u64, LineEncoder> = &sink;
//! # Ok::<(), sink_api::SinkError>(())
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod blocking;
pub mod bucket;
pub mod bulk;
pub mod clock;
mod committer;
mod compaction;
mod config;
mod dir_sync;
pub mod encoder;
mod format;
mod group_set;
mod hidden_name;
pub mod hive;
mod identity;
mod io_error;
#[cfg(feature = "object-store")]
mod memory_store;
mod multipart_limits;
#[cfg(feature = "object-store")]
mod object_output;
mod orphans;
mod outcome;
mod output;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "object-store")]
mod part_buffers;
mod part_file;
mod placement;
mod position_commit;
mod position_group;
mod position_log;
pub mod rolling;
mod segments;
mod sink;
mod state;
mod stats;
#[cfg(feature = "object-store")]
mod upload;
#[cfg(feature = "object-store")]
mod upload_commit;
#[cfg(feature = "object-store")]
mod upload_listing;
#[cfg(feature = "object-store")]
mod upload_orphans;
#[cfg(feature = "object-store")]
mod upload_positions;
mod writer;

pub use bucket::{
    BasePathBucketAssigner, BucketAssigner, BucketContext, DateTimeBucketAssigner, FnBucketAssigner,
};
pub use bulk::{BulkFormat, BulkPart, PartMerger};
pub use clock::{Clock, ManualClock, SystemClock};
pub use committer::FileCommitter;
pub use compaction::CompactionPolicy;
pub use encoder::{CsvEncoder, Encoder, JsonLinesEncoder, LineEncoder};
pub use hive::{
    escape_hive_value, EventTimeBucketAssigner, FieldsBucketAssigner, HIVE_DEFAULT_PARTITION,
};
#[cfg(feature = "object-store")]
pub use memory_store::MemoryObjectStore;
pub use multipart_limits::S3_MINIMUM_PART_SIZE;
#[cfg(feature = "object-store")]
pub use object_output::{ObjectOutput, ObjectOutputStore};
pub use output::{finished_files, read_finished};
#[cfg(feature = "object-store")]
pub use output::{finished_objects, read_object};
#[cfg(feature = "parquet")]
pub use parquet::{read_parquet, ParquetCompression, ParquetEncoder};
pub use position_group::{PositionGroupId, PositionMember};
pub use rolling::{PartInfo, RollingPolicy};
pub use sink::{FileSink, FileSinkBuilder};
#[cfg(feature = "parquet")]
/// Time units for [`ParquetEncoder::timestamp`] (re-exported from `arrow-schema`).
pub use sink_arrow::TimeUnit;
pub use state::{FileCommittable, InProgressState, Upload, UploadedPart};
pub use stats::{FileSinkStats, FileSinkStatsSnapshot};
#[cfg(feature = "object-store")]
pub use upload_listing::ListUploads;
#[cfg(feature = "object-store")]
pub use upload_orphans::clear_object_output;
pub use writer::{FileWriter, FileWriterState};
