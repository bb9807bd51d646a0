//! A container's counters read for one run's receipt, where reading them
//! costs no engine call (its cgroup on this host): CPU and network so far,
//! and a mark from which its memory's peak is measured.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Counters of a container at one moment.
#[derive(Debug)]
pub struct Counters {
    /// CPU time since the container started.
    pub cpu_seconds: f64,
    /// Bytes received and sent on its own interfaces since it started.
    pub network_bytes: Option<u64>,
}

/// The highest memory use of a cgroup from a moment on: cgroup v2's
/// `memory.peak`, reset for this descriptor when opened (Linux 6.12 and
/// later; earlier kernels refuse the reset, and no mark is made), or cgroup
/// v1's `memory.max_usage_in_bytes`, reset for every reader (the sandbox's
/// runs are one at a time, and nothing else of the server reads it).
#[derive(Debug)]
pub struct PeakMark(File);

impl PeakMark {
    /// A mark on the cgroup v2 folder `dir`, or None where it cannot be set.
    pub fn set_v2(dir: &Path) -> Option<Self> {
        Self::set(&dir.join("memory.peak"), b"reset\n")
    }

    /// A mark on the cgroup v1 memory folder `dir`.
    pub fn set_v1(dir: &Path) -> Option<Self> {
        Self::set(&dir.join("memory.max_usage_in_bytes"), b"0\n")
    }

    fn set(path: &Path, reset: &[u8]) -> Option<Self> {
        let mut file = File::options().read(true).write(true).open(path).ok()?;
        file.write_all(reset).ok()?;
        Some(Self(file))
    }

    /// The highest memory use, in bytes, since the mark was set.
    pub fn read(&mut self) -> Option<u64> {
        let mut text = String::new();
        self.0.seek(SeekFrom::Start(0)).ok()?;
        (&self.0).take(64).read_to_string(&mut text).ok()?;
        text.trim().parse().ok()
    }
}
