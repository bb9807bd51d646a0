//! Resting: the actor of a sandbox asleep on disk and left alone stops, and
//! hands the supervisor what it kept only in memory, so that a sleeping
//! sandbox costs the server its registry entry and little else (see
//! [`crate::registry`]). Its next call starts an actor again from its record
//! and this.

use std::time::Duration;

use time::OffsetDateTime;

use super::SandboxState;
use crate::config::Settings;
use crate::history::History;
use crate::records::InstallState;

/// How long a sleeping sandbox's actor waits without messages before it
/// rests: calls that come in a row (a listing of files, then a read) find it
/// still there.
pub(super) const REST_AFTER: Duration = Duration::from_secs(10);

/// The reason an actor that rests stops with.
pub const RESTED: &str = "rested";

/// What a resting actor kept only in memory, for its next actor.
#[derive(Debug)]
pub struct Rested {
    pub(super) history: History,
    /// Idle expiry counts from it, asleep or not.
    pub(super) last_used: OffsetDateTime,
    /// The end of its lifetime, from its record.
    pub(super) lifetime_ends: Option<OffsetDateTime>,
    pub(super) notice: Option<String>,
    pub(super) python_lost: bool,
}

impl Rested {
    /// A sleeping sandbox adopted at start, before any actor of this server
    /// held it.
    pub fn adopted(lifetime_ends: Option<OffsetDateTime>) -> Self {
        Self {
            history: History::default(),
            last_used: crate::moment::now(),
            lifetime_ends,
            notice: None,
            python_lost: false,
        }
    }

    pub fn last_used(&self) -> OffsetDateTime {
        self.last_used
    }

    pub fn lifetime_ends(&self) -> Option<OffsetDateTime> {
        self.lifetime_ends
    }

    /// Its lifetime or idle time is over: its actor must start to delete it.
    pub fn due(&self, settings: &Settings, now: OffsetDateTime) -> bool {
        expiry(settings, self.lifetime_ends, self.last_used).is_some_and(|t| t <= now)
    }
}

/// The earlier of the end of a lifetime and of an idle time that began at
/// `last_used`.
pub(crate) fn expiry(
    settings: &Settings,
    lifetime_ends: Option<OffsetDateTime>,
    last_used: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let idle = settings.sandbox.idle_timeout_seconds;
    let idle_end = (idle > 0).then(|| last_used + Duration::from_secs(idle));
    match (lifetime_ends, idle_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the actor may stop now without anything lost or left waiting:
/// asleep, with no job, queue, install, check or fork of its own, and no
/// message for a while.
pub(super) fn may_rest(state: &SandboxState) -> bool {
    state.record.hibernated.is_some()
        && state.deletion.is_none()
        && state.record.seeding.is_none()
        && state.link.is_some()
        && state.queue.is_empty()
        && !state.sleeping
        && state.first_call.is_none()
        && !state.checking_venv.load(std::sync::atomic::Ordering::SeqCst)
        && state
            .installs
            .values()
            .all(|tx| tx.borrow().status != InstallState::Installing)
        && state.touched.elapsed() >= REST_AFTER
}

/// Takes from the actor's state what its next actor needs.
pub(super) fn take(state: &mut SandboxState) -> Rested {
    Rested {
        history: std::mem::take(&mut state.history),
        last_used: state.last_used,
        lifetime_ends: state.record.expires_at,
        notice: state.notice.take(),
        python_lost: state.python_lost,
    }
}
