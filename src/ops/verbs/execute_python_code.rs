//! `execute_python_code`: Python in the sandbox's persistent namespace.

use sandbox_actors::{Progress, Work};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::access::caller::Caller;
use crate::ops::args::check_len;
use crate::ops::error::OpsError;
use crate::ops::results::PythonResult;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::{Ops, Run};

/// Largest `code` accepted.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExecutePythonCode {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// Python source to run. Variables and imports persist between calls.
    pub code: String,
    /// Seconds before the run is interrupted (default and maximum set by the server).
    #[serde(default)]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

impl Ops {
    /// Runs Python code; output so far goes to `progress` while it runs.
    pub async fn execute_python_code(
        &self,
        caller: &Caller,
        args: ExecutePythonCode,
        progress: Option<mpsc::Sender<Progress>>,
    ) -> Result<PythonResult, OpsError> {
        forward_if_elsewhere!(self, caller, "execute_python_code", args, progress);
        let work = check_len("code", &args.code, MAX_CODE_BYTES).map(|()| Work::Python(args.code));
        let run = Run {
            caller,
            raw_id: &args.sandbox_id,
            timeout: args.timeout_seconds,
            progress,
        };
        self.execute("execute_python_code", run, work, PythonResult::new).await
    }
}
