//! The egress proxy: the only way out of a sandbox whose policy is not
//! `open`. Such a sandbox has no network interface but loopback; a relay in
//! it (started by the agent) forwards `127.0.0.1:3128` to a unix socket that
//! this server listens on, one socket per sandbox, mounted read-only into
//! that sandbox alone. So a connection's sandbox is known from the socket it
//! came in on, and no sandbox can spoof another, reach another, or reach
//! anything the proxy does not admit. The policy is looked up for each
//! connection, so a pooled sandbox takes its owner's policy when claimed.

mod policy;
mod proxy;
mod rules;
mod sni;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use tokio::net::UnixListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use sandbox_host::addresses::host_networks;
use sandbox_host::SANDBOX_UID;

pub use policy::EgressPolicy;
pub use rules::{is_host_name, AddressGuard, RuleError, Rules};

/// The proxy's socket in the folder [`Egress::socket_dir`] names.
pub const EGRESS_SOCKET_NAME: &str = "proxy.sock";

/// Why the proxy could not be set up, or could not serve a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// An allow-list entry is none of the forms [`Rules::parse`] takes.
    #[error("{key}: {source}")]
    Rules {
        key: &'static str,
        #[source]
        source: RuleError,
    },
    #[error("egress proxy socket of {id}: {source}")]
    Socket {
        id: Uuid,
        #[source]
        source: std::io::Error,
    },
}

/// What the proxy is set up with.
#[derive(Debug, Clone)]
pub struct EgressSettings {
    /// The folder of the sandboxes' socket folders (`state_dir/egress`).
    pub root: PathBuf,
    /// The server-wide policy (`sandbox.network`).
    pub default: EgressPolicy,
    /// Connections one sandbox may hold at once (`sandbox.egress_max_connections`).
    pub max_connections: usize,
    /// `sandbox.egress_mb_per_minute`.
    pub mb_per_minute: u64,
    /// `sandbox.egress_allow`.
    pub allow: Vec<String>,
    /// The hosts installs contact: the package index and its file hosts.
    pub packages_hosts: Vec<String>,
}

/// Refusals logged per sandbox per minute; more are only counted.
const LOGGED_PER_MINUTE: u64 = 20;

/// Connections past `sandbox.egress_max_connections` that one sandbox's
/// proxy answers (429) at once. Each is held a few seconds (see
/// `proxy::refuse`), so past these a connection is closed as soon as it is
/// accepted, unanswered: a sandbox that opens thousands holds at most the
/// cap and these, never a task or a descriptor more.
pub const REFUSALS_IN_FLIGHT: usize = 8;

/// Descriptors the proxy of one sandbox holds at most when its connections
/// are capped at `max_connections`: its listening socket and the connection
/// just accepted, two for each connection it serves (the sandbox's stream
/// and the upstream one) and one for each refusal it writes.
pub fn descriptors_per_sandbox(max_connections: usize) -> u64 {
    2 + 2 * max_connections as u64 + REFUSALS_IN_FLIGHT as u64
}

/// What every connection checks against.
pub struct Policies {
    /// The package index and its file hosts.
    pub packages: Rules,
    /// `sandbox.egress_allow`.
    pub allow: Rules,
    pub guard: AddressGuard,
}

