//! Local directories made durable, for every crate of the exactly-once sink
//! SDK that writes local files: the local checkpoint storage
//! (`sink-runtime`), the file sink (`sinks-file`), the command-line tools
//! (`sink-cli`) and the ingest service.
//!
//! A file's data survives a power cut once the file is fsynced; its name
//! only once its directory is; a new directory's name only once its parent
//! is. A job that creates its output directory and reports a checkpoint
//! without syncing the directory above it can lose everything it reported
//! (`docs/semantics.md`, "Durability"). These are the calls that close that
//! gap; each is blocking file I/O, to be called off the async workers.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let state = dir.path().join("out/.state");
//! sink_local_fs::create_dir_all(&state).unwrap();
//! assert!(state.is_dir());
//! ```

mod dirs;

pub use dirs::{create_dir_all, sync_dir, sync_entries_of};
