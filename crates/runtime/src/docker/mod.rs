//! [`ContainerRuntime`] on the Docker Engine API (bollard): the runtime,
//! its start and the trait's calls (here), split by concern: the server's
//! bridge network and the joins to it (`network`), what a container is made
//! of (`spec`), its cgroup read from the host (`cgroups`), and the installer
//! container (`installer`).

mod cgroups;
mod installer;
mod network;
mod spec;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Ipam, IpamConfig, NetworkCreateRequest, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, RestartContainerOptionsBuilder, StatsOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use uuid::Uuid;

use sandbox_egress::{Rules, EGRESS_SOCKET_NAME};
use sandbox_host::addresses::{host_networks, name_servers, resolver_config};
use sandbox_host::bridge::{self, Bridge, Holder};
use sandbox_host::syscalls::Syscalls;
use sandbox_host::{agent_dir, firewall, SANDBOX_UID};

use crate::agent::{AgentClient, AGENT_DIR_IN_CONTAINER, RESULTS_IN_CONTAINER, SOCKET_NAME};
use crate::config::{SandboxConfig, AUTO_OCI_RUNTIME};
use crate::ports::{self, PortError, PortStream};
use crate::template::{Definition, Template};
use crate::{image, labels, spans};
use crate::{
    ContainerRef, ContainerRuntime, ContainerState, Installed, Labelled, Result, RuntimeError, SandboxPaths, Usage,
};
use cgroups::{cgroup_counters, cgroup_frozen, cgroup_peak_mark, cgroup_pid, cgroup_usage};
use spec::LOOPBACK_HOSTS;

/// Writes a file that sandboxes mount read-only (`/etc/hosts`,
/// `/etc/resolv.conf`), readable by the sandbox user whatever the server's
/// umask, beside it and then renamed into place: a running sandbox keeps
/// the file it mounted, never a half-written one.
fn write_mounted(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let part = path.with_extension("part");
    std::fs::write(&part, text)
        .and_then(|()| std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o644)))
        .and_then(|()| std::fs::rename(&part, path))
        .map_err(|source| RuntimeError::File {
            path: path.to_path_buf(),
            source,
        })
}

/// How long `sandbox.runtime = "auto"` waits for its trial container.
const RUNTIME_PROBE_DEADLINE: Duration = Duration::from_secs(30);
pub struct DockerRuntime {
    docker: Docker,
    server_id: String,
    config: SandboxConfig,
    image: String,
    /// The server's own bridge network, once [`Self::isolate_network`] made it.
    network: Option<String>,
    /// The server's folder of agent sockets, one folder per sandbox.
    agents: PathBuf,
    /// [`LOOPBACK_HOSTS`], in the state folder, mounted read-only.
    loopback_hosts: PathBuf,
    /// Where [`Self::isolate_network`] could set it up: the server joins
    /// `open` sandboxes to its network itself (see [`bridge`]); without it
    /// the engine does.
    bridge: Option<Bridge>,
    /// The `resolv.conf` of sandboxes the server joins to its network.
    resolv_conf: PathBuf,
    /// What the firewall rules are written through.
    host: Arc<dyn Syscalls>,
}

impl DockerRuntime {
    /// Connects to the local engine and agrees on an API version (bollard
    /// does not put one in request paths otherwise), and writes the
    /// loopback `/etc/hosts` of sandboxes without a network into the state
    /// folder.
    /// `state_dir` is the server's own folder, `agents` its folder of agent
    /// sockets (one folder per sandbox).
    /// `host` makes the firewall rules of the sandbox network.
    pub async fn connect(
        server_id: &str,
        config: &SandboxConfig,
        state_dir: &Path,
        agents: PathBuf,
        host: Arc<dyn Syscalls>,
    ) -> Result<Self> {
        let docker = Docker::connect_with_local_defaults()?.negotiate_version().await?;
        docker.ping().await?;
        let config = config.clone();
        let image = image::tag(&config);
        let loopback_hosts = state_dir.join("hosts");
        write_mounted(&loopback_hosts, LOOPBACK_HOSTS)?;
        Ok(Self {
            docker,
            server_id: server_id.to_string(),
            config,
            image,
            network: None,
            agents,
            host,
            loopback_hosts,
            bridge: None,
            resolv_conf: state_dir.join("resolv.conf"),
        })
    }

