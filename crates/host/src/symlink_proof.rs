//! Opening what a path names one component at a time from a folder's
//! descriptor, never following a symbolic link.
//!
//! Both users read folders that someone else writes while they look: the
//! file tools read a sandbox's `/app/results` (the sandbox's to write), and
//! uploads read host folders that other writers may change. So a name is
//! looked up with `openat(folder, name, O_PATH | O_NOFOLLOW)`, which gives a
//! descriptor of the link itself when the name is a link, and of a FIFO or
//! device without opening it; what it is comes from that descriptor's own
//! status, and what is then read is opened from the descriptor
//! ([`Found::reopen`]), the inode that was checked, whatever name now
//! points elsewhere. A deeper name is looked up from its folder's
//! descriptor, so a folder on the way that is swapped for a link cannot
//! redirect the walk.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

/// What a folder entry is, as seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Folder,
    /// A symbolic link (`"link"` in listings).
    #[serde(rename = "link")]
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl EntryKind {
    pub fn of_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFREG => EntryKind::File,
            libc::S_IFDIR => EntryKind::Folder,
            libc::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }
}

/// `openat(dir, name)` with `O_NOFOLLOW`: a symlink is never followed.
pub fn openat(dir: &OwnedFd, name: &OsStr, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::ENOENT))?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name; the
    // result is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Lists the folder a descriptor holds (by `/proc/self/fd/N`, which names
/// that folder, not whatever its path now leads to). An entry's
/// `metadata()` is its own status, not that of what a link points to.
pub fn read_dir(dir: &OwnedFd) -> std::io::Result<std::fs::ReadDir> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// A name looked up without following it: an `O_PATH` descriptor of what it
/// names (not opened for reading, so a FIFO cannot block) and its status.
pub struct Found {
    pub fd: OwnedFd,
    pub st: libc::stat,
}

impl Found {
    /// What `name` in the folder `dir` is, without following it.
    pub fn open(dir: &OwnedFd, name: &OsStr) -> std::io::Result<Self> {
        Self::of(openat(dir, name, libc::O_PATH)?)
    }

    fn of(fd: OwnedFd) -> std::io::Result<Self> {
        Ok(Self { st: fstat(&fd)?, fd })
    }

    pub fn kind(&self) -> EntryKind {
        EntryKind::of_mode(self.st.st_mode)
    }

    /// Opens what an `O_PATH` descriptor names, by the descriptor: the same
    /// inode, whatever was renamed meanwhile.
    pub fn reopen(&self, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let path = CString::new(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).expect("no NUL");
        // SAFETY: a NUL-terminated path; the result is owned below.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The target of the link this names (read from the link's own
    /// descriptor, never resolved).
    pub fn read_link(&self) -> std::io::Result<PathBuf> {
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: an open descriptor, an empty NUL-terminated path (the
        // descriptor itself) and a buffer of the length given.
        let n = unsafe { libc::readlinkat(self.fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = n as usize;
        if n == buf.len() {
            return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        }
        buf.truncate(n);
        Ok(PathBuf::from(std::ffi::OsString::from_vec(buf)))
    }
}

/// Why a [`walk`] stopped, and where: the first `at` segments name what was
/// wrong.
#[derive(Debug)]
pub struct Stopped {
    pub at: usize,
    pub why: Why,
}

#[derive(Debug)]
pub enum Why {
    /// A symbolic link stands where a folder was needed.
    Symlink,
    /// Something else that is not a folder does.
    NotFolder,
    /// The lookup failed (`ENOENT`: nothing has that name).
    Io(std::io::Error),
}

/// Walks `segments` (plain names, no `/`) beneath the folder `root`, one
/// at a time, each looked up from the descriptor of the folder before it.
/// The last segment may name anything (a link too, reported, not
/// followed); every earlier one must be a folder.
pub fn walk<S: AsRef<OsStr>>(root: OwnedFd, segments: &[S]) -> Result<Found, Stopped> {
    let mut found = Found::of(root).map_err(|e| Stopped { at: 0, why: Why::Io(e) })?;
    for (i, segment) in segments.iter().enumerate() {
        let why = match found.kind() {
            EntryKind::Folder => None,
            EntryKind::Symlink => Some(Why::Symlink),
            _ => Some(Why::NotFolder),
        };
        if let Some(why) = why {
            return Err(Stopped { at: i, why });
        }
        found = Found::open(&found.fd, segment.as_ref()).map_err(|e| Stopped {
            at: i + 1,
            why: Why::Io(e),
        })?;
    }
    Ok(found)
}

fn c_name(name: &OsStr) -> std::io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> std::io::Result<()> {
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Creates the regular file `name` in `dir` with `mode`; fails if anything
/// has that name (a link planted there is never written through).
pub fn create_file(dir: &OwnedFd, name: &OsStr, mode: u32) -> std::io::Result<OwnedFd> {
    let c = c_name(name)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and a NUL-terminated name; with
    // O_CREAT the mode argument is read. The result is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the folder `name` in `dir`.
pub fn mkdir_at(dir: &OwnedFd, name: &OsStr, mode: u32) -> std::io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) })
}

/// Makes the symbolic link `name` in `dir`, pointing at `target` (stored, not resolved).
pub fn symlink_at(target: &OsStr, dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    let (t, c) = (c_name(target)?, c_name(name)?);
    // SAFETY: NUL-terminated strings and a valid directory descriptor.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) })
}

/// Gives `name` in `dir` (a link itself, never what it points to) to `uid`.
pub fn chown_at(dir: &OwnedFd, name: &OsStr, uid: u32) -> std::io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    check(unsafe { libc::fchownat(dir.as_raw_fd(), c.as_ptr(), uid, uid, libc::AT_SYMLINK_NOFOLLOW) })
}

/// Removes the folder `name` in `dir` if it is empty; a folder with
/// something in it, a link or a file fails it and stays.
pub fn remove_empty_at(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
}

/// Removes `name` from `dir` whatever it is; a folder with everything in it,
/// each level opened from the one above, at most `depth` levels deep.
pub fn remove_at(dir: &OwnedFd, name: &OsStr, depth: usize) -> std::io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EISDIR) {
        return Err(err);
    }
    if depth == 0 {
        return Err(std::io::Error::other("folders nested too deeply"));
    }
    let inner = openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY)?;
    for entry in read_dir(&inner)? {
        remove_at(&inner, &entry?.file_name(), depth - 1)?;
    }
    // SAFETY: as above.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
}
