//! Host side of the channel to the in-container agent (`docker/agent.py`):
//! JSON lines over a unix socket that the agent creates in a folder the
//! server bind-mounts into the sandbox.
//!
//! Everything read from that socket is untrusted: the sandbox's user can stop
//! the agent and put anything in its place. So the socket is opened without
//! following symlinks (a symlink to a host socket would otherwise connect the
//! server to it), lines are bounded, and replies are parsed into fixed types.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Mutex};

use crate::outputs::{Output, RunError};

/// Folder of the agent's socket inside the container.
pub const AGENT_DIR_IN_CONTAINER: &str = "/run/mcp-agent";
pub const SOCKET_NAME: &str = "agent.sock";
/// Results folder inside the container; reported files must lie below it.
pub const RESULTS_IN_CONTAINER: &str = "/app/results";
const MAX_FILES: usize = 1000;
/// Longest path the agent may report (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// Packages kept from one listing, and the longest name or version: the
/// listing is kept in the sandbox's record and rewritten with it, so a
/// replaced agent must not make it megabytes (at most about 256 KiB here).
const MAX_PACKAGES: usize = 2_000;
const MAX_PACKAGE_TEXT: usize = 64;
/// Longest text of the agent's that the server keeps or passes on as a
/// message (an error, a protocol complaint quoting a reply): the agent may be
/// the sandbox's own program, and such texts end up in every history entry
/// and result.
pub const MAX_AGENT_TEXT: usize = 1024;

/// The most text a well-behaved agent sends for one output under `cap`: it
/// keeps at least 1 KiB, every byte it cannot decode becomes U+FFFD (three
/// bytes), and a cut output carries a line saying what was omitted.
fn output_bound(cap: usize) -> usize {
    3 * cap.max(1024) + 256
}

/// `text` cut to at most `max` bytes, on a character boundary, marked when cut.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" …");
    }
    text
}

/// How the agent begins the errors of a request it refused for the caller.
const REFUSED: &str = "process: ";

#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request<'a> {
    Exec {
        id: u64,
        code: &'a str,
        timeout: f64,
        output_cap: usize,
        progress: bool,
    },
    Run {
        id: u64,
        argv: &'a [String],
        timeout: f64,
        output_cap: usize,
        progress: bool,
    },
    Packages {
        id: u64,
    },
    Reset {
        id: u64,
    },
    Snapshot {
        id: u64,
        slot: &'a str,
    },
    Restore {
        id: u64,
        slot: &'a str,
        python: bool,
    },
    Forget {
        id: u64,
        slot: &'a str,
    },
    Dump {
        id: u64,
        slot: &'a str,
        from: Option<&'a str>,
        timeout: f64,
    },
    Load {
        id: u64,
        slot: &'a str,
        timeout: f64,
    },
    Ping {
        id: u64,
    },
    Interrupt {
        id: u64,
    },
}

/// What to run: Python code in the persistent worker, or a program.
#[derive(Debug, Clone)]
pub enum Work {
    Python(String),
    Program(Vec<String>),
}

/// The part of every reply that says which request it answers; read first,
/// so that a stale reply of another request is skipped whatever its shape.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<u64>,
}

/// A reply to one request, tagged by `type`. `T` is the body of a `result`,
/// which differs by operation: [`RunOutput`] for `exec` and `run`,
/// [`PackageList`] for `packages`, [`Pong`] and [`ResetDone`] for the bare
/// acknowledgements. A reply of another shape fails to parse.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Reply<T> {
    Progress(Progress),
    Result(T),
    Error(ErrorBody),
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: String,
}

#[derive(Debug, Deserialize)]
struct PackageList {
    packages: Vec<Package>,
}

/// The answer to `ping`. Its field is required, so that the result of
/// another operation is refused (as for [`ResetDone`]).
#[derive(Debug, Deserialize)]
struct Pong {
    #[serde(rename = "pong")]
    _pong: True,
}

