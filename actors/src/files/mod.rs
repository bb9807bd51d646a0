//! A sandbox's `/app/results`, read from the host folder mounted there.
//!
//! That folder is the sandbox's to write: it may hold symlinks to host files,
//! symlink loops, FIFOs that block whoever opens them, huge files and deep or
//! wide trees, and it may swap any of them while the server looks. So every
//! path is resolved one component at a time with `O_PATH | O_NOFOLLOW` from
//! the folder's own descriptor (a link is reported, never followed), only a
//! descriptor already checked to be a regular file is opened for reading
//! (a FIFO or device is never opened at all), reads are windows of a bounded
//! size, and a listing stops after a bounded number of entries (the lookups
//! are those of [`sandbox_host::symlink_proof`], which uploads share). Callers run these
//! functions off the async threads, under a deadline.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub use sandbox_host::symlink_proof::EntryKind;
use sandbox_host::symlink_proof::{self, Found, Stopped, Why};
use sandbox_runtime::agent::RESULTS_IN_CONTAINER;

mod list;
mod read;
#[cfg(test)]
mod tests;

pub use list::{list, Entry, ListOptions, Listing};
pub use read::{read, ByteWindow, Content, FileRead, TextWindow, Window};

/// Most entries one listing returns, and the deepest it may go.
pub const MAX_LIST_ENTRIES: usize = 1000;
pub const MAX_LIST_DEPTH: usize = 16;
/// Folder entries one listing may examine, listed or not: a sandbox can fill
/// a folder with millions of names, and a listing must still end quickly.
pub const MAX_SCANNED: usize = 100_000;
/// The largest text window one read returns.
pub const MAX_READ_BYTES: usize = 256 * 1024;
/// The largest file one write accepts (it arrives as a tool argument).
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;
/// How long one file operation may take on the host before the caller is
/// answered (the disk may be slow; the work itself is bounded).
pub const FILE_DEADLINE: Duration = Duration::from_secs(10);

/// Why a file operation was refused; each message says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("path {0:?} is outside /app/results: give a path under /app/results (absolute, or relative to it), without '..'")]
    Outside(String),
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("{0} is a folder")]
    IsFolder(String),
    #[error("{0} is not a folder")]
    NotFolder(String),
    #[error("{0} is a symbolic link, and links are never followed; use the path of the file itself")]
    Symlink(String),
    #[error("{0} is not a regular file (a FIFO, socket or device) and is never opened")]
    Special(String),
    #[error("{what} is {size} bytes; at most {max} are accepted")]
    TooLarge { what: String, size: usize, max: usize },
    #[error("{what} took longer than {} s; try again, or a smaller folder or depth", FILE_DEADLINE.as_secs())]
    Slow { what: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

type Result<T, E = FileError> = std::result::Result<T, E>;

/// Runs `op` on the results folder `root` off the async threads, and gives
/// up waiting after [`FILE_DEADLINE`] (`what` names it then; the work itself
/// is bounded and ends on its own).
pub async fn bounded<T: Send + 'static>(
    root: PathBuf,
    what: &str,
    op: impl FnOnce(&Path) -> Result<T> + Send + 'static,
) -> Result<T> {
    within(FILE_DEADLINE, root, what, op).await
}

async fn within<T: Send + 'static>(
    deadline: Duration,
    root: PathBuf,
    what: &str,
    op: impl FnOnce(&Path) -> Result<T> + Send + 'static,
) -> Result<T> {
    let task = tokio::task::spawn_blocking(move || op(&root));
    match tokio::time::timeout(deadline, task).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => Err(FileError::Io {
            path: what.into(),
            source: std::io::Error::other(e.to_string()),
        }),
        Err(_) => Err(FileError::Slow { what: what.into() }),
    }
}

/// A path under `/app/results`, as a caller names it: absolute, or relative
/// to the folder; `.` and empty segments are dropped, `..` is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsPath {
    segments: Vec<String>,
}

