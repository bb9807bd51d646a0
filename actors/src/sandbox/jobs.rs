//! The jobs a sandbox actor queues, and the tasks that carry them out while
//! holding the sandbox's link.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{warn, Instrument, Span};

use super::{hibernation, info, join_notices, live_status, snapshot, SandboxActor, SandboxState};
use crate::agent_connection::{AgentConnection, Ran};
use crate::error::{Result, SandboxError};
use crate::files::{self, ResultsPath};
use crate::history::{CallKind, CallRecord};
use crate::install::{InstallArgs, InstallTask};
use crate::messages::{Finished, Queued, RunRequest, SandboxMsg};
use crate::moment;
use crate::processes;
use crate::receipt::Meter;
use crate::results::{Slept, Uploaded};
use crate::snapshots::{Restored, SnapshotDone};
use crate::uploads::{self, UploadSource};
use crate::usage::reading::Subject;
use sandbox_runtime::agent::Work;

pub(super) enum Job {
    Run(RunRequest),
    Install {
        package: String,
        specs: Vec<String>,
    },
    Queued(Queued),
    /// Restarts a container that missed a deadline.
    Recover,
    /// Brings back a container that died while the sandbox was idle.
    Revive,
    /// Puts the sandbox to sleep on disk: asked for (with whom to answer),
    /// or after `sandbox.hibernate_after_seconds` idle.
    Hibernate(Option<RpcReplyPort<Result<Slept>>>),
    /// Wakes a sleeping sandbox, ahead of the call that found it asleep.
    Wake,
    /// Answers once the sandbox is awake (its disk is read from the host).
    Awake(RpcReplyPort<Result<()>>),
}

impl Job {
    /// Its name in traces.
    fn kind(&self) -> &'static str {
        match self {
            Job::Run(_) => "run",
            Job::Install { .. } => "install",
            Job::Queued(Queued::Upload { .. }) => "upload",
            Job::Queued(Queued::Restart { .. }) => "restart",
            Job::Queued(Queued::ResetPython { .. }) => "reset_python",
            Job::Queued(Queued::Snapshot { .. }) => "snapshot",
            Job::Queued(Queued::Process { op, .. }) => op.verb(),
            Job::Recover => "recover",
            Job::Revive => "revive",
            Job::Hibernate(_) => "hibernate",
            Job::Wake => "wake",
            Job::Awake(_) => "awake",
        }
    }

    /// Whether it needs the sandbox awake: every caller's job but a
    /// hibernation, none of the actor's own.
    pub(super) fn needs_waking(&self) -> bool {
        matches!(self, Job::Run(_) | Job::Install { .. } | Job::Queued(_) | Job::Awake(_))
    }

    /// Answers the caller of a job that will not run.
    pub(super) fn refuse(self, error: SandboxError) {
        match self {
            Job::Run(req) => {
                let _ = req.reply.send(Err(error));
            }
            Job::Queued(call) => call.refuse(error),
            Job::Hibernate(Some(reply)) => drop(reply.send(Err(error))),
            Job::Awake(reply) => drop(reply.send(Err(error))),
            Job::Install { .. } | Job::Recover | Job::Revive | Job::Hibernate(None) | Job::Wake => {}
        }
    }
}

/// A queued job with the span of the call that asked for it, and the span
/// that times its wait (both none for the actor's own jobs).
pub(super) struct QueuedJob {
    pub(super) job: Job,
    caller: Span,
    queued: Span,
}

impl QueuedJob {
    pub(super) fn new(job: Job, caller: &Span) -> Self {
        let queued = match caller.is_none() {
            true => Span::none(),
            false => tracing::info_span!(parent: caller, "queued", job = job.kind()),
        };
        Self {
            job,
            caller: caller.clone(),
            queued,
        }
    }

    /// A job of the actor's own, traced by no call.
    pub(super) fn own(job: Job) -> Self {
        Self::new(job, &Span::none())
    }

    /// The job, its wait over, and the span its work runs in.
    fn start(self) -> (Job, Span) {
        drop(self.queued);
        let span = match self.caller.is_none() {
            true => Span::none(),
            false => tracing::info_span!(parent: &self.caller, "job", job = self.job.kind()),
        };
        (self.job, span)
    }
}

/// Spawns a job's task within `span`; if it panics, the actor hears of it
/// (the link the task held is gone with it) instead of waiting for it
/// forever.
fn spawn_job(me: ActorRef<SandboxMsg>, span: Span, job: impl std::future::Future<Output = ()> + Send + 'static) {
    let task = tokio::spawn(job.instrument(span));
    tokio::spawn(async move {
        if let Err(e) = task.await {
            if e.is_panic() {
                let _ = me.send_message(SandboxMsg::JobPanicked(e.to_string()));
            }
        }
    });
}

