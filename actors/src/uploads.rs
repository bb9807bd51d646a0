//! What `upload_file_to_sandbox` may copy: a file or folder from one of the
//! configured host folders (after resolving symlinks, so a link inside an
//! allowed folder cannot point out of it), never the server's own state or
//! configuration, into a folder under `/app/results`.

use std::path::{Component, Path, PathBuf};

use crate::agent::RESULTS_IN_CONTAINER;
use crate::config::Settings;
use crate::error::{Result, SandboxError};
use crate::runtime::SANDBOX_UID;

/// Largest upload, in bytes of file content.
pub const MAX_UPLOAD_BYTES: u64 = 256 * 1024 * 1024;

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
    let mut protected: Vec<PathBuf> = vec![settings.state_dir.clone()];
    protected.extend(settings.protected.iter().cloned());
    for p in protected.iter().filter_map(|p| p.canonicalize().ok()) {
        if real.starts_with(&p) || p.starts_with(&real) {
            return refuse(format!("{local} holds the server's own state or configuration"));
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
    Bytes { name: String, data: Vec<u8> },
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
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            );
            header.set_uid(SANDBOX_UID.into());
            header.set_gid(SANDBOX_UID.into());
            let mut tar = tar::Builder::new(Vec::new());
            let io = |e: std::io::Error| SandboxError::Internal(format!("packing an upload: {e}"));
            tar.append_data(&mut header, &name, data.as_slice()).map_err(io)?;
            Ok((tar.into_inner().map_err(io)?, name))
        }
    }
}

/// Packs a host file or folder, symlinks kept as links.
fn pack_host(source: &Path) -> Result<(Vec<u8>, String)> {
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| SandboxError::UploadRefused("the path has no file name".into()))?;
    let io = |e: std::io::Error| SandboxError::UploadRefused(format!("reading {}: {e}", source.display()));
    let mut total = 0u64;
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    let mut stack = vec![(source.to_path_buf(), PathBuf::from(&name))];
    while let Some((path, inner)) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(io)?;
        let mut header = tar::Header::new_gnu();
        header.set_metadata(&meta);
        header.set_uid(SANDBOX_UID.into());
        header.set_gid(SANDBOX_UID.into());
        if meta.is_dir() {
            tar.append_data(&mut header, &inner, std::io::empty()).map_err(io)?;
            for entry in std::fs::read_dir(&path).map_err(io)? {
                let entry = entry.map_err(io)?;
                stack.push((entry.path(), inner.join(entry.file_name())));
            }
        } else if meta.is_file() {
            total += meta.len();
            if total > MAX_UPLOAD_BYTES {
                return Err(SandboxError::UploadRefused(format!(
                    "larger than {MAX_UPLOAD_BYTES} bytes"
                )));
            }
            let file = std::fs::File::open(&path).map_err(io)?;
            tar.append_data(&mut header, &inner, file).map_err(io)?;
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(io)?;
            tar.append_link(&mut header, &inner, target).map_err(io)?;
        }
    }
    Ok((tar.into_inner().map_err(io)?, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PackagesConfig, SandboxConfig, UploadsConfig};

    fn settings(allowed: &Path, state: &Path) -> Settings {
        Settings {
            sandbox: SandboxConfig::default(),
            packages: PackagesConfig::default(),
            uploads: UploadsConfig {
                allowed_dirs: vec![allowed.to_path_buf()],
                ..Default::default()
            },
            pool: Default::default(),
            state_dir: state.to_path_buf(),
            results_dir: state.join("results"),
            protected: vec![],
            min_free_disk_mb: 0,
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
            data: b"hello".to_vec(),
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