impl ResultsPath {
    pub fn parse(raw: &str) -> Result<Self> {
        let trimmed = raw.trim();
        let relative = match trimmed.strip_prefix(RESULTS_IN_CONTAINER) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ if trimmed.starts_with('/') => return Err(FileError::Outside(raw.into())),
            _ => trimmed,
        };
        let mut segments = Vec::new();
        for s in relative.split('/') {
            match s {
                "" | "." => {}
                ".." => return Err(FileError::Outside(raw.into())),
                _ if s.contains('\0') => return Err(FileError::Outside(raw.into())),
                _ => segments.push(s.to_string()),
            }
        }
        Ok(Self { segments })
    }

    /// Whether this is `/app/results` itself.
    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }

    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The last segment (none for the folder itself).
    pub fn name(&self) -> Option<&str> {
        self.segments.last().map(String::as_str)
    }

    /// The folder holding this path (the folder itself for the root).
    pub fn parent(&self) -> ResultsPath {
        let n = self.segments.len().saturating_sub(1);
        Self {
            segments: self.segments[..n].to_vec(),
        }
    }

    /// Relative to `/app/results`, `/`-separated.
    pub fn relative(&self) -> String {
        self.segments.join("/")
    }

    /// The absolute path inside the sandbox.
    pub fn absolute(&self) -> String {
        match self.is_root() {
            true => RESULTS_IN_CONTAINER.to_string(),
            false => format!("{RESULTS_IN_CONTAINER}/{}", self.relative()),
        }
    }
}

fn io(path: &ResultsPath) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        path: path.absolute(),
        source,
    }
}

/// Walks `path` beneath `root` without following any link.
fn resolve(root: &Path, path: &ResultsPath) -> Result<Found> {
    let root_fd: OwnedFd = File::open(root).map_err(io(path))?.into();
    symlink_proof::walk(root_fd, path.segments()).map_err(|Stopped { at, why }| {
        let at = ResultsPath {
            segments: path.segments[..at].to_vec(),
        };
        match why {
            Why::Symlink => FileError::Symlink(at.absolute()),
            Why::NotFolder => FileError::NotFolder(at.absolute()),
            Why::Io(e) if e.raw_os_error() == Some(libc::ENOENT) => FileError::NotFound(at.absolute()),
            Why::Io(e) => io(&at)(e),
        }
    })
}

fn modified(st: &libc::stat) -> SystemTime {
    let secs = Duration::from_secs(st.st_mtime.max(0) as u64);
    SystemTime::UNIX_EPOCH + secs + Duration::from_nanos(st.st_mtime_nsec.clamp(0, 999_999_999) as u64)
}

/// Opens `path` as a regular file for reading.
fn open_regular(root: &Path, path: &ResultsPath) -> Result<(File, libc::stat)> {
    let found = resolve(root, path)?;
    match found.kind() {
        EntryKind::File => {}
        EntryKind::Folder => return Err(FileError::IsFolder(path.absolute())),
        EntryKind::Symlink => return Err(FileError::Symlink(path.absolute())),
        EntryKind::Other => return Err(FileError::Special(path.absolute())),
    }
    let fd = found.reopen(libc::O_RDONLY | libc::O_NONBLOCK).map_err(io(path))?;
    Ok((File::from(fd), found.st))
}

/// Opens the regular file `path` beneath `root` (the artifacts route).
pub fn open_file(root: &Path, path: &ResultsPath) -> Result<(File, u64)> {
    open_regular(root, path).map(|(file, st)| (file, st.st_size as u64))
}

/// What a file sent as bytes must not replace: a link or a non-folder on the
/// way, or a folder (which unpacking would remove with all it holds), link
/// or special file where the file goes. The write itself is unpacked inside
/// the sandbox's own container, so a sandbox that swaps a folder after this
/// check only redirects its own write within its own file system.
pub fn check_writable(root: &Path, path: &ResultsPath) -> Result<()> {
    match resolve(root, path) {
        Ok(found) => match found.kind() {
            EntryKind::File => Ok(()),
            EntryKind::Folder => Err(FileError::IsFolder(path.absolute())),
            EntryKind::Symlink => Err(FileError::Symlink(path.absolute())),
            EntryKind::Other => Err(FileError::Special(path.absolute())),
        },
        Err(FileError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
