//! I/O errors of the file sink, with what was being done and what to do.

use sink_api::SinkError;

/// An I/O error with what was being done, and a hint for a full disk.
pub(crate) fn io_error(context: String, error: std::io::Error) -> SinkError {
    let context = match error.kind() {
        std::io::ErrorKind::StorageFull => {
            format!("{context} (the disk is full: free space and restart the job)")
        }
        std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied => {
            format!("{context} (the output directory must be writable by this process)")
        }
        _ => context,
    };
    SinkError::io(context, error)
}
