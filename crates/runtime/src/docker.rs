//! [`ContainerRuntime`] on the Docker Engine API (bollard).

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
use sandbox_host::{agent_dir, conntrack, firewall, SANDBOX_UID};

use crate::agent::{AgentClient, AGENT_DIR_IN_CONTAINER, RESULTS_IN_CONTAINER, SOCKET_NAME};
use crate::config::{SandboxConfig, AUTO_OCI_RUNTIME};
use crate::{image, labels, spans};
use crate::{
    ContainerRef, ContainerRuntime, ContainerState, Installed, Labelled, Result, RuntimeError, SandboxPaths, Usage,
};

/// Where the sandbox image keeps the CA bundle that `ca_bundle` replaces.
const CA_IN_CONTAINER: &str = "/etc/ssl/certs/ca-certificates.crt";
const VENV_IN_CONTAINER: &str = "/app/.venv";
/// Where a proxied sandbox finds the egress proxy's socket.
const EGRESS_IN_CONTAINER: &str = "/run/mcp-egress";
/// The address the in-sandbox relay listens on.
const EGRESS_RELAY: &str = "127.0.0.1:3128";
/// The `/etc/hosts` of sandboxes the engine does not network (see
/// [`DockerRuntime::sandbox_body`]): the engine writes one only for
/// containers it gives a network, and an image's own is hidden under the
/// engine's empty placeholder, so without it `localhost` (which the proxy
/// variables exempt) would not resolve. Their host name is
/// [`SANDBOX_HOSTNAME`], resolving to a loopback address as on a Debian
/// host, since programs (servers binding to it, say) expect their own name
/// to resolve.
const LOOPBACK_HOSTS: &str = "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";
const SANDBOX_HOSTNAME: &str = "sandbox";
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
/// OOM score of sandbox processes: a host out of memory has the kernel end
/// a sandbox before the server or the engine. Raising a score needs no
/// privilege, unlike the server lowering its own.
const SANDBOX_OOM_SCORE_ADJ: i64 = 500;

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

    /// Makes this server's own labelled bridge network, for `open`
    /// sandboxes and installer containers (never Docker's default bridge),
    /// with inter-container traffic off, and with `sandbox.isolate_host`
    /// applies the host firewall rules for its subnet (see
    /// [`firewall`]). Without rules (no iptables, not root)
    /// sandboxes still run; the warning says what is lost. Returns the subnet.
    pub async fn isolate_network(&mut self) -> Result<Option<ipnet::IpNet>> {
        let subnet = self.make_network().await?;
        // Once the firewall rules are in.
        self.rejoin_running().await;
        Ok(subnet)
    }

    /// Finds or makes the server's network, chooses who joins `open`
    /// sandboxes to it, and applies the firewall rules of its subnet.
    async fn make_network(&mut self) -> Result<Option<ipnet::IpNet>> {
        let name = format!("mcp-sandbox-{}", self.server_id);
        if self.docker.inspect_network(&name, None).await.is_err() {
            self.create_network(&name).await?;
        }
        let inspect = self.docker.inspect_network(&name, None).await?;
        let ipam = inspect
            .ipam
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| c.iter().find(|c| c.subnet.is_some()))
            .cloned()
            .unwrap_or_default();
        let subnet = ipam.subnet.clone();
        self.network = Some(name.clone());
        self.bridge = match self.own_bridge(&inspect, &ipam).await {
            Ok(bridge) => {
                tracing::info!(addresses = %bridge.range(), "open sandboxes are joined to the sandbox network by the server");
                Some(bridge)
            }
            Err(why) => {
                tracing::info!(%why, "open sandboxes are joined to the sandbox network by the engine");
                None
            }
        };
        let Some(subnet) = subnet else {
            tracing::warn!(network = %name, "the sandbox network has no subnet; no firewall rules applied");
            return Ok(None);
        };
        if self.config.isolate_host {
            let listed: Vec<ipnet::IpNet> = Rules::parse(&self.config.egress_allow)
                .map_err(|e| RuntimeError::Internal(format!("sandbox.egress_allow: {e}")))?
                .nets()
                .copied()
                .collect();
            let bounds = firewall::Bounds {
                connections: self.config.egress_max_connections,
                bytes_per_minute: self.config.egress_mb_per_minute.saturating_mul(1024 * 1024),
            };
            let (host, server_id, net) = (self.host.clone(), self.server_id.clone(), subnet.clone());
            let applied =
                tokio::task::spawn_blocking(move || firewall::apply(host.as_ref(), &server_id, &net, &listed, bounds))
                    .await
                    .map_err(|e| RuntimeError::Internal(e.to_string()))?;
            match applied {
                Ok(()) => {}
                Err(e) if e.unavailable() => {
                    tracing::warn!(error = %e, "host firewall rules not applied: open sandboxes can reach the host, private networks and each other");
                }
                // The host has a firewall and refused part of the rules:
                // sandboxes are not started half-fenced.
                Err(e) => {
                    return Err(RuntimeError::Internal(format!(
                        "the host firewall rules of the sandbox network could not be applied ({e}); \
                         nothing is started without them while sandbox.isolate_host is true: \
                         check what else changes iptables on this host, then start again"
                    )))
                }
            }
        }
        Ok(subnet.parse().ok())
    }

    /// Makes the server's network: once with the subnet the engine picks,
    /// then again with that subnet and the engine's addresses limited to its
    /// lower half, so that the server hands out the upper half itself
    /// ([`bridge`]). Where the second creation fails (another network took
    /// the subnet in between), the engine's first choice is made again
    /// without the split, and the engine joins sandboxes to it.
    async fn create_network(&self, name: &str) -> Result<()> {
        let request = |ipam: Option<Ipam>| NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            labels: Some(labels::for_server(&self.server_id)),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.enable_icc".to_string(),
                "false".to_string(),
            )])),
            ipam,
            ..Default::default()
        };
        self.docker.create_network(request(None)).await?;
        let picked = self.docker.inspect_network(name, None).await?;
        let config = picked.ipam.and_then(|i| i.config).unwrap_or_default();
        let split = config.iter().find_map(|c| {
            let subnet: ipnet::Ipv4Net = c.subnet.as_ref()?.parse().ok()?;
            let (engine, _) = bridge::halves(subnet)?;
            Some(IpamConfig {
                subnet: c.subnet.clone(),
                gateway: c.gateway.clone(),
                ip_range: Some(engine.to_string()),
                ..Default::default()
            })
        });
        let Some(split) = split else { return Ok(()) };
        self.docker.remove_network(name).await?;
        let ipam = Ipam {
            config: Some(vec![split]),
            ..Default::default()
        };
        if let Err(e) = self.docker.create_network(request(Some(ipam))).await {
            tracing::warn!(error = %e, "could not make the sandbox network with the server's half of addresses");
            self.docker.create_network(request(None)).await?;
        }
        Ok(())
    }

    /// The server's joining of `open` sandboxes to `network`, or why it
    /// cannot: the network lacks the engine's half-range (made by an older
    /// version, or by hand), sandboxes run under gVisor, the server is not
    /// root, or the host resolves names only through an address a sandbox
    /// cannot reach (a local resolver such as 127.0.0.53).
    async fn own_bridge(
        &self,
        network: &bollard::models::NetworkInspect,
        ipam: &IpamConfig,
    ) -> std::result::Result<Bridge, String> {
        let subnet: ipnet::Ipv4Net = ipam
            .subnet
            .as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or("the network has no IPv4 subnet")?;
        let (engine, range) = bridge::halves(subnet).ok_or("the network's subnet is too small to share")?;
        if ipam.ip_range.as_deref() != Some(engine.to_string().as_str()) {
            return Err("the network was made without the server's half of addresses (by an older version?)".into());
        }
        let gateway: Ipv4Addr = ipam
            .gateway
            .as_deref()
            .and_then(|g| g.parse().ok())
            .ok_or("the network has no IPv4 gateway")?;
        if self.config.runtime == "runsc" {
            // gVisor copies the namespace's interfaces into its own network
            // stack once, when the container starts: one joined after
            // would never be seen.
            return Err("gVisor sees only the interfaces a container starts with".into());
        }
        if let Some(why) = bridge::cannot_join() {
            return Err(why);
        }
        let host: Vec<IpAddr> = host_networks()
            .into_iter()
            .filter(|n| n.prefix_len() == n.max_prefix_len())
            .map(|n| n.addr())
            .collect();
        let servers = bridge::reachable_name_servers(&name_servers(), &host);
        // (The firewall lets the subnet reach the same servers on port 53.)
        if servers.is_empty() {
            return Err("the host has no name server a sandbox on the bridge could reach".into());
        }
        let id = network.id.as_deref().unwrap_or_default();
        let interface = network
            .options
            .as_ref()
            .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
            .unwrap_or_else(|| format!("br-{}", id.get(..12).unwrap_or(id)));
        let mtu = std::fs::read_to_string(format!("/sys/class/net/{interface}/mtu"))
            .ok()
            .and_then(|m| m.trim().parse().ok())
            .ok_or_else(|| format!("the bridge interface {interface} is not on this host"))?;
        let host_resolv = resolver_config();
        write_mounted(&self.resolv_conf, &bridge::resolv_conf(&host_resolv, &servers)).map_err(|e| e.to_string())?;
        let taken = self.addresses_in_use().await.map_err(|e| e.to_string())?;
        // One walk of the kernel's table forgets the flows of every free
        // address (a run killed before it could forget a removed sandbox's
        // leaves them), so that their first joins need none. Through
        // netlink, which a host without conntrack's netlink module does not
        // offer.
        let held: HashSet<Ipv4Addr> = taken.iter().map(|(address, _)| *address).collect();
        let forgotten = conntrack::forget_where_off_thread(move |a| range.contains(&a) && !held.contains(&a))
            .await
            .map_err(|e| format!("the kernel's connection tracking cannot be reached over netlink: {e}"))?;
        if forgotten > 0 {
            tracing::info!(forgotten, %range, "forgot the tracked flows of the sandbox range's free addresses");
        }
        Ok(Bridge::new(interface, subnet, gateway, range, mtu, taken))
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

    /// The addresses of this server's containers that exist, and their
    /// holders, from their labels.
    async fn addresses_in_use(&self) -> Result<Vec<(Ipv4Addr, Holder)>> {
        Ok(self
            .server_containers(true)
            .await?
            .iter()
            .filter_map(|c| {
                let labels = c.labels.as_ref()?;
                let holder = Holder {
                    sandbox: labelled_sandbox(Some(labels))?,
                    container: c.id.clone(),
                };
                Some((labels.get(labels::ADDRESS)?.parse().ok()?, holder))
            })
            .collect())
    }

    /// Joins the running container `container_id` to the server's bridge
    /// at `address`, or at the address its label names (a start or restart
    /// of a container joined before); a container without one (proxied,
    /// or joined by the engine) is left as it is.
    async fn join_bridge(&self, container_id: &str, address: Option<Ipv4Addr>) -> Result<()> {
        // A creation knows the address and the container's full id, and
        // finds its processes in its cgroup, without a round trip to the
        // engine.
        if let (Some(bridge), Some(address), Some(pid)) = (&self.bridge, address, cgroup_pid(container_id)) {
            spans::engine("attach", bridge.attach(container_id, pid, address)).await?;
            return Ok(());
        }
        let inspect = self.docker.inspect_container(container_id, None).await?;
        let labelled = inspect
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(labels::ADDRESS))
            .and_then(|a| a.parse().ok());
        let Some(address) = address.or(labelled) else {
            return Ok(());
        };
        let Some(bridge) = &self.bridge else {
            return Err(bridge::AttachError::Unavailable(
                "this start of the server found it cannot (its log says why)".into(),
            )
            .into());
        };
        let pid = inspect.state.and_then(|s| s.pid).unwrap_or(0);
        let full_id = inspect.id.unwrap_or_default();
        let pid = u32::try_from(pid)
            .ok()
            .filter(|p| *p > 0)
            .ok_or(bridge::AttachError::NotRunning(0))?;
        spans::engine("attach", bridge.attach(&full_id, pid, address)).await?;
        Ok(())
    }

    /// Joins again the running containers the server joined before whose
    /// port on the bridge is missing: a server killed between a start and
    /// the join, or a container started behind the server's back. One that
    /// cannot be joined is stopped, as in [`Self::rejoin`].
    async fn rejoin_running(&self) {
        let Some(bridge) = &self.bridge else { return };
        let Ok(running) = self.server_containers(false).await else {
            return;
        };
        for container in running {
            let address = container
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::ADDRESS)?.parse().ok());
            if let (Some(id), Some(address)) = (&container.id, address) {
                if !bridge.has_port(address) {
                    let _ = self.rejoin(id).await;
                }
            }
        }
    }

    /// After a start or restart of `container_id`: joins it to the bridge
    /// again if the server joined it before. A container that could not be
    /// joined is stopped rather than left running without its network, so
    /// that the sandbox's next call starts it again.
    async fn rejoin(&self, container_id: &str) -> Result<()> {
        let joined = self.join_bridge(container_id, None).await;
        if let Err(e) = &joined {
            tracing::warn!(container = container_id, error = %e, "a started container could not be joined to the sandbox network; stopping it");
            let _ = self
                .docker
                .kill_container(container_id, None::<bollard::query_parameters::KillContainerOptions>)
                .await;
        }
        joined
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
            let registered = self.docker.info().await?.runtimes.unwrap_or_default();
            let crun = registered.contains_key("crun") && self.runs_under("crun").await;
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

    /// Builds the sandbox image unless it is present (see [`image`]).
    pub async fn ensure_image(&self, scratch: &Path) -> Result<String> {
        image::ensure(&self.docker, &self.config, &self.image, scratch).await?;
        Ok(self.image.clone())
    }

    /// Makes the sandbox's package volume unless it exists; `fresh`: its
    /// name is new (the sandbox's id is), so it is made without asking
    /// (one engine round trip fewer in every creation).
    async fn ensure_volume(&self, paths: &SandboxPaths, volume: &str, fresh: bool) -> Result<()> {
        if !fresh {
            match self.docker.inspect_volume(volume).await {
                Ok(_) => return Ok(()),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(volume.to_string()),
                labels: Some(labels::for_sandbox(&self.server_id, paths.id)),
                driver_opts: paths.packages.as_deref().map(bound_volume),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// Gives back `address`, held for `sandbox` by a container that is gone
    /// or was never made, once the kernel's tracked flows of it are
    /// forgotten (so that none reaches its next holder).
    async fn give_back(&self, address: Ipv4Addr, sandbox: Uuid) {
        if let Some(bridge) = &self.bridge {
            let forgotten = forget_flows(address).await;
            bridge.give_back(address, sandbox, forgotten);
        }
    }

    /// [`ContainerRuntime::create`] once the sandbox's address (if the
    /// server joins it to its network) is taken.
    async fn make(
        &self,
        paths: &SandboxPaths,
        volume: Option<&str>,
        address: Option<Ipv4Addr>,
    ) -> Result<ContainerRef> {
        // A new sandbox's volume is made here and goes with a failed creation.
        let (volume, own_volume) = match volume {
            Some(v) => (v.to_string(), false),
            None => (format!("mcp-sandbox-{}-venv", paths.id), true),
        };
        // Made here, labelled, when it does not exist: Docker would make a
        // missing volume itself, without labels, and nothing would remove it.
        if let Err(e) = self.ensure_volume(paths, &volume, own_volume).await {
            if let Some(address) = address {
                self.give_back(address, paths.id).await;
            }
            return Err(e);
        }
        let name = Self::container_name(paths.id);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let made = async {
            let body = self.sandbox_body(paths, &volume, address)?;
            let created = spans::engine("create", self.docker.create_container(Some(options), body)).await?;
            if let (Some(bridge), Some(address)) = (&self.bridge, address) {
                bridge.made(address, paths.id, &created.id)?;
            }
            spans::engine("start", self.docker.start_container(&created.id, None)).await?;
            if address.is_some() {
                self.join_bridge(&created.id, address).await?;
            }
            Ok::<_, RuntimeError>(created.id)
        };
        match made.await {
            Ok(container_id) => Ok(ContainerRef { container_id, volume }),
            Err(e) => {
                // By name: the engine may have made the container though
                // its answer was lost. While the engine is down this fails
                // too, and the stop's or the next start's sweep removes it;
                // its address is given back only once it is gone.
                let removed = self.remove(&name, own_volume.then_some(volume.as_str())).await;
                if let (Ok(()), Some(address)) = (removed, address) {
                    self.give_back(address, paths.id).await;
                }
                Err(e)
            }
        }
    }

    fn container_name(id: Uuid) -> String {
        format!("mcp-sandbox-{id}")
    }

    /// A hardened container of the sandbox image: all capabilities dropped,
    /// no new privileges, read-only root, size-capped `/tmp`, memory (no
    /// swap), CPU and PID limits, the sandbox user, this server's labels.
    fn hardened(&self, sandbox: Uuid, mut binds: Vec<String>, network: &str, runtime: &str) -> ContainerCreateBody {
        let c = &self.config;
        let mut env = vec![];
        if let Some(ca) = &c.ca_bundle {
            binds.push(format!("{}:{CA_IN_CONTAINER}:ro", ca.display()));
            for var in ["SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"] {
                env.push(format!("{var}={CA_IN_CONTAINER}"));
            }
        }
        let memory = (c.memory_mb * 1024 * 1024) as i64;
        let tmpfs = format!(
            "rw,nosuid,nodev,size={}m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=1777",
            c.tmp_size_mb
        );
        let host = HostConfig {
            binds: Some(binds),
            init: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([("/tmp".to_string(), tmpfs)])),
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some((c.cpus * 1e9) as i64),
            pids_limit: Some(c.pids_limit),
            network_mode: Some(network.to_string()),
            runtime: Some(runtime.to_string()),
            log_config: Some(capped_log()),
            oom_score_adj: Some(SANDBOX_OOM_SCORE_ADJ),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(self.image.clone()),
            user: Some(format!("{SANDBOX_UID}:{SANDBOX_UID}")),
            labels: Some(labels::for_sandbox(&self.server_id, sandbox)),
            env: Some(env),
            host_config: Some(host),
            ..Default::default()
        }
    }

    /// The server's bridge network; sandboxes never fall back to Docker's default one.
    fn server_network(&self) -> Result<&str> {
        self.network
            .as_deref()
            .ok_or_else(|| RuntimeError::Internal("the server's sandbox network was not set up".into()))
    }

    /// `address`: where the server joins an `open` sandbox to its bridge
    /// itself; an `open` sandbox without one joins through the engine.
    fn sandbox_body(
        &self,
        paths: &SandboxPaths,
        volume: &str,
        address: Option<Ipv4Addr>,
    ) -> Result<ContainerCreateBody> {
        let mut binds = vec![
            format!("{}:{RESULTS_IN_CONTAINER}:rw", paths.results.display()),
            format!("{}:{AGENT_DIR_IN_CONTAINER}:rw", paths.agent.display()),
            format!("{volume}:{VENV_IN_CONTAINER}:rw"),
        ];
        if paths.egress.is_none() && address.is_none() {
            let network = self.server_network()?.to_string();
            return Ok(self.hardened(paths.id, binds, &network, &self.config.runtime));
        }
        binds.push(format!("{}:/etc/hosts:ro", self.loopback_hosts.display()));
        if let Some(egress) = &paths.egress {
            binds.push(format!("{}:{EGRESS_IN_CONTAINER}:ro", egress.display()));
        } else {
            binds.push(format!("{}:/etc/resolv.conf:ro", self.resolv_conf.display()));
        }
        let mut body = self.hardened(paths.id, binds, "none", &self.config.runtime);
        body.hostname = Some(SANDBOX_HOSTNAME.into());
        // Networking disabled, not only mode "none": the container still gets
        // a namespace of its own holding only loopback, but the engine skips
        // the hook through which it would join that namespace to its network
        // controller (a start of the engine's whole binary for every
        // container: about 0.13 CPU-seconds, near half the engine's cost of
        // a create and start on a two-core host; docs/benchmarks.md). An
        // `open` sandbox is then joined to the bridge by the server.
        body.network_disabled = Some(true);
        if let Some(address) = address {
            body.labels
                .get_or_insert_with(HashMap::new)
                .insert(labels::ADDRESS.to_string(), address.to_string());
            return Ok(body);
        }
        // No interface but loopback: the agent's relay on 127.0.0.1 reaches
        // the server's proxy through the mounted socket, and the usual proxy
        // variables send pip, uv, requests and curl there.
        let env = body.env.get_or_insert_with(Vec::new);
        let proxy = format!("http://{EGRESS_RELAY}");
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push(format!("{var}={proxy}"));
        }
        for var in ["NO_PROXY", "no_proxy"] {
            env.push(format!("{var}=localhost,127.0.0.1,::1"));
        }
        env.push(format!("MCP_EGRESS_SOCKET={EGRESS_IN_CONTAINER}/{EGRESS_SOCKET_NAME}"));
        env.push(format!("MCP_EGRESS_LISTEN={EGRESS_RELAY}"));
        Ok(body)
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

/// Whether the processes of a container that has a cgroup here are frozen
/// (`docker pause`, by this server or anyone); `None` where no cgroup of it
/// is found (it stopped, or the layout is none of Docker's usual ones).
fn cgroup_frozen(container_id: &str) -> Option<bool> {
    let [v2_cgroupfs, v2_systemd, _] = cgroup_dirs(container_id)?;
    for dir in [v2_cgroupfs, v2_systemd] {
        if let Ok(events) = std::fs::read_to_string(format!("{dir}/cgroup.events")) {
            return Some(events.lines().any(|l| l.trim() == "frozen 1"));
        }
    }
    let v1 = [
        format!("/sys/fs/cgroup/freezer/docker/{container_id}/freezer.state"),
        format!("/sys/fs/cgroup/freezer/system.slice/docker-{container_id}.scope/freezer.state"),
    ];
    v1.iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|state| state.trim() != "THAWED")
}

/// CPU and memory read straight from the container's cgroup, in
/// microseconds, where the stats API takes about a second per container (it
/// samples). `None` where the layout is none of Docker's usual ones.
fn cgroup_usage(container_id: &str) -> Option<Usage> {
    let [v2_cgroupfs, v2_systemd, memory] = cgroup_dirs(container_id)?;
    let read = |path: String| std::fs::read_to_string(path).ok();
    let number = |text: Option<String>| text.and_then(|t| t.trim().parse::<u64>().ok());
    let field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    for dir in [v2_cgroupfs, v2_systemd] {
        if let Some(current) = number(read(format!("{dir}/memory.current"))) {
            let stat = read(format!("{dir}/memory.stat")).unwrap_or_default();
            let cpu_us = field(&read(format!("{dir}/cpu.stat"))?, "usage_usec");
            return Some(Usage {
                cpu_seconds: cpu_us as f64 / 1e6,
                memory_bytes: current.saturating_sub(field(&stat, "inactive_file")),
                memory_limit_bytes: number(read(format!("{dir}/memory.max"))).unwrap_or(0),
                network_bytes: network_bytes(&dir),
            });
        }
    }
    // cgroup v1.
    let used = number(read(format!("{memory}/memory.usage_in_bytes")))?;
    let stat = read(format!("{memory}/memory.stat")).unwrap_or_default();
    let cpu_ns = ["cpuacct", "cpu,cpuacct"]
        .iter()
        .find_map(|c| number(read(format!("/sys/fs/cgroup/{c}/docker/{container_id}/cpuacct.usage"))))?;
    Some(Usage {
        cpu_seconds: cpu_ns as f64 / 1e9,
        memory_bytes: used.saturating_sub(field(&stat, "total_inactive_file")),
        memory_limit_bytes: number(read(format!("{memory}/memory.limit_in_bytes"))).unwrap_or(0),
        network_bytes: network_bytes(&memory),
    })
}

/// Bytes received and sent on the network interfaces (loopback aside) of
/// the network namespace of the container's processes, read through the
/// lowest process id in the cgroup folder `dir` (the container's first
/// process, unless ids wrapped): the container's own interfaces, counted by
/// the host's kernel whatever the sandbox does. None when unreadable (the
/// process just ended, say).
fn network_bytes(dir: &str) -> Option<u64> {
    let pid = lowest_pid(dir)?;
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(
        dev.lines()
            .filter_map(|line| line.split_once(':'))
            .filter(|(name, _)| name.trim() != "lo")
            .map(|(_, counters)| {
                // Received bytes come first, sent bytes ninth.
                let n: Vec<u64> = counters.split_whitespace().filter_map(|c| c.parse().ok()).collect();
                n.first().copied().unwrap_or(0) + n.get(8).copied().unwrap_or(0)
            })
            .sum(),
    )
}

/// Forgets the kernel's tracked flows of an address given back: a sandbox
/// removed with connections open leaves them established in the host's
/// table for days (their ends never closed on the host's side), where
/// enough deleted sandboxes would fill it for the whole host. Whether they
/// were forgotten.
async fn forget_flows(address: Ipv4Addr) -> bool {
    match conntrack::forget_off_thread(address).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(%address, error = %e, "could not forget the tracked flows of a sandbox's address; its next join will");
            false
        }
    }
}