/// One sandbox known to the proxy.
pub struct Attached {
    id: Uuid,
    policy: Mutex<EgressPolicy>,
    /// Places of the connections served (`egress_max_connections`)...
    conns: Arc<Semaphore>,
    /// ...and of those being answered 429 ([`REFUSALS_IN_FLIGHT`]).
    refusals: Arc<Semaphore>,
    budget: proxy::ByteBudget,
    logged: proxy::ByteBudget,
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
    shared: Arc<Policies>,
    /// The hosts installs contact.
    packages_hosts: Vec<String>,
    attached: Mutex<HashMap<Uuid, Arc<Attached>>>,
    denials: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl Egress {
    /// `never` are ranges no sandbox may reach even when listed (the
    /// server's own sandbox network).
    pub fn new(settings: EgressSettings, never: Vec<IpNet>) -> Result<Self, EgressError> {
        let parse = |list: &[String], key| Rules::parse(list).map_err(|source| EgressError::Rules { key, source });
        Ok(Self {
            root: settings.root,
            default: settings.default,
            max_connections: settings.max_connections,
            bytes_per_minute: settings.mb_per_minute.saturating_mul(1024 * 1024),
            shared: Arc::new(Policies {
                packages: parse(&settings.packages_hosts, "packages")?,
                allow: parse(&settings.allow, "sandbox.egress_allow")?,
                guard: AddressGuard::new(host_networks(), never),
            }),
            packages_hosts: settings.packages_hosts,
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
        self.attached_policy(id).unwrap_or(self.default)
    }

    /// The policy of an attached sandbox; none for one not (or no longer) attached.
    pub fn attached_policy(&self, id: Uuid) -> Option<EgressPolicy> {
        self.get(id).map(|a| a.policy())
    }

    /// Bytes a sandbox moved through its proxy since it was attached (none
    /// when it is not attached).
    pub fn moved(&self, id: Uuid) -> Option<u64> {
        self.get(id).map(|a| a.budget.moved())
    }

    fn get(&self, id: Uuid) -> Option<Arc<Attached>> {
        self.attached.lock().expect("egress lock").get(&id).cloned()
    }

    /// Registers a sandbox under `policy` and, when proxied, starts
    /// listening on its socket (before its container exists).
    pub fn attach(&self, id: Uuid, policy: EgressPolicy) -> Result<(), EgressError> {
        let sb = Arc::new(Attached {
            id,
            policy: Mutex::new(policy),
            conns: Arc::new(Semaphore::new(self.max_connections)),
            refusals: Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT)),
            budget: proxy::ByteBudget::new(self.bytes_per_minute),
            logged: proxy::ByteBudget::new(LOGGED_PER_MINUTE),
            stop: CancellationToken::new(),
        });
        if policy.is_proxied() {
            let listener = self.listen(id).map_err(|source| EgressError::Socket { id, source })?;
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

/// Where an accepted connection stands under its sandbox's caps.
enum Admission {
    Served(OwnedSemaphorePermit),
    Refused(OwnedSemaphorePermit),
}

async fn accept(
    listener: UnixListener,
    sb: Arc<Attached>,
    shared: Arc<Policies>,
    denials: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    max_connections: usize,
) {
    let over_cap = || proxy::Denial {
        status: 429,
        kind: "limit",
        reason: format!("this sandbox already holds {max_connections} connections, the most allowed"),
    };
    loop {
        let mut stream = tokio::select! {
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
        // The place is taken before any task is spawned, so a connection
        // that finds none costs nothing past this line.
        let place = match sb.conns.clone().try_acquire_owned() {
            Ok(permit) => Admission::Served(permit),
            Err(_) => match sb.refusals.clone().try_acquire_owned() {
                Ok(permit) => Admission::Refused(permit),
                Err(_) => {
                    drop(stream);
                    record(&sb, &denials, &over_cap());
                    continue;
                }
            },
        };
        let (sb, shared, denials) = (sb.clone(), shared.clone(), denials.clone());
        let denial = over_cap();
        tokio::spawn(async move {
            let served = async {
                match place {
                    Admission::Served(_permit) => proxy::serve(stream, &sb, &shared).await,
                    Admission::Refused(_permit) => {
                        proxy::refuse(&mut stream, &denial).await;
                        Err(denial)
                    }
                }
            };
            let outcome = tokio::select! {
                r = served => r,
                _ = sb.stop.cancelled() => Ok(()),
            };
            if let Err(d) = outcome.as_ref() {
                record(&sb, &denials, d);
            }
        });
    }
}

/// Counts (and, a few a minute, logs) a refusal of the sandbox `sb`.
fn record(sb: &Attached, denials: &Mutex<BTreeMap<&'static str, u64>>, d: &proxy::Denial) {
    if proxy::is_denial(d) {
        *denials.lock().expect("denials lock").entry(d.kind).or_default() += 1;
        if sb.logged.charge(1).is_none() {
            info!(sandbox = %sb.id, reason = d.kind, "egress refused: {}", d.reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixStream;

    use super::*;

    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
    }

    /// The attack: many connections to the proxy socket, none sending a
    /// byte. The proxy serves its cap, answers a few more, and closes the
    /// rest at once; the process's descriptors grow by the clients' own
    /// and little more (other tests in this process may hold a few).
    #[tokio::test]
    async fn a_sandbox_cannot_make_the_proxy_hold_its_connections() {
        const CAP: usize = 4;
        const CLIENTS: usize = 300;
        let root = tempfile::tempdir().unwrap();
        let settings = EgressSettings {
            root: root.path().join("egress"),
            default: EgressPolicy::Packages,
            max_connections: CAP,
            mb_per_minute: 64,
            allow: vec![],
            packages_hosts: vec!["pypi.org".into()],
        };
        let egress = Egress::new(settings, vec![]).unwrap();
        let id = Uuid::new_v4();
        egress.attach(id, EgressPolicy::Packages).unwrap();
        let socket = egress.socket_dir(id).unwrap().join(EGRESS_SOCKET_NAME);
        let before = open_descriptors();
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..CLIENTS {
            let mut c = UnixStream::connect(&socket).await.unwrap();
            // Every client but the served ones hears from the proxy (an
            // answer, or the stream's end) as soon as it is accepted.
            clients.spawn(async move {
                let mut reply = Vec::new();
                let heard = tokio::time::timeout(Duration::from_secs(1), c.read_to_end(&mut reply)).await;
                let heard = heard.map(|read| read.map(|_| !reply.is_empty()).expect("reading the proxy"));
                (heard, c)
            });
        }
        let (mut answered, mut closed, mut open) = (0, 0, vec![]);
        while let Some(client) = clients.join_next().await {
            let (heard, c) = client.unwrap();
            match heard {
                Ok(true) => answered += 1,
                Ok(false) => closed += 1,
                Err(_) => {}
            }
            open.push(c); // held until the count below
        }
        let held_by_proxy = open_descriptors().saturating_sub(before + CLIENTS);
        assert!(answered <= REFUSALS_IN_FLIGHT, "{answered} refusals answered at once");
        assert!(
            closed >= CLIENTS - CAP - REFUSALS_IN_FLIGHT,
            "only {closed} of {CLIENTS} connections were closed unanswered"
        );
        assert!(
            held_by_proxy <= CAP + REFUSALS_IN_FLIGHT + 16,
            "the proxy holds {held_by_proxy} descriptors for {CLIENTS} idle connections"
        );
        // Counted when closed; those answered, once their answer is done.
        assert!(egress.denials()["limit"] >= closed as u64);
    }
}