impl SandboxActor {
    /// Starts the next job when none is running. Each job hands its link
    /// back (`Done`) before it answers, so that a query the caller sends
    /// once answered queues behind it in the mailbox and finds the job over
    /// and in the history.
    pub(super) async fn pump(
        &self,
        myself: &ActorRef<SandboxMsg>,
        state: &mut SandboxState,
    ) -> Result<(), ActorProcessingErr> {
        while state.link.is_some() && state.deletion.is_none() {
            let Some(next) = state.queue.front() else {
                return Ok(());
            };
            // A call to a sleeping sandbox waits behind its wake.
            if state.record.hibernated.is_some() && next.job.needs_waking() {
                state.queue.push_front(QueuedJob::own(Job::Wake));
            }
            let waiting = state.queue.pop_front().expect("a job is queued");
            let (job, span) = waiting.start();
            let mut link = state.link.take().expect("checked");
            let me = myself.clone();
            match job {
                Job::Run(req) => {
                    if req.cancel.is_cancelled() {
                        state.link = Some(link);
                        continue;
                    }
                    let (notice, python_lost) = state.take_notice();
                    let call = state.ctx.calls.enter();
                    spawn_job(me.clone(), span, async move {
                        let _call = call;
                        let started = moment::now();
                        let meter = Meter::start(&link);
                        let result = link
                            .run(&req.work, req.timeout, req.progress.as_ref(), &req.cancel)
                            .await;
                        let receipt = meter.finish(&link);
                        let full = link.ctx().disks.full_notice(link.paths.id);
                        let result = result.map(|mut ran| {
                            ran.notice = join_notices(join_notices(notice, ran.notice.take()), full);
                            ran.output.state_lost |= python_lost;
                            ran.receipt = Some(receipt);
                            ran
                        });
                        let call = run_record(started, &req.work, &result);
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = req.reply.send(result);
                    });
                }
                Job::Install { package, specs } => {
                    let args = InstallArgs {
                        link,
                        owner: state.record.owner.clone(),
                        package,
                        specs,
                        report: me,
                        span,
                    };
                    Actor::spawn_linked(None, InstallTask, args, myself.get_cell()).await?;
                }
                Job::Queued(Queued::Upload { source, dest, reply }) => {
                    spawn_job(me.clone(), span, async move {
                        let started = moment::now();
                        let what = match &source {
                            UploadSource::Host(path) => format!("{} → {dest}", path.display()),
                            UploadSource::Bytes { name, .. } => format!("{name} → {dest}"),
                        };
                        let result = upload(&mut link, source, &dest).await;
                        let call = outcome_record(started, CallKind::Upload, &what, &result, "uploaded");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::Queued(Queued::Restart { reply }) => {
                    // What it used up to now is read before its counters
                    // start again: restarting before every sample hides
                    // nothing.
                    let subject = Subject {
                        status: live_status(state),
                        ..Subject::from(&info(state))
                    };
                    state.restarting = true;
                    spawn_job(me.clone(), span, async move {
                        let started = moment::now();
                        link.ctx().read_usage(subject, false).await;
                        let result = link.restart().await;
                        let call = outcome_record(started, CallKind::Restart, "restart", &result, "restarted");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::Queued(Queued::ResetPython { reply }) => {
                    let (notice, _) = state.take_notice();
                    spawn_job(me.clone(), span, async move {
                        let started = moment::now();
                        let result = link.reset_python().await.map(|n| join_notices(notice, n));
                        let call = outcome_record(started, CallKind::ResetPython, "reset_python", &result, "reset");
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, Some(call)))));
                        let _ = reply.send(result);
                    });
                }
                Job::Queued(Queued::Snapshot { op, reply }) => {
                    let (notice, _) = state.take_notice();
                    spawn_job(me.clone(), span, async move {
                        let started = moment::now();
                        let what = op.to_string();
                        let result = snapshot::carry_out(&mut link, op).await;
                        let packages = match &result {
                            Ok((
                                SnapshotDone::Restored(Restored { packages: true, .. }) | SnapshotDone::Seeded(_),
                                _,
                            )) => AgentConnection::packages(link.ctx(), link.paths.id).await.ok(),
                            _ => None,
                        };
                        let result = result.map(|(done, n)| (done, join_notices(notice, n)));
                        let call = outcome_record(started, CallKind::Snapshot, &what, &result, "done");
                        let snapshots = Some(link.ctx().snapshots.totals(link.paths.id));
                        let seeded = matches!(result, Ok((SnapshotDone::Seeded(_), _)));
                        let finished = Finished {
                            packages,
                            snapshots,
                            seeded,
                            ..Finished::job(link, Some(call))
                        };
                        let _ = me.send_message(SandboxMsg::Done(Box::new(finished)));
                        let _ = reply.send(result);
                    });
                }
                Job::Queued(Queued::Process { op, reply }) => {
                    let (notice, _) = state.take_notice();
                    spawn_job(me.clone(), span, async move {
                        let started = moment::now();
                        let carried = processes::carry_out(&mut link, &op).await;
                        let call = outcome_record(started, CallKind::Process, &op.summary(), &carried, op.verb());
                        let (ctx, id) = (link.ctx().clone(), link.paths.id);
                        let may_run = match &carried {
                            Ok((processes::Carried::Done(answer), _)) => answer.may_run(),
                            Ok((processes::Carried::Follow { started: true, .. }, _)) => Some(true),
                            _ => None,
                        };
                        let finished = Finished {
                            processes_may_run: may_run,
                            ..Finished::job(link, Some(call))
                        };
                        let _ = me.send_message(SandboxMsg::Done(Box::new(finished)));
                        let answer = match carried {
                            Ok((processes::Carried::Done(answer), n)) => Ok((answer, join_notices(notice, n))),
                            Ok((follow, n)) => Ok((processes::follow(&ctx, id, follow).await, join_notices(notice, n))),
                            Err(e) => Err(e),
                        };
                        let _ = reply.send(answer);
                    });
                }
                // Nothing to bring back while asleep: the wake makes a container.
                Job::Revive | Job::Recover if state.record.hibernated.is_some() => {
                    state.link = Some(link);
                }
                Job::Recover => {
                    state.restarting = true;
                    spawn_job(me.clone(), span, async move {
                        link.restart_unresponsive().await;
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished::job(link, None))));
                    });
                }
                Job::Revive => {
                    spawn_job(me.clone(), span, async move {
                        let revived = link.revive().await;
                        if let Err(e) = &revived {
                            warn!(sandbox = %link.paths.id, error = %e, "could not bring a stopped sandbox back; retrying");
                        }
                        let _ = me.send_message(SandboxMsg::Done(Box::new(Finished {
                            still_stopped: revived.is_err(),
                            notice: revived.ok().flatten(),
                            ..Finished::job(link, None)
                        })));
                    });
                }
                Job::Hibernate(reply) => {
                    if let Some(asleep) = &state.record.hibernated {
                        if let Some(reply) = reply {
                            let _ = reply.send(Ok(Slept {
                                python: asleep.python.clone(),
                                snapshots: vec![],
                                already: true,
                            }));
                        }
                        state.link = Some(link);
                        continue;
                    }
                    let usage = Subject {
                        status: live_status(state),
                        ..Subject::from(&info(state))
                    };
                    let asked = match reply {
                        Some(_) => hibernation::Asked::Caller,
                        None => hibernation::Asked::Upkeep,
                    };
                    let ctx = state.ctx.clone();
                    if let Err(e) = ctx
                        .census
                        .fall_asleep(&state.asleep, &state.record.owner, &ctx.settings)
                    {
                        // No room among the hibernated: it stays awake.
                        tracing::info!(sandbox = %state.record.id, error = %e, "a sandbox stays awake");
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(e));
                        }
                        state.link = Some(link);
                        continue;
                    }
                    let flag = state.asleep.clone();
                    state.sleeping = true;
                    spawn_job(me.clone(), span, async move {
                        let started = moment::now();
                        let slept = hibernation::sleep(&mut link, asked, usage).await;
                        if let Err(e) = &slept {
                            // Still awake: it counts among the live ones again.
                            flag.store(false, Ordering::Release);
                            warn!(sandbox = %link.paths.id, error = %e, "could not put a sandbox to sleep");
                        }
                        // Asked for, it is a call; by the actor's own
                        // upkeep, it is none (and no use).
                        let call = reply
                            .as_ref()
                            .map(|_| outcome_record(started, CallKind::Hibernate, "hibernate", &slept, "hibernated"));
                        let finished = Finished {
                            hibernated: slept.as_ref().ok().map(|(h, _)| Some(h.clone())),
                            ..Finished::job(link, call)
                        };
                        let _ = me.send_message(SandboxMsg::Done(Box::new(finished)));
                        if let Some(reply) = reply {
                            let _ = reply.send(slept.map(|(h, snapshots)| Slept {
                                python: h.python,
                                snapshots,
                                already: false,
                            }));
                        }
                    });
                }
                Job::Wake => {
                    let asleep = state.record.hibernated.clone().expect("woken asleep");
                    let egress = state.record.egress.unwrap_or(state.ctx.egress.default_policy());
                    let ctx = state.ctx.clone();
                    let room = ctx.census.wake(&state.asleep, &state.record.owner, &ctx.settings);
                    let flag = state.asleep.clone();
                    spawn_job(me.clone(), span, async move {
                        let woke = match room {
                            Ok(()) => hibernation::wake(&mut link, &asleep, egress).await,
                            Err(e) => Err(e),
                        };
                        if woke.is_err() {
                            // Still asleep: it counts among the hibernated again.
                            flag.store(true, Ordering::Release);
                        }
                        let finished = match woke {
                            Ok(notice) => Finished {
                                hibernated: Some(None),
                                notice: Some(notice),
                                ..Finished::job(link, None)
                            },
                            Err(e) => {
                                warn!(sandbox = %link.paths.id, error = %e, "could not wake a sandbox");
                                Finished {
                                    wake_failed: Some(e.to_string()),
                                    ..Finished::job(link, None)
                                }
                            }
                        };
                        let _ = me.send_message(SandboxMsg::Done(Box::new(finished)));
                    });
                }
                Job::Awake(reply) => {
                    state.link = Some(link);
                    state.last_used = moment::now();
                    let _ = reply.send(Ok(()));
                }
            }
        }
        Ok(())
    }
}

