//! The messages between actors: what the front end, the supervisor and the
//! install task send a sandbox actor.

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::agent_connection::{AgentConnection, Ran};
use crate::error::{Result, SandboxError};
use crate::history::CallRecord;
use crate::processes::{ProcessAnswer, ProcessOp};
use crate::records::Hibernated;
use crate::records::InstallRecord;
use crate::results::{InstallStatus, SandboxInfo, Slept, Uploaded};
use crate::snapshots::{SnapshotDone, SnapshotOp, SnapshotTotals};
use crate::uploads::UploadSource;
use sandbox_runtime::agent::{Package, Progress, Work};

/// A run of Python code or of a shell command.
pub struct RunRequest {
    pub work: Work,
    pub timeout: Duration,
    pub progress: Option<mpsc::Sender<Progress>>,
    /// Cancelled when the caller gives up: a queued run is skipped, a
    /// running one interrupted.
    pub cancel: CancellationToken,
    pub reply: RpcReplyPort<Result<Ran>>,
}

pub enum SandboxMsg {
    Run(RunRequest),
    /// Queues an install (or joins the one in progress) and answers at once
    /// with a receiver that sees its status change.
    Install {
        package: String,
        specs: Vec<String>,
        reply: RpcReplyPort<Result<watch::Receiver<InstallRecord>>>,
    },
    InstallStatus {
        package: String,
        reply: RpcReplyPort<Result<InstallStatus>>,
    },
    /// A call that waits its turn with the sandbox's runs.
    Queued(Queued),
    /// `by_owner`: the owner's call, refused while a fork still copies
    /// into the sandbox; the fork's own undo of a new sandbox is not.
    Delete {
        reply: RpcReplyPort<Result<()>>,
        by_owner: bool,
    },
    Info(RpcReplyPort<SandboxInfo>),
    /// Exposes a port through preview links (or ends its links), answered
    /// with the ports exposed now; not queued (it changes no container).
    Expose {
        port: u16,
        expose: bool,
        reply: RpcReplyPort<Result<Vec<u16>>>,
    },
    /// A preview connection is about to be made to `port`: refused unless
    /// it is exposed; the sandbox is woken if it was paused, and counts as
    /// used.
    Preview {
        port: u16,
        reply: RpcReplyPort<Result<()>>,
    },
    History(RpcReplyPort<Vec<CallRecord>>),
    /// Puts the sandbox to sleep on disk in turn with its calls (answered
    /// with what of its Python state was written).
    Hibernate(RpcReplyPort<Result<Slept>>),
    /// Answered once the sandbox is awake: at once, or after a wake queued
    /// for it (the file tools, which read its disk from the host).
    Awake(RpcReplyPort<Result<()>>),
    /// Periodic: deletes the sandbox if its lifetime is over, pauses it if
    /// it has been idle long enough, and notices a container that died.
    Tick,
    /// From the supervisor: stop, answering with what the next actor needs,
    /// if the sandbox sleeps and nothing waits for it (see
    /// `sandbox::rest`); answered `None` otherwise.
    Rest(RpcReplyPort<Option<Box<crate::sandbox::Rested>>>),
    /// A job ended and hands the link back.
    Done(Box<Finished>),
    /// A job's task panicked: its link is gone and must be rebuilt.
    JobPanicked(String),
    /// The sandbox missed a deadline outside a job (a query over a second
    /// connection): restart its container in turn with its calls.
    Unhealthy,
    /// The removal of a deleted or expired sandbox ended.
    Removed(Result<(), Arc<SandboxError>>),
    /// A message sent within a call's span: the job it queues is traced as
    /// that call's child (its wait in the queue, then its work).
    Traced(tracing::Span, Box<SandboxMsg>),
}

impl SandboxMsg {
    /// `self` within the current call's span, when there is one.
    pub(crate) fn traced(self) -> SandboxMsg {
        match sandbox_runtime::spans::current_call() {
            Some(span) => SandboxMsg::Traced(span, Box::new(self)),
            None => self,
        }
    }
}

/// The calls other than runs and installs that wait their turn in a
/// sandbox's queue, each with whom to answer: the actor queues them as they
/// come (a job of its own, [`crate::sandbox`]).
pub enum Queued {
    Upload {
        source: UploadSource,
        dest: String,
        reply: RpcReplyPort<Result<Uploaded>>,
    },
    /// Restarts the container (Python state is lost, files and packages stay).
    Restart { reply: RpcReplyPort<Result<()>> },
    /// Gives Python a fresh namespace (files, packages and the container
    /// stay); answers with a notice, if any.
    ResetPython {
        reply: RpcReplyPort<Result<Option<String>>>,
    },
    /// Saves, restores or drops a snapshot, or exports or seeds a fork;
    /// answers with a notice, if any.
    Snapshot {
        op: SnapshotOp,
        reply: RpcReplyPort<Result<(SnapshotDone, Option<String>)>>,
    },
    /// A call on the sandbox's background processes; answers with a
    /// notice, if any.
    Process {
        op: ProcessOp,
        reply: RpcReplyPort<Result<(ProcessAnswer, Option<String>)>>,
    },
}

impl Queued {
    /// Answers the caller of a call that will not run.
    pub(crate) fn refuse(self, error: SandboxError) {
        match self {
            Queued::Upload { reply, .. } => drop(reply.send(Err(error))),
            Queued::Restart { reply } => drop(reply.send(Err(error))),
            Queued::ResetPython { reply } => drop(reply.send(Err(error))),
            Queued::Snapshot { reply, .. } => drop(reply.send(Err(error))),
            Queued::Process { reply, .. } => drop(reply.send(Err(error))),
        }
    }
}

pub struct Finished {
    pub(crate) link: AgentConnection,
    pub(crate) install: Option<(InstallRecord, Option<Vec<Package>>)>,
    /// The call, for the sandbox's history.
    pub(crate) call: Option<CallRecord>,
    /// Told with the next result (the container had to be brought back).
    pub(crate) notice: Option<String>,
    /// The container is still dead (it could not be brought back yet).
    pub(crate) still_stopped: bool,
    /// The venv's packages, listed again after the job changed them (a
    /// snapshot restored).
    pub(crate) packages: Option<Vec<Package>>,
    /// The sandbox's snapshots, counted again after a snapshot job.
    pub(crate) snapshots: Option<SnapshotTotals>,
    /// A fork's seeding ended well: its record loses its mark.
    pub(crate) seeded: bool,
    /// Whether background processes may run now, where the job tells.
    pub(crate) processes_may_run: Option<bool>,
    /// The sandbox went to sleep (`Some(Some(_))`) or woke (`Some(None)`).
    pub(crate) hibernated: Option<Option<Hibernated>>,
    /// A wake failed: the calls waiting for it are answered with this.
    pub(crate) wake_failed: Option<String>,
}

impl Finished {
    pub fn install(link: AgentConnection, record: InstallRecord, packages: Option<Vec<Package>>) -> Self {
        Self {
            install: Some((record, packages)),
            ..Self::job(link, None)
        }
    }

    pub(crate) fn job(link: AgentConnection, call: Option<CallRecord>) -> Self {
        Self {
            link,
            install: None,
            call,
            notice: None,
            still_stopped: false,
            packages: None,
            snapshots: None,
            seeded: false,
            processes_may_run: None,
            hibernated: None,
            wake_failed: None,
        }
    }
}
