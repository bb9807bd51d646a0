//! Copies of a sandbox's folders on the host: saved into a snapshot,
//! brought back from one, and cloned into a new fork's.
//!
//! The sandbox writes the folders these read (`save`) and write (`restore`)
//! while the server, as root, walks them, so every name is looked up from
//! its folder's descriptor without following links ([`sandbox_host::symlink_proof`]):
//! a folder swapped for a link on the way cannot lead the copy elsewhere on
//! the host. A clone reads one sandbox's folder and writes another's, so
//! both sides are walked that way. The snapshot's own folders are the
//! server's (under the state folder), read and written by path.
//!
//! A save hard-links a file unchanged since the previous snapshot (same
//! size, modification time and mode: rsync's quick check) instead of
//! copying it, and a restore leaves alone a file that already matches, so
//! both cost what changed rather than what is there.

use std::collections::hash_map::DefaultHasher;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, FileTimes, Metadata};
use std::hash::Hasher;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use crate::error::CopyError;
use sandbox_host::sparse;
use sandbox_host::symlink_proof::{self, EntryKind, Found};

/// Folders deeper than this are refused (each level holds a descriptor).
const MAX_DEPTH: usize = 128;
/// A capped file system's own folder, which neither side copies.
const LOST_FOUND: &str = "lost+found";

/// What a save may still take; crossing it fails the save.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyBudget {
    pub bytes: u64,
    pub files: u64,
}

/// What a save wrote: entries, bytes newly stored (hard links to the
/// previous snapshot cost none), and the fingerprint of what it copied.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Saved {
    pub files: u64,
    pub bytes: u64,
    pub fingerprint: Fingerprint,
}

/// What a folder holds, by each entry's path, kind, size, modification
/// time, mode and link target: two folders with the same fingerprint are
/// taken to hold the same files (the quick check again), so a snapshot
/// shares a saved folder instead of saving it again, and a restore leaves
/// alone a folder that already matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint(u64, u64);

impl Fingerprint {
    pub(crate) fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.0, self.1)
    }
}

/// Hashes entries in the order a walk meets them (names sorted).
struct Tally {
    a: DefaultHasher,
    b: DefaultHasher,
    path: Vec<u8>,
}

impl Tally {
    fn new() -> Self {
        let mut b = DefaultHasher::new();
        b.write_u8(0xa5);
        Self {
            a: DefaultHasher::new(),
            b,
            path: Vec::new(),
        }
    }

    fn entry(&mut self, name: &OsStr, st: &libc::stat, link: Option<&Path>) {
        let kind = EntryKind::of_mode(st.st_mode) as u8;
        let (size, time) = match kind {
            k if k == EntryKind::File as u8 => (st.st_size as u64, (st.st_mtime, st.st_mtime_nsec)),
            _ => (0, (0, 0)),
        };
        for h in [&mut self.a, &mut self.b] {
            h.write(&self.path);
            h.write_u8(b'/');
            h.write(name.as_bytes());
            h.write_u8(0);
            h.write_u8(kind);
            h.write_u64(size);
            h.write_i64(time.0);
            h.write_i64(time.1);
            h.write_u32(st.st_mode & 0o777);
            if let Some(link) = link {
                h.write(link.as_os_str().as_bytes());
                h.write_u8(0);
            }
        }
    }

    /// Names entries below `name` until [`Self::leave`].
    fn enter(&mut self, name: &OsStr) -> usize {
        let len = self.path.len();
        self.path.push(b'/');
        self.path.extend_from_slice(name.as_bytes());
        len
    }

    fn leave(&mut self, len: usize) {
        self.path.truncate(len);
    }

    fn finish(&self) -> Fingerprint {
        Fingerprint(self.a.finish(), self.b.finish())
    }
}

/// The names in a folder, sorted, so that walks meet entries in one order;
/// more than `max` of them is [`CopyError::TooLarge`] (whose bounds the
/// caller fills in), so that a folder of millions of names is never held.
fn sorted_names(dir: &OwnedFd, max: u64) -> Result<Vec<OsString>, CopyError> {
    let mut names = Vec::new();
    for entry in symlink_proof::read_dir(dir)? {
        if names.len() as u64 >= max.saturating_add(1) {
            return Err(CopyError::TooLarge { bytes: 0, files: 0 });
        }
        names.push(entry?.file_name());
    }
    names.sort();
    Ok(names)
}

/// The fingerprint of the folder `src` (the sandbox's) and its entry
/// count, read without following links; past `budget.files` entries it
/// fails as a save would.
pub(crate) fn fingerprint(src: &Path, budget: CopyBudget, stop: &AtomicBool) -> Result<(Fingerprint, u64), CopyError> {
    fn walk(
        dir: &OwnedFd,
        tally: &mut Tally,
        left: &mut u64,
        depth: usize,
        stop: &AtomicBool,
    ) -> Result<(), CopyError> {
        if depth > MAX_DEPTH {
            return Err(CopyError::TooDeep { max: MAX_DEPTH });
        }
        for name in sorted_names(dir, *left)? {
            if depth == 0 && name == LOST_FOUND {
                continue;
            }
            if stop.load(Ordering::Relaxed) {
                return Err(CopyError::Stopped);
            }
            let Ok(found) = Found::open(dir, &name) else { continue };
            if found.kind() == EntryKind::Other {
                continue;
            }
            *left = left.checked_sub(1).ok_or(CopyError::TooLarge { bytes: 0, files: 0 })?;
            match found.kind() {
                EntryKind::Folder => {
                    tally.entry(&name, &found.st, None);
                    let inner = found.reopen(libc::O_RDONLY | libc::O_DIRECTORY)?;
                    let len = tally.enter(&name);
                    walk(&inner, tally, left, depth + 1, stop)?;
                    tally.leave(len);
                }
                EntryKind::Symlink => tally.entry(&name, &found.st, Some(&found.read_link()?)),
                EntryKind::File => tally.entry(&name, &found.st, None),
                EntryKind::Other => {}
            }
        }
        Ok(())
    }
    let root: OwnedFd = File::open(src)?.into();
    let mut tally = Tally::new();
    let mut left = budget.files;
    walk(&root, &mut tally, &mut left, 0, stop).map_err(|e| match e {
        CopyError::TooLarge { .. } => CopyError::TooLarge {
            bytes: budget.bytes,
            files: budget.files,
        },
        other => other,
    })?;
    Ok((tally.finish(), budget.files - left))
}