/// The answer to `reset`.
#[derive(Debug, Deserialize)]
struct ResetDone {
    #[serde(rename = "reset")]
    _reset: True,
}

/// The answer to `snapshot` and `restore`: what became of the Python state.
#[derive(Debug, Deserialize)]
struct PythonAnswer {
    python: PythonState,
}

/// The Python state a snapshot holds, or what a restore brought back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PythonState {
    /// A parked copy of the worker holds (or gave back) the namespace.
    Parked,
    /// The namespace is a file in the snapshot's store: its parked copy
    /// was written out when the sandbox went to sleep (the copy ended with
    /// the container). A restore loads it into a fresh worker.
    Saved,
    /// The namespace was back as it was.
    Restored,
    /// No worker ran: the state is a fresh namespace.
    Fresh,
    /// The parked copy was gone (the container restarted, or the sandbox's
    /// code ended it): the worker starts fresh.
    Lost,
}

/// How much of a Python namespace a fork carried: the answer to `dump` and
/// `load`, as the agent gives it (bounded before anyone sees it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Carried {
    pub python: CarriedState,
    /// The names carried.
    pub names: u64,
    /// The names that were not, each with why (`[name, reason]`).
    #[serde(default)]
    pub skipped: Vec<(String, String)>,
}

/// What became of a namespace carried into a fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CarriedState {
    /// Every name.
    Carried,
    /// No Python had run: the fork starts with a fresh namespace too.
    Fresh,
    /// Some names (listed) were not carried.
    Partial,
    /// None: the snapshot's parked copy was gone, or nothing loaded.
    Lost,
}

impl Carried {
    /// At most this many names are listed as not carried, each name and
    /// reason at most [`MAX_SKIPPED_TEXT`] bytes: the agent says what it likes.
    pub const MAX_SKIPPED: usize = 100;

    /// No Python had run: nothing to carry, a fresh namespace.
    pub fn fresh() -> Self {
        Self {
            python: CarriedState::Fresh,
            names: 0,
            skipped: vec![],
        }
    }

    /// Everything carried, the names not counted: a namespace written
    /// before (whose file the reader counts).
    pub fn whole() -> Self {
        Self {
            python: CarriedState::Carried,
            names: 0,
            skipped: vec![],
        }
    }

    /// Nothing carried, and why (as the whole namespace, `*`).
    pub fn lost(why: String) -> Self {
        Self {
            python: CarriedState::Lost,
            names: 0,
            skipped: vec![("*".into(), why)],
        }
    }

    fn bounded(mut self) -> Self {
        self.skipped.truncate(Self::MAX_SKIPPED);
        for (name, reason) in &mut self.skipped {
            *name = bounded(std::mem::take(name), MAX_SKIPPED_TEXT);
            *reason = bounded(std::mem::take(reason), MAX_SKIPPED_TEXT);
        }
        self
    }
}

/// The longest name or reason a [`Carried`] lists.
const MAX_SKIPPED_TEXT: usize = 200;

/// The answer to `forget`.
#[derive(Debug, Deserialize)]
struct Forgotten {
    #[serde(rename = "forgotten")]
    _forgotten: True,
}

/// The JSON value `true`, and nothing else.
#[derive(Debug)]
struct True;

impl<'de> Deserialize<'de> for True {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match bool::deserialize(d)? {
            true => Ok(True),
            false => Err(serde::de::Error::custom("expected true")),
        }
    }
}

/// Output of one run, as the agent reports it.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct RunOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub cancelled: bool,
    /// The Python worker was replaced: variables and imports are gone.
    #[serde(default)]
    pub state_lost: bool,
    #[serde(default)]
    pub truncated: bool,
    /// Full outputs kept under the results folder when truncated.
    #[serde(default)]
    pub output_files: Vec<String>,
    #[serde(default)]
    pub duration_ms: f64,
    /// Files under `/app/results` created or changed by the run.
    #[serde(default)]
    pub files: Vec<String>,
    /// What a Python run showed besides its printed text, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<Output>,
    /// A Python run's uncaught exception.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