    /// This server's containers: all of them, or the running ones.
    async fn server_containers(&self, all: bool) -> Result<Vec<bollard::models::ContainerSummary>> {
        self.containers_labelled(&labels::server_filter(&self.server_id), all)
            .await
    }

    /// The containers the engine selects by `filters`: all of them, or the
    /// running ones.
    async fn containers_labelled(
        &self,
        filters: &HashMap<String, Vec<String>>,
        all: bool,
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        let options = ListContainersOptionsBuilder::default()
            .all(all)
            .filters(filters)
            .build();
        Ok(self.docker.list_containers(Some(options)).await?)
    }

    /// Replaces `sandbox.runtime = "auto"` with crun where the engine has
    /// it registered and it runs a container of the sandbox image here,
    /// and with runc otherwise; returns the runtime sandboxes run under.
    /// crun's create and start is 15 to 20 % below runc's on this project's
    /// machines (docs/benchmarks.md), with the same confinement; a crun
    /// that is registered but cannot start containers on this host (a
    /// cgroup layout it does not support, say) must not fail every
    /// creation, so it is tried first. Needs the image.
    pub async fn choose_oci_runtime(&mut self) -> Result<String> {
        if self.config.runtime == AUTO_OCI_RUNTIME {
            let crun = self.oci_runtimes().await?.iter().any(|r| r == "crun") && self.runs_under("crun").await;
            self.config.runtime = if crun { "crun" } else { "runc" }.into();
            tracing::info!(runtime = %self.config.runtime, "sandbox.runtime \"auto\": chose the OCI runtime");
        }
        Ok(self.config.runtime.clone())
    }

    /// Whether a bare container of the sandbox image (networking disabled,
    /// labelled as the server's, so that a start killed meanwhile leaves
    /// nothing the next one keeps) runs `true` under `runtime` within
    /// [`RUNTIME_PROBE_DEADLINE`].
    async fn runs_under(&self, runtime: &str) -> bool {
        let name = format!("mcp-sandbox-{}-probe-{runtime}", self.server_id);
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(vec!["true".into()]),
            network_disabled: Some(true),
            labels: Some(labels::for_server(&self.server_id)),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                runtime: Some(runtime.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ran = async {
            // One of a start that was killed would hold the name.
            let _ = self.remove(&name, None).await;
            let options = CreateContainerOptionsBuilder::default().name(&name).build();
            let id = self.docker.create_container(Some(options), body).await?.id;
            self.docker.start_container(&id, None).await?;
            // A non-zero exit arrives as an error.
            self.docker.wait_container(&id, None).next().await.transpose()?;
            Ok::<_, bollard::errors::Error>(())
        };
        let ran = tokio::time::timeout(RUNTIME_PROBE_DEADLINE, ran).await;
        let _ = self.remove(&name, None).await;
        match ran {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(runtime, error = %e, "the runtime is registered but could not run a container; not using it");
                false
            }
            Err(_) => {
                tracing::warn!(
                    runtime,
                    "the runtime is registered but ran no container within {RUNTIME_PROBE_DEADLINE:?}; not using it"
                );
                false
            }
        }
    }

    /// The OCI runtime of a sandbox made from `template`.
    fn oci_runtime<'a>(&'a self, template: Option<&'a Template>) -> &'a str {
        template
            .and_then(|t| t.runtime.as_deref())
            .unwrap_or(&self.config.runtime)
    }

    /// Builds the sandbox image unless it is present (see [`image`]).
    pub async fn ensure_image(&self, scratch: &Path) -> Result<String> {
        image::ensure(&self.docker, &self.config, &self.image, scratch).await?;
        Ok(self.image.clone())
    }
}

fn labelled_sandbox(labels: Option<&HashMap<String, String>>) -> Option<Uuid> {
    labels?.get(labels::SANDBOX).and_then(|v| Uuid::parse_str(v).ok())
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
    )
}

/// The engine is already removing it (a removal begun by an earlier server).
fn is_being_removed(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 409, message } if message.contains("already in progress")
    )
}

