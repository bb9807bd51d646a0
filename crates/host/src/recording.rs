//! A [`Syscalls`] that records every call and plays a small kernel: mounts
//! that exist until unmounted, ext4 images that show `lost+found` when
//! mounted fresh from `mkfs`, iptables tables that `-S`, `-I`, `-A` and
//! `-D` list and change, links that are made, joined to a bridge and
//! deleted, containers' processes, and tracked flows. Calls can be made to fail, so tests see what the
//! host code does after a failure. For tests only (this crate's, and with
//! the `recording` feature the crates above it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use ipnet::IpNet;

use crate::syscalls::{Port, Syscalls, ToolOutput};
use crate::veth::{Addressing, Deadline, StepError};

/// One call, as made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    MakeExt4 {
        image: PathBuf,
        inodes: u64,
    },
    MountExt4 {
        image: PathBuf,
        target: PathBuf,
        options: String,
    },
    MountTmpfs {
        target: PathBuf,
        options: String,
    },
    Unmount {
        target: PathBuf,
        lazily: bool,
    },
    Iptables(Vec<String>),
    MakePair {
        host_end: String,
        address: Ipv4Addr,
    },
    JoinPort {
        host_end: String,
        bridge: String,
    },
    DeleteLink {
        host_end: String,
    },
    ForgetFlows,
}

/// Which calls fail: those of an operation whose path (for iptables, the
/// arguments joined by spaces) contains a text.
#[derive(Debug, Clone)]
struct Failure {
    op: &'static str,
    containing: String,
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    mounted: HashSet<PathBuf>,
    formatted: HashSet<PathBuf>,
    failures: Vec<Failure>,
    /// Rules by (table, chain), in order.
    tables: BTreeMap<(String, String), Vec<Vec<String>>>,
    no_raw_table: bool,
    links: BTreeMap<String, Port>,
    /// Running containers' first processes: pid to container id.
    containers: HashMap<u32, String>,
    /// The processes whose namespace has an `eth0`.
    with_eth0: HashSet<u32>,
    /// Tracked flows, by an address of theirs.
    flows: Vec<Ipv4Addr>,
}

/// The recording double of [`Syscalls`].
#[derive(Default)]
pub struct Recorder {
    state: Mutex<State>,
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("recorder lock")
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// What is mounted now.
    pub fn mounted(&self) -> HashSet<PathBuf> {
        self.state().mounted.clone()
    }

    /// From now on, calls of `op` (`make_ext4`, `mount_ext4`, `mount_tmpfs`,
    /// `unmount`, `iptables`) whose path or arguments contain `containing`
    /// fail.
    pub fn fail(&self, op: &'static str, containing: &str) {
        self.state().failures.push(Failure {
            op,
            containing: containing.into(),
        });
    }

    /// The host has no `raw` table.
    pub fn without_raw_table(&self) {
        self.state().no_raw_table = true;
    }

