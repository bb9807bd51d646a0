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
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Connections all sandboxes may hold together: the server's share of
    /// its open files for them, so that a thousand sandboxes need not each
    /// be budgeted their whole `max_connections`.
    pub max_total_connections: usize,
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

/// Descriptors the proxy of one sandbox holds whatever it serves: its
/// listening socket, the connection just accepted, and one for each
/// refusal it writes.
pub const DESCRIPTORS_PER_PROXY: u64 = 2 + REFUSALS_IN_FLIGHT as u64;
/// Descriptors one connection the proxy serves holds: the sandbox's
/// stream and the upstream one.
pub const DESCRIPTORS_PER_CONNECTION: u64 = 2;

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
    /// Places of every sandbox's connections together.
    total: Arc<Shared>,
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
            total: Arc::new(Shared::new(settings.max_total_connections)),
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
                self.total.clone(),
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

/// The connections all sandboxes share, and how they are shared.
struct Shared {
    places: Arc<Semaphore>,
    capacity: usize,
    /// Sandboxes whose proxy is listening.
    proxies: AtomicUsize,
}

/// Each sandbox's fair share of the shared places never falls below this
/// many connections.
const FAIR_FLOOR: usize = 4;

impl Shared {
    fn new(capacity: usize) -> Self {
        let capacity = capacity.min(Semaphore::MAX_PERMITS);
        Self {
            places: Arc::new(Semaphore::new(capacity)),
            capacity,
            proxies: AtomicUsize::new(0),
        }
    }

    /// A place for a sandbox that holds `held` connections with this one:
    /// none when the places are gone, or when it holds its fair share of
    /// them already (the places over the listening proxies, at least
    /// [`FAIR_FLOOR`]), so that a few sandboxes cannot take them all.
    fn take(&self, held: usize) -> Option<OwnedSemaphorePermit> {
        let proxies = self.proxies.load(Ordering::Relaxed).max(1);
        let share = (self.capacity / proxies).max(FAIR_FLOOR);
        (held <= share)
            .then(|| self.places.clone().try_acquire_owned().ok())
            .flatten()
    }
}

/// Counts a listening proxy while it lives.
struct Listening<'a>(&'a AtomicUsize);

impl<'a> Listening<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where an accepted connection stands under its sandbox's caps and the
/// server's: served with a place under both, or refused (`why`).
enum Admission {
    Served(OwnedSemaphorePermit, OwnedSemaphorePermit),
    Refused(OwnedSemaphorePermit, proxy::Denial),
}

