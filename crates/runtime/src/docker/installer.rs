//! The installer container: a short-lived container of the sandbox image
//! that installs packages into a sandbox's package volume, for sandboxes
//! whose policy does not reach the package index.

use super::spec::VENV_IN_CONTAINER;
use super::*;

/// How often an installer container's use is read while it runs.
const INSTALLER_READING: Duration = Duration::from_millis(250);

impl DockerRuntime {
    /// [`ContainerRuntime::run_installer`]: `argv` in an installer container
    /// on the sandbox's package volume, ended after `timeout`.
    pub(super) async fn install(
        &self,
        paths: &SandboxPaths,
        volume: &str,
        argv: Vec<String>,
        timeout: Duration,
    ) -> Result<Installed> {
        // The installer runs no user code, so it may have the network the
        // sandbox lacks: the server's own, under its firewall rules (never
        // Docker's default bridge). It always runs with runc. Its whole
        // environment is the server's: nothing on a search path or in a
        // configuration file comes from the sandbox-writable volume.
        let network = self.server_network()?.to_string();
        let mut body = self.hardened(
            paths.id,
            vec![format!("{volume}:{VENV_IN_CONTAINER}:rw")],
            &network,
            "runc",
            None,
        );
        body.cmd = Some(argv);
        body.entrypoint = Some(vec![]);
        body.working_dir = Some("/tmp".into());
        body.env.get_or_insert_with(Vec::new).extend(
            [
                "PATH=/opt/uv/bin:/usr/bin:/bin",
                "HOME=/tmp",
                "VIRTUAL_ENV=/opt/uv",
                "UV_PYTHON=/opt/uv/bin/python",
                "UV_CACHE_DIR=/tmp/uv-cache",
                "UV_NO_CONFIG=1",
                "PYTHONNOUSERSITE=1",
                "PYTHONDONTWRITEBYTECODE=1",
                "PYTHONPATH=",
                "PYTHONSTARTUP=",
            ]
            .map(String::from),
        );
        let name = format!(
            "mcp-sandbox-{}-installer-{}",
            paths.id,
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let id = spans::engine("create", self.docker.create_container(Some(options), body))
            .await?
            .id;
        let result = spans::engine("run_installer", async {
            self.docker.start_container(&id, None).await?;
            let mut wait = self.docker.wait_container(&id, None);
            // What it uses is read from its cgroup while it runs (the
            // cgroup goes with the container): its last reading is what is
            // billed, short of at most one interval.
            let deadline = tokio::time::Instant::now() + timeout;
            let mut reading = tokio::time::interval(INSTALLER_READING);
            let mut usage = Usage::default();
            // A non-zero exit arrives as an error; the state tells the code.
            let timed_out = loop {
                tokio::select! {
                    _ = wait.next() => break false,
                    _ = tokio::time::sleep_until(deadline) => break true,
                    _ = reading.tick() => {
                        if let Some(now) = cgroup_usage(&id) {
                            usage = Usage {
                                cpu_seconds: now.cpu_seconds.max(usage.cpu_seconds),
                                network_bytes: now.network_bytes.max(usage.network_bytes),
                                ..now
                            };
                        }
                    }
                }
            };
            if timed_out {
                let _ = self.docker.kill_container(&id, None).await;
            }
            let exit_code = match self.state(&id).await? {
                ContainerState::Stopped { exit_code, .. } => exit_code,
                _ => -1,
            };
            Ok(Installed {
                exit_code,
                output: self.output(&id).await,
                timed_out,
                usage,
            })
        })
        .await;
        self.remove(&id, None).await?;
        result
    }

    /// A finished container's stdout and stderr, the last `MAX_LOG` bytes.
    async fn output(&self, id: &str) -> String {
        const MAX_LOG: usize = 64 * 1024;
        let options = LogsOptionsBuilder::default().stdout(true).stderr(true).build();
        let mut logs = self.docker.logs(id, Some(options));
        let mut out: Vec<u8> = Vec::new();
        while let Some(Ok(chunk)) = logs.next().await {
            out.extend_from_slice(&chunk.into_bytes());
            if out.len() > 2 * MAX_LOG {
                out.drain(..out.len() - MAX_LOG);
            }
        }
        let start = out.len().saturating_sub(MAX_LOG);
        String::from_utf8_lossy(&out[start..]).into_owned()
    }
}