struct Saving<'a> {
    left: CopyBudget,
    limit: CopyBudget,
    files: u64,
    bytes: u64,
    tally: Tally,
    stop: &'a AtomicBool,
}

/// Where a save writes.
enum Dest {
    /// A new folder of the server's (a snapshot's), written by path.
    Store(PathBuf),
    /// A sandbox's folder (a new fork's), each name made from its folder's
    /// descriptor without following links, and given to `owner`: the
    /// sandbox's code may run while it is written.
    Sandbox { dir: OwnedFd, owner: u32 },
}

impl Dest {
    /// Makes the folder `name` (reusing a folder the sandbox already has
    /// there) and opens it.
    fn folder(&self, name: &OsStr) -> io::Result<Dest> {
        match self {
            Dest::Store(dir) => {
                let path = dir.join(name);
                fs::DirBuilder::new().mode(0o700).create(&path)?;
                Ok(Dest::Store(path))
            }
            Dest::Sandbox { dir, owner } => {
                if !make_room(dir, name, true)? {
                    symlink_proof::mkdir_at(dir, name, 0o700)?;
                    give(dir, name, *owner)?;
                }
                let inner = symlink_proof::openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY)?;
                Ok(Dest::Sandbox {
                    dir: inner,
                    owner: *owner,
                })
            }
        }
    }

    /// Removes from a sandbox's folder what the source's folder, holding
    /// `names`, lacks (first, so that a full disk has room for what comes):
    /// a fork holds the source's files, not those of its image besides.
    /// A store folder is new, and holds nothing to remove.
    fn prune(&self, names: &[OsString], depth: usize, stop: &AtomicBool) -> Result<(), CopyError> {
        let Dest::Sandbox { dir, .. } = self else { return Ok(()) };
        for entry in symlink_proof::read_dir(dir)? {
            if stop.load(Ordering::Relaxed) {
                return Err(CopyError::Stopped);
            }
            let name = entry?.file_name();
            if (depth == 0 && name == LOST_FOUND) || names.binary_search(&name).is_ok() {
                continue;
            }
            symlink_proof::remove_at(dir, &name, MAX_DEPTH)?;
        }
        Ok(())
    }

    /// Gives a folder made by [`Self::folder`] the mode it had, once filled.
    fn seal(self, mode: u32) -> io::Result<()> {
        let permissions = fs::Permissions::from_mode(mode);
        match self {
            Dest::Store(path) => fs::set_permissions(path, permissions),
            Dest::Sandbox { dir, .. } => File::from(dir).set_permissions(permissions),
        }
    }

    /// Creates the file `name` with `mode`, to be written.
    fn file(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let file = match self {
            Dest::Store(dir) => fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join(name))?,
            Dest::Sandbox { dir, owner } => {
                make_room(dir, name, false)?;
                let file = File::from(symlink_proof::create_file(dir, name, 0o600)?);
                // Through the descriptor: the name may be another file by now.
                match std::os::unix::fs::fchown(&file, Some(*owner), Some(*owner)) {
                    Err(e) if e.raw_os_error() != Some(libc::EPERM) => return Err(e),
                    _ => file,
                }
            }
        };
        // Not left to the server's umask: a mode that differs from the
        // sandbox's would never match it again.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        Ok(file)
    }

    /// Makes the symbolic link `name` pointing at `target` (stored, not resolved).
    fn link(&self, name: &OsStr, target: &Path) -> io::Result<()> {
        match self {
            Dest::Store(dir) => std::os::unix::fs::symlink(target, dir.join(name)),
            Dest::Sandbox { dir, owner } => {
                make_room(dir, name, false)?;
                symlink_proof::symlink_at(target.as_os_str(), dir, name)?;
                give(dir, name, *owner)
            }
        }
    }

    /// Links `name` to the previous snapshot's `before` (the store only).
    fn hard_link(&self, before: &Path, name: &OsStr) -> io::Result<()> {
        match self {
            Dest::Store(dir) => fs::hard_link(before, dir.join(name)),
            Dest::Sandbox { .. } => Err(io::Error::other("a sandbox's folder is never linked to the store")),
        }
    }
}

