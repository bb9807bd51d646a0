//! The disk that snapshot saves in flight may still write.
//!
//! One check of free space before a save does not hold when saves run side
//! by side: each sees the space the others are about to fill. A save first
//! reserves what it may write (see `Snapshots::reserve_room`); a
//! reservation is refused when the file system's free space, less every
//! reservation held, would fall below what `limits.min_free_disk_mb`
//! keeps. Free space read during the others' saves already lacks what they
//! wrote, which they still hold: the count errs towards refusing.

use std::sync::{Arc, Mutex};

/// The bytes reserved by saves in flight, server-wide.
#[derive(Debug, Default)]
pub(super) struct DiskReserve {
    held: Mutex<u64>,
}

/// One save's reservation, given back when dropped.
#[must_use = "the reservation ends when this is dropped"]
pub(super) struct Reserved {
    reserve: Arc<DiskReserve>,
    bytes: u64,
}

impl DiskReserve {
    /// Reserves `need` bytes of a file system with `free` bytes free, so
    /// that `keep` stay free once every reservation is written. Refused
    /// with the bytes the others hold.
    pub(super) fn take(self: &Arc<Self>, free: u64, keep: u64, need: u64) -> Result<Reserved, u64> {
        let mut held = self.held.lock().expect("never poisoned: no panics under it");
        if free.saturating_sub(*held) < keep.saturating_add(need) {
            return Err(*held);
        }
        *held += need;
        Ok(Reserved {
            reserve: self.clone(),
            bytes: need,
        })
    }

    /// A reservation of nothing (the free space could not be read).
    pub(super) fn nothing(self: &Arc<Self>) -> Reserved {
        Reserved {
            reserve: self.clone(),
            bytes: 0,
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        *self.reserve.held.lock().expect("never poisoned: no panics under it") -= self.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn saves_side_by_side_cannot_together_pass_the_reserve() {
        let reserve = Arc::new(DiskReserve::default());
        // 1,000 MB free, 500 kept: room for one save of 300 MB, not two.
        let first = reserve.take(1000 * MB, 500 * MB, 300 * MB).expect("one fits");
        assert_eq!(
            reserve.take(1000 * MB, 500 * MB, 300 * MB).err(),
            Some(300 * MB),
            "the second is refused while the first holds its room"
        );
        let small = reserve.take(1000 * MB, 500 * MB, 200 * MB).expect("what is left fits");
        drop(first);
        drop(small);
        let again = reserve.take(1000 * MB, 500 * MB, 300 * MB);
        assert!(again.is_ok(), "a finished save gives its room back");
    }

    #[test]
    fn a_save_larger_than_the_room_is_refused_alone() {
        let reserve = Arc::new(DiskReserve::default());
        assert_eq!(reserve.take(600 * MB, 500 * MB, 101 * MB).err(), Some(0));
        assert!(
            reserve.take(100 * MB, 500 * MB, 0).is_err(),
            "below the reserve already"
        );
        let nothing = reserve.nothing();
        drop(nothing);
        assert!(reserve.take(600 * MB, 500 * MB, 100 * MB).is_ok());
    }
}
