//! The file tools and uploads: reads of a sandbox's `/app/results` from the
//! host (bounded, off the async threads: [`crate::files`]), and writes and
//! uploads queued to its actor in turn with its other calls.

use std::fs::File;
use std::path::{Path, PathBuf};

use uuid::Uuid;

use crate::error::{Result, SandboxError};
use crate::files::{self, FileError, FileRead, ListOptions, Listing, ResultsPath, Window, MAX_WRITE_BYTES};
use crate::messages::{Queued, SandboxMsg};
use crate::results::Uploaded;
use crate::scope::Scope;
use crate::uploads::{self, UploadSource};

use super::Sandboxes;

impl Sandboxes {
    /// The host folder holding a sandbox's `/app/results` (a signed link
    /// proves access with [`Scope::Everyone`]), for whoever opens files in
    /// it through [`files`] (the inline images). A sleeping sandbox's disk
    /// is mounted only awake: it is woken first, in turn with its calls.
    pub async fn results_dir<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid) -> Result<PathBuf> {
        self.ask(scope.into(), id, None, SandboxMsg::Awake).await??;
        Ok(self.ctx.paths(id).results)
    }

    /// Runs `op` on the host folder holding a sandbox's `/app/results`, off
    /// the async threads and within a deadline ([`files::bounded`]).
    async fn on_results<T: Send + 'static>(
        &self,
        scope: Scope<'_>,
        id: Uuid,
        what: &str,
        op: impl FnOnce(&Path) -> std::result::Result<T, FileError> + Send + 'static,
    ) -> Result<T> {
        Ok(files::bounded(self.results_dir(scope, id).await?, what, op).await?)
    }

    /// Opens a regular file under `/app/results` for serving.
    pub async fn open_file<'a>(&self, scope: impl Into<Scope<'a>>, id: Uuid, path: ResultsPath) -> Result<(File, u64)> {
        self.on_results(scope.into(), id, "opening the file", move |root| {
            files::open_file(root, &path)
        })
        .await
    }

    /// Lists a folder under `/app/results`.
    pub async fn list_files<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        path: ResultsPath,
        options: ListOptions,
    ) -> Result<Listing> {
        self.on_results(scope.into(), id, "listing the folder", move |root| {
            files::list(root, &path, options)
        })
        .await
    }

    /// Reads a window of a text file under `/app/results`, or says what
    /// kind of file it is.
    pub async fn read_file<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        path: ResultsPath,
        window: Window,
    ) -> Result<FileRead> {
        self.on_results(scope.into(), id, "reading the file", move |root| {
            files::read(root, &path, window)
        })
        .await
    }

    /// Writes `data` as the file `path` under `/app/results` (its folders
    /// are made), in turn with the sandbox's other calls: it is queued as an
    /// upload before this first awaits, so code sent afterwards sees it.
    pub async fn write_file<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        path: ResultsPath,
        data: Vec<u8>,
    ) -> Result<Uploaded> {
        let scope = scope.into();
        self.reach.check(scope, id)?;
        let name = path.name().ok_or_else(|| FileError::IsFolder(path.absolute()))?;
        let name = uploads::check_file_name(name).map_err(|_| {
            SandboxError::InvalidArgument(format!(
                "{name:?} is not a file name: at most 255 bytes, no control characters"
            ))
        })?;
        if data.len() > MAX_WRITE_BYTES {
            return Err(FileError::TooLarge {
                what: "the content".into(),
                size: data.len(),
                max: MAX_WRITE_BYTES,
            }
            .into());
        }
        let dest = path.parent().absolute();
        let data = data.into();
        self.send_upload(scope, id, UploadSource::Bytes { name, data }, &dest)
            .await
    }

    /// Copies a host file or folder (from an allowed folder) into the sandbox.
    pub async fn upload<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        local_path: &str,
        dest: &str,
    ) -> Result<Uploaded> {
        let scope = scope.into();
        self.reach.check(scope, id)?;
        let source = UploadSource::Host(uploads::resolve_source(&self.ctx.settings, local_path)?);
        self.send_upload(scope, id, source, dest).await
    }

    /// Writes bytes sent by the caller as the file `name` in the sandbox.
    pub async fn upload_bytes<'a>(
        &self,
        scope: impl Into<Scope<'a>>,
        id: Uuid,
        name: &str,
        data: bytes::Bytes,
        dest: &str,
    ) -> Result<Uploaded> {
        let scope = scope.into();
        self.reach.check(scope, id)?;
        let source = UploadSource::Bytes {
            name: uploads::check_file_name(name)?,
            data,
        };
        self.send_upload(scope, id, source, dest).await
    }

    async fn send_upload(&self, scope: Scope<'_>, id: Uuid, source: UploadSource, dest: &str) -> Result<Uploaded> {
        let dest = uploads::resolve_dest(dest)?;
        self.ask(scope, id, None, |reply| {
            SandboxMsg::Queued(Queued::Upload { source, dest, reply })
        })
        .await?
    }
}