    /// The rules of `chain` in `table`, in order.
    pub fn rules(&self, table: &str, chain: &str) -> Vec<Vec<String>> {
        self.state()
            .tables
            .get(&(table.to_string(), chain.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Puts a rule that someone else wrote at the end of `chain`.
    pub fn append_rule(&self, table: &str, chain: &str, rule: &[&str]) {
        self.state()
            .tables
            .entry((table.to_string(), chain.to_string()))
            .or_default()
            .push(rule.iter().map(|w| w.to_string()).collect());
    }

    /// `pid` is the first process of the running container `container_id`;
    /// `eth0`: its namespace has an `eth0` already.
    pub fn run_container(&self, pid: u32, container_id: &str, eth0: bool) {
        let mut state = self.state();
        state.containers.insert(pid, container_id.into());
        if eth0 {
            state.with_eth0.insert(pid);
        }
    }

    /// The host's links now.
    pub fn link_ports(&self) -> BTreeMap<String, Port> {
        self.state().links.clone()
    }

    /// Puts a link on the host (someone else's, or one left behind).
    pub fn add_link(&self, name: &str, port: Port) {
        self.state().links.insert(name.into(), port);
    }

    /// The kernel tracks a flow of `address`.
    pub fn track_flow(&self, address: Ipv4Addr) {
        self.state().flows.push(address);
    }

    /// The tracked flows, by an address of theirs.
    pub fn flows(&self) -> Vec<Ipv4Addr> {
        self.state().flows.clone()
    }

    /// Records a link call; its error when made to fail.
    fn record_step(&self, op: &'static str, about: &str, call: Call) -> Result<(), StepError> {
        self.record(op, about, call).map_err(|source| StepError {
            step: op.into(),
            source,
        })
    }

    fn record(&self, op: &'static str, about: &str, call: Call) -> io::Result<()> {
        let mut state = self.state();
        state.calls.push(call);
        match state
            .failures
            .iter()
            .any(|f| f.op == op && about.contains(&f.containing))
        {
            true => Err(io::Error::other(format!("{op} made to fail for {about}"))),
            false => Ok(()),
        }
    }
}

fn listing(chain: &str, rules: &[Vec<String>]) -> String {
    let mut out = format!("-N {chain}\n");
    for rule in rules {
        let words: Vec<String> = rule
            .iter()
            .map(|w| match w.contains(' ') {
                true => format!("\"{w}\""),
                false => w.clone(),
            })
            .collect();
        out.push_str(&format!("-A {chain} {}\n", words.join(" ")));
    }
    out
}

impl Syscalls for Recorder {
    fn make_ext4(&self, image: &Path, inodes: u64, _deadline: Duration) -> Result<(), String> {
        let call = Call::MakeExt4 {
            image: image.into(),
            inodes,
        };
        self.record("make_ext4", &image.to_string_lossy(), call)
            .map_err(|e| e.to_string())?;
        if !image.is_file() {
            return Err(format!("{}: no such file", image.display()));
        }
        self.state().formatted.insert(image.into());
        Ok(())
    }

    fn mount_ext4(&self, image: &Path, target: &Path, _flags: libc::c_ulong, options: &str) -> io::Result<()> {
        let call = Call::MountExt4 {
            image: image.into(),
            target: target.into(),
            options: options.into(),
        };
        self.record("mount_ext4", &format!("{} {}", image.display(), target.display()), call)?;
        if !image.is_file() || !target.is_dir() {
            return Err(io::ErrorKind::NotFound.into());
        }
        let fresh = self.state().formatted.remove(image);
        if fresh {
            std::fs::create_dir_all(target.join("lost+found"))?;
        }
        self.state().mounted.insert(target.into());
        Ok(())
    }

    fn mount_tmpfs(&self, _source: &str, target: &Path, _flags: libc::c_ulong, options: &str) -> io::Result<()> {
        let call = Call::MountTmpfs {
            target: target.into(),
            options: options.into(),
        };
        self.record("mount_tmpfs", &target.to_string_lossy(), call)?;
        if !target.is_dir() {
            return Err(io::ErrorKind::NotFound.into());
        }
        self.state().mounted.insert(target.into());
        Ok(())
    }

    fn unmount(&self, target: &Path, lazily_if_busy: bool) -> io::Result<()> {
        let call = Call::Unmount {
            target: target.into(),
            lazily: lazily_if_busy,
        };
        self.record("unmount", &target.to_string_lossy(), call)?;
        match self.state().mounted.remove(target) {
            true => Ok(()),
            false => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn is_mount_point(&self, path: &Path) -> bool {
        self.state().mounted.contains(path)
    }

    fn iptables(&self, args: &[&str]) -> io::Result<ToolOutput> {
        let call = Call::Iptables(args.iter().map(|a| a.to_string()).collect());
        if let Err(e) = self.record("iptables", &args.join(" "), call) {
            return Ok(ToolOutput {
                stderr: e.to_string(),
                ..ToolOutput::default()
            });
        }
        let refused = |why: &str| ToolOutput {
            stderr: why.into(),
            ..ToolOutput::default()
        };
        let done = |stdout: String| ToolOutput {
            success: true,
            stdout,
            stderr: String::new(),
        };
        let ["-t", table, verb, chain, rest @ ..] = args else {
            return Ok(refused("the recorder plays -t TABLE VERB CHAIN only"));
        };
        let mut state = self.state();
        if *table == "raw" && state.no_raw_table {
            return Ok(refused("can't initialize iptables table `raw': Table does not exist"));
        }
        let rules = state.tables.entry((table.to_string(), chain.to_string())).or_default();
        let rule = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        Ok(match (*verb, rest) {
            ("-S", []) => done(listing(chain, rules)),
            ("-A", words) => {
                rules.push(rule(words));
                done(String::new())
            }
            ("-I", [at, words @ ..]) => match at.parse::<usize>() {
                Ok(n) if (1..=rules.len() + 1).contains(&n) => {
                    rules.insert(n - 1, rule(words));
                    done(String::new())
                }
                _ => refused("Index of insertion too big"),
            },
            ("-D", words) => match rules.iter().position(|r| *r == rule(words)) {
                Some(at) => {
                    rules.remove(at);
                    done(String::new())
                }
                None => refused("Bad rule (does a matching rule exist in that chain?)."),
            },
            _ => refused("the recorder does not play this verb"),
        })
    }

    fn container_namespace(&self, container_id: &str, pid: u32) -> Option<File> {
        let ours = self.state().containers.get(&pid).is_some_and(|c| c == container_id);
        ours.then(|| File::open("/dev/null").expect("/dev/null"))
    }

    fn own_namespace(&self) -> io::Result<File> {
        File::open("/")
    }

    fn has_eth0(&self, pid: u32) -> bool {
        self.state().with_eth0.contains(&pid)
    }

    fn links(&self) -> Vec<String> {
        self.state().links.keys().cloned().collect()
    }

    /// A host on one network, with the loopback: the same at every call.
    fn host_networks(&self) -> Vec<IpNet> {
        ["127.0.0.0/8", "127.0.0.1/32", "192.168.5.0/24", "192.168.5.15/32"]
            .map(|n| n.parse().expect("valid network"))
            .to_vec()
    }

    fn port(&self, name: &str) -> Option<Port> {
        self.state().links.get(name).cloned()
    }

    fn make_veth_pair(
        &self,
        _namespace: &File,
        _server: &File,
        host_end: &str,
        addressing: Addressing,
        _deadline: &Deadline,
    ) -> Result<(), StepError> {
        let call = Call::MakePair {
            host_end: host_end.into(),
            address: addressing.address,
        };
        self.record_step("make_veth_pair", host_end, call)?;
        let port = Port {
            master: None,
            up: false,
        };
        match self.state().links.insert(host_end.into(), port) {
            None => Ok(()),
            Some(_) => Err(StepError {
                step: format!("making {host_end}"),
                source: io::Error::from_raw_os_error(libc::EEXIST),
            }),
        }
    }

    fn join_port(&self, host_end: &str, bridge: &str, _deadline: &Deadline) -> Result<(), StepError> {
        let call = Call::JoinPort {
            host_end: host_end.into(),
            bridge: bridge.into(),
        };
        self.record_step("join_port", host_end, call)?;
        match self.state().links.get_mut(host_end) {
            Some(port) => {
                *port = Port {
                    master: Some(bridge.into()),
                    up: true,
                };
                Ok(())
            }
            None => Err(StepError {
                step: format!("joining {host_end}"),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            }),
        }
    }

    fn delete_link(&self, host_end: &str, _deadline: &Deadline) -> Result<(), StepError> {
        let call = Call::DeleteLink {
            host_end: host_end.into(),
        };
        self.record_step("delete_link", host_end, call)?;
        match self.state().links.remove(host_end) {
            Some(_) => Ok(()),
            None => Err(StepError {
                step: format!("deleting {host_end}"),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            }),
        }
    }

    fn forget_flows(&self, doomed: &dyn Fn(Ipv4Addr) -> bool) -> io::Result<usize> {
        self.record("forget_flows", "", Call::ForgetFlows)?;
        let mut state = self.state();
        let before = state.flows.len();
        state.flows.retain(|a| !doomed(*a));
        Ok(before - state.flows.len())
    }
}