impl RunOutput {
    /// Drops or cuts what a well-behaved agent never sends: output past the
    /// cap it was asked for, paths outside the results folder, with `..`
    /// components or longer than a path can be, and more files than the
    /// agent reports.
    fn sanitise(mut self, output_cap: usize) -> Self {
        let bound = output_bound(output_cap);
        for out in [&mut self.stdout, &mut self.stderr] {
            if out.len() > bound {
                *out = bounded(std::mem::take(out), bound);
                self.truncated = true;
            }
        }
        let inside = |p: &String| {
            p.len() <= MAX_PATH_BYTES
                && p.starts_with(&format!("{RESULTS_IN_CONTAINER}/"))
                && !p.split('/').any(|c| c == ".." || c == ".")
        };
        self.files.retain(inside);
        self.files.truncate(MAX_FILES);
        self.output_files.retain(inside);
        self.output_files.truncate(2);
        self.outputs = Output::sanitise_all(std::mem::take(&mut self.outputs), bound);
        self.error = self.error.map(RunError::sanitised);
        self
    }
}

/// A distribution installed in the sandbox's virtual environment.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// Output seen so far by a running request, forwarded as it arrives.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Progress {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nothing reached the agent: the request can be sent again safely.
    #[error("could not reach the agent: {0}")]
    Send(std::io::Error),
    /// The request was sent but no answer came: it may have run.
    #[error("the agent stopped answering: {0}")]
    Receive(#[source] std::io::Error),
    /// The agent answered with something that is not the protocol.
    #[error("the agent broke the protocol: {0}")]
    Protocol(String),
    /// The agent still runs the request of an earlier connection.
    #[error("the agent is busy")]
    Busy,
    /// The agent does not know the operation: it is older than the server
    /// (a sandbox made from an earlier image and adopted since).
    #[error("the agent does not know this operation ({0})")]
    Unsupported(String),
    /// The agent refused the request for a reason the caller can act on
    /// (no such process, a port nothing listens on).
    #[error("{0}")]
    Refused(String),
}

/// A connected socket to an agent: a socket, since [`AgentClient::is_closed`]
/// peeks at its descriptor (a stream that buffers on its own would hide
/// what it holds).
pub trait AgentStream: AsyncRead + AsyncWrite + AsRawFd + Send + Sync + Unpin + 'static {}

impl<S: AsyncRead + AsyncWrite + AsRawFd + Send + Sync + Unpin + 'static> AgentStream for S {}

/// One connection to an agent. A request is sent and its answer read by the
/// same owner; [`Interrupter`] lets another task cancel the request in flight.
pub struct AgentClient {
    reader: BufReader<ReadHalf<Box<dyn AgentStream>>>,
    writer: Arc<Mutex<WriteHalf<Box<dyn AgentStream>>>>,
    /// The socket's descriptor, kept open by the halves, for [`Self::is_closed`].
    fd: RawFd,
    next_id: u64,
    max_line: usize,
}

/// Cancels the request in flight on an [`AgentClient`].
#[derive(Clone)]
pub struct Interrupter {
    writer: Arc<Mutex<WriteHalf<Box<dyn AgentStream>>>>,
}

impl Interrupter {
    pub async fn interrupt(&self) {
        let line = serde_json::to_vec(&Request::Interrupt { id: 0 }).expect("serialisable");
        let mut w = self.writer.lock().await;
        let _ = w.write_all(&[line.as_slice(), b"\n"].concat()).await;
    }
}

impl AgentClient {
    /// Connects to the socket at `path` without following a symlink in its
    /// last component (the folder itself is the server's own mount point).
    pub async fn connect(path: &Path, output_cap: usize) -> std::io::Result<Self> {
        let fd = open_socket_nofollow(path)?;
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let stream = UnixStream::connect(&proc_path).await?;
        drop(fd);
        Ok(Self::from_stream(stream, output_cap))
    }

