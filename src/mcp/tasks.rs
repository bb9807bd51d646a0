//! Long calls as tasks: the `io.modelcontextprotocol/tasks` extension
//! (SEP-2663) as rmcp implements it ([`TaskManager`]).
//!
//! Clients cut long calls at 30–60 s. When a client declares the extension
//! (at `initialize`, or in a request's `_meta` capabilities), a long call
//! (an execution or an install) that is still running after
//! `[tasks] threshold_ms` is handed to the task store and the call answers
//! with a task handle instead; the client polls `tasks/get` (status, the
//! tail of the output so far, then the result) and may `tasks/cancel` it,
//! which drops the run and so interrupts it, leaving the sandbox usable. The
//! extension has no per-request opt-in: declaring it is how a request asks,
//! and `threshold_ms = 0` makes every such call a task at once.
//!
//! What a client can make the server hold is bounded here: the tasks of one
//! tenant (running, or finished and not yet fetched) and of the whole server
//! (every task kept for its TTL) are capped, a slot is taken before the run
//! starts so the caps hold under concurrent calls, and the TTL is the
//! server's, not the client's. A call past a cap is not refused: it runs as
//! a plain call and answers its plain result, as for a client without the
//! extension. A finished task whose end a poll has returned no longer counts
//! against its tenant's cap (it stays readable, and in the server's count,
//! until its TTL), so a client that fetches its results is not held back;
//! a tenant keeps at most [`KEPT_PER_HELD`] times its cap, fetched included.
//! Task ids are tenant-scoped: another tenant's poll is told "unknown task",
//! exactly as for an id that never existed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask, TaskStatus};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::access::caller::Caller;
use crate::mcp::results::failure;
use crate::ops::error::OpsError;

/// The status message of a running task holds at most this much of the
/// run's latest output (a poll every second must stay cheap to answer).
const TAIL_BYTES: usize = 4096;
/// Bounds of the keys: a threshold beyond a minute misses the clients it
/// is for; a TTL must outlast the longest run and not keep results for days.
const MAX_THRESHOLD_MS: u64 = 60_000;
const MAX_TTL_SECONDS: u64 = 24 * 3600;
const MAX_TASKS_TOTAL: usize = 100_000;
/// Tasks one tenant may have kept, fetched ones included, per task it may
/// hold: fetching frees a place under the tenant's cap, but the results stay
/// (readable again) for their TTL, and one tenant churning through tasks
/// must not fill the server's `max_total` and turn tasks off for everyone.
const KEPT_PER_HELD: usize = 4;
/// A group of tenants that anyone can join in numbers (guests, or without
/// keys the clients' addresses) keeps at most this share of `max_total`
/// (here a half), so that the many cannot turn tasks off for the others.
const GROUP_SHARE: usize = 2;

/// The group a tenant's tasks count in: all guests together, all addresses
/// together, and a configured key alone.
fn group_of(owner: &str) -> &str {
    use crate::access::caller::GUEST_PREFIX;
    match owner {
        o if o.starts_with(GUEST_PREFIX) => GUEST_PREFIX,
        o if o.starts_with("ip:") => "ip:",
        o => o,
    }
}

/// `[tasks]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// Offer the tasks extension to clients that declare it.
    pub enabled: bool,
    /// A long call still running after this long becomes a task (0: at once).
    pub threshold_ms: u64,
    /// How long a task lives from its creation (a run still going then is
    /// ended and the task failed), and how long a finished task's result is
    /// kept after it finished.
    pub ttl_seconds: u64,
    /// Tasks one tenant may hold, running or finished within their TTL.
    pub max_per_tenant: usize,
    /// Tasks the whole server may hold.
    pub max_total: usize,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold_ms: 10_000,
            ttl_seconds: 3600,
            max_per_tenant: 16,
            max_total: 1024,
        }
    }
}

/// A bad `[tasks]` section; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TasksConfigError {
    #[error("tasks.threshold_ms: at most {MAX_THRESHOLD_MS}")]
    Threshold,
    #[error(
        "tasks.ttl_seconds: at least the longest run ({0} s: sandbox.max_exec_timeout_seconds \
         or sandbox.install_timeout_seconds) and at most {MAX_TTL_SECONDS}"
    )]
    Ttl(u64),
    #[error("tasks.max_per_tenant: at least 1 and at most tasks.max_total")]
    PerTenant,
    #[error("tasks.max_total: at most {MAX_TASKS_TOTAL}")]
    Total,
}

