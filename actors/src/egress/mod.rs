//! The egress proxy: the only way out of a sandbox whose policy is not
//! `open`. Such a sandbox has no network interface but loopback; a relay in
//! it (started by the agent) forwards `127.0.0.1:3128` to a unix socket that
//! this server listens on, one socket per sandbox, mounted read-only into
//! that sandbox alone. So a connection's sandbox is known from the socket it
//! came in on, and no sandbox can spoof another, reach another, or reach
//! anything the proxy does not admit. The policy is looked up for each
//! connection, so a pooled sandbox takes its owner's policy when claimed.

mod proxy;
mod sni;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::{EgressPolicy, Settings};
use crate::error::{Result, SandboxError};
use crate::runtime::{EGRESS_SOCKET_NAME, SANDBOX_UID};

use crate::egress_rules::is_host_name;
pub use crate::egress_rules::{host_networks, Guard, Rules};

/// Refusals logged per sandbox per minute; more are only counted.
const LOGGED_PER_MINUTE: u64 = 20;

/// What every connection checks against.
pub struct Shared {
    /// The package index and its file hosts.
    pub packages: Rules,
    /// `sandbox.egress_allow`.
    pub allow: Rules,
    pub guard: Guard,
}

/// One sandbox known to the proxy.
pub struct Attached {
    id: Uuid,
    policy: Mutex<EgressPolicy>,
    conns: Arc<Semaphore>,
    budget: proxy::Budget,
    logged: proxy::Budget,
    stop: CancellationToken,
}

impl Attached {
    fn policy(&self) -> EgressPolicy {
        *self.policy.lock().expect("policy lock")
    }
}