    /// Wraps a connected stream: the Docker runtime's unix socket, a socket
    /// pair (the test runtime's agent), or any other socket a runtime reaches
    /// its agents over.
    pub fn from_stream(stream: impl AgentStream, output_cap: usize) -> Self {
        let fd = stream.as_raw_fd();
        let (r, w) = tokio::io::split(Box::new(stream) as Box<dyn AgentStream>);
        Self {
            reader: BufReader::new(r),
            writer: Arc::new(Mutex::new(w)),
            fd,
            next_id: 1,
            // stdout, stderr and the outputs' texts of at most `output_cap`
            // bytes each, which JSON escaping can inflate up to six times,
            // plus paths and slack.
            max_line: 18 * output_cap + 1024 * 1024,
        }
    }

    /// Whether the agent closed the connection. Peeks without consuming,
    /// so a line still in flight stays whole.
    pub fn is_closed(&self) -> bool {
        if !self.reader.buffer().is_empty() {
            return false;
        }
        let fd = self.fd;
        let mut byte = [0u8; 1];
        // SAFETY: `fd` is this client's open socket; the buffer is one byte.
        let n = unsafe { libc::recv(fd, byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => !matches!(std::io::Error::last_os_error().kind(), std::io::ErrorKind::WouldBlock),
        }
    }

    pub fn interrupter(&self) -> Interrupter {
        Interrupter {
            writer: self.writer.clone(),
        }
    }

    /// Runs `work` and returns its output; progress lines go to `progress`.
    pub async fn run(
        &mut self,
        work: &Work,
        timeout_secs: f64,
        output_cap: usize,
        progress: Option<&mpsc::Sender<Progress>>,
    ) -> Result<RunOutput, AgentError> {
        let id = self.take_id();
        let want_progress = progress.is_some();
        let req = match work {
            Work::Python(code) => Request::Exec {
                id,
                code,
                timeout: timeout_secs,
                output_cap,
                progress: want_progress,
            },
            Work::Program(argv) => Request::Run {
                id,
                argv,
                timeout: timeout_secs,
                output_cap,
                progress: want_progress,
            },
        };
        self.send(&req).await?;
        loop {
            match self.receive::<RunOutput>(id).await? {
                Reply::Progress(p) => {
                    if let Some(tx) = progress {
                        let _ = tx.try_send(Progress {
                            stdout: bounded(p.stdout, output_bound(output_cap)),
                            stderr: bounded(p.stderr, output_bound(output_cap)),
                        });
                    }
                }
                Reply::Result(out) => return Ok(out.sanitise(output_cap)),
                Reply::Error(e) => return Err(e.into()),
            }
        }
    }

    /// Lists the distributions installed in the sandbox's virtual environment.
    pub async fn packages(&mut self) -> Result<Vec<Package>, AgentError> {
        let id = self.take_id();
        self.send(&Request::Packages { id }).await?;
        let mut packages = self.answer::<PackageList>(id).await?.packages;
        // Names as PEP 508 spells them, versions in printable ASCII.
        let name_ok = |n: &str| n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        packages.retain(|p| {
            p.name.len() <= MAX_PACKAGE_TEXT
                && p.version.len() <= MAX_PACKAGE_TEXT
                && name_ok(&p.name)
                && p.version.bytes().all(|b| b.is_ascii_graphic())
        });
        packages.truncate(MAX_PACKAGES);
        Ok(packages)
    }

    /// Replaces the Python worker: a fresh namespace, files and packages kept.
    pub async fn reset(&mut self) -> Result<(), AgentError> {
        let id = self.take_id();
        self.send(&Request::Reset { id }).await?;
        self.answer::<ResetDone>(id).await.map(drop)
    }

    /// Parks a copy of the Python worker under `slot` (32 hex digits).
    pub async fn snapshot(&mut self, slot: &str) -> Result<PythonState, AgentError> {
        let id = self.take_id();
        self.send(&Request::Snapshot { id, slot }).await?;
        Ok(self.answer::<PythonAnswer>(id).await?.python)
    }

    /// Replaces the worker with one from the copy parked under `slot`, or
    /// with a fresh one when `python` is false.
    pub async fn restore(&mut self, slot: &str, python: bool) -> Result<PythonState, AgentError> {
        let id = self.take_id();
        self.send(&Request::Restore { id, slot, python }).await?;
        Ok(self.answer::<PythonAnswer>(id).await?.python)
    }

    /// Ends the copy parked under `slot`.
    pub async fn forget(&mut self, slot: &str) -> Result<(), AgentError> {
        let id = self.take_id();
        self.send(&Request::Forget { id, slot }).await?;
        self.answer::<Forgotten>(id).await.map(drop)
    }

    /// Writes the Python namespace (that of the copy parked under `from`,
    /// when given) to the fork file of `slot`, within `timeout`.
    pub async fn dump(&mut self, slot: &str, from: Option<&str>, timeout: Duration) -> Result<Carried, AgentError> {
        let id = self.take_id();
        let timeout = timeout.as_secs_f64();
        self.send(&Request::Dump {
            id,
            slot,
            from,
            timeout,
        })
        .await?;
        Ok(self.answer::<Carried>(id).await?.bounded())
    }

    /// Reads the fork file of `slot` into the Python namespace, within `timeout`.
    pub async fn load(&mut self, slot: &str, timeout: Duration) -> Result<Carried, AgentError> {
        let id = self.take_id();
        let timeout = timeout.as_secs_f64();
        self.send(&Request::Load { id, slot, timeout }).await?;
        Ok(self.answer::<Carried>(id).await?.bounded())
    }

    /// Asks the agent whether it is there (callers bound the wait).
    pub async fn ping(&mut self) -> Result<(), AgentError> {
        let id = self.take_id();
        self.send(&Request::Ping { id }).await?;
        self.answer::<Pong>(id).await.map(drop)
    }

    /// The `result` of a request answered at once (no progress).
    pub(crate) async fn answer<T: serde::de::DeserializeOwned>(&mut self, id: u64) -> Result<T, AgentError> {
        match self.receive::<T>(id).await? {
            Reply::Result(body) => Ok(body),
            Reply::Error(e) => Err(e.into()),
            Reply::Progress(_) => Err(AgentError::Protocol("progress for a request that has none".into())),
        }
    }

    pub(crate) fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) async fn send(&mut self, req: &impl Serialize) -> Result<(), AgentError> {
        let mut line = serde_json::to_vec(req).map_err(|e| AgentError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let mut w = self.writer.lock().await;
        w.write_all(&line).await.map_err(AgentError::Send)
    }

    /// Reads replies until the one for `id` (stale ones of a cancelled
    /// request are skipped), never buffering more than `max_line` bytes, and
    /// parses it as a reply whose `result` is a `T`.
    async fn receive<T: serde::de::DeserializeOwned>(&mut self, id: u64) -> Result<Reply<T>, AgentError> {
        // serde's messages quote what they refused: the agent's text.
        let protocol = |e: serde_json::Error| AgentError::Protocol(bounded(e.to_string(), MAX_AGENT_TEXT));
        loop {
            let line = self.read_line().await?;
            let envelope: Envelope = serde_json::from_slice(&line).map_err(protocol)?;
            if envelope.id == Some(id) || envelope.id.is_none() {
                return serde_json::from_slice(&line).map_err(protocol);
            }
        }
    }

    async fn read_line(&mut self) -> Result<Vec<u8>, AgentError> {
        let mut line = Vec::new();
        loop {
            let buf = self.reader.fill_buf().await.map_err(AgentError::Receive)?;
            if buf.is_empty() {
                return Err(AgentError::Receive(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed",
                )));
            }
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            if line.len() + chunk.len() > self.max_line {
                return Err(AgentError::Protocol(format!(
                    "a reply longer than {} bytes",
                    self.max_line
                )));
            }
            line.extend_from_slice(chunk);
            let used = done.unwrap_or(buf.len());
            self.reader.consume(used);
            if done.is_some() {
                return Ok(line);
            }
        }
    }
}

