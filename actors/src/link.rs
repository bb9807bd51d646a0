//! A sandbox's connection to its agent, with recovery: when the connection is
//! gone, the container is inspected and started, unpaused or re-created (its
//! package volume and results folder are kept), and the run is sent again
//! only when it provably never reached the agent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent::{AgentClient, AgentError, Progress, RunOutput, Work};
use crate::context::{Context, Counters};
use crate::error::{Result, SandboxError};
use crate::runtime::{ContainerState, SandboxPaths};

/// How long a (re)started container may take until its agent answers.
const AGENT_START: Duration = Duration::from_secs(30);
/// Slack beyond the agent's own timeout and grace before the host gives up.
const WATCHDOG_SLACK: Duration = Duration::from_secs(15);
/// How long to wait for an agent that still finishes an abandoned run.
const BUSY_WAIT: Duration = Duration::from_secs(10);

pub struct Link {
    ctx: Arc<Context>,
    pub paths: SandboxPaths,
    pub container_id: String,
    pub volume: String,
    client: Option<AgentClient>,
    /// Whether this link has talked to the agent: losing a connection after
    /// that means the Python state went with it.
    connected_before: bool,
    /// The container is frozen (idle parking); the next call thaws it.
    paused: bool,
}

/// A run's output and what happened to the sandbox on the way.
#[derive(Debug)]
pub struct Ran {
    pub output: RunOutput,
    pub notice: Option<String>,
}

