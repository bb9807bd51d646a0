//! Where the host's CPU went while a benchmark's phase ran: the server, the
//! engine's containers, the benchmark itself, and the rest (engine daemons,
//! kernel threads, anything else on the host). A phase that keeps every
//! core busy cannot end sooner than its CPU divided by the cores, whatever
//! the software does with its waits: these figures say how close a latency
//! is to that bound, and which part of the work to make cheaper.

use std::path::Path;
use std::time::{Duration, Instant};

/// Counters read at one moment; [`CpuSplit::since`] subtracts two of them.
pub struct CpuMark {
    at: Instant,
    host: Option<HostTimes>,
    server: Option<Duration>,
    containers: Option<Duration>,
    own: Option<Duration>,
}

impl CpuMark {
    /// Reads the counters now; `server` is the server's process id.
    pub fn now(server: u32) -> Self {
        Self {
            at: Instant::now(),
            host: host_times(),
            server: process_cpu(server),
            containers: containers_cpu(),
            own: process_cpu(std::process::id()),
        }
    }
}

/// CPU time spent between two marks, by whom.
pub struct CpuSplit {
    pub wall: Duration,
    pub cores: usize,
    pub host: Option<Duration>,
    pub steal: Option<Duration>,
    pub server: Option<Duration>,
    pub containers: Option<Duration>,
    pub own: Option<Duration>,
}

impl CpuSplit {
    pub fn since(start: &CpuMark, end: &CpuMark) -> Self {
        let diff = |a: Option<Duration>, b: Option<Duration>| Some(b?.saturating_sub(a?));
        Self {
            wall: end.at - start.at,
            cores: end.host.map_or(1, |h| h.cores),
            host: diff(start.host.map(|h| h.busy), end.host.map(|h| h.busy)),
            steal: diff(start.host.map(|h| h.steal), end.host.map(|h| h.steal)),
            server: diff(start.server, end.server),
            containers: diff(start.containers, end.containers),
            own: diff(start.own, end.own),
        }
    }

    /// One line: the host's busy time against what the cores could give in
    /// the wall time, then each part, in milliseconds, and the whole per
    /// unit of work (`per`, `units` of it).
    pub fn line(&self, units: usize, per: &str) -> String {
        let ms = |d: Option<Duration>| d.map_or("n/a".to_string(), |d| format!("{:.0}", d.as_secs_f64() * 1e3));
        let known: Duration = [self.server, self.containers, self.own].iter().flatten().sum();
        let other = self.host.map(|h| h.saturating_sub(known));
        let capacity = self.wall.as_secs_f64() * self.cores as f64;
        let busy = self.host.map_or("n/a".to_string(), |h| {
            format!("{:.0} % busy", 100.0 * h.as_secs_f64() / capacity.max(f64::EPSILON))
        });
        let whole = self.host.map_or("n/a".to_string(), |h| {
            format!("{:.2}", h.as_secs_f64() * 1e3 / units.max(1) as f64)
        });
        format!(
            "CPU {} ms in {:.2} s on {} cores ({busy}): server {}, containers {}, this benchmark {}, other {}; {whole} ms per {per}; stolen by the hypervisor {} ms",
            ms(self.host),
            self.wall.as_secs_f64(),
            self.cores,
            ms(self.server),
            ms(self.containers),
            ms(self.own),
            ms(other),
            ms(self.steal),
        )
    }
}

/// The host's counters in `/proc/stat`, whose ticks make them exact to
/// about 10 ms per core.
#[derive(Clone, Copy)]
struct HostTimes {
    /// Time the cores spent running anything.
    busy: Duration,
    /// Time the hypervisor gave them to other guests: a shared host's
    /// noise, not this host's work.
    steal: Duration,
    /// The cores those times are summed over (every `cpuN` line), so that
    /// the busy share is of the same cores whatever this process may use.
    cores: usize,
}

fn host_times() -> Option<HostTimes> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let cores = stat
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Some(HostTimes {
        busy: ticks([0, 1, 2, 5, 6].iter().map(|&i| field(i)).sum()),
        steal: ticks(field(7)),
        cores: cores.max(1),
    })
}

/// A process's CPU: the sum of its live threads' run time in nanoseconds
/// (from `schedstat`; a thread that ends between two marks takes its time
/// with it), or its ticks where the kernel keeps no `schedstat`.
fn process_cpu(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let run_ns = |path: std::path::PathBuf| -> Option<u64> {
        std::fs::read_to_string(path)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let times: Vec<u64> = tasks
        .flatten()
        .filter_map(|t| run_ns(t.path().join("schedstat")))
        .collect();
    match times.is_empty() {
        true => process_ticks(pid),
        false => Some(Duration::from_nanos(times.iter().sum())),
    }
}

fn process_ticks(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Past the command's closing parenthesis: state is field 0, utime 11, stime 12.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(ticks(user + system))
}

/// Every container of the engine (the cgroupfs driver's `docker` group, v1
/// or v2); `None` where the engine keeps them elsewhere.
fn containers_cpu() -> Option<Duration> {
    for v1 in ["/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/cpu,cpuacct/docker"] {
        if let Some(ns) = read_number(&Path::new(v1).join("cpuacct.usage")) {
            return Some(Duration::from_nanos(ns));
        }
    }
    let stat = std::fs::read_to_string("/sys/fs/cgroup/docker/cpu.stat").ok()?;
    let usec = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_micros(usec))
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Clock ticks as time; whole seconds apart, so that a long-running host's
/// totals (ticks × 10⁹ past u64) cannot overflow.
fn ticks(n: u64) -> Duration {
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_secs(n / per_second) + Duration::from_nanos(n % per_second * 1_000_000_000 / per_second)
}
