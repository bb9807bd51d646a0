//! Background processes of a sandbox: the calls on them, each carried out
//! in turn with the sandbox's other calls over its link, and the waits for
//! output (a start's first second, a read that follows a log), which happen
//! after the job has handed its link back, over a second connection, so
//! that no wait holds up the calls queued behind it.

use std::time::Duration;

use crate::agent_connection::{AgentConnection, AGENT_QUERY};
use crate::context::Context;
use crate::error::{Result, SandboxError};
use sandbox_runtime::processes::{OutputWindow, ProcessInfo, ProcessState, StartProcess};
use uuid::Uuid;

/// The output a start answers with: what its first second wrote.
pub const FIRST_OUTPUT: Duration = Duration::from_secs(1);
/// The longest wait for output a read may ask for.
pub const MAX_WAIT_SECONDS: f64 = 10.0;
/// The most output one read answers with.
pub const MAX_WINDOW: usize = 256 * 1024;
/// How long a stop may take past its grace (the agent kills the process's
/// session then, and answers once it ended).
const STOP_SLACK: Duration = Duration::from_secs(10);
/// The longest grace a stop may ask for.
pub const MAX_GRACE_SECONDS: f64 = 60.0;

/// A call on a sandbox's processes.
#[derive(Debug, Clone)]
pub enum ProcessOp {
    Start(StartProcess),
    List,
    Read {
        process_id: String,
        offset: u64,
        max: usize,
        wait: f64,
    },
    Input {
        process_id: String,
        text: String,
    },
    Stop {
        process_id: String,
        signal: String,
        grace: f64,
    },
}

impl ProcessOp {
    /// Its name in traces and the history.
    pub fn verb(&self) -> &'static str {
        match self {
            ProcessOp::Start(_) => "start_process",
            ProcessOp::List => "list_processes",
            ProcessOp::Read { .. } => "read_process_output",
            ProcessOp::Input { .. } => "send_process_input",
            ProcessOp::Stop { .. } => "stop_process",
        }
    }

    /// What the history shows of it.
    pub fn summary(&self) -> String {
        match self {
            ProcessOp::Start(s) => s.command.clone(),
            ProcessOp::List => "list".into(),
            ProcessOp::Read { process_id, .. } | ProcessOp::Input { process_id, .. } => process_id.clone(),
            ProcessOp::Stop { process_id, signal, .. } => format!("{process_id} {signal}"),
        }
    }
}

/// What a call on processes answers.
#[derive(Debug, Clone)]
pub enum ProcessAnswer {
    /// A started process and what its first second wrote.
    Started(OutputWindow),
    Listed(Vec<ProcessInfo>),
    Window(OutputWindow),
    Input {
        written: u64,
        process: ProcessInfo,
    },
    Stopped(ProcessInfo),
}

impl ProcessAnswer {
    /// Whether processes of the sandbox may still run after this answer
    /// (while they do, the idle sandbox is not paused under them).
    pub(crate) fn may_run(&self) -> Option<bool> {
        match self {
            ProcessAnswer::Started(_) => Some(true),
            ProcessAnswer::Listed(list) => Some(list.iter().any(|p| p.state == ProcessState::Running)),
            _ => None,
        }
    }
}

/// What a job carries out in turn: the answer, or for a start and a read
/// that waits, the wait still to do once the link is handed back.
pub(crate) enum Carried {
    Done(ProcessAnswer),
    Follow {
        first: OutputWindow,
        max: usize,
        wait: f64,
        until_end: bool,
        started: bool,
    },
}