impl TasksConfig {
    /// `longest_run_seconds`: the longest execution or install the server
    /// allows, which a task's TTL must outlast.
    pub fn validate(&self, longest_run_seconds: u64) -> Result<(), TasksConfigError> {
        if self.threshold_ms > MAX_THRESHOLD_MS {
            return Err(TasksConfigError::Threshold);
        }
        if !(longest_run_seconds..=MAX_TTL_SECONDS).contains(&self.ttl_seconds) {
            return Err(TasksConfigError::Ttl(longest_run_seconds));
        }
        if self.max_per_tenant == 0 || self.max_per_tenant > self.max_total {
            return Err(TasksConfigError::PerTenant);
        }
        if self.max_total > MAX_TASKS_TOTAL {
            return Err(TasksConfigError::Total);
        }
        Ok(())
    }
}

/// The latest output of a run, for the status message of its task.
#[derive(Default)]
struct Tail {
    text: String,
    /// The call has become a task: its request has been answered, so its
    /// progress notifications would go nowhere.
    detached: bool,
}

/// A run's output tail, shared by its progress forwarder and its task.
#[derive(Clone, Default)]
pub struct Output(Arc<Mutex<Tail>>);

impl Output {
    /// Appends output, keeping the last [`TAIL_BYTES`] (on a character boundary).
    pub fn push(&self, text: &str) {
        let mut tail = self.0.lock().expect("tail lock");
        tail.text.push_str(text);
        if tail.text.len() > TAIL_BYTES {
            let mut cut = tail.text.len() - TAIL_BYTES;
            while !tail.text.is_char_boundary(cut) {
                cut += 1;
            }
            tail.text.drain(..cut);
        }
    }

    /// Whether the call has become a task (progress notifications stop).
    pub fn detached(&self) -> bool {
        self.0.lock().expect("tail lock").detached
    }

    fn detach(&self) {
        self.0.lock().expect("tail lock").detached = true;
    }

    fn text(&self) -> String {
        self.0.lock().expect("tail lock").text.clone()
    }
}

/// A task, or a slot taken for a call that may become one.
struct Held {
    owner: String,
    output: Output,
    /// A task in the store, not just a slot.
    spawned: bool,
    /// Its end has been returned to a poll: it no longer counts against
    /// its tenant.
    fetched: bool,
}

struct Inner {
    config: TasksConfig,
    manager: TaskManager,
    /// By task id (or slot id until the call becomes a task).
    held: Mutex<HashMap<String, Held>>,
}

/// The server's tasks, shared by every session (a tenant's cap spans them).
#[derive(Clone)]
pub struct Tasks(Arc<Inner>);

/// A slot for a call that may become a task; freed on drop unless it did.
pub struct Admission {
    tasks: Tasks,
    slot: String,
    owner: String,
    output: Output,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut held = self.tasks.0.held.lock().expect("tasks lock");
        if held.get(&self.slot).is_some_and(|h| !h.spawned) {
            held.remove(&self.slot);
        }
    }
}

impl Admission {
    pub fn output(&self) -> Output {
        self.output.clone()
    }
}

impl Tasks {
    pub fn new(config: TasksConfig) -> Self {
        Self(Arc::new(Inner {
            config,
            manager: TaskManager::new(),
            held: Mutex::default(),
        }))
    }

    pub fn enabled(&self) -> bool {
        self.0.config.enabled
    }

    /// Whether a call of this request may become a task: the server offers
    /// the extension and the client declared it.
    pub fn offered(&self, ctx: &RequestContext<RoleServer>) -> bool {
        self.enabled() && ctx.client_capabilities().is_some_and(|c| c.supports_tasks())
    }

    /// How long an install called by a tasks client waits for the install
    /// to end: as long as its task may live (the install's own timeout
    /// ends it sooner).
    pub fn install_wait(&self) -> Duration {
        Duration::from_secs(self.0.config.ttl_seconds)
    }

    /// A slot for a call from a client that declared the extension; `None`
    /// (a plain call) for other clients, and once the caller or the server
    /// holds its most tasks.
    pub fn admit(&self, ctx: &RequestContext<RoleServer>, caller: &Caller) -> Option<Admission> {
        if !self.offered(ctx) {
            return None;
        }
        let config = &self.0.config;
        let mut held = self.0.held.lock().expect("tasks lock");
        // Finished tasks past their retention leave the store (its sweep
        // runs on every call into it); free their places here too.
        held.retain(|id, h| !h.spawned || self.0.manager.get_task(id).is_ok());
        let (mut tenant_holds, mut tenant_keeps) = (0, 0);
        for h in held.values().filter(|h| h.owner == caller.owner) {
            tenant_keeps += 1;
            tenant_holds += usize::from(!h.fetched);
        }
        let group = group_of(&caller.owner);
        let group_keeps = held.values().filter(|h| group_of(&h.owner) == group).count();
        if held.len() >= config.max_total
            || tenant_holds >= config.max_per_tenant
            || tenant_keeps >= KEPT_PER_HELD * config.max_per_tenant
            || (group != caller.owner && group_keeps >= (config.max_total / GROUP_SHARE).max(1))
        {
            tracing::debug!(tenant = %caller.owner, tenant_holds, tenant_keeps, group_keeps, total = held.len(), "tasks at their cap: a plain call");
            return None;
        }
        let slot = Uuid::new_v4().to_string();
        let output = Output::default();
        held.insert(
            slot.clone(),
            Held {
                owner: caller.owner.clone(),
                output: output.clone(),
                spawned: false,
                fetched: false,
            },
        );
        Some(Admission {
            tasks: self.clone(),
            slot,
            owner: caller.owner.clone(),
            output,
        })
    }

