//! A container's cgroup read from the host, where the engine's answer
//! would cost a round trip: whether it is frozen, what it used, its first
//! process, its network bytes.

use std::path::Path;

use super::*;
use crate::counters::{Counters, PeakMark};

/// Whether the processes of a container that has a cgroup here are frozen
/// (`docker pause`, by this server or anyone); `None` where no cgroup of it
/// is found (it stopped, or the layout is none of Docker's usual ones).
pub(super) fn cgroup_frozen(container_id: &str) -> Option<bool> {
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
pub(super) fn cgroup_usage(container_id: &str) -> Option<Usage> {
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

/// CPU and network so far, straight from the container's cgroup (see
/// [`crate::counters`]); None where the layout is none of Docker's usual ones.
pub(super) fn cgroup_counters(container_id: &str) -> Option<Counters> {
    let [v2_cgroupfs, v2_systemd, memory] = cgroup_dirs(container_id)?;
    let v2 = [v2_cgroupfs, v2_systemd].into_iter().find_map(|dir| {
        let stat = std::fs::read_to_string(format!("{dir}/cpu.stat")).ok()?;
        let cpu_us = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())?;
        Some(Counters {
            cpu_seconds: cpu_us as f64 / 1e6,
            network_bytes: network_bytes(&dir),
        })
    });
    v2.or_else(|| {
        let cpu_ns = ["cpuacct", "cpu,cpuacct"].iter().find_map(|c| {
            let text =
                std::fs::read_to_string(format!("/sys/fs/cgroup/{c}/docker/{container_id}/cpuacct.usage")).ok()?;
            text.trim().parse::<u64>().ok()
        })?;
        Some(Counters {
            cpu_seconds: cpu_ns as f64 / 1e9,
            network_bytes: network_bytes(&memory),
        })
    })
}

/// A mark on the container's cgroup from which its memory's peak is read.
pub(super) fn cgroup_peak_mark(container_id: &str) -> Option<PeakMark> {
    let [v2_cgroupfs, v2_systemd, memory] = cgroup_dirs(container_id)?;
    [v2_cgroupfs, v2_systemd]
        .iter()
        .find_map(|dir| PeakMark::set_v2(Path::new(dir)))
        .or_else(|| PeakMark::set_v1(Path::new(&memory)))
}

/// Bytes received and sent on the network interfaces (loopback aside) of
/// the network namespace of the container's processes, read through the
/// lowest process id in the cgroup folder `dir` (the container's first
/// process, unless ids wrapped): the container's own interfaces, counted by
/// the host's kernel whatever the sandbox does. None when unreadable (the
/// process just ended, say).
pub(super) fn network_bytes(dir: &str) -> Option<u64> {
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

/// The lowest process id in the cgroup folder `dir`.
pub(super) fn lowest_pid(dir: &str) -> Option<u32> {
    let procs = std::fs::read_to_string(format!("{dir}/cgroup.procs")).ok()?;
    procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()).min()
}

/// A process of the running container `container_id` (a full id), from its
/// cgroup in Docker's usual layouts (cgroup v2 with the cgroupfs or the
/// systemd driver, v1): any of them is in the container's namespaces.
pub(super) fn cgroup_pid(container_id: &str) -> Option<u32> {
    cgroup_dirs(container_id)?.iter().find_map(|dir| lowest_pid(dir))
}

/// A container's cgroup folders in Docker's usual layouts: cgroup v2 with
/// the cgroupfs driver, v2 with the systemd driver, v1's memory
/// controller. None for anything but a full container id, which alone is
/// put into a path.
pub(super) fn cgroup_dirs(container_id: &str) -> Option<[String; 3]> {
    if container_id.len() != 64 || !container_id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    Some([
        format!("/sys/fs/cgroup/docker/{container_id}"),
        format!("/sys/fs/cgroup/system.slice/docker-{container_id}.scope"),
        format!("/sys/fs/cgroup/memory/docker/{container_id}"),
    ])
}
