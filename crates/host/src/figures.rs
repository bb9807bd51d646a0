//! Figures about the host the sandboxes share: the free space of a file
//! system and the host's memory. They back the free-disk guard, `/health`,
//! `/metrics`, the start-up memory warning and the pool's size; and the
//! server's own standing with the kernel's OOM killer.

use std::path::Path;

/// Space of the file system holding `path`, as `statvfs` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    /// Bytes an unprivileged writer may still use.
    pub free_bytes: u64,
    pub total_files: u64,
    pub free_files: u64,
}

/// `statvfs(path)`; `None` when the path cannot be examined.
pub fn space(path: &Path) -> Option<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a properly sized out-parameter.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some(Space {
        total_bytes: st.f_blocks as u64 * unit,
        free_bytes: st.f_bavail as u64 * unit,
        total_files: st.f_files as u64,
        free_files: st.f_favail as u64,
    })
}

/// The least free space among `paths` (the state and results folders may
/// be on different file systems; the fuller one decides).
pub fn free_disk_bytes<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Option<u64> {
    paths.into_iter().filter_map(|p| space(p).map(|s| s.free_bytes)).min()
}

/// The host's memory (`MemTotal` of `/proc/meminfo`).
pub fn memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Gives the free pages of the server's heap back to the kernel (glibc's
/// `malloc_trim`). Memory the server freed (the actors of sandboxes that went
/// dormant) is otherwise kept by the allocator, among allocations that live
/// on, and counted in the server's memory. It walks the heap: call it
/// seldom, off the async threads. Elsewhere than glibc, it does nothing.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps the heap in at most two glibc arenas. glibc gives threads arenas
/// of their own, up to eight per core, and each keeps what it freed (the
/// blocking threads' disk and file work, the listings of thousands of
/// sleeping sandboxes): with two, the server held less at every step of the
/// density bench (docs/benchmarks.md, "Many sandboxes, most asleep"). Call
/// it before other threads allocate. Elsewhere than glibc, it does nothing.
pub fn limit_heap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only changes the allocator's
    // settings.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Lowers this process's OOM score so that, when the host runs out of
/// memory, the kernel ends a sandbox rather than the server. Needs root
/// (CAP_SYS_RESOURCE) to go below zero.
pub fn protect_from_oom_killer(adj: i32) -> std::io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", adj.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_of_this_host() {
        let s = space(Path::new("/")).expect("statvfs /");
        assert!(s.total_bytes > 0 && s.free_bytes <= s.total_bytes);
        assert!(space(Path::new("/no/such/folder")).is_none());
        assert!(free_disk_bytes([Path::new("/"), Path::new("/nope")]).is_some());
        assert_eq!(free_disk_bytes([Path::new("/nope")]), None);
        assert!(memory_bytes().expect("MemTotal") > 64 * 1024 * 1024);
    }
}
