//! `read_process_output`: a window of a process's output from an offset,
//! waiting a few seconds for new output when asked, so that an agent can
//! follow a log without polling hard.

use sandbox_actors::processes::{ProcessAnswer, ProcessOp, MAX_WINDOW};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::processes::ProcessOutput;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// The window's size when none is asked for.
const DEFAULT_WINDOW: usize = 64 * 1024;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadProcessOutput {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The process_id returned by start_process.
    pub process_id: String,
    /// Where to start reading (the next_offset of the last read; 0 for the beginning).
    #[serde(default)]
    pub offset: u64,
    /// Seconds to wait for new output when there is none yet (0 to 10).
    #[serde(default)]
    pub wait_seconds: f64,
    /// The most bytes to answer with (default 65536, at most 262144).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

impl Ops {
    pub async fn read_process_output(
        &self,
        caller: &Caller,
        args: ReadProcessOutput,
    ) -> Result<ProcessOutput, OpsError> {
        forward_if_elsewhere!(self, caller, "read_process_output", args, None);
        self.on_sandbox("read_process_output", &args.sandbox_id, |id| async move {
            let max = args.max_bytes.unwrap_or(DEFAULT_WINDOW);
            if !(1..=MAX_WINDOW).contains(&max) {
                return Err(OpsError::InvalidArgument(format!(
                    "max_bytes must be from 1 to {MAX_WINDOW}"
                )));
            }
            let op = ProcessOp::Read {
                process_id: args.process_id,
                offset: args.offset,
                max,
                wait: args.wait_seconds,
            };
            match self.sandboxes.process(caller.scope(), id, op).await? {
                (ProcessAnswer::Window(window), notice) => Ok(ProcessOutput::new(window, notice, false)),
                _ => Err(OpsError::Internal("a read answered with something else".into())),
            }
        })
        .await
    }
}
