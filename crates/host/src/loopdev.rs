//! Mounting a disk image through a loop device by system calls.
//!
//! `mount -o loop` first reads the backing file of every loop device on the
//! host, to refuse an image that is attached already; with two devices per
//! sandbox that scan grows with the host's sandboxes and was most of what a
//! sandbox's two mounts cost (measured in a burst of creations with 100
//! sandboxes live: 9 % of both cores, in `stat` and `ioctl` calls over
//! `/sys/block/loop*`). Here a free device is asked of the kernel, the image
//! attached to it with `LOOP_CONFIGURE` and mounted: a constant cost. The
//! check `mount` makes has nothing to catch here: each image belongs to one
//! sandbox and is mounted only where nothing is (a new sandbox's folders, or
//! at start a sandbox's folder found unmounted, one record after another).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `<linux/loop.h>`.
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// How often a free device is asked for again when another process took
/// the one the kernel named first.
const ATTACH_TRIES: usize = 16;

/// Held from asking for a free device until it is taken: the kernel names
/// the same lowest free device to every caller, so the server's own
/// concurrent attaches (two per creation, a burst's worth at once) would
/// otherwise take it from each other until one ran out of tries.
static ATTACHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// Attaches `image` to a free loop device, set to detach itself once its
/// last user closes it: the caller's handle, then the file system mounted
/// from it.
fn attach(image: &Path) -> io::Result<(File, String)> {
    let control = OpenOptions::new().read(true).write(true).open("/dev/loop-control")?;
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let mut config = LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: 0,
        info: LoopInfo64 {
            device: 0,
            inode: 0,
            rdevice: 0,
            offset: 0,
            sizelimit: 0,
            number: 0,
            encrypt_type: 0,
            encrypt_key_size: 0,
            flags: LO_FLAGS_AUTOCLEAR,
            file_name: [0; 64],
            crypt_name: [0; 64],
            encrypt_key: [0; 32],
            init: [0; 2],
        },
        reserved: [0; 8],
    };
    let name = image.as_os_str().as_bytes();
    let kept = name.len().min(config.info.file_name.len() - 1);
    config.info.file_name[..kept].copy_from_slice(&name[..kept]);
    // A panic while held poisons nothing this guards.
    let _attaching = ATTACHING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut busy = None;
    for _ in 0..ATTACH_TRIES {
        // SAFETY: an ioctl without argument on a descriptor this holds.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = format!("/dev/loop{n}");
        let device = OpenOptions::new().read(true).write(true).open(&path)?;
        // SAFETY: `config` is a `struct loop_config` that outlives the call.
        if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &config) } == 0 {
            return Ok((device, path));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
        busy = Some(e);
    }
    Err(busy.expect("at least one try"))
}

/// Mounts the ext4 file system of `image` at `target` with `flags` and
/// `options`. The loop device goes with the file system: it is detached
/// when the file system is unmounted, or at once when the mount fails.
pub(crate) fn mount_ext4(image: &Path, target: &Path, flags: libc::c_ulong, options: &str) -> io::Result<()> {
    let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let c_target = CString::new(target.as_os_str().as_bytes()).map_err(invalid)?;
    let c_options = CString::new(options).map_err(invalid)?;
    let (device, path) = attach(image)?;
    let c_device = CString::new(path).map_err(invalid)?;
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let done = unsafe {
        libc::mount(
            c_device.as_ptr(),
            c_target.as_ptr(),
            c"ext4".as_ptr(),
            flags,
            c_options.as_ptr().cast(),
        )
    } == 0;
    let result = if done { Ok(()) } else { Err(io::Error::last_os_error()) };
    drop(device);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device mounted at `target`, from this process's mount table.
    fn device_at(target: &Path) -> Option<String> {
        let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let target = target.to_str()?;
        table.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            (fields[4] == target).then(|| fields[dash + 2].to_string())
        })
    }

    fn backing_file(device: &str) -> Option<String> {
        let name = device.strip_prefix("/dev/")?;
        std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()
    }

    /// Needs root and mkfs.ext4, as the server's disk quotas do (CI runs
    /// as root); elsewhere it says so and passes.
    #[test]
    fn an_image_is_mounted_through_a_device_that_goes_with_its_file_system() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (image, target) = (dir.path().join("disk.img"), dir.path().join("mnt"));
        std::fs::create_dir(&target).unwrap();
        std::fs::File::create(&image).unwrap().set_len(8 << 20).unwrap();
        let made = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
            .status()
            .unwrap();
        assert!(made.success());

        mount_ext4(
            &image,
            &target,
            libc::MS_NODEV | libc::MS_NOSUID,
            "noinit_itable,discard",
        )
        .unwrap();
        let device = device_at(&target).expect("mounted");
        assert!(device.starts_with("/dev/loop"), "{device}");
        let backing = backing_file(&device).expect("attached");
        assert_eq!(backing.trim(), image.to_str().unwrap());
        std::fs::write(target.join("f"), b"written").unwrap();
        let options = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = options.lines().find(|l| l.contains(target.to_str().unwrap())).unwrap();
        assert!(
            line.contains("nodev") && line.contains("nosuid") && line.contains("discard"),
            "{line}"
        );

        // A second mount of a file that holds no file system fails and
        // leaves no device behind.
        let junk = dir.path().join("junk.img");
        std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        assert!(mount_ext4(&junk, &other, 0, "").is_err());
        let c_target = CString::new(target.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::umount2(c_target.as_ptr(), 0) }, 0);
        // Both devices detached, the mounted one with its file system (the
        // kernel does it a moment later).
        let attached = |file: &Path| {
            std::fs::read_dir("/sys/block")
                .unwrap()
                .flatten()
                .filter_map(|e| backing_file(&format!("/dev/{}", e.file_name().to_string_lossy())))
                .any(|b| b.trim() == file.to_str().unwrap())
        };
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            !attached(&image) && !attached(&junk)
        });
        assert!(gone, "{device} or a failed mount's device stayed attached");
    }
}