/// Clears `name` in the sandbox's folder `dir` for a new entry; a folder
/// is kept when a folder is wanted (says so).
fn make_room(dir: &OwnedFd, name: &OsStr, folder: bool) -> io::Result<bool> {
    match Found::open(dir, name) {
        Ok(there) if folder && there.kind() == EntryKind::Folder => Ok(true),
        Ok(_) => symlink_proof::remove_at(dir, name, MAX_DEPTH).map(|()| false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives a new entry to the sandbox's user. A server that is not root
/// cannot, and needs not: what it makes is then its own, as the folder is.
fn give(dir: &OwnedFd, name: &OsStr, owner: u32) -> io::Result<()> {
    match symlink_proof::chown_at(dir, name, owner) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        other => other,
    }
}

/// Copies the folder `src` (the sandbox's) into the new folder `dst`,
/// linking files unchanged since `previous` (the last snapshot's copy of
/// the same folder). FIFOs, sockets and devices are left out.
pub(crate) fn save(
    src: &Path,
    dst: &Path,
    previous: Option<&Path>,
    budget: CopyBudget,
    stop: &AtomicBool,
) -> Result<Saved, CopyError> {
    fs::DirBuilder::new().mode(0o700).create(dst)?;
    walk_into(src, Dest::Store(dst.to_path_buf()), previous, budget, stop)
}

/// Makes the folder `dst` (a new fork's, which `owner` gets everything
/// in) hold what the folder `src` (another sandbox's, or a snapshot's)
/// holds: one copy from disk to disk, neither side's links followed; what
/// `dst` held is replaced or removed (its file system's `lost+found` stays).
pub(crate) fn clone_into(
    src: &Path,
    dst: &Path,
    owner: u32,
    budget: CopyBudget,
    stop: &AtomicBool,
) -> Result<Saved, CopyError> {
    let dir = File::open(dst)?.into();
    walk_into(src, Dest::Sandbox { dir, owner }, None, budget, stop)
}

fn walk_into(
    src: &Path,
    dst: Dest,
    previous: Option<&Path>,
    budget: CopyBudget,
    stop: &AtomicBool,
) -> Result<Saved, CopyError> {
    let root = File::open(src)?;
    let mut saving = Saving {
        left: budget,
        limit: budget,
        files: 0,
        bytes: 0,
        tally: Tally::new(),
        stop,
    };
    saving.folder(&root.into(), &dst, previous, 0)?;
    Ok(Saved {
        files: saving.files,
        bytes: saving.bytes,
        fingerprint: saving.tally.finish(),
    })
}

impl Saving<'_> {
    fn folder(&mut self, src: &OwnedFd, dst: &Dest, previous: Option<&Path>, depth: usize) -> Result<(), CopyError> {
        if depth > MAX_DEPTH {
            return Err(CopyError::TooDeep { max: MAX_DEPTH });
        }
        let names = sorted_names(src, self.left.files).map_err(|e| match e {
            CopyError::TooLarge { .. } => self.too_large(),
            other => other,
        })?;
        dst.prune(&names, depth, self.stop)?;
        for name in names {
            if depth == 0 && name == LOST_FOUND {
                continue;
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(CopyError::Stopped);
            }
            // Gone since it was listed: the sandbox's to remove.
            let Ok(found) = Found::open(src, &name) else { continue };
            let before = previous.map(|p| p.join(&name));
            match found.kind() {
                EntryKind::Folder => {
                    self.spend(0)?;
                    self.tally.entry(&name, &found.st, None);
                    let target = dst.folder(&name)?;
                    let inner = found.reopen(libc::O_RDONLY | libc::O_DIRECTORY)?;
                    let len = self.tally.enter(&name);
                    // The previous snapshot holds the sandbox's links as
                    // links: only a real folder of it is looked into, so no
                    // path below it can lead out of the store.
                    let before = before.filter(|b| fs::symlink_metadata(b).is_ok_and(|m| m.is_dir()));
                    self.folder(&inner, &target, before.as_deref(), depth + 1)?;
                    self.tally.leave(len);
                    target.seal(found.st.st_mode & 0o777)?;
                }
                EntryKind::File => {
                    self.spend(0)?;
                    self.tally.entry(&name, &found.st, None);
                    let unchanged = before
                        .as_deref()
                        .and_then(|b| fs::symlink_metadata(b).ok().map(|m| (b.to_path_buf(), m)))
                        .filter(|(_, m)| m.is_file() && same_file(&found.st, m));
                    if let Some((before, _)) = unchanged {
                        // Linked, not stored: it costs nothing more.
                        dst.hard_link(&before, &name)?;
                        continue;
                    }
                    let from = File::from(found.reopen(libc::O_RDONLY)?);
                    let to = dst.file(&name, found.st.st_mode & 0o777)?;
                    // Only its data is stored, and counted: a file of holes
                    // costs the host no more than it cost the sandbox. The
                    // file may grow while it is read: never past the budget.
                    let copied = match sparse::copy_data(&from, &to, self.left.bytes) {
                        Err(e) if e.kind() == io::ErrorKind::FileTooLarge => return Err(self.too_large()),
                        copied => copied?,
                    };
                    self.left.bytes -= copied;
                    if let Some(modified) = modified(&found.st) {
                        to.set_times(FileTimes::new().set_modified(modified))?;
                    }
                    self.bytes += copied;
                }
                EntryKind::Symlink => {
                    self.spend(0)?;
                    let link = found.read_link()?;
                    self.tally.entry(&name, &found.st, Some(&link));
                    dst.link(&name, &link)?;
                }
                EntryKind::Other => {}
            }
        }
        Ok(())
    }

    fn spend(&mut self, bytes: u64) -> Result<(), CopyError> {
        if self.left.files == 0 || self.left.bytes < bytes {
            return Err(self.too_large());
        }
        self.left.files -= 1;
        self.left.bytes -= bytes;
        self.files += 1;
        Ok(())
    }

    fn too_large(&self) -> CopyError {
        CopyError::TooLarge {
            bytes: self.limit.bytes,
            files: self.limit.files,
        }
    }
}

/// Makes the folder `dst` (the sandbox's) hold what the snapshot folder
/// `src` holds: what is not in the snapshot is removed, what differs is
/// replaced, what matches is left. Everything to go is removed first, in the
/// whole tree, so that a full disk has room for what comes back. New
/// entries are given to `owner`.
pub(crate) fn restore(src: &Path, dst: &Path, owner: u32, stop: &AtomicBool) -> Result<(), CopyError> {
    let root: OwnedFd = File::open(dst)?.into();
    let restoring = Restoring { owner, stop };
    restoring.prune(src, &root, 0)?;
    restoring.fill(src, &root, 0)
}

struct Restoring<'a> {
    owner: u32,
    stop: &'a AtomicBool,
}

