//! `execute_terminal_command`: a shell command under `sh -c`.

use sandbox_actors::{Progress, Work};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::access::caller::Caller;
use crate::ops::args::check_len;
use crate::ops::error::OpsError;
use crate::ops::results::CommandResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::{Ops, Run};

/// Largest `command` accepted.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExecuteTerminalCommand {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A shell command, run with `sh -c` in /app/results (pipes, && and redirects work).
    pub command: String,
    /// Seconds before the command is stopped (default and maximum set by the server).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

impl Ops {
    /// Runs a shell command under `sh -c`; the command is one argument,
    /// never spliced into another shell line.
    pub async fn execute_terminal_command(
        &self,
        caller: &Caller,
        args: ExecuteTerminalCommand,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<CommandResult, OpsError> {
        forward_if_elsewhere!(self, caller, "execute_terminal_command", args, progress);
        let argv = |command| vec!["sh".to_string(), "-c".to_string(), command];
        let work = check_len("command", &args.command, MAX_COMMAND_BYTES).map(|()| Work::Program(argv(args.command)));
        let run = Run {
            caller,
            raw_id: &args.sandbox_id,
            timeout: args.timeout_seconds,
            progress,
        };
        self.execute("execute_terminal_command", run, work, CommandResult::new)
            .await
    }
}
