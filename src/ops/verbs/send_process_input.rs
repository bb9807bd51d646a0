//! `send_process_input`: text written to a running process's standard
//! input, in turn with the sandbox's other calls.

use sandbox_actors::processes::{ProcessAnswer, ProcessOp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::processes::{InputResult, ProcessView};
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// The most text one call sends (a pipe takes 64 KiB before its reader reads).
const MAX_INPUT: usize = 64 * 1024;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SendProcessInput {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The process_id returned by start_process.
    pub process_id: String,
    /// The text to write; end a line with "\n" for programs that read lines.
    pub text: String,
}

impl Ops {
    pub async fn send_process_input(&self, caller: &Caller, args: SendProcessInput) -> Result<InputResult, OpsError> {
        forward_if_elsewhere!(self, caller, "send_process_input", args, None);
        self.on_sandbox("send_process_input", &args.sandbox_id, |id| async move {
            if args.text.len() > MAX_INPUT {
                return Err(OpsError::InvalidArgument(format!(
                    "text takes at most {MAX_INPUT} bytes"
                )));
            }
            let sent = args.text.len() as u64;
            let op = ProcessOp::Input {
                process_id: args.process_id,
                text: args.text,
            };
            match self.sandboxes.process(caller.scope(), id, op).await? {
                (ProcessAnswer::Input { written, process }, notice) => Ok(InputResult {
                    success: written == sent,
                    written,
                    message: match written == sent {
                        true => format!("Wrote {written} bytes to the process's input."),
                        false => format!(
                            "The process took {written} of {sent} bytes: it does not read its input as fast; \
                             send the rest later."
                        ),
                    },
                    process: ProcessView::from(process),
                    notice,
                }),
                _ => Err(OpsError::Internal("an input answered with something else".into())),
            }
        })
        .await
    }
}
