//! Listings: breadth first, bounded in entries, depth and names scanned.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::SystemTime;

use sandbox_host::symlink_proof::{self, openat};

use super::{io, resolve, EntryKind, FileError, Result, ResultsPath, MAX_LIST_DEPTH, MAX_SCANNED};

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
        EntryKind::Symlink => return Err(FileError::Symlink(path.absolute())),
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
            let Ok(names) = symlink_proof::read_dir(&dir) else {
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
