//! Open MCP sessions, of both transports that have them (legacy SSE
//! streams and Streamable HTTP sessions before 2026-07-28): how many each
//! tenant and the whole server hold, and which have idled long enough to be
//! closed. A session is idle while no call of it runs and its client sends
//! nothing; keep-alive comments the server writes are not activity. The
//! stateless 2026-07-28 revision has no sessions and holds nothing here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::access::caller::Caller;
use crate::access::limits::LimitsConfig;
use crate::metrics::{Metrics, SessionRefusal};

struct Entry {
    tenant: String,
    /// When the client last did something, or a call of it ended.
    last_active: Mutex<Instant>,
    /// Calls of this session still running.
    busy: AtomicUsize,
    /// When the key that opened it stops being valid (guest keys).
    deadline: Option<Instant>,
    close: CancellationToken,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    entries: HashMap<u64, Arc<Entry>>,
    per_tenant: HashMap<String, usize>,
}

struct Inner {
    per_tenant: usize,
    total: usize,
    idle: Duration,
    open: Mutex<Open>,
    metrics: Arc<Metrics>,
}

/// The registry; cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

/// One open session's place in the registry: dropping it frees the place
/// and signals [`Ticket::closed`].
pub struct Ticket {
    id: u64,
    entry: Arc<Entry>,
    inner: Arc<Inner>,
}

/// Marks a call of a session as running until dropped.
pub struct Busy(Arc<Entry>);

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.last_active.lock().expect("session lock") = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Ticket {
    /// The client did something.
    pub fn touch(&self) {
        *self.entry.last_active.lock().expect("session lock") = Instant::now();
    }

    /// A call starts; it is running until the returned guard is dropped.
    pub fn busy(&self) -> Busy {
        self.entry.busy.fetch_add(1, Ordering::AcqRel);
        self.touch();
        Busy(self.entry.clone())
    }

    /// A call starts that its answer ends ([`Ticket::end_call`]), for
    /// transports that see requests and answers as separate messages.
    pub fn begin_call(&self) {
        self.entry.busy.fetch_add(1, Ordering::AcqRel);
        self.touch();
    }

    pub fn end_call(&self) {
        let _ = self
            .entry
            .busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.touch();
    }

    /// Resolves when the registry closes the session (idle, its key
    /// expired) or the ticket is dropped.
    pub fn closed(&self) -> WaitForCancellationFutureOwned {
        self.entry.close.clone().cancelled_owned()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.entry.close.cancel();
        let mut open = self.inner.open.lock().expect("sessions lock");
        if open.entries.remove(&self.id).is_some() {
            if let Some(n) = open.per_tenant.get_mut(&self.entry.tenant) {
                *n -= 1;
                if *n == 0 {
                    open.per_tenant.remove(&self.entry.tenant);
                }
            }
            self.inner.metrics.session_closed();
        }
    }
}

impl Sessions {
    pub fn new(limits: &LimitsConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                per_tenant: limits.max_sessions_per_tenant,
                total: limits.max_sessions_total,
                idle: Duration::from_secs(limits.session_idle_seconds),
                open: Mutex::default(),
                metrics,
            }),
        }
    }

    /// A place for a new session of `caller`, or why there is none.
    pub fn open(&self, caller: &Caller) -> Result<Ticket, SessionRefusal> {
        let mut open = self.inner.open.lock().expect("sessions lock");
        let refused = if open.entries.len() >= self.inner.total {
            Some(SessionRefusal::Total(self.inner.total))
        } else if open.per_tenant.get(&caller.owner).copied().unwrap_or(0) >= self.inner.per_tenant {
            Some(SessionRefusal::Tenant(self.inner.per_tenant))
        } else {
            None
        };
        if let Some(r) = refused {
            self.inner.metrics.session_refused(r);
            return Err(r);
        }
        let deadline = caller.expires_at.map(|t| {
            let left = t.saturating_sub(crate::access::signer::unix_now());
            Instant::now() + Duration::from_secs(left)
        });
        let entry = Arc::new(Entry {
            tenant: caller.owner.clone(),
            last_active: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            deadline,
            close: CancellationToken::new(),
        });
        open.next_id += 1;
        let id = open.next_id;
        open.entries.insert(id, entry.clone());
        *open.per_tenant.entry(caller.owner.clone()).or_default() += 1;
        self.inner.metrics.session_opened();
        Ok(Ticket {
            id,
            entry,
            inner: self.inner.clone(),
        })
    }

    /// Signals every session idle past the limit, or whose key expired, to
    /// close; returns how many.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let open = self.inner.open.lock().expect("sessions lock");
        let mut closed = 0;
        for e in open.entries.values() {
            let expired = e.deadline.is_some_and(|d| d <= now);
            let idle = e.busy.load(Ordering::Acquire) == 0
                && now.duration_since(*e.last_active.lock().expect("session lock")) >= self.inner.idle;
            if (expired || idle) && !e.close.is_cancelled() {
                e.close.cancel();
                closed += 1;
            }
        }
        if closed > 0 {
            self.inner.metrics.sessions_idled(closed);
        }
        closed
    }

    /// Sweeps until `stop`, often enough for the idle limit to hold within
    /// a quarter of itself (at least every 5 s).
    pub fn spawn_sweeper(&self, stop: CancellationToken) {
        let every = (self.inner.idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => { me.sweep(); }
                    _ = stop.cancelled() => break,
                }
            }
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.open.lock().expect("sessions lock").entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(per_tenant: usize, total: usize, idle_ms: u64) -> Sessions {
        let mut s = Sessions::new(
            &LimitsConfig {
                max_sessions_per_tenant: per_tenant,
                max_sessions_total: total,
                ..Default::default()
            },
            Arc::default(),
        );
        Arc::get_mut(&mut s.inner).unwrap().idle = Duration::from_millis(idle_ms);
        s
    }

    #[test]
    fn caps_hold_per_tenant_and_in_total_and_free_with_their_tickets() {
        let s = sessions(2, 3, 60_000);
        let (a, b) = (Caller::tenant("a", false), Caller::tenant("b", false));
        let a1 = s.open(&a).unwrap();
        let _a2 = s.open(&a).unwrap();
        assert_eq!(s.open(&a).err(), Some(SessionRefusal::Tenant(2)));
        let _b1 = s.open(&b).unwrap();
        assert_eq!(s.open(&b).err(), Some(SessionRefusal::Total(3)));
        drop(a1);
        let _a3 = s.open(&a).expect("a closed session frees its place");
        assert_eq!(s.len(), 3);
    }

    #[tokio::test]
    async fn idle_sessions_are_closed_and_busy_ones_are_not() {
        let s = sessions(10, 10, 50);
        let caller = Caller::tenant("a", false);
        let idle = s.open(&caller).unwrap();
        let working = s.open(&caller).unwrap();
        let call = working.busy();
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(s.sweep(), 1);
        tokio::time::timeout(Duration::from_secs(1), idle.closed())
            .await
            .expect("the idle session is told to close");
        assert!(!working.entry.close.is_cancelled(), "a running call is activity");
        drop(call);
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(s.sweep(), 1);
        assert!(working.entry.close.is_cancelled());
    }
}