/// A snapshot folder's entries, sorted by name.
fn wanted(src: &Path) -> io::Result<Vec<(OsString, Metadata)>> {
    let mut wanted = Vec::new();
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        wanted.push((entry.file_name(), entry.metadata()?));
    }
    wanted.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(wanted)
}

impl Restoring<'_> {
    fn check(&self, depth: usize) -> Result<(), CopyError> {
        if depth > MAX_DEPTH {
            return Err(CopyError::TooDeep { max: MAX_DEPTH });
        }
        if self.stop.load(Ordering::Relaxed) {
            return Err(CopyError::Stopped);
        }
        Ok(())
    }

    /// Removes from `dst` what is not in `src` or differs from it; a folder
    /// that is a folder in both is pruned in turn.
    fn prune(&self, src: &Path, dst: &OwnedFd, depth: usize) -> Result<(), CopyError> {
        self.check(depth)?;
        let wanted = wanted(src)?;
        for entry in symlink_proof::read_dir(dst)? {
            let name = entry?.file_name();
            if depth == 0 && name == LOST_FOUND {
                continue;
            }
            let Ok(there) = Found::open(dst, &name) else { continue };
            match wanted.binary_search_by(|(n, _)| n.as_os_str().cmp(&name)) {
                Ok(i) if wanted[i].1.is_dir() && there.kind() == EntryKind::Folder => {
                    let inner = symlink_proof::openat(dst, &name, libc::O_RDONLY | libc::O_DIRECTORY)?;
                    self.prune(&src.join(&name), &inner, depth + 1)?;
                }
                Ok(i) if matches(&src.join(&name), &wanted[i].1, &there) => {}
                _ => symlink_proof::remove_at(dst, &name, MAX_DEPTH)?,
            }
        }
        Ok(())
    }

    /// Writes into `dst` what `src` holds and `dst` lacks (after
    /// [`Self::prune`]; what the sandbox changed meanwhile is replaced too).
    fn fill(&self, src: &Path, dst: &OwnedFd, depth: usize) -> Result<(), CopyError> {
        self.check(depth)?;
        for (name, meta) in &wanted(src)? {
            self.check(depth)?;
            let from = src.join(name);
            let there = Found::open(dst, name).ok();
            let mode = meta.mode() & 0o777;
            if meta.is_dir() {
                if !there.as_ref().is_some_and(|f| f.kind() == EntryKind::Folder) {
                    self.clear(dst, name, there.is_some())?;
                    symlink_proof::mkdir_at(dst, name, 0o700)?;
                    give(dst, name, self.owner)?;
                }
                let inner = symlink_proof::openat(dst, name, libc::O_RDONLY | libc::O_DIRECTORY)?;
                self.fill(&from, &inner, depth + 1)?;
                fs::File::from(inner).set_permissions(fs::Permissions::from_mode(mode))?;
                continue;
            }
            if there.as_ref().is_some_and(|f| matches(&from, meta, f)) {
                continue;
            }
            self.clear(dst, name, there.is_some())?;
            if meta.is_file() {
                let to = File::from(symlink_proof::create_file(dst, name, 0o600)?);
                sparse::copy_data(&File::open(&from)?, &to, u64::MAX)?;
                to.set_permissions(fs::Permissions::from_mode(mode))?;
                if let Ok(modified) = meta.modified() {
                    to.set_times(FileTimes::new().set_modified(modified))?;
                }
            } else if meta.is_symlink() {
                symlink_proof::symlink_at(fs::read_link(&from)?.as_os_str(), dst, name)?;
            } else {
                continue;
            }
            give(dst, name, self.owner)?;
        }
        Ok(())
    }

    fn clear(&self, dst: &OwnedFd, name: &OsStr, present: bool) -> io::Result<()> {
        match present {
            true => symlink_proof::remove_at(dst, name, MAX_DEPTH),
            false => Ok(()),
        }
    }
}

/// Whether the sandbox's entry `there` already is the snapshot's file or
/// link `from` (a folder is never "the same": it is pruned and filled).
fn matches(from: &Path, meta: &Metadata, there: &Found) -> bool {
    if meta.is_file() {
        there.kind() == EntryKind::File && same_file(&there.st, meta)
    } else if meta.is_symlink() {
        there.kind() == EntryKind::Symlink
            && matches!((fs::read_link(from), there.read_link()), (Ok(want), Ok(have)) if want == have)
    } else {
        false
    }
}

/// rsync's quick check, and the mode: the same size, modification time and
/// permissions.
fn same_file(st: &libc::stat, other: &Metadata) -> bool {
    st.st_size as u64 == other.size()
        && st.st_mtime == other.mtime()
        && st.st_mtime_nsec == other.mtime_nsec()
        && st.st_mode & 0o777 == other.mode() & 0o777
}