/// The lowest process id in the cgroup folder `dir`.
fn lowest_pid(dir: &str) -> Option<u32> {
    let procs = std::fs::read_to_string(format!("{dir}/cgroup.procs")).ok()?;
    procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()).min()
}

/// A process of the running container `container_id` (a full id), from its
/// cgroup in Docker's usual layouts (cgroup v2 with the cgroupfs or the
/// systemd driver, v1): any of them is in the container's namespaces.
fn cgroup_pid(container_id: &str) -> Option<u32> {
    cgroup_dirs(container_id)?.iter().find_map(|dir| lowest_pid(dir))
}

/// A container's cgroup folders in Docker's usual layouts: cgroup v2 with
/// the cgroupfs driver, v2 with the systemd driver, v1's memory
/// controller. None for anything but a full container id, which alone is
/// put into a path.
fn cgroup_dirs(container_id: &str) -> Option<[String; 3]> {
    if container_id.len() != 64 || !container_id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some([
        format!("/sys/fs/cgroup/docker/{container_id}"),
        format!("/sys/fs/cgroup/system.slice/docker-{container_id}.scope"),
        format!("/sys/fs/cgroup/memory/docker/{container_id}"),
    ])
}

/// Options of a local-driver volume that is a bind of `dir` (the capped file
/// system of the packages); Docker still fills it from the image while empty.
fn bound_volume(dir: &Path) -> HashMap<String, String> {
    HashMap::from([
        ("type".to_string(), "none".to_string()),
        ("o".to_string(), "bind".to_string()),
        ("device".to_string(), dir.display().to_string()),
    ])
}

/// A log a container cannot grow past 1 MiB: a sandbox can write to its
/// PID 1's stdout, and nothing reads those logs but the installer's last
/// 64 KiB of output.
fn capped_log() -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), "1m".to_string()),
            ("max-file".to_string(), "1".to_string()),
        ])),
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
            // A non-zero exit arrives as an error; the state tells the code.
            let timed_out = tokio::time::timeout(timeout, wait.next()).await.is_err();
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
            })
        })
        .await;
        self.remove(&id, None).await?;
        result
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
}
