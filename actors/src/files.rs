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
//! are those of [`crate::nofollow`], which uploads share). Callers run these
//! functions off the async threads, under a deadline.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::agent::RESULTS_IN_CONTAINER;
pub use crate::nofollow::EntryKind;
use crate::nofollow::{self, openat, Found, Stopped, Why};

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
/// How much of the end of a large file a first read shows.
const TAIL_BYTES: usize = 2048;
/// How much of a file's start decides whether it is text.
const SNIFF_BYTES: usize = 8192;
/// How long one file operation may take on the host before the caller is
/// answered (the disk may be slow; the work itself is bounded).
pub const FILE_DEADLINE: Duration = Duration::from_secs(10);

/// Why a file operation was refused; each message says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("path {0:?} is outside /app/results: give a path under /app/results (absolute, or relative to it), without '..'")]
    Outside(String),
    #[error("{0} does not exist; call list_files to see what is there")]
    NotFound(String),
    #[error("{0} is a folder; call list_files to see what it holds")]
    IsFolder(String),
    #[error("{0} is not a folder")]
    NotFolder(String),
    #[error("{0} is a symbolic link, and links are never followed; use the path of the file itself")]
    Link(String),
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

/// One entry of a listing.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative to `/app/results`, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub modified: SystemTime,
}

/// What a listing covers.
#[derive(Debug, Clone, Copy)]
pub struct ListOptions {
    /// Folder levels walked: 1 lists the folder's own entries.
    pub depth: usize,
    pub max_entries: usize,
    /// Only regular files appear (folders are still walked).
    pub files_only: bool,
}

#[derive(Debug, Clone)]
pub struct Listing {
    /// Sorted by path.
    pub entries: Vec<Entry>,
    /// More entries exist than were listed.
    pub truncated: bool,
}

/// A window of text, or what kind of file it is.
#[derive(Debug)]
pub enum Content {
    Text(TextWindow),
    /// An image (by its first bytes, or `.svg`), with its media type and the
    /// opened file, for whoever presents it.
    Image {
        mime: &'static str,
        file: File,
    },
    /// Neither text nor an image.
    Binary,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextWindow {
    /// The text from `offset` (invalid UTF-8 replaced).
    pub text: String,
    /// Where the text starts: the requested offset, moved forward to the
    /// start of a character when it fell inside one.
    pub offset: u64,
    /// Where the next window starts; `None` when this one reached the end.
    pub next_offset: Option<u64>,
    /// The file's last lines, on a first read of a file larger than the window.
    pub tail: Option<String>,
}

/// Which part of a text file to read.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub offset: u64,
    pub max_bytes: usize,
    /// Stop after this many lines (0: no line limit).
    pub max_lines: usize,
}