async fn accept(
    listener: UnixListener,
    sb: Arc<Attached>,
    shared: Arc<Policies>,
    denials: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    total: Arc<Shared>,
    max_connections: usize,
) {
    let _listening = Listening::new(&total.proxies);
    let over_cap = || proxy::Denial {
        status: 429,
        kind: "limit",
        reason: format!("this sandbox already holds {max_connections} connections, the most allowed"),
    };
    let server_full = || proxy::Denial {
        status: 429,
        kind: "limit",
        reason: "the server's outbound connections are all in use; try again in a moment".into(),
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
        let places = match sb.conns.clone().try_acquire_owned() {
            Ok(own) => {
                let held = max_connections - sb.conns.available_permits();
                match total.take(held) {
                    Some(shared) => Ok((own, shared)),
                    None => Err(server_full()),
                }
            }
            Err(_) => Err(over_cap()),
        };
        let place = match places {
            Ok((own, shared)) => Admission::Served(own, shared),
            Err(why) => match sb.refusals.clone().try_acquire_owned() {
                Ok(permit) => Admission::Refused(permit, why),
                Err(_) => {
                    drop(stream);
                    record(&sb, &denials, &why);
                    continue;
                }
            },
        };
        let (sb, shared, denials) = (sb.clone(), shared.clone(), denials.clone());
        tokio::spawn(async move {
            let served = async {
                match place {
                    Admission::Served(_own, _shared) => proxy::serve(stream, &sb, &shared).await,
                    Admission::Refused(_permit, why) => {
                        proxy::refuse(&mut stream, &why).await;
                        Err(why)
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

    /// The settings of a test's proxy under `root`, which a test changes.
    fn settings(root: &std::path::Path) -> EgressSettings {
        EgressSettings {
            root: root.join("egress"),
            default: EgressPolicy::Packages,
            max_connections: 4,
            max_total_connections: 1024,
            mb_per_minute: 64,
            allow: vec![],
            packages_hosts: vec!["pypi.org".into()],
        }
    }

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
            max_connections: CAP,
            ..settings(root.path())
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

    /// The attack: a second request pipelined behind an admitted one, for a
    /// host the policy does not admit. Only the checked request, and its
    /// body, reach the upstream server.
    #[tokio::test]
    async fn nothing_past_the_checked_request_goes_upstream() {
        use tokio::io::AsyncWriteExt;

        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let received = tokio::spawn(async move {
            let (mut conn, _) = upstream.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // What arrives within a moment; the proxy sends no more after.
            while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(500), conn.read(&mut buf)).await {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await
                .unwrap();
            got
        });
        let root = tempfile::tempdir().unwrap();
        let settings = EgressSettings {
            default: EgressPolicy::Allowlist,
            allow: vec!["127.0.0.1/32".into()],
            packages_hosts: vec![],
            ..settings(root.path())
        };
        let egress = Egress::new(settings, vec![]).unwrap();
        let id = Uuid::new_v4();
        egress.attach(id, EgressPolicy::Allowlist).unwrap();
        let socket = egress.socket_dir(id).unwrap().join(EGRESS_SOCKET_NAME);
        let mut c = UnixStream::connect(&socket).await.unwrap();
        let request = format!(
            "POST http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 4\r\n\r\nbody\
             GET http://acc-evil.example/ HTTP/1.1\r\nHost: acc-evil.example\r\n\r\n"
        );
        c.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut answer))
            .await
            .expect("the answer comes")
            .unwrap();
        let got = String::from_utf8(received.await.unwrap()).unwrap();
        assert!(
            got.starts_with("POST /a HTTP/1.1\r\n") && got.ends_with("\r\n\r\nbody"),
            "{got:?}"
        );
        assert!(!got.contains("evil"), "{got:?}");
        assert!(String::from_utf8_lossy(&answer).ends_with("ok"));
    }

    /// The sandboxes' connections together hold at most the server's
    /// share: past it a new one is refused (429, said so), whichever
    /// sandbox asks, and served again once a place is free.
    #[tokio::test]
    async fn sandboxes_together_hold_at_most_the_server_s_egress_connections() {
        let root = tempfile::tempdir().unwrap();
        let settings = EgressSettings {
            max_total_connections: 3,
            ..settings(root.path())
        };
        let egress = Egress::new(settings, vec![]).unwrap();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        egress.attach(a, EgressPolicy::Packages).unwrap();
        egress.attach(b, EgressPolicy::Packages).unwrap();
        let socket = |id| egress.socket_dir(id).unwrap().join(EGRESS_SOCKET_NAME);
        let mut held = vec![];
        for _ in 0..3 {
            held.push(UnixStream::connect(socket(a)).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let answer = |mut c: UnixStream| async move {
            use tokio::io::AsyncWriteExt;
            c.write_all(b"x\r\n\r\n").await.unwrap();
            let mut reply = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut reply))
                .await
                .expect("an answer")
                .unwrap();
            String::from_utf8_lossy(&reply).into_owned()
        };
        let refused = answer(UnixStream::connect(socket(b)).await.unwrap()).await;
        assert!(
            refused.starts_with("HTTP/1.1 429") && refused.contains("all in use"),
            "{refused}"
        );
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let served = answer(UnixStream::connect(socket(b)).await.unwrap()).await;
        assert!(
            served.starts_with("HTTP/1.1 400"),
            "served again (and refused as malformed): {served}"
        );
    }

    /// A few sandboxes cannot take every shared place: each holds at most
    /// the places over the listening proxies (at least four), and the
    /// others keep theirs.
    #[tokio::test]
    async fn each_sandbox_holds_at_most_its_fair_share_of_the_shared_connections() {
        let shared = Shared::new(8);
        let (one, two) = (Listening::new(&shared.proxies), Listening::new(&shared.proxies));
        let mut first = vec![];
        for held in 1..=6 {
            first.extend(shared.take(held));
        }
        assert_eq!(first.len(), 4, "a sandbox's fair share of 8 places over 2 proxies");
        let second: Vec<_> = (1..=4).filter_map(|held| shared.take(held)).collect();
        assert_eq!(second.len(), 4, "the other sandbox keeps its share");
        drop((one, two));
        assert_eq!(shared.proxies.load(Ordering::Relaxed), 0);
    }
}
