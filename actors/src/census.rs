//! Which registered sandboxes are awake and which asleep, for the caps: the
//! live caps (`limits.max_sandboxes_total`, each tenant's most) count the
//! awake ones only, and hibernated ones count against caps of their own
//! (`limits.max_hibernated_total`, `limits.max_hibernated_per_tenant`), so
//! that sleeping sandboxes cost disk, not the room memory is kept for.
//!
//! Each registered sandbox carries its own flag, which its actor turns as
//! it goes to sleep and wakes. A turn is checked against the caps and made
//! under one lock, so that two at once never both take the last place; the
//! flag goes with the registry's entry, so a deleted sandbox counts nowhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::config::Settings;
use crate::error::{Result, SandboxError};
use crate::registry::Registry;

pub struct Census {
    registry: Registry,
    turns: Mutex<()>,
}

impl Census {
    pub(crate) fn new(registry: Registry) -> Self {
        Self {
            registry,
            turns: Mutex::new(()),
        }
    }

    /// The awake (`asleep` false) or hibernated sandboxes of `owner`, or of
    /// every tenant.
    pub(crate) fn count(&self, owner: Option<&str>, asleep: bool) -> usize {
        let registry = self.registry.read().expect("registry lock");
        registry
            .values()
            .filter(|e| owner.is_none_or(|o| e.owner == o) && e.asleep.load(Ordering::Acquire) == asleep)
            .count()
    }

    /// Turns a sandbox of `owner` (its flag, `asleep`) to hibernated, when
    /// the hibernated caps leave room for it.
    pub(crate) fn fall_asleep(&self, asleep: &AtomicBool, owner: &str, settings: &Settings) -> Result<()> {
        let _turn = self.turns.lock().expect("census lock");
        if asleep.load(Ordering::Acquire) {
            return Ok(());
        }
        let mine = self.count(Some(owner), true);
        if mine >= settings.max_hibernated_per_tenant {
            return Err(SandboxError::Quota(format!(
                "not put to sleep: you have {mine} hibernated sandboxes, the most a tenant may \
                 (limits.max_hibernated_per_tenant); delete one you no longer need"
            )));
        }
        let all = self.count(None, true);
        if all >= settings.max_hibernated_total {
            return Err(SandboxError::Quota(format!(
                "not put to sleep: the server holds its maximum of {all} hibernated sandboxes \
                 (limits.max_hibernated_total)"
            )));
        }
        asleep.store(true, Ordering::Release);
        Ok(())
    }

    /// Turns a hibernated sandbox of `owner` to awake, when the live caps
    /// leave room for it.
    pub(crate) fn wake(&self, asleep: &AtomicBool, owner: &str, settings: &Settings) -> Result<()> {
        let _turn = self.turns.lock().expect("census lock");
        if !asleep.load(Ordering::Acquire) {
            return Ok(());
        }
        let most = settings.live_cap.of(owner);
        let mine = self.count(Some(owner), false);
        if mine >= most {
            return Err(SandboxError::Quota(format!(
                "you have {mine} live sandboxes, your most; hibernate or delete one, then call again"
            )));
        }
        let all = self.count(None, false);
        if all >= settings.max_sandboxes_total {
            return Err(SandboxError::Quota(format!(
                "the server holds its maximum of {all} live sandboxes; try again later"
            )));
        }
        asleep.store(false, Ordering::Release);
        Ok(())
    }
}
