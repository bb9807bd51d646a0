//! What `upload_file_to_sandbox` may copy: a file or folder from one of the
//! configured host folders (after resolving symlinks, so a link inside an
//! allowed folder cannot point out of it), never the server's own state,
//! results or configuration, into a folder under `/app/results`.
//!
//! The checked path is then read as it was checked, whoever writes the
//! folder meanwhile: it is walked again from `/` one component at a time
//! without following links, and a folder's entries are looked up from the
//! folder's own descriptor, never by path ([`sandbox_host::symlink_proof`]). A link in
//! an uploaded folder is copied as a link (it points into the sandbox's own
//! file system there), never followed on the host; FIFOs, sockets and
//! devices are left out unopened.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use crate::config::Settings;
use crate::error::{Result, SandboxError};
use sandbox_host::symlink_proof::{self, EntryKind, Found, Stopped, Why};
use sandbox_host::SANDBOX_UID;
use sandbox_runtime::agent::RESULTS_IN_CONTAINER;

/// Largest upload, in bytes of file content.
pub const MAX_UPLOAD_BYTES: u64 = 256 * 1024 * 1024;
/// Deepest folder an upload may hold: the walk keeps one descriptor open
/// per level it is in.
const MAX_UPLOAD_DEPTH: usize = 64;

/// Resolves `local` and checks it against the allowed folders.
pub fn resolve_source(settings: &Settings, local: &str) -> Result<PathBuf> {
    let refuse = |why: String| Err(SandboxError::UploadRefused(why));
    if settings.uploads.allowed_dirs.is_empty() {
        return refuse("no upload folders are configured on this server ([uploads] allowed_dirs)".into());
    }
    let path = Path::new(local);
    if !path.is_absolute() {
        return refuse(format!(
            "local_file_path must be an absolute path on the server, got {local:?}"
        ));
    }
    let Ok(real) = path.canonicalize() else {
        return refuse(format!("local file not found: {local}"));
    };
    let inside_allowed = settings
        .uploads
        .allowed_dirs
        .iter()
        .filter_map(|d| d.canonicalize().ok())
        .any(|d| real.starts_with(&d));
    if !inside_allowed {
        let allowed: Vec<String> = settings
            .uploads
            .allowed_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        return refuse(format!(
            "{local} is outside the folders uploads may come from ({})",
            allowed.join(", ")
        ));
    }
    // The configuration check refuses upload folders that overlap these;
    // this holds too when a folder is swapped for a link to one later.
    let mut protected: Vec<PathBuf> = vec![settings.state_dir.clone(), settings.results_dir.clone()];
    protected.extend(settings.protected.iter().cloned());
    for p in protected.iter().filter_map(|p| p.canonicalize().ok()) {
        if real.starts_with(&p) || p.starts_with(&real) {
            return refuse(format!(
                "{local} holds the server's own state, sandbox results or configuration"
            ));
        }
    }
    Ok(real)
}

/// Checks `dest` (a folder in the sandbox) and returns it normalised.
pub fn resolve_dest(dest: &str) -> Result<String> {
    let path = Path::new(dest);
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(SandboxError::InvalidArgument(format!(
                    "dest_path {dest:?} must not contain '..'"
                )))
            }
        }
    }
    let normal = format!("/{}", parts.join("/"));
    if !path.is_absolute()
        || !(normal == RESULTS_IN_CONTAINER || normal.starts_with(&format!("{RESULTS_IN_CONTAINER}/")))
    {
        return Err(SandboxError::InvalidArgument(format!(
            "dest_path must be {RESULTS_IN_CONTAINER} or a folder below it, got {dest:?}"
        )));
    }
    Ok(normal)
}

/// What an upload copies into a sandbox.
#[derive(Debug)]
pub enum UploadSource {
    /// A file or folder on the server's host, already checked by [`resolve_source`].
    Host(PathBuf),
    /// Bytes sent over HTTP (the web UI), with the file name to give them,
    /// already checked by [`check_file_name`].
    Bytes { name: String, data: bytes::Bytes },
}

/// Checks the name of a file sent over HTTP: one path component, no
/// control characters, at most 255 bytes.
pub fn check_file_name(name: &str) -> Result<String> {
    let name = name.trim();
    if name.is_empty()
        || name.len() > 255
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(SandboxError::UploadRefused(format!(
            "{name:?} is not a file name: 1 to 255 bytes, no '/', no control characters, not '.' or '..'"
        )));
    }
    Ok(name.to_string())
}