#[async_trait]
impl ContainerRuntime for DockerRuntime {
    async fn ping(&self) -> Result<()> {
        self.docker.ping().await?;
        Ok(())
    }

    async fn create(&self, paths: &SandboxPaths, volume: Option<&str>) -> Result<ContainerRef> {
        // Taken first: a range with no address left makes nothing.
        let address = match (&paths.egress, &self.bridge) {
            (None, Some(bridge)) => Some(bridge.take(paths.id)?),
            _ => None,
        };
        self.make(paths, volume, address).await
    }

    async fn start(&self, container_id: &str) -> Result<()> {
        spans::engine("start", self.docker.start_container(container_id, None)).await?;
        self.rejoin(container_id).await
    }

    async fn state(&self, container_id: &str) -> Result<ContainerState> {
        let inspect = match self.docker.inspect_container(container_id, None).await {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Ok(ContainerState::Missing),
            Err(e) => return Err(e.into()),
        };
        let state = inspect.state.unwrap_or_default();
        Ok(if state.paused == Some(true) {
            ContainerState::Paused
        } else if state.running == Some(true) {
            ContainerState::Running
        } else {
            ContainerState::Stopped {
                exit_code: state.exit_code.unwrap_or(-1),
                oom_killed: state.oom_killed.unwrap_or(false),
            }
        })
    }

    async fn started_state(&self, container_id: &str) -> Result<ContainerState> {
        match cgroup_frozen(container_id) {
            Some(true) => Ok(ContainerState::Paused),
            Some(false) => Ok(ContainerState::Running),
            None => self.state(container_id).await,
        }
    }

    fn counters(&self, container_id: &str) -> Option<crate::counters::Counters> {
        cgroup_counters(container_id)
    }

    fn peak_mark(&self, container_id: &str) -> Option<crate::counters::PeakMark> {
        cgroup_peak_mark(container_id)
    }

    async fn usage(&self, container_id: &str) -> Result<Usage> {
        if let Some(usage) = cgroup_usage(container_id) {
            return Ok(usage);
        }
        let options = StatsOptionsBuilder::default().stream(false).one_shot(true).build();
        let stats = self
            .docker
            .stats(container_id, Some(options))
            .next()
            .await
            .ok_or(RuntimeError::NoStatistics)??;
        let cpu_ns = stats.cpu_stats.and_then(|c| c.cpu_usage).and_then(|u| u.total_usage);
        let memory = stats.memory_stats.unwrap_or_default();
        let cache = memory
            .stats
            .as_ref()
            .and_then(|s| s.get("inactive_file").or_else(|| s.get("total_inactive_file")).copied())
            .unwrap_or(0);
        // None for a container the engine does not network (proxied, or
        // joined to the bridge by the server): it has no counters of it.
        let network_bytes = stats.networks.map(|networks| {
            networks
                .values()
                .map(|n| n.rx_bytes.unwrap_or(0) + n.tx_bytes.unwrap_or(0))
                .sum::<u64>()
        });
        Ok(Usage {
            cpu_seconds: cpu_ns.unwrap_or(0) as f64 / 1e9,
            memory_bytes: memory.usage.unwrap_or(0).saturating_sub(cache),
            memory_limit_bytes: memory.limit.unwrap_or(0),
            network_bytes,
        })
    }

    async fn pause(&self, container_id: &str) -> Result<()> {
        Ok(spans::engine("pause", self.docker.pause_container(container_id)).await?)
    }

    async fn unpause(&self, container_id: &str) -> Result<()> {
        Ok(spans::engine("unpause", self.docker.unpause_container(container_id)).await?)
    }

    async fn restart(&self, container_id: &str) -> Result<()> {
        let options = RestartContainerOptionsBuilder::default().t(0).build();
        spans::engine("restart", self.docker.restart_container(container_id, Some(options))).await?;
        self.rejoin(container_id).await
    }

