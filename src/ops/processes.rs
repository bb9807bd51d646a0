//! What the process and preview verbs answer: neutral result types that the
//! MCP tools, the REST API and the node channel all send as they are.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use sandbox_runtime::processes::{OutputWindow, ProcessInfo, ProcessState};

use crate::ops::timestamps::rfc3339;

/// A background process of a sandbox.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProcessView {
    /// The process_id to pass to read_process_output, send_process_input and stop_process.
    pub process_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `running` or `exited`.
    pub state: String,
    /// Its exit code once it exited (128 + the signal that ended it); absent
    /// when it ended with its container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Bytes it wrote so far (stdout and stderr together).
    pub output_bytes: u64,
    /// Why it ended when not by itself, or what became of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl From<ProcessInfo> for ProcessView {
    fn from(p: ProcessInfo) -> Self {
        let at = |t: Option<f64>| {
            // To the millisecond: a float's nanoseconds are noise.
            let millis = |s: f64| ((s * 1e3).round() as i128).checked_mul(1_000_000);
            t.and_then(millis)
                .and_then(|n| OffsetDateTime::from_unix_timestamp_nanos(n).ok())
                .map(rfc3339)
        };
        Self {
            process_id: p.process_id,
            name: p.name,
            command: p.command,
            cwd: p.cwd,
            state: match p.state {
                ProcessState::Running => "running".into(),
                ProcessState::Exited => "exited".into(),
            },
            exit_code: p.exit_code,
            started_at: at(p.started_at),
            ended_at: at(p.ended_at),
            output_bytes: p.output_bytes,
            note: p.note,
        }
    }
}

/// A window of a process's output, as `start_process` (its first second)
/// and `read_process_output` answer it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProcessOutput {
    pub success: bool,
    pub process: ProcessView,
    /// Its stdout and stderr together, in the order written.
    pub output: String,
    /// Where `output` starts in everything the process wrote.
    pub offset: u64,
    /// Pass this as `offset` to read on.
    pub next_offset: u64,
    /// Bytes between the offset asked for and `offset` that are no longer
    /// kept (a process keeps only its latest output).
    pub skipped: u64,
    pub message: String,
    /// Something that happened to the sandbox since your last call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

impl ProcessOutput {
    pub(crate) fn new(window: OutputWindow, notice: Option<String>, started: bool) -> Self {
        let process = ProcessView::from(window.process);
        let more = window.next_offset < process.output_bytes;
        let mut message = match (started, process.state.as_str(), process.exit_code) {
            (true, "running", _) => format!(
                "Started process {} (its first second's output is below); follow it with read_process_output \
                 from offset {}.",
                process.process_id, window.next_offset
            ),
            (true, _, code) => format!(
                "Process {} ended within its first second (exit code {}).",
                process.process_id,
                code.map_or("unknown".into(), |c| c.to_string())
            ),
            (false, "running", _) if window.output.is_empty() => "No new output yet; the process runs.".into(),
            (false, "running", _) => "The process runs.".into(),
            (false, _, code) => format!(
                "The process has exited (exit code {}).",
                code.map_or("unknown".into(), |c| c.to_string())
            ),
        };
        if window.skipped > 0 {
            message.push_str(&format!(
                " {} bytes before offset {} are no longer kept.",
                window.skipped, window.offset
            ));
        }
        if more {
            message.push_str(&format!(
                " More output follows from next_offset {}.",
                window.next_offset
            ));
        }
        Self {
            success: true,
            process,
            output: window.output,
            offset: window.offset,
            next_offset: window.next_offset,
            skipped: window.skipped,
            message,
            notice,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProcessList {
    pub sandbox_id: String,
    pub processes: Vec<ProcessView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct InputResult {
    pub success: bool,
    /// Bytes the process's input took (fewer than sent when it does not read).
    pub written: u64,
    pub process: ProcessView,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StopResult {
    pub success: bool,
    pub process: ProcessView,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// A preview link, as `expose_port` answers it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PreviewResult {
    pub success: bool,
    pub sandbox_id: String,
    pub port: u16,
    /// Open it in a browser or any HTTP client; it carries its own token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Every port of the sandbox exposed now.
    pub exposed_ports: Vec<u16>,
    pub message: String,
}