/// Packs an upload as a tar whose entries belong to the sandbox user, and
/// names its top entry.
pub fn pack(source: UploadSource) -> Result<(Vec<u8>, String)> {
    match source {
        UploadSource::Host(path) => pack_host(&path),
        UploadSource::Bytes { name, data } => {
            if data.len() as u64 > MAX_UPLOAD_BYTES {
                return Err(SandboxError::UploadRefused(format!(
                    "larger than {MAX_UPLOAD_BYTES} bytes"
                )));
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut header = sandbox_header(tar::EntryType::Regular, 0o644, data.len() as u64, now);
            // Room for the file, its headers and the archive's end, so that
            // the buffer is not grown (and briefly held twice) on the way.
            let mut tar = tar::Builder::new(Vec::with_capacity(data.len() + 4096));
            let io = |e: std::io::Error| SandboxError::Internal(format!("packing an upload: {e}"));
            tar.append_data(&mut header, &name, data.as_ref()).map_err(io)?;
            drop(data);
            Ok((tar.into_inner().map_err(io)?, name))
        }
    }
}

/// A header of an entry owned by the sandbox user. Only permission bits are
/// kept: set-id bits have no use on what the sandbox user owns.
fn sandbox_header(kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode & 0o777);
    header.set_size(size);
    header.set_mtime(mtime);
    header.set_uid(SANDBOX_UID.into());
    header.set_gid(SANDBOX_UID.into());
    header
}

/// Packs the host file or folder `source`, which [`resolve_source`] checked
/// (its canonical path), walking it again from `/` without following any
/// link: a folder on the way that became a link since is refused.
fn pack_host(source: &Path) -> Result<(Vec<u8>, String)> {
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| SandboxError::UploadRefused("the path has no file name".into()))?;
    let changed = || {
        SandboxError::UploadRefused(format!(
            "{} changed while it was being uploaded (a folder on the way, or the file itself, is now a link or gone); try again",
            source.display()
        ))
    };
    let segments: Vec<&OsStr> = source
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            _ => None,
        })
        .collect();
    let top: OwnedFd = File::open("/").map_err(|e| host_io(source, e))?.into();
    let found = symlink_proof::walk(top, &segments).map_err(|Stopped { why, .. }| match why {
        Why::Io(e) if e.raw_os_error() != Some(libc::ENOENT) => host_io(source, e),
        _ => changed(),
    })?;
    if !matches!(found.kind(), EntryKind::File | EntryKind::Folder) {
        return Err(changed());
    }
    let mut packer = Packer {
        tar: tar::Builder::new(Vec::new()),
        total: 0,
        source,
    };
    packer.add(found, Path::new(&name), 0)?;
    let tar = packer.tar.into_inner().map_err(|e| host_io(source, e))?;
    Ok((tar, name))
}

fn host_io(source: &Path, e: std::io::Error) -> SandboxError {
    SandboxError::UploadRefused(format!("reading {}: {e}", source.display()))
}

/// The archive of a host upload as it is walked.
struct Packer<'a> {
    tar: tar::Builder<Vec<u8>>,
    /// Bytes of file content packed so far.
    total: u64,
    /// The uploaded path, for messages.
    source: &'a Path,
}

