//! What a sandbox's container is made of: its package volume, the
//! hardened container body (capabilities, read-only root, limits, the
//! sandbox user, labels), its mounts and environment, and its capped log.

use super::*;

/// Where the sandbox image keeps the CA bundle that `ca_bundle` replaces.
pub(super) const CA_IN_CONTAINER: &str = "/etc/ssl/certs/ca-certificates.crt";
pub(super) const VENV_IN_CONTAINER: &str = "/app/.venv";
/// Where a proxied sandbox finds the egress proxy's socket.
pub(super) const EGRESS_IN_CONTAINER: &str = "/run/mcp-egress";
/// The address the in-sandbox relay listens on.
pub(super) const EGRESS_RELAY: &str = "127.0.0.1:3128";
/// The `/etc/hosts` of sandboxes the engine does not network (see
/// [`DockerRuntime::sandbox_body`]): the engine writes one only for
/// containers it gives a network, and an image's own is hidden under the
/// engine's empty placeholder, so without it `localhost` (which the proxy
/// variables exempt) would not resolve. Their host name is
/// [`SANDBOX_HOSTNAME`], resolving to a loopback address as on a Debian
/// host, since programs (servers binding to it, say) expect their own name
/// to resolve.
pub(super) const LOOPBACK_HOSTS: &str =
    "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";
pub(super) const SANDBOX_HOSTNAME: &str = "sandbox";
/// OOM score of sandbox processes: a host out of memory has the kernel end
/// a sandbox before the server or the engine. Raising a score needs no
/// privilege, unlike the server lowering its own.
pub(super) const SANDBOX_OOM_SCORE_ADJ: i64 = 500;

impl DockerRuntime {
    /// Makes the sandbox's package volume unless it exists; `fresh`: its
    /// name is new (the sandbox's id is), so it is made without asking
    /// (one engine round trip fewer in every creation).
    pub(super) async fn ensure_volume(&self, paths: &SandboxPaths, volume: &str, fresh: bool) -> Result<()> {
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

    /// [`ContainerRuntime::create`] once the sandbox's address (if the
    /// server joins it to its network) is taken.
    pub(super) async fn make(
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

    pub(super) fn container_name(id: Uuid) -> String {
        format!("mcp-sandbox-{id}")
    }

    /// A hardened container of the sandbox image, or of `template`'s: all
    /// capabilities dropped, no new privileges, read-only root, size-capped
    /// `/tmp`, memory (no swap), CPU and PID limits (the template's where it
    /// sets them), the sandbox user, this server's labels.
    pub(super) fn hardened(
        &self,
        sandbox: Uuid,
        mut binds: Vec<String>,
        network: &str,
        runtime: &str,
        template: Option<&Template>,
    ) -> ContainerCreateBody {
        let c = &self.config;
        let memory_mb = template.and_then(|t| t.memory_mb).unwrap_or(c.memory_mb);
        let cpus = template.and_then(|t| t.cpus).unwrap_or(c.cpus);
        let image = template.map_or(&self.image, |t| &t.image);
        let mut env = vec![];
        if let Some(ca) = &c.ca_bundle {
            binds.push(format!("{}:{CA_IN_CONTAINER}:ro", ca.display()));
            for var in ["SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"] {
                env.push(format!("{var}={CA_IN_CONTAINER}"));
            }
        }
        let memory = (memory_mb * 1024 * 1024) as i64;
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
            nano_cpus: Some((cpus * 1e9) as i64),
            pids_limit: Some(c.pids_limit),
            network_mode: Some(network.to_string()),
            runtime: Some(runtime.to_string()),
            log_config: Some(capped_log()),
            oom_score_adj: Some(SANDBOX_OOM_SCORE_ADJ),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(image.clone()),
            user: Some(format!("{SANDBOX_UID}:{SANDBOX_UID}")),
            labels: Some(labels::for_sandbox(&self.server_id, sandbox)),
            env: Some(env),
            host_config: Some(host),
            ..Default::default()
        }
    }

    /// `address`: where the server joins an `open` sandbox to its bridge
    /// itself; an `open` sandbox without one joins through the engine.
    pub(super) fn sandbox_body(
        &self,
        paths: &SandboxPaths,
        volume: &str,
        address: Option<Ipv4Addr>,
    ) -> Result<ContainerCreateBody> {
        let template = paths.template.as_deref();
        let mut binds = vec![
            format!("{}:{RESULTS_IN_CONTAINER}:rw", paths.results.display()),
            format!("{}:{AGENT_DIR_IN_CONTAINER}:rw", paths.agent.display()),
            format!("{volume}:{VENV_IN_CONTAINER}:rw"),
        ];
        if paths.egress.is_none() && address.is_none() {
            let network = self.server_network()?.to_string();
            let runtime = self.oci_runtime(template);
            return Ok(self.hardened(paths.id, binds, &network, runtime, template));
        }
        binds.push(format!("{}:/etc/hosts:ro", self.loopback_hosts.display()));
        if let Some(egress) = &paths.egress {
            binds.push(format!("{}:{EGRESS_IN_CONTAINER}:ro", egress.display()));
        } else {
            binds.push(format!("{}:/etc/resolv.conf:ro", self.resolv_conf.display()));
        }
        let mut body = self.hardened(paths.id, binds, "none", self.oci_runtime(template), template);
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
}

/// Options of a local-driver volume that is a bind of `dir` (the capped file
/// system of the packages); Docker still fills it from the image while empty.
pub(super) fn bound_volume(dir: &Path) -> HashMap<String, String> {
    HashMap::from([
        ("type".to_string(), "none".to_string()),
        ("o".to_string(), "bind".to_string()),
        ("device".to_string(), dir.display().to_string()),
    ])
}

/// A log a container cannot grow past 1 MiB: a sandbox can write to its
/// PID 1's stdout, and nothing reads those logs but the installer's last
/// 64 KiB of output.
pub(super) fn capped_log() -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), "1m".to_string()),
            ("max-file".to_string(), "1".to_string()),
        ])),
    }
}