fn modified(st: &libc::stat) -> Option<SystemTime> {
    let secs = u64::try_from(st.st_mtime).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, st.st_mtime_nsec as u32))
}

/// Moves the regular file `rel` beneath the folder `root` (the sandbox's)
/// to the new file `dst` (the server's): read through a descriptor of the
/// inode that was checked, at most `max` bytes. Whatever has that name is
/// then unlinked from the sandbox, taken or not (a file left there would
/// hold its disk), and the folders on its way that it leaves empty. A link
/// or anything else than a file on the way fails it.
pub(crate) fn take_file(root: &Path, rel: &[&str], dst: &Path, max: u64) -> Result<u64, CopyError> {
    let (name, folders) = rel.split_last().expect("a file's name");
    let parent = open_folder(root, folders)?;
    let taken = copy_out(&parent, OsStr::new(name), dst, max);
    let removed = remove_file_at(root, rel, parent);
    if taken.is_err() {
        let _ = fs::remove_file(dst);
    }
    let copied = taken?;
    removed?;
    Ok(copied)
}

/// Removes whatever has the name `rel` beneath `root` (a sandbox's folder)
/// and the folders on its way that it leaves empty, without following links.
pub(crate) fn remove_file(root: &Path, rel: &[&str]) -> Result<(), CopyError> {
    let (_, folders) = rel.split_last().expect("a file's name");
    remove_file_at(root, rel, open_folder(root, folders)?)
}

/// [`remove_file`], given the folder that holds the file.
fn remove_file_at(root: &Path, rel: &[&str], parent: OwnedFd) -> Result<(), CopyError> {
    let (name, folders) = rel.split_last().expect("a file's name");
    let removed = symlink_proof::remove_at(&parent, OsStr::new(name), 0);
    for depth in (0..folders.len()).rev() {
        let emptied = open_folder(root, &folders[..depth])
            .ok()
            .is_some_and(|dir| symlink_proof::remove_empty_at(&dir, OsStr::new(folders[depth])).is_ok());
        if !emptied {
            break;
        }
    }
    Ok(removed?)
}

/// Copies the regular file `name` in `dir` to the new file `dst`, at most
/// `max` bytes, then empties it: its disk is freed even while something
/// else holds it open (gVisor keeps a file the sandbox wrote open after the
/// sandbox closed it, so an unlink alone frees nothing until it lets go).
fn copy_out(dir: &OwnedFd, name: &OsStr, dst: &Path, max: u64) -> Result<u64, CopyError> {
    let found = Found::open(dir, name)?;
    if found.kind() != EntryKind::File {
        return Err(io::Error::other(format!("{} is not a regular file", name.to_string_lossy())).into());
    }
    let src = File::from(found.reopen(libc::O_RDWR)?);
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)?;
    let copied = io::copy(&mut (&src).take(max + 1), &mut out);
    src.set_len(0)?;
    match copied? {
        copied if copied > max => Err(CopyError::TooLarge { bytes: max, files: 1 }),
        copied => Ok(copied),
    }
}

