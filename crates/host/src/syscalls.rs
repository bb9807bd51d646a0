//! The seam between the host code and the kernel: every mount, loop
//! device, `mkfs.ext4`, `iptables` run, network link and tracked flow the
//! server makes or reads for its sandboxes goes through [`Syscalls`], as
//! youki's container set-up goes through its syscall trait. [`Linux`] makes the calls;
//! [`Recorder`](crate::recording::Recorder) (tests, and the crates above
//! with the `recording` feature) records them and plays a small kernel, so
//! the order of set-up and tear-down, the rules a sandbox network gets and
//! the clean-up after a failure are tested without root.
//!
//! What stays outside: reading and writing plain files and folders (tests
//! give each run a folder of its own), and the reads of the host's own
//! figures (`figures`, `addresses`) but for the host's networks the
//! firewall is made of, which change whenever another program makes a
//! network and so are a call of their own.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use crate::veth::{Addressing, Deadline, StepError};
use crate::SANDBOX_UID;

/// A bridge port as the host shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The bridge it is a port of, if any.
    pub master: Option<String>,
    pub up: bool,
}

/// What a program run by the host code printed, and whether it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// The calls the host code makes of the kernel and of the host's programs.
/// Each blocks: callers run them off the async threads, under deadlines of
/// their own where the call may hang.
pub trait Syscalls: Send + Sync + 'static {
    /// Formats the (sparse, sized) file `image` as an empty ext4 owned by
    /// the sandbox user: no reserved blocks, `inodes` inodes, inode tables
    /// and journal left unwritten. `mkfs.ext4`, ended after `deadline`.
    fn make_ext4(&self, image: &Path, inodes: u64, deadline: Duration) -> Result<(), String>;
    /// Mounts the ext4 file system of `image` at `target` through a loop
    /// device that goes with the file system.
    fn mount_ext4(&self, image: &Path, target: &Path, flags: libc::c_ulong, options: &str) -> io::Result<()>;
    /// Mounts a tmpfs named `source` at `target`.
    fn mount_tmpfs(&self, source: &str, target: &Path, flags: libc::c_ulong, options: &str) -> io::Result<()>;
    /// Unmounts `target`; a busy file system is detached lazily when
    /// `lazily_if_busy`, and an error otherwise.
    fn unmount(&self, target: &Path, lazily_if_busy: bool) -> io::Result<()>;
    /// Whether `path` is the root of a mount.
    fn is_mount_point(&self, path: &Path) -> bool;
    /// Runs `iptables -w ARGS` once.
    fn iptables(&self, args: &[&str]) -> io::Result<ToolOutput>;
    /// The network namespace of `pid`, held open, when `pid` is a process
    /// of the container `container_id` (by its cgroup); none otherwise.
    fn container_namespace(&self, container_id: &str, pid: u32) -> Option<File>;
    /// This process's own network namespace, held open.
    fn own_namespace(&self) -> io::Result<File>;
    /// Whether the namespace of `pid` has an `eth0`.
    fn has_eth0(&self, pid: u32) -> bool;
    /// The names of the host's network links.
    fn links(&self) -> Vec<String>;
    /// The host's own addresses and the networks its interfaces sit on,
    /// as they are now.
    fn host_networks(&self) -> Vec<IpNet>;
    /// The link `name` as a bridge port; none when there is no such link.
    fn port(&self, name: &str) -> Option<Port>;
    /// Makes a veth pair: `eth0` in `namespace` as `addressing` says, and
    /// `host_end` in `server` (this process's namespace), down and on no
    /// bridge; on an error nothing of it is left.
    fn make_veth_pair(
        &self,
        namespace: &File,
        server: &File,
        host_end: &str,
        addressing: Addressing,
        deadline: &Deadline,
    ) -> Result<(), StepError>;
    /// Makes `host_end` an isolated port of `bridge`, up.
    fn join_port(&self, host_end: &str, bridge: &str, deadline: &Deadline) -> Result<(), StepError>;
    /// Deletes the link `host_end` (and so its pair's other end).
    fn delete_link(&self, host_end: &str, deadline: &Deadline) -> Result<(), StepError>;
    /// Deletes every tracked IPv4 flow with an address that `doomed` picks;
    /// how many.
    fn forget_flows(&self, doomed: &dyn Fn(Ipv4Addr) -> bool) -> io::Result<usize>;
}

/// The host's own kernel and programs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

/// The host's own kernel and programs, for the structures that hold a
/// [`Syscalls`].
pub fn linux() -> Arc<dyn Syscalls> {
    Arc::new(Linux)
}