impl From<ErrorBody> for AgentError {
    fn from(body: ErrorBody) -> Self {
        let text = bounded(body.error, MAX_AGENT_TEXT);
        match text.as_str() {
            "busy" => AgentError::Busy,
            e if e.starts_with("unknown op") => AgentError::Unsupported(text),
            e if e.starts_with(REFUSED) => AgentError::Refused(e[REFUSED.len()..].to_string()),
            e if e.starts_with("port ") => AgentError::Refused(text),
            _ => AgentError::Protocol(text),
        }
    }
}

/// Opens `path` as `O_PATH | O_NOFOLLOW` and checks that it is a socket.
pub(crate) fn open_socket_nofollow(path: &Path) -> std::io::Result<OwnedFd> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: a valid NUL-terminated path; the returned fd is owned below.
    let raw = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the agent path is not a socket",
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn symlinked_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.sock");
        let _listener = tokio::net::UnixListener::bind(&real).unwrap();
        let link = dir.path().join(SOCKET_NAME);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(AgentClient::connect(&link, 1024).await.is_err());
        assert!(AgentClient::connect(&real, 1024).await.is_ok());
    }

    #[tokio::test]
    async fn overlong_reply_is_a_protocol_error() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut client = AgentClient::from_stream(a, 1024);
        let max = client.max_line;
        tokio::spawn(async move {
            let junk = vec![b'x'; max + 10];
            let _ = b.write_all(&junk).await;
            let _ = b.write_all(b"\n").await;
        });
        let err = client
            .run(&Work::Python("print(1)".into()), 1.0, 1024, None)
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::Protocol(_)), "{err}");
    }

    #[tokio::test]
    async fn a_closed_connection_is_seen_without_reading_it() {
        let (a, b) = UnixStream::pair().unwrap();
        let client = AgentClient::from_stream(a, 1024);
        assert!(!client.is_closed());
        drop(b);
        assert!(client.is_closed());
    }

    #[tokio::test]
    async fn an_agent_without_an_operation_says_so() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut client = AgentClient::from_stream(a, 1024);
        tokio::spawn(async move {
            // What an older agent answers to an operation it does not know.
            let (r, mut w) = b.into_split();
            let mut lines = BufReader::new(r).lines();
            let line = lines.next_line().await.unwrap().unwrap();
            let req: serde_json::Value = serde_json::from_str(&line).unwrap();
            let reply =
                serde_json::json!({"id": req["id"], "type": "error", "error": format!("unknown op {:?}", req["op"])});
            w.write_all(format!("{reply}\n").as_bytes()).await.unwrap();
        });
        let err = client.reset().await.unwrap_err();
        assert!(matches!(err, AgentError::Unsupported(_)), "{err}");
    }

    /// A fake agent that answers the n-th request with the n-th list of
    /// replies; a reply without an `id` gets the request's.
    fn fake_agent(script: Vec<Vec<serde_json::Value>>) -> AgentClient {
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let (r, mut w) = b.into_split();
            let mut lines = BufReader::new(r).lines();
            for replies in script {
                let Ok(Some(line)) = lines.next_line().await else {
                    return;
                };
                let req: serde_json::Value = serde_json::from_str(&line).unwrap();
                for mut reply in replies {
                    if let Some(fields) = reply.as_object_mut() {
                        fields.entry("id").or_insert_with(|| req["id"].clone());
                    }
                    let _ = w.write_all(format!("{reply}\n").as_bytes()).await;
                }
            }
            // Hold the connection open until the client is done.
            let _ = lines.next_line().await;
        });
        AgentClient::from_stream(a, 1024)
    }

    fn run_result() -> serde_json::Value {
        serde_json::json!({"type": "result", "stdout": "out", "stderr": "", "exit_code": 0})
    }

    async fn run(client: &mut AgentClient) -> Result<RunOutput, AgentError> {
        client.run(&Work::Python("print(1)".into()), 1.0, 1024, None).await
    }

    #[tokio::test]
    async fn a_reply_of_the_wrong_shape_is_a_protocol_error() {
        use serde_json::json;
        let packages = json!({"type": "result", "packages": [{"name": "six", "version": "1"}]});
        let pong = json!({"type": "result", "pong": true});
        let reset = json!({"type": "result", "reset": true});
        let progress = json!({"type": "progress", "stdout": "x", "stderr": ""});
        let wrong_for_run = [
            packages.clone(),
            pong.clone(),
            json!({"type": "result"}),
            json!({"type": "result", "stdout": "", "stderr": "", "exit_code": "0"}),
            json!({"type": "result", "stdout": 1, "stderr": "", "exit_code": 0}),
            json!({"type": "result", "stdout": "", "stderr": "", "exit_code": 0, "files": "/app/results/a"}),
            json!({"type": "progress", "stdout": 5}),
            json!({"type": "weird", "stdout": ""}),
            json!({"type": "error"}),
            json!({"stdout": "", "stderr": "", "exit_code": 0}),
            json!([1, 2]),
        ];
        for reply in wrong_for_run {
            let err = run(&mut fake_agent(vec![vec![reply.clone()]])).await.unwrap_err();
            assert!(matches!(err, AgentError::Protocol(_)), "{reply}: {err}");
        }
        for reply in [
            run_result(),
            pong.clone(),
            progress.clone(),
            json!({"type": "result", "packages": {"six": "1"}}),
            json!({"type": "result", "packages": [{"name": "six"}]}),
        ] {
            let err = fake_agent(vec![vec![reply.clone()]]).packages().await.unwrap_err();
            assert!(matches!(err, AgentError::Protocol(_)), "{reply}: {err}");
        }
        for reply in [
            reset.clone(),
            packages.clone(),
            json!({"type": "result"}),
            json!({"type": "result", "pong": false}),
            progress.clone(),
        ] {
            let err = fake_agent(vec![vec![reply.clone()]]).ping().await.unwrap_err();
            assert!(matches!(err, AgentError::Protocol(_)), "{reply}: {err}");
        }
        for reply in [pong.clone(), run_result(), json!({"type": "result", "reset": "yes"})] {
            let err = fake_agent(vec![vec![reply.clone()]]).reset().await.unwrap_err();
            assert!(matches!(err, AgentError::Protocol(_)), "{reply}: {err}");
        }
        // The right shapes, for contrast.
        fake_agent(vec![vec![pong]]).ping().await.unwrap();
        fake_agent(vec![vec![reset]]).reset().await.unwrap();
        let list = fake_agent(vec![vec![packages]]).packages().await.unwrap();
        assert_eq!(
            list,
            vec![Package {
                name: "six".into(),
                version: "1".into()
            }]
        );
        assert_eq!(
            run(&mut fake_agent(vec![vec![run_result()]])).await.unwrap().stdout,
            "out"
        );
    }

    #[tokio::test]
    async fn stale_replies_of_other_requests_are_skipped_whatever_their_shape() {
        use serde_json::json;
        let mut client = fake_agent(vec![
            vec![
                json!({"id": 999, "type": "progress", "stdout": "old", "stderr": ""}),
                json!({"id": 998, "type": "result", "packages": []}),
                json!({"id": 997, "type": "error", "error": "busy"}),
                json!({"type": "progress", "stdout": "new", "stderr": ""}),
                run_result(),
            ],
            vec![
                json!({"id": 996, "type": "result", "stdout": "", "stderr": "", "exit_code": 1}),
                json!({"type": "result", "pong": true}),
            ],
        ]);
        let (tx, mut rx) = mpsc::channel(8);
        let out = client
            .run(&Work::Python("print(1)".into()), 1.0, 1024, Some(&tx))
            .await
            .unwrap();
        assert_eq!(out.stdout, "out");
        assert_eq!(rx.try_recv().unwrap().stdout, "new", "only this request's progress");
        assert!(rx.try_recv().is_err());
        client.ping().await.unwrap();
    }

    #[tokio::test]
    async fn errors_busy_and_results_are_mapped() {
        use serde_json::json;
        let err = run(&mut fake_agent(vec![vec![json!({"type": "error", "error": "busy"})]]))
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::Busy), "{err}");
        let err = fake_agent(vec![vec![json!({"type": "error", "error": "busy"})]])
            .reset()
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::Busy), "{err}");
        let err = fake_agent(vec![vec![json!({"type": "error", "error": "could not start: x"})]])
            .ping()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::Protocol(e) if e == "could not start: x"),
            "{err}"
        );
        // An error about a malformed request carries no id; it answers the request.
        let err = fake_agent(vec![vec![
            json!({"id": null, "type": "error", "error": "malformed request"}),
        ]])
        .packages()
        .await
        .unwrap_err();
        assert!(matches!(err, AgentError::Protocol(_)), "{err}");

        let mut many: Vec<_> = (0..MAX_PACKAGES + 5)
            .map(|i| json!({"name": format!("p{i}"), "version": "1"}))
            .collect();
        // Names no distribution can have, and versions past the bound, are left out.
        many.insert(0, json!({"name": "bad name\u{202e}", "version": "1"}));
        many.insert(0, json!({"name": "ok", "version": "v".repeat(MAX_PACKAGE_TEXT + 1)}));
        let list = fake_agent(vec![vec![json!({"type": "result", "packages": many})]])
            .packages()
            .await
            .unwrap();
        assert_eq!(list.len(), MAX_PACKAGES, "the list is bounded");
        assert_eq!(list[0].name, "p0", "{:?}", &list[..2]);

        let mut reply = run_result();
        reply["files"] = json!(["/app/results/a.png", "/etc/passwd", "/app/results/../x"]);
        reply["output_files"] = json!(["/tmp/out.txt", "/app/results/.mcp-sandbox/output/1-stdout.txt"]);
        let out = run(&mut fake_agent(vec![vec![reply]])).await.unwrap();
        assert_eq!(out.files, vec!["/app/results/a.png".to_string()]);
        assert_eq!(
            out.output_files,
            vec!["/app/results/.mcp-sandbox/output/1-stdout.txt".to_string()]
        );
    }

    #[test]
    fn reported_paths_outside_results_are_dropped() {
        let out = RunOutput {
            files: vec![
                "/app/results/a.png".into(),
                "/etc/passwd".into(),
                "/app/results/../x".into(),
                "/app/resultsx/y".into(),
            ],
            ..Default::default()
        }
        .sanitise(65536);
        assert_eq!(out.files, vec!["/app/results/a.png".to_string()]);
    }

    #[test]
    fn what_an_agent_says_is_bounded_before_the_server_keeps_it() {
        let huge = "ü".repeat(4 << 20);
        let out = RunOutput {
            stdout: huge.clone(),
            stderr: "short".into(),
            files: vec![format!("/app/results/{}", "a".repeat(MAX_PATH_BYTES))],
            ..Default::default()
        }
        .sanitise(1024);
        assert!(out.stdout.len() <= output_bound(1024) + 4 && out.stdout.ends_with(" …"));
        assert!(out.truncated, "a cut output says so");
        assert_eq!(out.stderr, "short");
        assert!(out.files.is_empty(), "a path longer than a path can be is dropped");
        let well_behaved = RunOutput {
            stdout: "\u{fffd}".repeat(1024),
            ..Default::default()
        }
        .sanitise(1024);
        assert!(!well_behaved.truncated, "an output the real agent sends is kept whole");
        for err in [
            AgentError::from(ErrorBody { error: huge.clone() }),
            AgentError::from(ErrorBody {
                error: format!("unknown op {huge}"),
            }),
        ] {
            assert!(
                err.to_string().len() <= MAX_AGENT_TEXT + 64,
                "{}",
                err.to_string().len()
            );
        }
        assert!(matches!(
            AgentError::from(ErrorBody { error: "busy".into() }),
            AgentError::Busy
        ));
    }
}