impl Link {
    pub fn new(ctx: Arc<Context>, paths: SandboxPaths, container_id: String, volume: String) -> Self {
        Self {
            ctx,
            paths,
            container_id,
            volume,
            client: None,
            connected_before: false,
            paused: false,
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Freezes the idle container: memory stays, CPU use drops to zero.
    pub async fn pause(&mut self) -> Result<()> {
        if !self.paused {
            self.ctx.runtime.pause(&self.container_id).await?;
            self.paused = true;
        }
        Ok(())
    }

    /// Thaws the container if this link froze it (or found it frozen).
    pub async fn wake(&mut self) -> Result<()> {
        if self.paused {
            self.ctx.runtime.unpause(&self.container_id).await?;
            self.paused = false;
        }
        Ok(())
    }

    /// Records that the container was found frozen (by an earlier server).
    pub fn found_paused(&mut self) {
        self.paused = true;
    }

    pub fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Runs `work`; a cancelled `cancel` interrupts it (the agent answers
    /// with what ran so far).
    pub async fn run(
        &mut self,
        work: &Work,
        timeout: Duration,
        progress: Option<&mpsc::Sender<Progress>>,
        cancel: &CancellationToken,
    ) -> Result<Ran> {
        let cap = self.ctx.settings.sandbox.output_cap_bytes;
        let mut notices: Vec<String> = Vec::new();
        let mut resent = false;
        let busy_until = tokio::time::Instant::now() + BUSY_WAIT;
        self.wake().await?;
        loop {
            if let Some(n) = self.connect().await? {
                notices.push(n);
            }
            let result = {
                let client = self.client.as_mut().expect("connected");
                let interrupter = client.interrupter();
                let watchdog = timeout + WATCHDOG_SLACK;
                let run = client.run(work, timeout.as_secs_f64(), cap, progress);
                tokio::pin!(run);
                let mut interrupted = false;
                loop {
                    tokio::select! {
                        r = tokio::time::timeout(watchdog, &mut run) => break r,
                        _ = cancel.cancelled(), if !interrupted => {
                            interrupted = true;
                            interrupter.interrupt().await;
                        }
                    }
                }
            };
            match result {
                Ok(Ok(output)) => {
                    self.connected_before = true;
                    return Ok(Ran {
                        output,
                        notice: join(notices),
                    });
                }
                Ok(Err(AgentError::Send(e))) if !resent => {
                    // Nothing reached the agent: reconnect (restarting the
                    // container if it died) and send the same run once more.
                    info!(sandbox = %self.paths.id, error = %e, "agent connection lost; reconnecting");
                    self.drop_client();
                    resent = true;
                }
                Ok(Err(AgentError::Busy)) if tokio::time::Instant::now() < busy_until => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Err(AgentError::Receive(e))) => {
                    warn!(sandbox = %self.paths.id, error = %e, "the sandbox stopped during a run");
                    self.drop_client();
                    return self.died_during_run(notices).await;
                }
                Ok(Err(e)) => {
                    self.drop_client();
                    return Err(SandboxError::Agent(e.to_string()));
                }
                Err(_elapsed) => {
                    warn!(sandbox = %self.paths.id, "agent unresponsive past its timeout; restarting the container");
                    self.drop_client();
                    Counters::bump(&self.ctx.counters.container_restarts);
                    let _ = self.ctx.runtime.restart(&self.container_id).await;
                    return self.died_during_run(notices).await;
                }
            }
        }
    }

    /// Restarts the container on request: processes and Python state go,
    /// files and packages stay. Answers once the agent is back.
    pub async fn restart(&mut self) -> Result<()> {
        self.wake().await?;
        self.drop_client();
        Counters::bump(&self.ctx.counters.container_restarts);
        self.ctx.runtime.restart(&self.container_id).await?;
        self.client = Some(wait_for_agent(&self.ctx, &self.paths, &self.container_id).await?);
        Ok(())
    }

    /// Lists the venv's distributions over a short-lived second connection,
    /// so it works while a run holds the main one.
    pub async fn packages(ctx: &Context, paths: &SandboxPaths) -> Result<Vec<crate::agent::Package>> {
        let mut client = ctx
            .runtime
            .connect_agent(paths)
            .await
            .map_err(|e| SandboxError::Agent(format!("the sandbox is not running ({e})")))?;
        client.packages().await.map_err(|e| SandboxError::Agent(e.to_string()))
    }

    fn drop_client(&mut self) {
        self.client = None;
    }

    /// The result of a run whose container stopped under it (the memory
    /// limit killed the agent, or someone killed the container). The sandbox
    /// is brought back so that the next call works.
    async fn died_during_run(&mut self, mut notices: Vec<String>) -> Result<Ran> {
        let state = self.ctx.runtime.state(&self.container_id).await?;
        let (exit_code, why) = match state {
            ContainerState::Stopped { oom_killed: true, .. } => (137, "it ran out of memory"),
            ContainerState::Stopped { exit_code, .. } => (exit_code.max(1), "it stopped"),
            _ => (137, "it stopped answering"),
        };
        if let Some(n) = self.connect().await? {
            notices.push(n);
        }
        let output = RunOutput {
            stderr: format!(
                "[mcp-sandbox] The sandbox's container was restarted during this run because {why}. \
                 Files in /app/results and installed packages are kept; Python variables were lost.\n"
            ),
            exit_code,
            state_lost: true,
            ..Default::default()
        };
        Ok(Ran {
            output,
            notice: join(notices),
        })
    }

    /// Makes sure a connection is open; says what had to be done for it.
    async fn connect(&mut self) -> Result<Option<String>> {
        if self.client.is_some() {
            return Ok(None);
        }
        let lost_state = self.connected_before;
        if let Ok(client) = self.ctx.runtime.connect_agent(&self.paths).await {
            self.client = Some(client);
            return Ok(lost_state.then(|| {
                "The sandbox's agent was restarted since your last call: Python variables were lost; files and packages are kept.".to_string()
            }));
        }
        let runtime = &self.ctx.runtime;
        let notice = match runtime.state(&self.container_id).await? {
            ContainerState::Running => None,
            ContainerState::Paused => {
                runtime.unpause(&self.container_id).await?;
                None
            }
            ContainerState::Stopped { exit_code, oom_killed } => {
                info!(sandbox = %self.paths.id, exit_code, oom_killed, "restarting a stopped sandbox container");
                runtime.start(&self.container_id).await?;
                Counters::bump(&self.ctx.counters.container_restarts);
                let why = if oom_killed {
                    "it ran out of memory".to_string()
                } else {
                    format!("it had stopped (exit code {exit_code})")
                };
                Some(format!(
                    "The sandbox's container was restarted because {why}. Files in /app/results and installed packages are kept; Python variables were lost."
                ))
            }
            ContainerState::Missing => {
                info!(sandbox = %self.paths.id, "re-creating a removed sandbox container");
                let created = runtime.create(&self.paths, Some(&self.volume)).await?;
                self.container_id = created.container_id;
                Counters::bump(&self.ctx.counters.container_restarts);
                Some("The sandbox's container had been removed and was re-created. Files in /app/results and installed packages are kept; Python variables were lost.".to_string())
            }
        };
        self.client = Some(wait_for_agent(&self.ctx, &self.paths, &self.container_id).await?);
        Ok(notice)
    }
}

/// Waits until a (re)started container's agent accepts a connection.
pub async fn wait_for_agent(ctx: &Context, paths: &SandboxPaths, container_id: &str) -> Result<AgentClient> {
    let deadline = tokio::time::Instant::now() + AGENT_START;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match ctx.runtime.connect_agent(paths).await {
            Ok(client) => return Ok(client),
            Err(e) => last = e.to_string(),
        }
        if let ContainerState::Stopped { exit_code, .. } = ctx.runtime.state(container_id).await? {
            return Err(SandboxError::Agent(format!(
                "the container exited (code {exit_code}) before its agent started"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(SandboxError::Agent(format!(
        "the agent did not start within {AGENT_START:?}: {last}"
    )))
}

fn join(notices: Vec<String>) -> Option<String> {
    (!notices.is_empty()).then(|| notices.join(" "))
}