    /// Runs a call: to its end when it has no slot or ends within the
    /// threshold, else as a task whose handle is the answer. A cancelled
    /// request ends the run while it is the request's; a task's run ends with
    /// `tasks/cancel` or its TTL (dropping the run interrupts it).
    pub async fn run(
        &self,
        admission: Option<Admission>,
        request: &CancellationToken,
        work: impl Future<Output = CallToolResult> + Send + 'static,
    ) -> CallToolResponse {
        let mut work = Box::pin(work);
        let threshold = Duration::from_millis(self.0.config.threshold_ms);
        tokio::select! {
            result = &mut work => return result.into(),
            _ = request.cancelled() => {
                return failure(&OpsError::InvalidArgument("the request was cancelled".into())).into()
            }
            _ = tokio::time::sleep(threshold), if admission.is_some() => {}
        }
        let admission = admission.expect("only a call with a slot waits for the threshold");
        let options = TaskOptions::new().with_ttl_ms(self.0.config.ttl_seconds * 1000);
        admission.output.detach();
        // The slot becomes the task under one lock, so no poll sees neither.
        let task = {
            let mut held = self.0.held.lock().expect("tasks lock");
            let task = self.0.manager.spawn(options, move |ctx| {
                Box::pin(async move {
                    tokio::select! {
                        result = work => Ok(result),
                        _ = ctx.cancelled() => Err(TaskExit::Cancelled),
                    }
                })
            });
            held.remove(&admission.slot);
            held.insert(
                task.task_id.clone(),
                Held {
                    owner: admission.owner.clone(),
                    output: admission.output.clone(),
                    spawned: true,
                    fetched: false,
                },
            );
            task
        };
        CallToolResponse::Task(CreateTaskResult::new(task))
    }

    /// `tasks/get` for the caller's own task: a running one carries the tail
    /// of its output as its status message; a finished one, once returned,
    /// frees its place under the tenant's cap.
    pub fn get(&self, caller: &Caller, task_id: &str) -> Result<DetailedTask, McpError> {
        let output = self.own(caller, task_id)?;
        let mut task = self.0.manager.get_task(task_id)?;
        match task.status() {
            TaskStatus::Working => task.task.status_message = Some(output.text()),
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled => {
                if let Some(h) = self.0.held.lock().expect("tasks lock").get_mut(task_id) {
                    h.fetched = true;
                }
            }
            _ => {}
        }
        Ok(task)
    }

    /// `tasks/cancel` for the caller's own task.
    pub fn cancel(&self, caller: &Caller, task_id: &str) -> Result<(), McpError> {
        self.own(caller, task_id)?;
        self.0.manager.cancel_task(task_id)
    }

    /// `tasks/update` for the caller's own task (these tools ask for no
    /// input, so there is nothing to deliver, but the id is still checked).
    pub fn update(
        &self,
        caller: &Caller,
        task_id: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), McpError> {
        self.own(caller, task_id)?;
        self.0.manager.update_task(task_id, responses)
    }

    /// The output of the caller's task; another tenant's id is as unknown as
    /// an id that never was (the store's own error for that).
    fn own(&self, caller: &Caller, task_id: &str) -> Result<Output, McpError> {
        let held = self.0.held.lock().expect("tasks lock");
        match held.get(task_id) {
            Some(h) if h.spawned && h.owner == caller.owner => Ok(h.output.clone()),
            _ => Err(McpError::invalid_params(format!("unknown task: {task_id}"), None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_latest_output_on_a_character_boundary() {
        let out = Output::default();
        out.push(&"é".repeat(TAIL_BYTES));
        out.push("end");
        let text = out.text();
        assert!(text.len() <= TAIL_BYTES && text.ends_with("end"));
    }

    #[test]
    fn bounds_are_validated() {
        let ok = TasksConfig::default();
        assert!(ok.validate(600).is_ok());
        assert!(ok.validate(7200).unwrap_err().to_string().contains("tasks.ttl_seconds"));
        let per_tenant = TasksConfig {
            max_per_tenant: 2000,
            ..ok.clone()
        };
        assert!(per_tenant
            .validate(600)
            .unwrap_err()
            .to_string()
            .contains("max_per_tenant"));
        let threshold = TasksConfig {
            threshold_ms: 120_000,
            ..ok
        };
        assert!(threshold.validate(600).is_err());
    }
}