impl Packer<'_> {
    fn io(&self) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
        |e| host_io(self.source, e)
    }

    /// Adds `found` as `inner` (its path in the archive), `depth` folders
    /// below the uploaded one.
    fn add(&mut self, found: Found, inner: &Path, depth: usize) -> Result<()> {
        let st = found.st;
        let mtime = st.st_mtime.max(0) as u64;
        match found.kind() {
            EntryKind::Folder => {
                if depth >= MAX_UPLOAD_DEPTH {
                    return Err(SandboxError::UploadRefused(format!(
                        "{} holds folders more than {MAX_UPLOAD_DEPTH} levels deep",
                        self.source.display()
                    )));
                }
                let mut header = sandbox_header(tar::EntryType::Directory, st.st_mode, 0, mtime);
                self.tar
                    .append_data(&mut header, inner, std::io::empty())
                    .map_err(self.io())?;
                let dir = found.reopen(libc::O_RDONLY | libc::O_DIRECTORY).map_err(self.io())?;
                drop(found);
                // Names first (sorted, for an archive that does not depend on
                // the order on disk), so that only this folder's descriptor
                // stays open while its entries are added.
                let mut names = symlink_proof::read_dir(&dir)
                    .and_then(|entries| {
                        entries
                            .map(|e| e.map(|e| e.file_name()))
                            .collect::<std::io::Result<Vec<_>>>()
                    })
                    .map_err(self.io())?;
                names.sort();
                for name in names {
                    self.add_entry(&dir, &name, &inner.join(&name), depth + 1)?;
                }
            }
            EntryKind::File => {
                let size = st.st_size as u64;
                self.total += size;
                if self.total > MAX_UPLOAD_BYTES {
                    return Err(SandboxError::UploadRefused(format!(
                        "larger than {MAX_UPLOAD_BYTES} bytes"
                    )));
                }
                let file = File::from(found.reopen(libc::O_RDONLY | libc::O_NONBLOCK).map_err(self.io())?);
                let mut header = sandbox_header(tar::EntryType::Regular, st.st_mode, size, mtime);
                // Exactly the size the header states, whatever the file does
                // meanwhile: bytes a growing file gained would otherwise be
                // read as entries of their own, and a shrunk file would end
                // the archive short (its missing tail comes as zeros).
                let body = file.take(size).chain(std::io::repeat(0)).take(size);
                self.tar.append_data(&mut header, inner, body).map_err(self.io())?;
            }
            EntryKind::Symlink => {
                let target = found.read_link().map_err(self.io())?;
                let mut header = sandbox_header(tar::EntryType::Symlink, 0o777, 0, mtime);
                self.tar.append_link(&mut header, inner, target).map_err(self.io())?;
            }
            // Never opened (a FIFO would block), and nothing a sandbox needs.
            EntryKind::Other => {}
        }
        Ok(())
    }

    /// Adds the entry `name` of the folder `dir`, as it is now: looked up
    /// from the folder's descriptor without following it, so an entry
    /// swapped for a link after the folder was listed is added as the link.
    fn add_entry(&mut self, dir: &OwnedFd, name: &OsStr, inner: &Path, depth: usize) -> Result<()> {
        match Found::open(dir, name) {
            Ok(found) => self.add(found, inner, depth),
            // Gone since the folder was listed.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(self.io()(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UploadsConfig;

    fn settings(allowed: &Path, state: &Path) -> Settings {
        Settings {
            uploads: UploadsConfig {
                allowed_dirs: vec![allowed.to_path_buf()],
                ..Default::default()
            },
            state_dir: state.to_path_buf(),
            results_dir: state.join("results"),
            ..Settings::under(state)
        }
    }

    #[test]
    fn sources_outside_allowed_folders_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("in");
        let state = root.path().join("state");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(allowed.join("ok.txt"), "x").unwrap();
        std::fs::write(root.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret"), allowed.join("link")).unwrap();
        let s = settings(&allowed, &state);
        assert!(resolve_source(&s, allowed.join("ok.txt").to_str().unwrap()).is_ok());
        for bad in [
            root.path().join("secret"),
            allowed.join("link"),
            allowed.join("../secret"),
            PathBuf::from("/etc/passwd"),
        ] {
            assert!(resolve_source(&s, bad.to_str().unwrap()).is_err(), "{bad:?} accepted");
        }
        assert!(resolve_source(&s, "relative.txt").is_err());
        // The state folder is refused even when an allowed folder holds it.
        let s = settings(root.path(), &state);
        std::fs::write(state.join("db"), "x").unwrap();
        assert!(resolve_source(&s, state.join("db").to_str().unwrap()).is_err());
    }

    /// The names in a packed upload, with what each holds: a file's
    /// content, a link's target, or nothing for a folder.
    fn packed(tar: &[u8]) -> Vec<(String, String)> {
        let mut archive = tar::Archive::new(tar);
        let mut out = vec![];
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let held = match entry.header().entry_type() {
                tar::EntryType::Symlink => {
                    format!("-> {}", entry.link_name().unwrap().unwrap().display())
                }
                _ => {
                    let mut body = String::new();
                    std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
                    body
                }
            };
            out.push((name, held));
        }
        out.sort();
        out
    }

    #[test]
    fn a_folder_swapped_for_a_link_after_the_check_is_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let (allowed, outside) = (root.path().join("in"), root.path().join("outside"));
        std::fs::create_dir_all(allowed.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(allowed.join("sub/data.txt"), "data").unwrap();
        std::fs::write(outside.join("data.txt"), "secret").unwrap();
        let s = settings(&allowed, &root.path().join("state"));
        let file = resolve_source(&s, allowed.join("sub/data.txt").to_str().unwrap()).unwrap();
        let folder = resolve_source(&s, allowed.join("sub").to_str().unwrap()).unwrap();
        // Checked; now a folder on the way is swapped for a link out.
        std::fs::rename(allowed.join("sub"), root.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, allowed.join("sub")).unwrap();
        for source in [file, folder] {
            match pack(UploadSource::Host(source.clone())) {
                Err(SandboxError::UploadRefused(_)) => {}
                Ok((tar, _)) => panic!("{source:?} was packed through the link: {:?}", packed(&tar)),
                Err(e) => panic!("{source:?}: {e}"),
            }
        }
    }

    #[test]
    fn an_entry_swapped_for_a_link_after_its_folder_was_listed_is_packed_as_the_link() {
        let root = tempfile::tempdir().unwrap();
        let (up, outside) = (root.path().join("up"), root.path().join("outside"));
        std::fs::create_dir_all(up.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(up.join("data.txt"), "data").unwrap();
        std::fs::write(up.join("sub/x.txt"), "x").unwrap();
        std::fs::write(outside.join("secret"), "secret").unwrap();
        let dir: OwnedFd = File::open(&up).unwrap().into();
        // The folder was listed (a file, a folder); then both are swapped.
        std::fs::remove_file(up.join("data.txt")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), up.join("data.txt")).unwrap();
        std::fs::rename(up.join("sub"), root.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, up.join("sub")).unwrap();
        let mut packer = Packer {
            tar: tar::Builder::new(Vec::new()),
            total: 0,
            source: &up,
        };
        for name in ["data.txt", "sub", "gone"] {
            let inner = Path::new("up").join(name);
            packer.add_entry(&dir, OsStr::new(name), &inner, 1).unwrap();
        }
        let got = packed(&packer.tar.into_inner().unwrap());
        let link = |to: &Path| format!("-> {}", to.display());
        assert_eq!(
            got,
            [
                ("up/data.txt".to_string(), link(&outside.join("secret"))),
                ("up/sub".to_string(), link(&outside)),
            ]
        );
    }

    #[test]
    fn links_in_an_uploaded_folder_are_packed_as_links_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let (allowed, outside) = (root.path().join("in"), root.path().join("outside"));
        let up = allowed.join("up");
        std::fs::create_dir_all(up.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(up.join("sub/x.txt"), "x").unwrap();
        std::fs::write(outside.join("secret"), "secret").unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), up.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, up.join("dirlink")).unwrap();
        let fifo = std::ffi::CString::new(up.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let s = settings(&allowed, &root.path().join("state"));
        let source = resolve_source(&s, up.to_str().unwrap()).unwrap();
        let (tar, name) = pack(UploadSource::Host(source)).unwrap();
        assert_eq!(name, "up");
        let link = |to: &Path| format!("-> {}", to.display());
        let expected: Vec<(String, String)> = [
            ("up", String::new()),
            ("up/dirlink", link(&outside)),
            ("up/link", link(&outside.join("secret"))),
            ("up/sub", String::new()),
            ("up/sub/x.txt", "x".to_string()),
        ]
        .into_iter()
        .map(|(n, held)| (n.to_string(), held))
        .collect();
        assert_eq!(packed(&tar), expected, "the FIFO is left out, the links are links");
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries().unwrap() {
            assert_eq!(entry.unwrap().header().uid().unwrap(), u64::from(SANDBOX_UID));
        }
    }

    #[test]
    fn folders_deeper_than_the_bound_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("in");
        let deepest: PathBuf = std::iter::once("up".to_string())
            .chain((1..MAX_UPLOAD_DEPTH).map(|i| i.to_string()))
            .collect();
        std::fs::create_dir_all(allowed.join(&deepest)).unwrap();
        let s = settings(&allowed, &root.path().join("state"));
        let up = || UploadSource::Host(resolve_source(&s, allowed.join("up").to_str().unwrap()).unwrap());
        let (tar, _) = pack(up()).unwrap();
        assert_eq!(packed(&tar).len(), MAX_UPLOAD_DEPTH);
        std::fs::create_dir(allowed.join(&deepest).join("one-more")).unwrap();
        assert!(matches!(pack(up()), Err(SandboxError::UploadRefused(m)) if m.contains("levels deep")));
    }

    #[test]
    fn sent_file_names_are_one_component() {
        assert_eq!(check_file_name(" data.csv ").unwrap(), "data.csv");
        assert_eq!(check_file_name("ünï cödé.txt").unwrap(), "ünï cödé.txt");
        for bad in ["", "..", ".", "a/b", "../x", "a\nb", &"x".repeat(256)] {
            assert!(check_file_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sent_bytes_pack_as_one_file_of_the_sandbox_user() {
        let (tar, name) = pack(UploadSource::Bytes {
            name: "a.txt".into(),
            data: bytes::Bytes::from_static(b"hello"),
        })
        .unwrap();
        assert_eq!(name, "a.txt");
        let mut archive = tar::Archive::new(tar.as_slice());
        let entries: Vec<_> = archive.entries().unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].path().unwrap().to_str(), Some("a.txt"));
        assert_eq!(entries[0].header().uid().unwrap(), u64::from(SANDBOX_UID));
        assert_eq!(entries[0].header().size().unwrap(), 5);
    }

    #[test]
    fn destinations_stay_under_results() {
        assert_eq!(resolve_dest("/app/results").unwrap(), "/app/results");
        assert_eq!(resolve_dest("/app/results/data/").unwrap(), "/app/results/data");
        for bad in ["/app/results/../../etc", "/tmp", "app/results", "/app/resultsx", "/"] {
            assert!(resolve_dest(bad).is_err(), "{bad} accepted");
        }
    }
}