/// Carries out `op` over the sandbox's link, in turn with its calls.
pub(crate) async fn carry_out(link: &mut AgentConnection, op: &ProcessOp) -> Result<(Carried, Option<String>)> {
    let (answer, notice) = match op {
        ProcessOp::Start(start) => {
            let (info, notice) = link
                .ask_agent("start a process", AGENT_QUERY, |c| {
                    let start = start.clone();
                    Box::pin(async move { c.start_process(&start).await })
                })
                .await?;
            let first = empty_window(info);
            let follow = Carried::Follow {
                first,
                max: MAX_WINDOW,
                wait: FIRST_OUTPUT.as_secs_f64(),
                until_end: true,
                started: true,
            };
            return Ok((follow, notice));
        }
        ProcessOp::List => {
            let (list, notice) = link
                .ask_agent("list processes", AGENT_QUERY, |c| {
                    Box::pin(async move { c.list_processes().await })
                })
                .await?;
            (ProcessAnswer::Listed(list), notice)
        }
        ProcessOp::Read {
            process_id,
            offset,
            max,
            wait,
        } => {
            let (window, notice) = link
                .ask_agent("read a process's output", AGENT_QUERY, |c| {
                    let (id, offset, max) = (process_id.clone(), *offset, *max);
                    Box::pin(async move { c.read_process(&id, offset, max, 0.0, false).await })
                })
                .await?;
            let nothing_yet = window.next_offset == window.offset && window.process.state == ProcessState::Running;
            if nothing_yet && *wait > 0.0 {
                let follow = Carried::Follow {
                    first: window,
                    max: *max,
                    wait: *wait,
                    until_end: false,
                    started: false,
                };
                return Ok((follow, notice));
            }
            (ProcessAnswer::Window(window), notice)
        }
        ProcessOp::Input { process_id, text } => {
            let ((written, process), notice) = link
                .ask_agent("send input to a process", AGENT_QUERY, |c| {
                    let (id, text) = (process_id.clone(), text.clone());
                    Box::pin(async move { c.process_input(&id, &text).await })
                })
                .await?;
            (ProcessAnswer::Input { written, process }, notice)
        }
        ProcessOp::Stop {
            process_id,
            signal,
            grace,
        } => {
            let deadline = Duration::from_secs_f64(*grace) + STOP_SLACK;
            let (info, notice) = link
                .ask_agent("stop a process", deadline, |c| {
                    let (id, signal, grace) = (process_id.clone(), signal.clone(), *grace);
                    Box::pin(async move { c.stop_process(&id, &signal, grace).await })
                })
                .await?;
            (ProcessAnswer::Stopped(info), notice)
        }
    };
    Ok((Carried::Done(answer), notice))
}

/// The wait a job left: a read of the process's output over a connection
/// of its own, within the wait and a query's slack. Should it fail (the
/// sandbox restarted meanwhile, say), the window read in turn stands.
pub(crate) async fn follow(ctx: &Context, sandbox: Uuid, carried: Carried) -> ProcessAnswer {
    let Carried::Follow {
        first,
        max,
        wait,
        until_end,
        started,
    } = carried
    else {
        unreachable!("only a follow-up waits")
    };
    let wrap = |w| match started {
        true => ProcessAnswer::Started(w),
        false => ProcessAnswer::Window(w),
    };
    let ask = async {
        let mut client = ctx.runtime.connect_agent(sandbox).await.ok()?;
        client
            .read_process(&first.process.process_id, first.offset, max, wait, until_end)
            .await
            .ok()
    };
    let deadline = Duration::from_secs_f64(wait) + AGENT_QUERY;
    match tokio::time::timeout(deadline, ask).await {
        Ok(Some(window)) => wrap(window),
        _ => wrap(first),
    }
}

fn empty_window(process: ProcessInfo) -> OutputWindow {
    OutputWindow {
        output: String::new(),
        offset: 0,
        next_offset: 0,
        skipped: 0,
        process,
    }
}

/// Checks a process call's arguments that the agent would otherwise be
/// trusted with.
pub fn check(op: &ProcessOp) -> Result<()> {
    let bad = |why: String| Err(SandboxError::InvalidArgument(why));
    match op {
        ProcessOp::Read { wait, .. } if !(0.0..=MAX_WAIT_SECONDS).contains(wait) => {
            bad(format!("wait_seconds must be from 0 to {MAX_WAIT_SECONDS}"))
        }
        ProcessOp::Stop { grace, .. } if !(0.0..=MAX_GRACE_SECONDS).contains(grace) => {
            bad(format!("grace_seconds must be from 0 to {MAX_GRACE_SECONDS}"))
        }
        ProcessOp::Read { process_id, .. }
        | ProcessOp::Input { process_id, .. }
        | ProcessOp::Stop { process_id, .. }
            if !sandbox_runtime::processes::is_process_id(process_id) =>
        {
            bad(format!(
                "{process_id:?} is not a process id (12 hex digits, as start_process answers)"
            ))
        }
        _ => Ok(()),
    }
}