/// A run's entry in the history.
fn run_record(started: OffsetDateTime, work: &Work, result: &Result<Ran>) -> CallRecord {
    let (kind, summary) = match work {
        Work::Python(code) => (CallKind::Python, code.as_str()),
        Work::Program(argv) => (CallKind::Shell, argv.last().map_or("", String::as_str)),
    };
    let (ok, outcome) = match result {
        Ok(ran) if ran.output.timed_out => (false, "timed out".to_string()),
        Ok(ran) => (ran.output.exit_code == 0, format!("exit {}", ran.output.exit_code)),
        Err(e) => (false, format!("error: {e}")),
    };
    CallRecord::ended(started, kind, summary, ok, outcome)
}

/// The history entry of a call that either worked or failed with an error.
fn outcome_record<T>(
    started: OffsetDateTime,
    kind: CallKind,
    what: &str,
    result: &Result<T>,
    done: &str,
) -> CallRecord {
    let (ok, outcome) = match result {
        Ok(_) => (true, done.to_string()),
        Err(e) => (false, format!("error: {e}")),
    };
    CallRecord::ended(started, kind, what, ok, outcome)
}

async fn upload(link: &mut AgentConnection, source: UploadSource, dest: &str) -> Result<Uploaded> {
    if let UploadSource::Bytes { name, .. } = &source {
        let target = ResultsPath::parse(&format!("{dest}/{name}"))?;
        files::bounded(link.paths.results.clone(), "checking the path", move |root| {
            files::check_writable(root, &target)
        })
        .await?;
    }
    let (tar, name) = tokio::task::spawn_blocking(move || uploads::pack(source))
        .await
        .map_err(|e| SandboxError::Internal(e.to_string()))??;
    // The folder must exist for the archive API; mkdir runs as the sandbox
    // user, inside the sandbox.
    let mkdir = Work::Program(vec!["/bin/mkdir".into(), "-p".into(), "--".into(), dest.to_string()]);
    let ran = link
        .run(&mkdir, Duration::from_secs(30), None, &CancellationToken::new())
        .await?;
    if ran.output.exit_code != 0 {
        return Err(SandboxError::UploadRefused(format!(
            "cannot create {dest}: {}",
            ran.output.stderr.trim()
        )));
    }
    link.ctx().runtime.upload(&link.container_id, dest, tar).await?;
    let path = format!("{dest}/{name}");
    Ok(Uploaded {
        message: format!("Uploaded {name} to {dest}"),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    /// Stands in for a sandbox actor: passes on what the job guard reports.
    struct Relay;

    impl Actor for Relay {
        type Msg = SandboxMsg;
        type State = Option<oneshot::Sender<String>>;
        type Arguments = oneshot::Sender<String>;

        async fn pre_start(
            &self,
            _: ActorRef<SandboxMsg>,
            tx: oneshot::Sender<String>,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(Some(tx))
        }

        async fn handle(
            &self,
            _: ActorRef<SandboxMsg>,
            msg: SandboxMsg,
            state: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let (SandboxMsg::JobPanicked(why), Some(tx)) = (msg, state.take()) {
                let _ = tx.send(why);
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_panicking_job_is_reported_instead_of_lost() {
        let (tx, rx) = oneshot::channel();
        let (relay, handle) = Actor::spawn(None, Relay, tx).await.unwrap();
        spawn_job(relay.clone(), Span::none(), async { panic!("job exploded") });
        let why = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .unwrap()
            .unwrap();
        assert!(why.contains("job exploded"), "{why}");
        relay.stop(None);
        handle.await.unwrap();
    }
}
