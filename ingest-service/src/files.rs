//! Reading the files an operator hands the service (the token table, the
//! TLS certificate and key) so that no file can wedge it: a regular file
//! only (a named pipe would block the open, a device would never end), at
//! most a given size, within [`READ_TIMEOUT`], on a thread of its own that
//! nothing waits for. A hung network file system costs one read its answer,
//! never a later reload, a request or the shutdown.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one read of an operator's file may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Who may read the file besides its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone: a certificate.
    Public,
    /// The owner only: group or others with read or write access are
    /// refused (a token table, as ssh refuses a readable private key).
    OwnerOnly,
}

/// Why an operator's file was not read. The file's content is never in it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Opening or reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A directory, a device, a pipe or a socket.
    #[error("it is not a regular file but a {0}")]
    NotAFile(&'static str),
    /// Larger than its kind of file may be.
    #[error("it is {size} bytes, more than the {limit} it may hold")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Group or others may read or write a file of secrets.
    #[error(
        "group or others may read or write it (mode {mode:04o}), and it holds secrets; \
         make it the owner's only: chmod 600 {path}"
    )]
    Exposed {
        /// Its permission bits.
        mode: u32,
        /// The file.
        path: PathBuf,
    },
    /// The read did not end in time.
    #[error("reading it took longer than {0:?} (a hung network file system?); it was left unread")]
    TimedOut(Duration),
}

/// The content of `path`, at most `limit` bytes, read on a thread of its
/// own within [`READ_TIMEOUT`]. Called at start and on every reload.
pub(crate) async fn read(path: &Path, limit: u64, access: Access) -> Result<Vec<u8>, FileError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let owned = path.to_path_buf();
    // A plain thread, not tokio's blocking pool: the runtime waits for its
    // blocking tasks when it shuts down, and a read hung in the kernel
    // would hold the process forever.
    std::thread::Builder::new()
        .name("operator-file".into())
        .spawn(move || {
            let _ = sender.send(read_now(&owned, limit, access));
        })?;
    match tokio::time::timeout(READ_TIMEOUT, receiver).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(FileError::Io(std::io::Error::other(
            "the thread reading it ended abnormally",
        ))),
        Err(_) => Err(FileError::TimedOut(READ_TIMEOUT)),
    }
}

/// [`read`]'s blocking part.
fn read_now(path: &Path, limit: u64, access: Access) -> Result<Vec<u8>, FileError> {
    // Checked before the open, which blocks on a named pipe; a symbolic
    // link is followed, as the open follows it.
    let metadata = std::fs::metadata(path)?;
    check(&metadata, path, limit, access)?;
    let file = std::fs::File::open(path)?;
    // The file opened may not be the one looked at (replaced in between).
    check(&file.metadata()?, path, limit, access)?;
    let mut content = Vec::new();
    file.take(limit + 1).read_to_end(&mut content)?;
    if content.len() as u64 > limit {
        return Err(FileError::TooLarge {
            size: content.len() as u64,
            limit,
        });
    }
    Ok(content)
}

fn check(
    metadata: &std::fs::Metadata,
    path: &Path,
    limit: u64,
    access: Access,
) -> Result<(), FileError> {
    let kind = metadata.file_type();
    if !kind.is_file() {
        return Err(FileError::NotAFile(if kind.is_dir() {
            "directory"
        } else if kind.is_fifo() {
            "named pipe"
        } else if kind.is_char_device() || kind.is_block_device() {
            "device"
        } else {
            "socket or other special file"
        }));
    }
    if metadata.len() > limit {
        return Err(FileError::TooLarge {
            size: metadata.len(),
            limit,
        });
    }
    let mode = metadata.permissions().mode() & 0o7777;
    if access == Access::OwnerOnly && mode & 0o066 != 0 {
        return Err(FileError::Exposed {
            mode,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private_file(dir: &Path, content: &str) -> PathBuf {
        let path = dir.join("file");
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    #[tokio::test]
    async fn a_regular_file_within_its_limit_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = private_file(dir.path(), "alpha token\n");
        assert_eq!(
            read(&path, 100, Access::OwnerOnly).await.unwrap(),
            b"alpha token\n"
        );
        let error = read(&path, 5, Access::OwnerOnly).await.unwrap_err();
        assert!(
            matches!(error, FileError::TooLarge { size: 12, limit: 5 }),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_file_of_secrets_others_may_read_is_refused_naming_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = private_file(dir.path(), "alpha token\n");
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = read(&path, 100, Access::OwnerOnly).await.unwrap_err();
            let message = error.to_string();
            assert!(message.contains(&format!("{mode:04o}")), "{message}");
            assert!(message.contains("chmod 600"), "{message}");
            assert!(!message.contains("token"), "no content: {message}");
            assert!(read(&path, 100, Access::Public).await.is_ok());
        }
    }

    /// A pipe would block the open forever, a device never end: both are
    /// refused before the open, at once.
    #[tokio::test]
    async fn a_pipe_or_a_device_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        assert!(std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap()
            .success());
        let error = read(&pipe, 100, Access::Public).await.unwrap_err();
        assert!(error.to_string().contains("named pipe"), "{error}");
        let error = read(Path::new("/dev/zero"), 100, Access::Public)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("device"), "{error}");
    }
}
