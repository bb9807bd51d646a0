//! `stop_process`: a signal (TERM by default), then KILL of the process and
//! whatever it started after a grace period; answered once it ended.

use sandbox_actors::processes::{ProcessAnswer, ProcessOp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::processes::{ProcessView, StopResult};
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// The signals a stop may send first.
const SIGNALS: [&str; 7] = ["TERM", "INT", "HUP", "QUIT", "KILL", "USR1", "USR2"];

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StopProcess {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// The process_id returned by start_process.
    pub process_id: String,
    /// The signal sent first: TERM (default), INT, HUP, QUIT, KILL, USR1 or USR2.
    #[serde(default)]
    pub signal: Option<String>,
    /// Seconds it has to end before it and what it started are killed (default 5, at most 60).
    #[serde(default)]
    pub grace_seconds: Option<f64>,
}

impl Ops {
    pub async fn stop_process(&self, caller: &Caller, args: StopProcess) -> Result<StopResult, OpsError> {
        forward_if_elsewhere!(self, caller, "stop_process", args, None);
        self.on_sandbox("stop_process", &args.sandbox_id, |id| async move {
            let signal = args
                .signal
                .as_deref()
                .unwrap_or("TERM")
                .trim_start_matches("SIG")
                .to_ascii_uppercase();
            if !SIGNALS.contains(&signal.as_str()) {
                return Err(OpsError::InvalidArgument(format!(
                    "signal must be one of {}",
                    SIGNALS.join(", ")
                )));
            }
            let op = ProcessOp::Stop {
                process_id: args.process_id,
                signal,
                grace: args.grace_seconds.unwrap_or(5.0),
            };
            match self.sandboxes.process(caller.scope(), id, op).await? {
                (ProcessAnswer::Stopped(info), notice) => {
                    let process = ProcessView::from(info);
                    let message = match (process.state.as_str(), process.exit_code) {
                        ("running", _) => "The process did not end after KILL; restart_sandbox ends everything.".into(),
                        (_, Some(code)) => format!("The process has ended (exit code {code})."),
                        _ => "The process had already ended.".into(),
                    };
                    Ok(StopResult {
                        success: process.state != "running",
                        process,
                        message,
                        notice,
                    })
                }
                _ => Err(OpsError::Internal("a stop answered with something else".into())),
            }
        })
        .await
    }
}
