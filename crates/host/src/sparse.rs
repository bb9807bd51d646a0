//! Copying a sparse file as a sparse file.
//!
//! A sandbox's disk image starts as a copy of an empty file system made
//! once (see [`super::disk`]): its few hundred kilobytes of data sit in a
//! file of the cap's size that is otherwise holes. `std::fs::copy` would
//! write the holes out as zeros, the whole cap; this copies the data only.
//! Snapshots copy a sandbox's files the same way ([`copy_data`]): a file
//! of a gigabyte of holes costs the sandbox nothing, and so costs the host
//! nothing in a snapshot.

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
    let dst = File::options().write(true).create_new(true).open(part)?;
    copy_data(&src, &dst, u64::MAX)?;
    dst.sync_data()
}

/// Copies `src` into the empty file `dst`, keeping its holes: only the
/// ranges that hold data, and in them the pieces that are not all zeros,
/// are written, and `dst` gets `src`'s length. Writes at most `limit`
/// bytes; past them it stops with an error of kind `FileTooLarge`. A file
/// that shrinks while it is read ends where it ends. The bytes written.
pub fn copy_data(src: &File, dst: &File, limit: u64) -> io::Result<u64> {
    dst.set_len(src.metadata()?.len())?;
    let mut buf = vec![0u8; PIECE];
    let (mut offset, mut written) = (0, 0u64);
    while let Some((start, end)) = next_data(src, offset)? {
        let mut at = start;
        while at < end {
            let n = usize::try_from(end - at).unwrap_or(PIECE).min(PIECE);
            let got = src.read_at(&mut buf[..n], at)?;
            if got == 0 {
                return Ok(written);
            }
            if buf[..got].iter().any(|&b| b != 0) {
                written += got as u64;
                if written > limit {
                    return Err(io::ErrorKind::FileTooLarge.into());
                }
                dst.write_all_at(&buf[..got], at)?;
            }
            at += got as u64;
        }
        offset = end;
    }
    Ok(written)
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

    #[test]
    fn a_copy_of_data_stops_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("from")).unwrap();
        f.set_len(1 << 30).unwrap();
        f.write_all_at(&[1u8; 2 * PIECE], 5 << 20).unwrap();
        let from = File::open(dir.path().join("from")).unwrap();
        let to = File::create(dir.path().join("to")).unwrap();
        let data = 2 * PIECE as u64;
        assert_eq!(
            copy_data(&from, &to, data).unwrap(),
            data,
            "a gigabyte of holes costs its data"
        );
        assert_eq!(to.metadata().unwrap().len(), 1 << 30);
        let again = File::create(dir.path().join("again")).unwrap();
        assert_eq!(
            copy_data(&from, &again, data - 1).unwrap_err().kind(),
            io::ErrorKind::FileTooLarge
        );
    }
}