    async fn remove(&self, container_id: &str, volume: Option<&str>) -> Result<()> {
        let options = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match spans::engine("remove", self.docker.remove_container(container_id, Some(options))).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) || is_being_removed(&e) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some((address, sandbox)) = self.bridge.as_ref().and_then(|b| b.address_of_container(container_id)) {
            self.give_back(address, sandbox).await;
        }
        if let Some(volume) = volume {
            self.remove_volume(volume).await?;
        }
        Ok(())
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        let options = RemoveVolumeOptionsBuilder::default().force(true).build();
        // Removal of a container is asynchronous inside the engine for a
        // moment; a volume still "in use" is retried briefly.
        for attempt in 0..20 {
            match self.docker.remove_volume(name, Some(options.clone())).await {
                Ok(()) => return Ok(()),
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) if attempt == 19 => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(())
    }

    async fn oci_runtimes(&self) -> Result<Vec<String>> {
        let registered = self.docker.info().await?.runtimes.unwrap_or_default();
        let mut names: Vec<String> = registered.into_keys().collect();
        names.sort();
        Ok(names)
    }

    async fn list_containers(&self) -> Result<Vec<Labelled>> {
        Ok(self
            .server_containers(true)
            .await?
            .into_iter()
            .filter_map(|c| {
                let sandbox = labelled_sandbox(c.labels.as_ref());
                c.id.map(|id| Labelled { id, sandbox })
            })
            .collect())
    }

    async fn sandbox_containers(&self, sandbox: Uuid) -> Result<Vec<String>> {
        let filters = labels::sandbox_filter(&self.server_id, sandbox);
        let listed = self.containers_labelled(&filters, true).await?;
        Ok(listed.into_iter().filter_map(|c| c.id).collect())
    }

    async fn list_volumes(&self) -> Result<Vec<Labelled>> {
        let filters = labels::server_filter(&self.server_id);
        let options = ListVolumesOptionsBuilder::default().filters(&filters).build();
        let list = self.docker.list_volumes(Some(options)).await?;
        Ok(list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| Labelled {
                sandbox: labelled_sandbox(Some(&v.labels)),
                id: v.name,
            })
            .collect())
    }

    async fn upload(&self, container_id: &str, dest_dir: &str, tar: Vec<u8>) -> Result<()> {
        let options = UploadToContainerOptionsBuilder::default().path(dest_dir).build();
        let upload = self
            .docker
            .upload_to_container(container_id, Some(options), bollard::body_full(tar.into()));
        spans::engine("upload", upload).await?;
        Ok(())
    }

    async fn run_installer(
        &self,
        paths: &SandboxPaths,
        volume: &str,
        argv: Vec<String>,
        timeout: Duration,
    ) -> Result<Installed> {
        self.install(paths, volume, argv, timeout).await
    }

    async fn release(&self) -> Result<()> {
        if let Some(network) = &self.network {
            let (host, server_id) = (self.host.clone(), self.server_id.clone());
            let removed = tokio::task::spawn_blocking(move || firewall::remove(host.as_ref(), &server_id)).await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(error = %e, "could not remove host firewall rules");
            }
            match self.docker.remove_network(network).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn connect_agent(&self, sandbox: Uuid) -> std::io::Result<AgentClient> {
        let socket = agent_dir(&self.agents, sandbox).join(SOCKET_NAME);
        AgentClient::connect(&socket, self.config.output_cap_bytes).await
    }

    async fn open_port(&self, paths: &SandboxPaths, port: u16) -> Result<PortStream, PortError> {
        // gVisor keeps a sandbox's sockets in its own kernel: they cannot
        // be passed out, so its agent relays.
        let relay = self.oci_runtime(paths.template.as_deref()) == "runsc";
        ports::open_port(&agent_dir(&self.agents, paths.id).join(SOCKET_NAME), port, relay).await
    }

    async fn ensure_template(
        &self,
        definition: &Definition,
        progress: &(dyn for<'l> Fn(&'l str) + Send + Sync),
    ) -> Result<(String, bool)> {
        let tag = definition.tag(&self.config, &self.server_id, &self.image);
        let built = image::ensure_template(
            &self.docker,
            &self.server_id,
            &self.config,
            definition,
            &tag,
            &self.image,
            progress,
        )
        .await?;
        Ok((tag, built))
    }

    async fn remove_unused_templates(&self, keep: &HashSet<String>) -> Result<Vec<String>> {
        image::remove_unused_templates(&self.docker, &self.server_id, keep).await
    }
}