/// [`Syscalls::forget_flows`] on a blocking thread (a netlink read blocks
/// for up to five seconds), for async callers.
pub async fn forget_flows_off_thread(
    host: &Arc<dyn Syscalls>,
    doomed: impl Fn(Ipv4Addr) -> bool + Send + 'static,
) -> io::Result<usize> {
    let host = host.clone();
    tokio::task::spawn_blocking(move || host.forget_flows(&doomed))
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn c_text(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Runs `cmd` with no input, killed once `deadline` has passed.
fn run_within(cmd: &mut Command, deadline: Duration) -> Result<std::process::Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let until = Instant::now() + deadline;
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(_) => return child.wait_with_output().map_err(|e| e.to_string()),
            None if Instant::now() >= until => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {deadline:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

impl Syscalls for Linux {
    fn make_ext4(&self, image: &Path, inodes: u64, deadline: Duration) -> Result<(), String> {
        let extended = format!("lazy_itable_init=1,lazy_journal_init=1,root_owner={SANDBOX_UID}:{SANDBOX_UID}");
        let out = run_within(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-N", &inodes.to_string(), "-E", &extended])
                .arg(image)
                .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin"),
            deadline,
        )?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }

    fn mount_ext4(&self, image: &Path, target: &Path, flags: libc::c_ulong, options: &str) -> io::Result<()> {
        crate::loopdev::mount_ext4(image, target, flags, options)
    }

    fn mount_tmpfs(&self, source: &str, target: &Path, flags: libc::c_ulong, options: &str) -> io::Result<()> {
        let (c_source, c_target, c_options) = (c_text(source)?, c_path(target)?, c_text(options)?);
        // SAFETY: valid NUL-terminated strings that outlive the call.
        let done = unsafe {
            libc::mount(
                c_source.as_ptr(),
                c_target.as_ptr(),
                c"tmpfs".as_ptr(),
                flags,
                c_options.as_ptr().cast(),
            )
        } == 0;
        match done {
            true => Ok(()),
            false => Err(io::Error::last_os_error()),
        }
    }

    fn unmount(&self, target: &Path, lazily_if_busy: bool) -> io::Result<()> {
        let c_target = c_path(target)?;
        // SAFETY: a valid NUL-terminated path.
        let done = unsafe { libc::umount2(c_target.as_ptr(), 0) } == 0
            || (lazily_if_busy && unsafe { libc::umount2(c_target.as_ptr(), libc::MNT_DETACH) } == 0);
        match done {
            true => Ok(()),
            false => Err(io::Error::last_os_error()),
        }
    }

    fn is_mount_point(&self, path: &Path) -> bool {
        let (Ok(me), Some(Ok(parent))) = (path.metadata(), path.parent().map(Path::metadata)) else {
            return false;
        };
        me.dev() != parent.dev()
    }

    fn iptables(&self, args: &[&str]) -> io::Result<ToolOutput> {
        let out = Command::new("iptables").arg("-w").args(args).output()?;
        Ok(ToolOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }

    fn container_namespace(&self, container_id: &str, pid: u32) -> Option<File> {
        let namespace = File::open(format!("/proc/{pid}/ns/net")).ok()?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        (container_id.len() >= 12 && cgroups.contains(container_id)).then_some(namespace)
    }

    fn own_namespace(&self) -> io::Result<File> {
        File::open("/proc/self/ns/net")
    }

    fn has_eth0(&self, pid: u32) -> bool {
        let interfaces = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
        interfaces.lines().any(|l| l.trim_start().starts_with("eth0:"))
    }

    fn links(&self) -> Vec<String> {
        std::fs::read_dir("/sys/class/net")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect()
    }

    fn host_networks(&self) -> Vec<IpNet> {
        crate::addresses::host_networks()
    }

    fn port(&self, name: &str) -> Option<Port> {
        let dir = Path::new("/sys/class/net").join(name);
        if !dir.exists() {
            return None;
        }
        let master = std::fs::read_link(dir.join("master"))
            .ok()
            .and_then(|m| m.file_name().and_then(|n| n.to_str()).map(String::from));
        let up = std::fs::read_to_string(dir.join("flags"))
            .ok()
            .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
            .is_some_and(|f| f & libc::IFF_UP as u32 != 0);
        Some(Port { master, up })
    }

    fn make_veth_pair(
        &self,
        namespace: &File,
        server: &File,
        host_end: &str,
        addressing: Addressing,
        deadline: &Deadline,
    ) -> Result<(), StepError> {
        crate::veth::make_pair(namespace, server, host_end, addressing, deadline)
    }

    fn join_port(&self, host_end: &str, bridge: &str, deadline: &Deadline) -> Result<(), StepError> {
        crate::veth::join_port(host_end, bridge, deadline)
    }

    fn delete_link(&self, host_end: &str, deadline: &Deadline) -> Result<(), StepError> {
        crate::veth::delete(host_end, deadline)
    }

    fn forget_flows(&self, doomed: &dyn Fn(Ipv4Addr) -> bool) -> io::Result<usize> {
        crate::conntrack::forget_where(doomed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_past_its_deadline_is_ended_and_one_within_it_answers() {
        let started = Instant::now();
        let late = run_within(Command::new("sleep").arg("5"), Duration::from_millis(100));
        assert!(late.unwrap_err().contains("no answer"));
        assert!(started.elapsed() < Duration::from_secs(3), "killed, not waited for");
        let out = run_within(Command::new("echo").arg("hi"), Duration::from_secs(5)).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
        assert!(!Linux.is_mount_point(Path::new("/no/such/path")));
    }
}
