//! `list_processes`: the background processes of a sandbox, running and
//! ended, in turn with its other calls.

use sandbox_actors::processes::{ProcessAnswer, ProcessOp};

use crate::access::caller::Caller;
use crate::ops::args::SandboxRef;
use crate::ops::error::OpsError;
use crate::ops::processes::{ProcessList, ProcessView};
use crate::ops::route::forward_if_elsewhere;
use crate::ops::Ops;

impl Ops {
    pub async fn list_processes(&self, caller: &Caller, args: SandboxRef) -> Result<ProcessList, OpsError> {
        forward_if_elsewhere!(self, caller, "list_processes", args, None);
        self.on_sandbox("list_processes", &args.sandbox_id, |id| async move {
            match self.sandboxes.process(caller.scope(), id, ProcessOp::List).await? {
                (ProcessAnswer::Listed(list), notice) => Ok(ProcessList {
                    sandbox_id: id.to_string(),
                    processes: list.into_iter().map(ProcessView::from).collect(),
                    notice,
                }),
                _ => Err(OpsError::Internal("a listing answered with something else".into())),
            }
        })
        .await
    }
}
