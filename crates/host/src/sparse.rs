//! Copying a sparse file as a sparse file.
//!
//! A sandbox's disk image starts as a copy of an empty file system made
//! once (see [`super::disk`]): its few hundred kilobytes of data sit in a
//! file of the cap's size that is otherwise holes. `std::fs::copy` would
//! write the holes out as zeros, the whole cap; this copies the data only.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Reads are done in pieces of this size.
const PIECE: usize = 1 << 16;

/// Where the next data at or after `offset` begins, and where it ends;
/// `None` past the last data.
fn next_data(file: &File, offset: u64) -> io::Result<Option<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let at = i64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `fd` is an open descriptor for the life of `file`.
    let start = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
    if start < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: as above.
    let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
    if end < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((start as u64, end as u64)))
}

/// Copies `from` to a new file `to` of the same length, writing only the
/// ranges that hold data: the holes of `from` stay holes in `to`, and so do
/// pieces of zeros (a file system without holes reports the whole file as
/// data). The copy is made beside `to`, written to disk and then renamed:
/// `to` is whole or absent, never a copy cut short (a full disk, a kill).
pub fn copy(from: &Path, to: &Path) -> io::Result<()> {
    let part = to.with_extension("part");
    let copied = copy_into(from, to, &part).and_then(|()| std::fs::rename(&part, to));
    if copied.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    copied
}

fn copy_into(from: &Path, to: &Path, part: &Path) -> io::Result<()> {
    if to.exists() {
        return Err(io::ErrorKind::AlreadyExists.into());
    }
    let src = File::open(from)?;
    let len = src.metadata()?.len();
    let dst = File::options().write(true).create_new(true).open(part)?;
    dst.set_len(len)?;
    let mut buf = vec![0u8; PIECE];
    let mut offset = 0;
    while let Some((start, end)) = next_data(&src, offset)? {
        let mut at = start;
        while at < end {
            let n = usize::try_from(end - at).unwrap_or(PIECE).min(PIECE);
            src.read_exact_at(&mut buf[..n], at)?;
            if buf[..n].iter().any(|&b| b != 0) {
                dst.write_all_at(&buf[..n], at)?;
            }
            at += n as u64;
        }
        offset = end;
    }
    dst.sync_data()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn data_is_copied_and_holes_stay_holes() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        let f = File::create(&from).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&[7u8; 200_000], 30 << 20).unwrap();
        // Zeros written out: data to the file system, a hole in the copy.
        f.write_all_at(&vec![0u8; 2 << 20], 40 << 20).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        drop(f);
        copy(&from, &to).unwrap();
        let (a, b) = (std::fs::read(&from).unwrap(), std::fs::read(&to).unwrap());
        assert!(a == b, "the copy differs");
        let allocated = std::fs::metadata(&to).unwrap().blocks() * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated for 200 KB of data");
        // An existing file is never written over, and nothing is left beside it.
        assert_eq!(copy(&from, &to).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert!(!to.with_extension("part").exists());
    }
}
