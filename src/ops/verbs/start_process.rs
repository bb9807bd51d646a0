//! `start_process`: a background command (a web app, a long job) that
//! outlives the call, in turn with the sandbox's other calls; answered with
//! what its first second wrote.

use std::collections::BTreeMap;

use sandbox_actors::processes::{ProcessAnswer, ProcessOp};
use sandbox_runtime::processes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::processes::ProcessOutput;
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

/// The longest command, and the most and longest environment variables.
const MAX_COMMAND: usize = 16 * 1024;
const MAX_ENV: usize = 64;
const MAX_ENV_VALUE: usize = 4096;

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StartProcess {
    /// The sandbox_id returned by create_sandbox.
    pub sandbox_id: String,
    /// A shell command line, run by `sh -c` (for example `python -m http.server 8000`).
    pub command: String,
    /// The folder it starts in (default /app/results).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment variables added for it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A name to know it by in list_processes.
    #[serde(default)]
    pub name: Option<String>,
}

impl StartProcess {
    fn check(&self) -> Result<(), OpsError> {
        let bad = |why: String| Err(OpsError::InvalidArgument(why));
        if self.command.trim().is_empty() || self.command.len() > MAX_COMMAND || self.command.contains('\0') {
            return bad(format!(
                "command must be a non-empty shell command of at most {MAX_COMMAND} bytes"
            ));
        }
        if self.env.len() > MAX_ENV {
            return bad(format!("env takes at most {MAX_ENV} variables"));
        }
        let name_ok = |k: &str| {
            k.len() <= 128
                && k.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        if let Some((k, _)) = self
            .env
            .iter()
            .find(|(k, v)| !name_ok(k) || v.len() > MAX_ENV_VALUE || v.contains('\0'))
        {
            return bad(format!(
                "env: {k:?} must be a variable name (letters, digits, _) with a value of at most {MAX_ENV_VALUE} bytes"
            ));
        }
        if self
            .cwd
            .as_ref()
            .is_some_and(|c| c.len() > 4096 || c.contains('\0') || !c.starts_with('/'))
        {
            return bad("cwd must be an absolute path".into());
        }
        if self.name.as_ref().is_some_and(|n| n.len() > processes::MAX_NAME) {
            return bad(format!("name takes at most {} bytes", processes::MAX_NAME));
        }
        Ok(())
    }
}

impl Ops {
    pub async fn start_process(&self, caller: &Caller, args: StartProcess) -> Result<ProcessOutput, OpsError> {
        forward_if_elsewhere!(self, caller, "start_process", args, None);
        let raw_id = args.sandbox_id.clone();
        self.on_sandbox("start_process", &raw_id, |id| async move {
            args.check()?;
            let op = ProcessOp::Start(processes::StartProcess {
                command: args.command,
                cwd: args.cwd,
                env: args.env,
                name: args.name,
                keep: 0,
                max_processes: 0,
            });
            match self.sandboxes.process(caller.scope(), id, op).await? {
                (ProcessAnswer::Started(window), notice) => Ok(ProcessOutput::new(window, notice, true)),
                _ => Err(OpsError::Internal("a start answered with something else".into())),
            }
        })
        .await
    }
}
