//! Background processes over the agent's channel (`start_process` and the
//! calls on what it started): the requests, and the answers parsed into
//! bounded, checked types, since the agent is the sandbox's to replace.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::agent::{bounded, AgentClient, AgentError, MAX_AGENT_TEXT};

/// The longest command and name the server keeps of a process (the agent
/// cuts them to these; a replaced agent's longer ones are cut here).
pub const MAX_COMMAND: usize = 2000;
pub const MAX_NAME: usize = 200;
/// The most processes one listing carries (the agent keeps the running
/// ones and as many ended ones under the server's cap of 64 at most).
const MAX_LISTED: usize = 256;

/// Where a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    Running,
    Exited,
}

/// A background process as the agent reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub process_id: String,
    pub name: Option<String>,
    #[serde(default)]
    pub command: String,
    pub cwd: Option<String>,
    pub state: ProcessState,
    /// Its exit code (128 + the signal that ended it); none while it runs
    /// or when it ended with its container.
    pub exit_code: Option<i32>,
    /// Unix seconds.
    pub started_at: Option<f64>,
    pub ended_at: Option<f64>,
    /// Every byte it wrote so far (stdout and stderr together).
    pub output_bytes: u64,
    /// Why it ended, when not by itself (its container stopped), or what
    /// happened to its output (the disk was full).
    pub note: Option<String>,
}

impl ProcessInfo {
    /// Checked and bounded: an id of 12 hex digits, texts cut.
    fn sanitise(mut self) -> Result<Self, AgentError> {
        if !is_process_id(&self.process_id) {
            return Err(AgentError::Protocol("a process id that is not 12 hex digits".into()));
        }
        self.command = bounded(self.command, MAX_COMMAND);
        self.name = self.name.map(|n| bounded(n, MAX_NAME));
        self.cwd = self.cwd.map(|c| bounded(c, 4096));
        self.note = self.note.map(|n| bounded(n, MAX_AGENT_TEXT));
        Ok(self)
    }
}

/// Whether `id` is a process id as the agent makes them.
pub fn is_process_id(id: &str) -> bool {
    id.len() == 12 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A window of a process's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputWindow {
    pub output: String,
    /// Where the window starts: later than asked when the output before
    /// was dropped (`skipped` bytes of it).
    pub offset: u64,
    pub next_offset: u64,
    pub skipped: u64,
    pub process: ProcessInfo,
}

/// What `start_process` asks of the agent.
#[derive(Debug, Clone, Serialize)]
pub struct StartProcess {
    pub command: String,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub name: Option<String>,
    /// Bytes of output kept (the oldest dropped past it).
    pub keep: u64,
    /// Running processes the sandbox may have.
    pub max_processes: usize,
}

#[derive(Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request<'a> {
    StartProcess {
        id: u64,
        #[serde(flatten)]
        start: &'a StartProcess,
    },
    ListProcesses {
        id: u64,
    },
    ReadProcess {
        id: u64,
        process_id: &'a str,
        offset: u64,
        max: usize,
        wait: f64,
        until_end: bool,
    },
    ProcessInput {
        id: u64,
        process_id: &'a str,
        text: &'a str,
    },
    StopProcess {
        id: u64,
        process_id: &'a str,
        signal: &'a str,
        grace: f64,
    },
}

#[derive(Deserialize)]
struct Started {
    process: ProcessInfo,
}

#[derive(Deserialize)]
struct Listed {
    processes: Vec<ProcessInfo>,
}

#[derive(Deserialize)]
struct Written {
    written: u64,
    process: ProcessInfo,
}

impl AgentClient {
    /// Starts a background command; answers at once.
    pub async fn start_process(&mut self, start: &StartProcess) -> Result<ProcessInfo, AgentError> {
        let id = self.take_id();
        self.send(&Request::StartProcess { id, start }).await?;
        self.answer::<Started>(id).await?.process.sanitise()
    }

    pub async fn list_processes(&mut self) -> Result<Vec<ProcessInfo>, AgentError> {
        let id = self.take_id();
        self.send(&Request::ListProcesses { id }).await?;
        let mut listed = self.answer::<Listed>(id).await?.processes;
        listed.truncate(MAX_LISTED);
        listed.into_iter().map(ProcessInfo::sanitise).collect()
    }

    /// Up to `max` bytes of output from `offset`; with `wait` seconds, the
    /// agent answers once there is output past `offset` (or, `until_end`,
    /// only at the end of the wait), or once the process ended.
    pub async fn read_process(
        &mut self,
        process_id: &str,
        offset: u64,
        max: usize,
        wait: f64,
        until_end: bool,
    ) -> Result<OutputWindow, AgentError> {
        let id = self.take_id();
        self.send(&Request::ReadProcess {
            id,
            process_id,
            offset,
            max,
            wait,
            until_end,
        })
        .await?;
        let mut window = self.answer::<OutputWindow>(id).await?;
        // A character the agent could not decode is three bytes here.
        window.output = bounded(window.output, 3 * max + 16);
        window.process = window.process.sanitise()?;
        if window.next_offset < window.offset {
            return Err(AgentError::Protocol(
                "an output window that ends before it starts".into(),
            ));
        }
        Ok(window)
    }

    /// Writes `text` to the process's standard input as far as its pipe
    /// takes it; answers how many bytes went in.
    pub async fn process_input(&mut self, process_id: &str, text: &str) -> Result<(u64, ProcessInfo), AgentError> {
        let id = self.take_id();
        self.send(&Request::ProcessInput { id, process_id, text }).await?;
        let written = self.answer::<Written>(id).await?;
        Ok((written.written, written.process.sanitise()?))
    }

    /// Sends `signal`, then kills the process's session after `grace`
    /// seconds; answered once it ended.
    pub async fn stop_process(
        &mut self,
        process_id: &str,
        signal: &str,
        grace: f64,
    ) -> Result<ProcessInfo, AgentError> {
        let id = self.take_id();
        self.send(&Request::StopProcess {
            id,
            process_id,
            signal,
            grace,
        })
        .await?;
        self.answer::<Started>(id).await?.process.sanitise()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ids_are_twelve_hex_digits() {
        assert!(is_process_id("0123456789ab"));
        assert!(!is_process_id("0123456789AB"));
        assert!(!is_process_id("../etc/pass"));
        assert!(!is_process_id("0123456789abc"));
    }

    #[test]
    fn what_an_agent_reports_of_a_process_is_bounded() {
        let info = ProcessInfo {
            process_id: "0123456789ab".into(),
            name: Some("n".repeat(10_000)),
            command: "c".repeat(100_000),
            cwd: None,
            state: ProcessState::Running,
            exit_code: None,
            started_at: None,
            ended_at: None,
            output_bytes: 0,
            note: Some("x".repeat(100_000)),
        };
        let clean = info.clone().sanitise().unwrap();
        assert!(clean.command.len() <= MAX_COMMAND + 4);
        assert!(clean.name.unwrap().len() <= MAX_NAME + 4);
        assert!(clean.note.unwrap().len() <= MAX_AGENT_TEXT + 4);
        let forged = ProcessInfo {
            process_id: "../../x".into(),
            ..info
        };
        assert!(forged.sanitise().is_err());
    }
}
