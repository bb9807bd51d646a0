//! The server's own bridge network: made (or found) at start with the
//! firewall rules of its subnet, and `open` sandboxes joined to it, by the
//! server itself where it can ([`bridge`]) and by the engine otherwise.

use sandbox_host::syscalls::forget_flows_off_thread;

use super::*;

impl DockerRuntime {
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
    pub(super) async fn make_network(&mut self) -> Result<Option<ipnet::IpNet>> {
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
    pub(super) async fn create_network(&self, name: &str) -> Result<()> {
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
    pub(super) async fn own_bridge(
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
        let forgotten = forget_flows_off_thread(&self.host, move |a| range.contains(&a) && !held.contains(&a))
            .await
            .map_err(|e| format!("the kernel's connection tracking cannot be reached over netlink: {e}"))?;
        if forgotten > 0 {
            tracing::info!(forgotten, %range, "forgot the tracked flows of the sandbox range's free addresses");
        }
        Ok(Bridge::new(
            self.host.clone(),
            interface,
            subnet,
            gateway,
            range,
            mtu,
            taken,
        ))
    }

    /// The addresses of this server's containers that exist, and their
    /// holders, from their labels.
    pub(super) async fn addresses_in_use(&self) -> Result<Vec<(Ipv4Addr, Holder)>> {
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
    pub(super) async fn join_bridge(&self, container_id: &str, address: Option<Ipv4Addr>) -> Result<()> {
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
    pub(super) async fn rejoin_running(&self) {
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
    pub(super) async fn rejoin(&self, container_id: &str) -> Result<()> {
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

    /// Gives back `address`, held for `sandbox` by a container that is gone
    /// or was never made, once the kernel's tracked flows of it are
    /// forgotten (so that none reaches its next holder).
    pub(super) async fn give_back(&self, address: Ipv4Addr, sandbox: Uuid) {
        if let Some(bridge) = &self.bridge {
            let forgotten = forget_flows(&self.host, address).await;
            bridge.give_back(address, sandbox, forgotten);
        }
    }

    /// The server's bridge network; sandboxes never fall back to Docker's default one.
    pub(super) fn server_network(&self) -> Result<&str> {
        self.network
            .as_deref()
            .ok_or_else(|| RuntimeError::Internal("the server's sandbox network was not set up".into()))
    }
}

/// Forgets the kernel's tracked flows of an address given back: a sandbox
/// removed with connections open leaves them established in the host's
/// table for days (their ends never closed on the host's side), where
/// enough deleted sandboxes would fill it for the whole host. Whether they
/// were forgotten.
pub(super) async fn forget_flows(host: &Arc<dyn Syscalls>, address: Ipv4Addr) -> bool {
    match forget_flows_off_thread(host, move |a| a == address).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(%address, error = %e, "could not forget the tracked flows of a sandbox's address; its next join will");
            false
        }
    }
}