/// Copies the server's file `src` to the new file `rel` beneath the folder
/// `root` (a sandbox's), making the folders on the way; what it makes is
/// given to `owner`. A link on the way, or anything already at `rel`, fails it.
pub(crate) fn place_file(src: &Path, root: &Path, rel: &[&str], owner: u32) -> Result<(), CopyError> {
    let (name, folders) = rel.split_last().expect("a file's name");
    let mut dir: OwnedFd = File::open(root)?.into();
    for folder in folders {
        let folder = OsStr::new(folder);
        match symlink_proof::mkdir_at(&dir, folder, 0o700) {
            Ok(()) => symlink_proof::chown_at(&dir, folder, owner)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
        dir = symlink_proof::openat(&dir, folder, libc::O_RDONLY | libc::O_DIRECTORY)?;
    }
    let out = File::from(symlink_proof::create_file(&dir, OsStr::new(name), 0o600)?);
    std::os::unix::fs::fchown(&out, Some(owner), Some(owner))?;
    io::copy(&mut File::open(src)?, &mut &out)?;
    Ok(())
}

/// The folder `rel` beneath `root`, each name looked up without following links.
fn open_folder(root: &Path, rel: &[&str]) -> Result<OwnedFd, CopyError> {
    let found = symlink_proof::walk(File::open(root)?.into(), rel)
        .map_err(|stopped| io::Error::other(format!("{}: {:?}", rel[..stopped.at].join("/"), stopped.why)))?;
    if found.kind() != EntryKind::Folder {
        return Err(io::Error::other(format!("{} is not a folder", rel.join("/"))).into());
    }
    Ok(found.reopen(libc::O_RDONLY | libc::O_DIRECTORY)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Saves `live` as `tmp/name`, linking from `tmp/previous`.
    fn save_as(tmp: &Path, live: &Path, name: &str, previous: Option<&str>) -> Saved {
        let previous = previous.map(|p| tmp.join(p));
        save(
            live,
            &tmp.join(name),
            previous.as_deref(),
            budget(),
            &AtomicBool::new(false),
        )
        .unwrap()
    }

    fn budget() -> CopyBudget {
        CopyBudget {
            bytes: 1 << 20,
            files: 100,
        }
    }

    /// The attack: a file of a gigabyte of holes, which costs the sandbox
    /// nothing, saved again and again. A snapshot stores and counts its
    /// data only, and a restore writes it back as holes.
    #[test]
    fn a_sparse_file_costs_a_snapshot_its_data_not_its_length() {
        use std::os::unix::fs::FileExt;

        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        let big = File::create(live.join("holes.bin")).unwrap();
        big.set_len(1 << 30).unwrap();
        big.write_all_at(b"data", 512 << 20).unwrap();
        drop(big);
        // The budget (1 MiB) is far below the file's length.
        let saved = save_as(tmp.path(), &live, "s1", None);
        assert!(saved.bytes < 1 << 20, "{} bytes stored", saved.bytes);
        let stored = fs::metadata(tmp.path().join("s1/holes.bin")).unwrap();
        assert_eq!(stored.len(), 1 << 30);
        assert!(
            stored.blocks() * 512 < 1 << 20,
            "{} bytes allocated",
            stored.blocks() * 512
        );
        let back = tmp.path().join("back");
        fs::create_dir(&back).unwrap();
        restore(&tmp.path().join("s1"), &back, nix_uid(), &AtomicBool::new(false)).unwrap();
        let restored = fs::metadata(back.join("holes.bin")).unwrap();
        assert_eq!(restored.len(), 1 << 30);
        assert!(restored.blocks() * 512 < 1 << 20);
        // Data past the budget is still refused.
        fs::write(live.join("dense.bin"), vec![7u8; 2 << 20]).unwrap();
        let over = save(&live, &tmp.path().join("s2"), None, budget(), &AtomicBool::new(false));
        assert!(matches!(over, Err(CopyError::TooLarge { .. })), "{over:?}");
    }

    fn nix_uid() -> u32 {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    }

    const FORK_FILE: [&str; 3] = [".mcp-sandbox", "fork", "f.pickle"];

    /// A sandbox folder, a host folder beside it that holds a host file at
    /// `.mcp-sandbox/fork/f.pickle` (what a link would lead to), and the
    /// server's folder.
    fn fork_folders(tmp: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let (sandbox, host, server) = (tmp.join("sandbox"), tmp.join("host"), tmp.join("server"));
        fs::create_dir_all(host.join(".mcp-sandbox/fork")).unwrap();
        fs::write(host.join(".mcp-sandbox/fork/f.pickle"), "host secret").unwrap();
        fs::create_dir_all(&sandbox).unwrap();
        fs::create_dir_all(&server).unwrap();
        (sandbox, host, server)
    }

    #[test]
    fn a_fork_file_is_taken_out_of_the_sandbox_and_placed_in_another() {
        let tmp = tempfile::tempdir().unwrap();
        let (sandbox, _, server) = fork_folders(tmp.path());
        fs::create_dir_all(sandbox.join(".mcp-sandbox/fork")).unwrap();
        fs::write(sandbox.join(".mcp-sandbox/fork/f.pickle"), "namespace").unwrap();
        assert_eq!(take_file(&sandbox, &FORK_FILE, &server.join("p"), 100).unwrap(), 9);
        assert!(
            !sandbox.join(".mcp-sandbox").exists(),
            "moved, not copied, and the folders it leaves empty gone"
        );
        // A folder with something else in it stays.
        fs::create_dir_all(sandbox.join(".mcp-sandbox/fork")).unwrap();
        fs::create_dir_all(sandbox.join(".mcp-sandbox/output")).unwrap();
        fs::write(sandbox.join(".mcp-sandbox/fork/f.pickle"), "namespace").unwrap();
        take_file(&sandbox, &FORK_FILE, &server.join("q"), 100).unwrap();
        assert!(!sandbox.join(".mcp-sandbox/fork").exists() && sandbox.join(".mcp-sandbox/output").is_dir());
        let other = tmp.path().join("other");
        fs::create_dir(&other).unwrap();
        place_file(&server.join("p"), &other, &FORK_FILE, 4242).unwrap();
        let placed = other.join(".mcp-sandbox/fork/f.pickle");
        assert_eq!(fs::read_to_string(&placed).unwrap(), "namespace");
        assert_eq!(fs::metadata(&placed).unwrap().uid(), 4242);
        assert_eq!(fs::metadata(other.join(".mcp-sandbox")).unwrap().uid(), 4242);
        assert!(
            place_file(&server.join("p"), &other, &FORK_FILE, 4242).is_err(),
            "never over what is there"
        );
    }

    #[test]
    fn a_fork_file_too_large_is_refused_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let (sandbox, _, server) = fork_folders(tmp.path());
        fs::create_dir_all(sandbox.join(".mcp-sandbox/fork")).unwrap();
        fs::write(sandbox.join(".mcp-sandbox/fork/f.pickle"), "0123456789").unwrap();
        let err = take_file(&sandbox, &FORK_FILE, &server.join("p"), 5).unwrap_err();
        assert!(matches!(err, CopyError::TooLarge { .. }), "{err}");
        assert!(!server.join("p").exists());
        assert!(
            !sandbox.join(".mcp-sandbox/fork/f.pickle").exists(),
            "its disk is freed"
        );
    }

    #[test]
    fn links_planted_on_a_fork_files_way_never_lead_to_the_host() {
        let tmp = tempfile::tempdir().unwrap();
        let (sandbox, host, server) = fork_folders(tmp.path());
        // The folder on the way is a link to the host.
        std::os::unix::fs::symlink(host.join(".mcp-sandbox"), sandbox.join(".mcp-sandbox")).unwrap();
        assert!(take_file(&sandbox, &FORK_FILE, &server.join("p"), 100).is_err());
        assert!(place_file(&host.join(".mcp-sandbox/fork/f.pickle"), &sandbox, &FORK_FILE, 1).is_err());
        // The file itself is a link to the host's file.
        fs::remove_file(sandbox.join(".mcp-sandbox")).unwrap();
        fs::create_dir_all(sandbox.join(".mcp-sandbox/fork")).unwrap();
        std::os::unix::fs::symlink(
            host.join(".mcp-sandbox/fork/f.pickle"),
            sandbox.join(".mcp-sandbox/fork/f.pickle"),
        )
        .unwrap();
        assert!(take_file(&sandbox, &FORK_FILE, &server.join("p"), 100).is_err());
        assert!(!server.join("p").exists(), "nothing of the host was read");
        let other = tmp.path().join("other");
        fs::create_dir_all(other.join(".mcp-sandbox")).unwrap();
        std::os::unix::fs::symlink(host.join(".mcp-sandbox/fork"), other.join(".mcp-sandbox/fork")).unwrap();
        fs::write(server.join("q"), "namespace").unwrap();
        assert!(place_file(&server.join("q"), &other, &["x", "f.pickle"], 1).is_ok());
        assert!(place_file(&server.join("q"), &other, &FORK_FILE, 1).is_err());
        assert_eq!(
            fs::read_to_string(host.join(".mcp-sandbox/fork/f.pickle")).unwrap(),
            "host secret",
            "the host's file is untouched"
        );
        assert_eq!(fs::read_dir(host.join(".mcp-sandbox/fork")).unwrap().count(), 1);
    }

    fn tree(root: &Path) {
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/data.txt"), "hello").unwrap();
        fs::write(root.join("top.txt"), "top").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    }

    #[test]
    fn a_clone_copies_one_sandboxs_folder_into_anothers_without_following_links_on_either_side() {
        let tmp = tempfile::tempdir().unwrap();
        let (sandbox, host, _) = fork_folders(tmp.path());
        tree(&sandbox);
        fs::set_permissions(sandbox.join("top.txt"), fs::Permissions::from_mode(0o640)).unwrap();
        // The source's folder leads to the host: copied as the link it is.
        std::os::unix::fs::symlink(&host, sandbox.join("to-host")).unwrap();
        // The new sandbox already has a folder of the same name, a file the
        // source has too, links where the source has a folder and a file,
        // and what the source lacks.
        let fork = tmp.path().join("fork");
        fs::create_dir_all(fork.join(".mcp-sandbox/spool")).unwrap();
        fs::create_dir_all(fork.join(LOST_FOUND)).unwrap();
        fs::write(fork.join("from-the-image.py"), "old").unwrap();
        fs::create_dir_all(sandbox.join(".mcp-sandbox")).unwrap();
        fs::write(sandbox.join(".mcp-sandbox/kept"), "from the source").unwrap();
        fs::write(fork.join("top.txt"), "the fork's").unwrap();
        std::os::unix::fs::symlink(host.join(".mcp-sandbox"), fork.join("a")).unwrap();
        std::os::unix::fs::symlink(host.join(".mcp-sandbox/fork/f.pickle"), fork.join("link")).unwrap();
        let cloned = clone_into(&sandbox, &fork, 4242, budget(), &AtomicBool::new(false)).unwrap();
        assert_eq!(
            (cloned.files, cloned.bytes),
            (8, 8 + 15),
            "a, a/b, data.txt, top.txt, link, to-host, .mcp-sandbox, kept"
        );
        assert_eq!(fs::read_to_string(fork.join("a/b/data.txt")).unwrap(), "hello");
        assert_eq!(fs::read_to_string(fork.join("top.txt")).unwrap(), "top");
        let top = fs::metadata(fork.join("top.txt")).unwrap();
        assert_eq!((top.mode() & 0o777, top.uid()), (0o640, 4242));
        assert_eq!(top.mtime(), fs::metadata(sandbox.join("top.txt")).unwrap().mtime());
        assert_eq!(fs::read_link(fork.join("link")).unwrap(), Path::new("/etc/passwd"));
        assert_eq!(fs::read_link(fork.join("to-host")).unwrap(), host);
        assert!(
            !fork.join(".mcp-sandbox/spool").exists(),
            "what only the fork had is gone"
        );
        assert!(!fork.join("from-the-image.py").exists() && fork.join(LOST_FOUND).is_dir());
        assert_eq!(
            fs::read_to_string(fork.join(".mcp-sandbox/kept")).unwrap(),
            "from the source"
        );
        assert_eq!(fs::symlink_metadata(fork.join("a")).unwrap().uid(), 4242);
        // Nothing was written through the fork's links.
        assert_eq!(fs::read_dir(host.join(".mcp-sandbox")).unwrap().count(), 1);
        assert_eq!(
            fs::read_to_string(host.join(".mcp-sandbox/fork/f.pickle")).unwrap(),
            "host secret"
        );
        // A clone past its budget fails.
        let small = CopyBudget { bytes: 4, files: 100 };
        let err = clone_into(&sandbox, &fork, 4242, small, &AtomicBool::new(false)).unwrap_err();
        assert!(matches!(err, CopyError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn a_restore_brings_back_what_was_saved_however_it_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let (live, snap) = (tmp.path().join("live"), tmp.path().join("snap"));
        fs::create_dir(&live).unwrap();
        tree(&live);
        let stop = AtomicBool::new(false);
        let saved = save(&live, &snap, None, budget(), &stop).unwrap();
        assert_eq!(saved.bytes, 8);
        // Changed, removed, added, and a folder swapped for a link to the host.
        fs::write(live.join("top.txt"), "changed!").unwrap();
        fs::remove_dir_all(live.join("a")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), live.join("a")).unwrap();
        fs::write(live.join("new.txt"), "new").unwrap();
        fs::remove_file(live.join("link")).unwrap();
        fs::write(live.join("link"), "not a link").unwrap();
        restore(&snap, &live, 0, &stop).unwrap();
        assert_eq!(fs::read_to_string(live.join("top.txt")).unwrap(), "top");
        assert_eq!(fs::read_to_string(live.join("a/b/data.txt")).unwrap(), "hello");
        assert!(!live.join("new.txt").exists());
        assert_eq!(fs::read_link(live.join("link")).unwrap(), Path::new("/etc/passwd"));
        // The folder the link pointed at was never entered.
        assert!(tmp.path().join("snap").exists() && tmp.path().join("live").exists());
        assert!(!tmp.path().join("b").exists());
    }

    #[test]
    fn a_save_links_what_the_previous_snapshot_holds_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        tree(&live);
        save_as(tmp.path(), &live, "one", None);
        fs::write(live.join("top.txt"), "other").unwrap();
        let second = save_as(tmp.path(), &live, "two", Some("one"));
        assert_eq!(second.bytes, 5, "only the changed file is stored again");
        let inode = |p: &str| fs::metadata(tmp.path().join(p)).unwrap().ino();
        assert_eq!(inode("one/a/b/data.txt"), inode("two/a/b/data.txt"));
        assert_ne!(inode("one/top.txt"), inode("two/top.txt"));
    }

    #[test]
    fn a_fingerprint_sees_any_change_and_matches_the_saved_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        tree(&live);
        let stop = AtomicBool::new(false);
        let (before, entries) = fingerprint(&live, budget(), &stop).unwrap();
        assert_eq!(entries, 5);
        let saved = save(&live, &tmp.path().join("snap"), None, budget(), &stop).unwrap();
        assert_eq!(saved.fingerprint, before, "the save hashes what it copied");
        assert_eq!(
            fingerprint(&tmp.path().join("snap"), budget(), &stop).unwrap().0,
            before
        );
        fs::write(live.join("a/b/data.txt"), "hellO").unwrap();
        assert_ne!(
            fingerprint(&live, budget(), &stop).unwrap().0,
            before,
            "same size, new time"
        );
        restore(&tmp.path().join("snap"), &live, 0, &stop).unwrap();
        assert_eq!(
            fingerprint(&live, budget(), &stop).unwrap().0,
            before,
            "a restore matches again"
        );
        fs::rename(live.join("top.txt"), live.join("tip.txt")).unwrap();
        assert_ne!(fingerprint(&live, budget(), &stop).unwrap().0, before, "a rename");
    }

    #[test]
    fn a_link_saved_by_one_snapshot_never_leads_the_next_out_of_the_store() {
        let tmp = tempfile::tempdir().unwrap();
        let (live, host) = (tmp.path().join("live"), tmp.path().join("host"));
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("secret.txt"), "host secret").unwrap();
        fs::create_dir(&live).unwrap();
        std::os::unix::fs::symlink(&host, live.join("a")).unwrap();
        save_as(tmp.path(), &live, "one", None);
        // Now a real folder, with a file of the host file's size and time.
        fs::remove_file(live.join("a")).unwrap();
        fs::create_dir(live.join("a")).unwrap();
        fs::write(live.join("a/secret.txt"), "sandbox own").unwrap();
        let when = fs::metadata(host.join("secret.txt")).unwrap().modified().unwrap();
        File::options()
            .write(true)
            .open(live.join("a/secret.txt"))
            .unwrap()
            .set_times(FileTimes::new().set_modified(when))
            .unwrap();
        save_as(tmp.path(), &live, "two", Some("one"));
        let saved = tmp.path().join("two/a/secret.txt");
        assert_eq!(fs::read_to_string(&saved).unwrap(), "sandbox own");
        assert_ne!(
            fs::metadata(&saved).unwrap().ino(),
            fs::metadata(host.join("secret.txt")).unwrap().ino()
        );
    }

    #[test]
    fn a_save_keeps_modes_whatever_the_umask_and_sees_a_mode_change() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        fs::write(live.join("run.sh"), "echo").unwrap();
        fs::set_permissions(live.join("run.sh"), fs::Permissions::from_mode(0o666)).unwrap();
        save_as(tmp.path(), &live, "one", None);
        let mode = |p: &str| fs::metadata(tmp.path().join(p)).unwrap().mode() & 0o777;
        assert_eq!(mode("one/run.sh"), 0o666);
        fs::set_permissions(live.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        save_as(tmp.path(), &live, "two", Some("one"));
        assert_eq!(
            mode("two/run.sh"),
            0o755,
            "a mode change is saved, not linked from before"
        );
    }

    #[test]
    fn a_save_past_its_budget_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let live = tmp.path().join("live");
        fs::create_dir(&live).unwrap();
        fs::write(live.join("big"), vec![7u8; 4096]).unwrap();
        let stop = AtomicBool::new(false);
        let small = CopyBudget { bytes: 1000, files: 10 };
        let err = save(&live, &tmp.path().join("s"), None, small, &stop).unwrap_err();
        assert!(matches!(err, CopyError::TooLarge { .. }), "{err}");
        let few = CopyBudget {
            bytes: 1 << 20,
            files: 0,
        };
        let err = save(&live, &tmp.path().join("t"), None, few, &stop).unwrap_err();
        assert!(matches!(err, CopyError::TooLarge { .. }), "{err}");
    }
}