#[derive(Debug)]
pub struct FileRead {
    pub path: ResultsPath,
    pub size: u64,
    pub modified: SystemTime,
    pub content: Content,
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
    nofollow::walk(root_fd, path.segments()).map_err(|Stopped { at, why }| {
        let at = ResultsPath {
            segments: path.segments[..at].to_vec(),
        };
        match why {
            Why::Link => FileError::Link(at.absolute()),
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
        EntryKind::Link => return Err(FileError::Link(path.absolute())),
        EntryKind::Other => return Err(FileError::Special(path.absolute())),
    }
    let fd = found.reopen(libc::O_RDONLY | libc::O_NONBLOCK).map_err(io(path))?;
    Ok((File::from(fd), found.st))
}

/// Opens the regular file `path` beneath `root` (the artifacts route).
pub fn open_file(root: &Path, path: &ResultsPath) -> Result<(File, u64)> {
    open_regular(root, path).map(|(file, st)| (file, st.st_size as u64))
}

/// Opens the folder `segments` below the folder `top`, one component at a
/// time, never following a link.
fn open_below(top: &OwnedFd, segments: &[String]) -> std::io::Result<OwnedFd> {
    let mut dir = top.try_clone()?;
    for s in segments {
        dir = openat(&dir, OsStr::new(s), libc::O_RDONLY | libc::O_DIRECTORY)?;
    }
    Ok(dir)
}

/// Lists the folder `path` beneath `root`, breadth first (so a cut listing
/// keeps the shallowest entries), links reported and never followed. The
/// folders of the next level are kept by name, not by descriptor, so a tree
/// of any width costs a few descriptors, not one per folder.
pub fn list(root: &Path, path: &ResultsPath, options: ListOptions) -> Result<Listing> {
    let found = resolve(root, path)?;
    match found.kind() {
        EntryKind::Folder => {}
        EntryKind::Link => return Err(FileError::Link(path.absolute())),
        _ => return Err(FileError::NotFolder(path.absolute())),
    }
    let top = found.reopen(libc::O_RDONLY | libc::O_DIRECTORY).map_err(io(path))?;
    let base = match path.is_root() {
        true => String::new(),
        false => format!("{}/", path.relative()),
    };
    let depth_limit = options.depth.clamp(1, MAX_LIST_DEPTH);
    let mut entries = Vec::new();
    let mut truncated = false;
    let mut scanned = 0usize;
    let mut level: Vec<Vec<String>> = vec![vec![]];
    'walk: for depth in 1..=depth_limit {
        let mut next = Vec::new();
        for folder in level {
            // Gone or swapped for a link since it was seen: skipped.
            let Ok(dir) = open_below(&top, &folder) else {
                continue;
            };
            let Ok(names) = nofollow::read_dir(&dir) else {
                continue;
            };
            let mut children = Vec::new();
            for entry in names.flatten() {
                scanned += 1;
                if scanned > MAX_SCANNED {
                    truncated = true;
                    break;
                }
                // The entry's own status (fstatat on the folder, not following).
                if let Ok(meta) = entry.metadata() {
                    children.push((entry.file_name().to_string_lossy().into_owned(), meta));
                }
            }
            children.sort_by(|a, b| a.0.cmp(&b.0));
            let prefix: String = folder.iter().map(|s| format!("{s}/")).collect();
            for (name, meta) in children {
                let kind = EntryKind::of_mode(meta.mode());
                let entry_path = format!("{base}{prefix}{name}");
                if kind == EntryKind::Folder && depth < depth_limit {
                    next.push(folder.iter().cloned().chain([name]).collect());
                }
                if options.files_only && kind != EntryKind::File {
                    continue;
                }
                if entries.len() == options.max_entries {
                    truncated = true;
                    break 'walk;
                }
                entries.push(Entry {
                    path: entry_path,
                    kind,
                    size: if kind == EntryKind::Folder { 0 } else { meta.len() },
                    modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
            if truncated {
                break 'walk;
            }
        }
        level = next;
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Listing { entries, truncated })
}

/// Reads the file `path` beneath `root`: a window of text, or what kind of
/// file it is (an image comes with the opened file).
pub fn read(root: &Path, path: &ResultsPath, window: Window) -> Result<FileRead> {
    let (file, st) = open_regular(root, path)?;
    let size = st.st_size as u64;
    let mut sniff = vec![0u8; SNIFF_BYTES.min(size as usize)];
    let n = read_at(&file, &mut sniff, 0).map_err(io(path))?;
    sniff.truncate(n);
    let content = match image_type(path, &sniff) {
        Some(mime) => Content::Image { mime, file },
        None if !is_text(&sniff, n as u64 == size) => Content::Binary,
        None => Content::Text(text_window(&file, size, window).map_err(io(path))?),
    };
    Ok(FileRead {
        path: path.clone(),
        size,
        modified: modified(&st),
        content,
    })
}

/// Reads up to `buf.len()` bytes at `offset` (fewer only at the end).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The media type of an image, by its first bytes (or `.svg` by name).
fn image_type(path: &ResultsPath, head: &[u8]) -> Option<&'static str> {
    let magic: [(&[u8], &'static str); 5] = [
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"RIFF", "image/webp"),
    ];
    let found = magic
        .iter()
        .find(|(m, mime)| head.starts_with(m) && (*mime != "image/webp" || head.get(8..12) == Some(b"WEBP")))
        .map(|(_, mime)| *mime);
    let svg = path.name().is_some_and(|n| n.to_ascii_lowercase().ends_with(".svg"));
    found.or(svg.then_some("image/svg+xml"))
}

/// Text: no NUL byte and valid UTF-8 (a character cut by the end of the
/// sample aside, unless the sample is the whole file).
fn is_text(sample: &[u8], whole: bool) -> bool {
    if sample.contains(&0) {
        return false;
    }
    match std::str::from_utf8(sample) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && !whole,
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// The window of text at `window.offset`, cut at character boundaries.
fn text_window(file: &File, size: u64, window: Window) -> std::io::Result<TextWindow> {
    // At least 4 bytes: a window always holds a whole character.
    let max_bytes = window.max_bytes.clamp(4, MAX_READ_BYTES);
    let start = window.offset.min(size);
    // Three bytes more on each side, to move the window's start and end to
    // character boundaries.
    let mut buf = vec![0u8; (max_bytes + 6).min((size - start) as usize)];
    let n = read_at(file, &mut buf, start)?;
    buf.truncate(n);
    let skip = buf.iter().take(3).take_while(|b| is_continuation(**b)).count();
    let offset = start + skip as u64;
    let mut end = (skip + max_bytes).min(buf.len());
    if end < buf.len() {
        // More follows: back to the start of the character the window cuts
        // (at most 3 bytes; further back it is not UTF-8, cut where it is).
        let mut cut = end;
        while end - cut < 3 && is_continuation(buf[cut]) {
            cut -= 1;
        }
        if !is_continuation(buf[cut]) {
            end = cut;
        }
    }
    let mut text = &buf[skip..end];
    if window.max_lines > 0 {
        let mut newlines = text.iter().enumerate().filter(|(_, b)| **b == b'\n');
        if let Some((i, _)) = newlines.nth(window.max_lines - 1) {
            text = &text[..=i];
        }
    }
    let next = offset + text.len() as u64;
    let next_offset = (next < size).then_some(next);
    let tail = match (window.offset, next_offset) {
        (0, Some(from)) => Some(tail(file, size, from, max_bytes.min(TAIL_BYTES))?),
        _ => None,
    };
    Ok(TextWindow {
        text: String::from_utf8_lossy(text).into_owned(),
        offset,
        next_offset,
        tail,
    })
}

/// The end of the file after `from`: its last `bytes` at most, from the
/// first whole line in them when they start inside one.
fn tail(file: &File, size: u64, from: u64, bytes: usize) -> std::io::Result<String> {
    let start = size.saturating_sub(bytes as u64).max(from);
    let mut buf = vec![0u8; (size - start) as usize];
    let n = read_at(file, &mut buf, start)?;
    buf.truncate(n);
    let body = match buf[..buf.len().saturating_sub(1)].iter().position(|b| *b == b'\n') {
        Some(i) if start > from => &buf[i + 1..],
        _ => {
            let skip = buf.iter().take(3).take_while(|b| is_continuation(**b)).count();
            &buf[skip..]
        }
    };
    Ok(String::from_utf8_lossy(body).into_owned())
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
            EntryKind::Link => Err(FileError::Link(path.absolute())),
            EntryKind::Other => Err(FileError::Special(path.absolute())),
        },
        Err(FileError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(raw: &str) -> ResultsPath {
        ResultsPath::parse(raw).unwrap()
    }

    fn window(offset: u64, max_bytes: usize, max_lines: usize) -> Window {
        Window {
            offset,
            max_bytes,
            max_lines,
        }
    }

    fn text(read: FileRead) -> TextWindow {
        match read.content {
            Content::Text(t) => t,
            other => panic!("not text: {other:?}"),
        }
    }

    const ALL: ListOptions = ListOptions {
        depth: MAX_LIST_DEPTH,
        max_entries: MAX_LIST_ENTRIES,
        files_only: false,
    };

    #[tokio::test]
    async fn a_host_access_past_its_deadline_is_answered_without_waiting() {
        let started = std::time::Instant::now();
        let slow = within(Duration::from_millis(50), PathBuf::from("/"), "sleeping", |_| {
            std::thread::sleep(Duration::from_secs(1));
            Ok(())
        });
        assert!(matches!(slow.await, Err(FileError::Slow { .. })));
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        let quick = within(Duration::from_secs(5), PathBuf::from("/"), "nothing", |_| Ok(1));
        assert_eq!(quick.await.unwrap(), 1);
    }

    #[test]
    fn paths_stay_under_results() {
        assert_eq!(p("/app/results/a/b.txt").relative(), "a/b.txt");
        assert_eq!(p("a//./b.txt").absolute(), "/app/results/a/b.txt");
        assert!(p("/app/results").is_root() && p("").is_root() && p("/app/results/").is_root());
        assert_eq!(p("d/f").parent().absolute(), "/app/results/d");
        for bad in [
            "/etc/passwd",
            "/app/resultsx/a",
            "../x",
            "a/../../x",
            "/app/results/..",
            "a\0b",
        ] {
            assert!(ResultsPath::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn links_fifos_and_folders_are_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/ok.txt"), "ok").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        std::os::unix::fs::symlink("loop", root.path().join("loop")).unwrap();
        let fifo = std::ffi::CString::new(root.path().join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let read = |path: &str| read(root.path(), &p(path), window(0, 100, 0));
        assert_eq!(text(read("d/ok.txt").unwrap()).text, "ok");
        assert!(matches!(read("link"), Err(FileError::Link(_))));
        assert!(matches!(read("loop"), Err(FileError::Link(_))));
        assert!(matches!(read("dirlink/secret"), Err(FileError::Link(p)) if p == "/app/results/dirlink"));
        // Opening a FIFO for reading would block until a writer came.
        assert!(matches!(read("fifo"), Err(FileError::Special(_))));
        assert!(matches!(read("d"), Err(FileError::IsFolder(_))));
        assert!(matches!(read("d/ok.txt/x"), Err(FileError::NotFolder(_))));
        assert!(matches!(read("nope"), Err(FileError::NotFound(p)) if p == "/app/results/nope"));
        assert!(matches!(list(root.path(), &p("dirlink"), ALL), Err(FileError::Link(_))));
        assert!(matches!(
            list(root.path(), &p("d/ok.txt"), ALL),
            Err(FileError::NotFolder(_))
        ));
        assert!(open_file(root.path(), &p("link")).is_err());
        assert!(check_writable(root.path(), &p("d/new/x.txt")).is_ok());
        assert!(check_writable(root.path(), &p("d/ok.txt")).is_ok());
        for bad in ["link", "dirlink/x", "fifo", "d", "d/ok.txt/x"] {
            assert!(check_writable(root.path(), &p(bad)).is_err(), "{bad} writable");
        }
    }

    #[test]
    fn listing_reports_links_without_following_them() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::fs::create_dir_all(root.path().join("d/e")).unwrap();
        std::fs::write(root.path().join("d/b.txt"), "bb").unwrap();
        std::fs::write(root.path().join("d/e/deep.txt"), "d").unwrap();
        std::fs::write(root.path().join("a b.png"), "a").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        let listed = list(root.path(), &p(""), ALL).unwrap();
        let got: Vec<_> = listed.entries.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        use EntryKind::*;
        assert_eq!(
            got,
            vec![
                ("a b.png", File),
                ("d", Folder),
                ("d/b.txt", File),
                ("d/e", Folder),
                ("d/e/deep.txt", File),
                ("dirlink", Link)
            ]
        );
        assert!(!listed.truncated);
        let shallow = list(root.path(), &p("d"), ListOptions { depth: 1, ..ALL }).unwrap();
        let got: Vec<_> = shallow.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(got, vec!["d/b.txt", "d/e"]);
        let files = list(
            root.path(),
            &p(""),
            ListOptions {
                files_only: true,
                ..ALL
            },
        )
        .unwrap();
        assert_eq!(files.entries.len(), 3);
    }

    #[test]
    fn listing_stops_at_its_entry_cap_keeping_the_shallowest() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        for i in 0..20 {
            std::fs::write(root.path().join(format!("{i:02}")), "").unwrap();
            std::fs::write(root.path().join(format!("sub/{i:02}")), "").unwrap();
        }
        let listed = list(root.path(), &p(""), ListOptions { max_entries: 21, ..ALL }).unwrap();
        assert_eq!(listed.entries.len(), 21);
        assert!(listed.truncated);
        assert!(listed.entries.iter().all(|e| !e.path.starts_with("sub/")));
    }

    #[test]
    fn listing_a_deep_tree_stops_at_the_deepest_level() {
        let root = tempfile::tempdir().unwrap();
        let deep: String = (0..MAX_LIST_DEPTH + 5).map(|i| format!("{i}/")).collect();
        std::fs::create_dir_all(root.path().join(&deep)).unwrap();
        let listed = list(root.path(), &p(""), ListOptions { depth: 1000, ..ALL }).unwrap();
        assert_eq!(listed.entries.len(), MAX_LIST_DEPTH);
    }

    #[test]
    fn listing_a_huge_folder_stops_after_scanning_its_bound() {
        let root = tempfile::tempdir().unwrap();
        for i in 0..MAX_SCANNED + 10 {
            std::fs::File::create(root.path().join(i.to_string())).unwrap();
        }
        let listed = list(
            root.path(),
            &p(""),
            ListOptions {
                max_entries: 10,
                files_only: true,
                ..ALL
            },
        )
        .unwrap();
        assert!(listed.truncated && listed.entries.len() == 10);
        let all = list(
            root.path(),
            &p(""),
            ListOptions {
                depth: 1,
                max_entries: usize::MAX,
                files_only: true,
            },
        )
        .unwrap();
        assert!(all.truncated, "more names than a listing scans");
        assert_eq!(all.entries.len(), MAX_SCANNED);
    }

    #[test]
    fn text_is_read_in_windows_with_head_and_tail() {
        let root = tempfile::tempdir().unwrap();
        let body: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(root.path().join("big.txt"), &body).unwrap();
        let first = text(read(root.path(), &p("big.txt"), window(0, 100, 0)).unwrap());
        assert_eq!(first.text, body[..100]);
        assert_eq!(first.next_offset, Some(100));
        assert_eq!(
            first.tail.as_deref(),
            Some(&body[body.len() - first.tail.as_ref().unwrap().len()..])
        );
        assert!(
            first.tail.unwrap().starts_with("line "),
            "the tail starts with a whole line"
        );
        let mut all = String::new();
        let mut offset = 0;
        loop {
            let w = text(read(root.path(), &p("big.txt"), window(offset, 4096, 0)).unwrap());
            assert!(w.tail.is_none() || offset == 0);
            all.push_str(&w.text);
            match w.next_offset {
                Some(n) => offset = n,
                None => break,
            }
        }
        assert_eq!(all, body);
        let lines = text(read(root.path(), &p("big.txt"), window(7, 10_000, 2)).unwrap());
        assert_eq!(lines.text, "line 1\nline 2\n");
        assert_eq!(lines.next_offset, Some(21));
        let past = text(read(root.path(), &p("big.txt"), window(1 << 40, 10, 0)).unwrap());
        assert_eq!((past.text.as_str(), past.next_offset), ("", None));
        let capped = text(read(root.path(), &p("big.txt"), window(0, usize::MAX, 0)).unwrap());
        assert_eq!(capped.text.len(), body.len().min(MAX_READ_BYTES));
    }

    #[test]
    fn windows_never_cut_a_character() {
        let root = tempfile::tempdir().unwrap();
        let body = "é".repeat(100);
        std::fs::write(root.path().join("u.txt"), &body).unwrap();
        let w = text(read(root.path(), &p("u.txt"), window(0, 5, 0)).unwrap());
        assert_eq!((w.text.as_str(), w.next_offset), ("éé", Some(4)));
        let inside = text(read(root.path(), &p("u.txt"), window(1, 4, 0)).unwrap());
        assert_eq!((inside.offset, inside.text.as_str()), (2, "éé"));
    }

    #[test]
    fn images_and_binaries_are_told_apart_from_text() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("plot.dat"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
        std::fs::write(root.path().join("x.svg"), "<svg/>").unwrap();
        std::fs::write(root.path().join("blob"), b"ab\0cd").unwrap();
        std::fs::write(root.path().join("latin1"), b"caf\xe9").unwrap();
        std::fs::write(root.path().join("empty"), b"").unwrap();
        let kind = |name: &str| read(root.path(), &p(name), window(0, 100, 0)).unwrap().content;
        assert!(matches!(kind("plot.dat"), Content::Image { mime: "image/png", .. }));
        assert!(matches!(
            kind("x.svg"),
            Content::Image {
                mime: "image/svg+xml",
                ..
            }
        ));
        assert!(matches!(kind("blob"), Content::Binary));
        assert!(matches!(kind("latin1"), Content::Binary));
        assert!(matches!(
            kind("empty"),
            Content::Text(TextWindow { next_offset: None, .. })
        ));
    }
}