pub struct Egress {
    root: PathBuf,
    default: EgressPolicy,
    max_connections: usize,
    bytes_per_minute: u64,
    shared: Arc<Shared>,
    /// The hosts installs contact.
    packages_hosts: Vec<String>,
    attached: Mutex<HashMap<Uuid, Arc<Attached>>>,
    denials: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl Egress {
    /// `never` are ranges no sandbox may reach even when listed (the
    /// server's own sandbox network).
    pub fn new(settings: &Settings, never: Vec<IpNet>) -> Result<Self> {
        let s = &settings.sandbox;
        let parse = |list: &[String], key: &str| {
            Rules::parse(list).map_err(|e| SandboxError::InvalidArgument(format!("{key}: {e}")))
        };
        let packages_hosts = settings.packages.hosts();
        Ok(Self {
            root: settings.state_dir.join("egress"),
            default: s.network,
            max_connections: s.egress_max_connections,
            bytes_per_minute: s.egress_mb_per_minute.saturating_mul(1024 * 1024),
            shared: Arc::new(Shared {
                packages: parse(&packages_hosts, "packages")?,
                allow: parse(&s.egress_allow, "sandbox.egress_allow")?,
                guard: Guard::new(host_networks(), never),
            }),
            packages_hosts,
            attached: Mutex::new(HashMap::new()),
            denials: Arc::default(),
        })
    }

    /// The server-wide policy (`sandbox.network`).
    pub fn default_policy(&self) -> EgressPolicy {
        self.default
    }

    /// The host folder that holds the proxy socket of a proxied sandbox.
    pub fn socket_dir(&self, id: Uuid) -> Option<PathBuf> {
        self.get(id)
            .filter(|a| a.policy().is_proxied())
            .map(|_| self.root.join(id.to_string()))
    }

    /// The policy a sandbox is under (the server's for one not attached).
    pub fn policy(&self, id: Uuid) -> EgressPolicy {
        self.get(id).map_or(self.default, |a| a.policy())
    }

    fn get(&self, id: Uuid) -> Option<Arc<Attached>> {
        self.attached.lock().expect("egress lock").get(&id).cloned()
    }

    /// Registers a sandbox under `policy` and, when proxied, starts
    /// listening on its socket (before its container exists).
    pub fn attach(&self, id: Uuid, policy: EgressPolicy) -> Result<()> {
        let sb = Arc::new(Attached {
            id,
            policy: Mutex::new(policy),
            conns: Arc::new(Semaphore::new(self.max_connections)),
            budget: proxy::Budget::new(self.bytes_per_minute),
            logged: proxy::Budget::new(LOGGED_PER_MINUTE),
            stop: CancellationToken::new(),
        });
        if policy.is_proxied() {
            let listener = self
                .listen(id)
                .map_err(|e| SandboxError::Internal(format!("egress proxy socket of {id}: {e}")))?;
            tokio::spawn(accept(
                listener,
                sb.clone(),
                self.shared.clone(),
                self.denials.clone(),
                self.max_connections,
            ));
        }
        if let Some(old) = self.attached.lock().expect("egress lock").insert(id, sb) {
            old.stop.cancel();
        }
        Ok(())
    }

    fn listen(&self, id: Uuid) -> std::io::Result<UnixListener> {
        let dir = self.root.join(id.to_string());
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let path = dir.join(EGRESS_SOCKET_NAME);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&path)?;
        // Only the sandbox user connects (the folder is mounted read-only,
        // so the sandbox can neither remove nor replace the socket).
        let mode = match std::os::unix::fs::chown(&path, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
            Ok(()) => 0o600,
            Err(_) => 0o666,
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(listener)
    }

    /// Gives a pooled sandbox its owner's policy. False when the policy
    /// needs the other kind of container (an interface or none), so the
    /// pooled one cannot serve it.
    pub fn claim(&self, id: Uuid, policy: EgressPolicy) -> bool {
        match self.get(id) {
            Some(a) if a.policy().is_proxied() == policy.is_proxied() => {
                *a.policy.lock().expect("policy lock") = policy;
                true
            }
            _ => false,
        }
    }

    /// Stops serving a removed sandbox and removes its socket folder.
    pub fn detach(&self, id: Uuid) {
        if let Some(a) = self.attached.lock().expect("egress lock").remove(&id) {
            a.stop.cancel();
        }
        let _ = std::fs::remove_dir_all(self.root.join(id.to_string()));
    }

    /// Whether installs for this sandbox run inside it (its policy reaches
    /// the package index) rather than in an installer container.
    pub fn installs_in_sandbox(&self, id: Uuid) -> bool {
        match self.policy(id) {
            EgressPolicy::Open | EgressPolicy::Packages => true,
            EgressPolicy::None => false,
            EgressPolicy::Allowlist => self.packages_hosts.iter().all(|h| self.shared.allow.admits_name(h)),
        }
    }

    /// Refused connections since start, by reason.
    pub fn denials(&self) -> BTreeMap<&'static str, u64> {
        self.denials.lock().expect("denials lock").clone()
    }
}

async fn accept(
    listener: UnixListener,
    sb: Arc<Attached>,
    shared: Arc<Shared>,
    denials: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    max_connections: usize,
) {
    loop {
        let stream = tokio::select! {
            _ = sb.stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(sandbox = %sb.id, error = %e, "egress proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (sb, shared, denials) = (sb.clone(), shared.clone(), denials.clone());
        tokio::spawn(async move {
            let mut stream = stream;
            let permit = sb.conns.clone().try_acquire_owned();
            let served = async {
                match permit {
                    Ok(_permit) => proxy::serve(stream, &sb, &shared).await,
                    Err(_) => {
                        let d = proxy::Denial {
                            status: 429,
                            kind: "limit",
                            reason: format!(
                                "this sandbox already holds {max_connections} connections, the most allowed"
                            ),
                        };
                        proxy::refuse(&mut stream, &d).await;
                        Err(d)
                    }
                }
            };
            let outcome = tokio::select! {
                r = served => r,
                _ = sb.stop.cancelled() => Ok(()),
            };
            if let Err(d) = outcome.as_ref() {
                if proxy::is_denial(d) {
                    *denials.lock().expect("denials lock").entry(d.kind).or_default() += 1;
                    if sb.logged.charge(1).is_none() {
                        info!(sandbox = %sb.id, reason = d.kind, "egress refused: {}", d.reason);
                    }
                }
            }
        });
    }
}
