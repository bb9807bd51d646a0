//! What the server counts, and `/metrics` in the Prometheus text format.
//!
//! Every tool call (from MCP or from the REST API) passes through
//! [`Metrics::observe`], which also opens its tracing span: one place
//! decides how a call is logged, counted and timed. The figures about
//! sandboxes themselves (states, pool, restarts, installs) come from the
//! domain when the metrics are read.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use sandbox_actors::usage::Totals;
use sandbox_actors::{SandboxError, SandboxStatus, Stats};
use tracing::{field, info, Instrument};
use uuid::Uuid;

/// Upper bounds (seconds) of the execution latency histogram's buckets.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Tools whose duration goes into the execution latency histogram.
const TIMED: [&str; 2] = ["execute_python_code", "execute_terminal_command"];

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Per bucket of [`BUCKETS`] (not cumulative; summed when rendered).
    counts: [u64; BUCKETS.len()],
    /// Observations above the last bucket.
    over: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        match BUCKETS.iter().position(|b| seconds <= *b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
        self.sum += seconds;
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.over
    }
}

/// A call's failure as the metrics count it: a stable name for its kind.
pub trait Outcome {
    fn kind(&self) -> &'static str;
}

impl Outcome for SandboxError {
    fn kind(&self) -> &'static str {
        SandboxError::kind(self)
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    /// (tool, outcome) → calls.
    calls: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    executions: Mutex<BTreeMap<&'static str, Histogram>>,
    rate_limited: AtomicU64,
    /// What clients hold open, and what was refused or closed for them.
    front: Front,
}

/// Connections and sessions: gauges and counters kept by the front end.
#[derive(Debug, Default)]
struct Front {
    connections: AtomicU64,
    connections_refused_per_ip: AtomicU64,
    connections_refused_total: AtomicU64,
    header_timeouts: AtomicU64,
    sessions: AtomicU64,
    sessions_refused_per_tenant: AtomicU64,
    sessions_refused_total: AtomicU64,
    sessions_idle_closed: AtomicU64,
    guest_keys: AtomicU64,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy)]
pub enum ConnectionRefusal {
    PerIp,
    Total,
}

/// Why a session was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionRefusal {
    #[error("this tenant already has its maximum of {0} open MCP sessions; close one (or let it idle out) and retry")]
    Tenant(usize),
    #[error("the server holds its maximum of {0} open MCP sessions; retry later")]
    Total(usize),
}

fn add(n: &AtomicU64) {
    n.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Runs one tool call inside its span (tool name and sandbox id; never
    /// the code or a key), logs how it ended, and counts and times it.
    pub async fn observe<T, E: Outcome>(
        &self,
        tool: &'static str,
        sandbox: Option<Uuid>,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let span = tracing::info_span!("tool", tool, sandbox_id = field::Empty);
        if let Some(id) = sandbox {
            span.record("sandbox_id", field::display(id));
        }
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        let elapsed = started.elapsed().as_secs_f64();
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        span.in_scope(|| info!(outcome, duration_ms = elapsed * 1000.0, "tool call"));
        *self
            .calls
            .lock()
            .expect("metrics lock")
            .entry((tool, outcome))
            .or_default() += 1;
        if TIMED.contains(&tool) && result.is_ok() {
            self.executions
                .lock()
                .expect("metrics lock")
                .entry(tool)
                .or_default()
                .observe(elapsed);
        }
        result
    }

    /// A request refused by a rate limit.
    pub fn rate_limited(&self) {
        self.rate_limited.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_opened(&self) {
        add(&self.front.connections);
    }

    pub fn connection_closed(&self) {
        self.front.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connection_refused(&self, why: ConnectionRefusal) {
        add(match why {
            ConnectionRefusal::PerIp => &self.front.connections_refused_per_ip,
            ConnectionRefusal::Total => &self.front.connections_refused_total,
        });
    }

    /// A connection dropped because its request headers were too slow.
    pub fn header_timeout(&self) {
        add(&self.front.header_timeouts);
    }

    pub fn session_opened(&self) {
        add(&self.front.sessions);
    }

    pub fn session_closed(&self) {
        self.front.sessions.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn session_refused(&self, why: SessionRefusal) {
        add(match why {
            SessionRefusal::Tenant(_) => &self.front.sessions_refused_per_tenant,
            SessionRefusal::Total(_) => &self.front.sessions_refused_total,
        });
    }

    /// Sessions told to close for idling (or outliving their key).
    pub fn sessions_idled(&self, n: usize) {
        self.front.sessions_idle_closed.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn guest_key_issued(&self) {
        add(&self.front.guest_keys);
    }

    fn render_front(&self, out: &mut String) {
        let f = &self.front;
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        header(out, "mcp_sandbox_connections", "gauge", "Open HTTP connections.");
        let _ = writeln!(out, "mcp_sandbox_connections {}", read(&f.connections));
        header(
            out,
            "mcp_sandbox_connections_refused_total",
            "counter",
            "HTTP connections refused by a cap (reason: per_ip, total).",
        );
        let _ = writeln!(
            out,
            "mcp_sandbox_connections_refused_total{{reason=\"per_ip\"}} {}\nmcp_sandbox_connections_refused_total{{reason=\"total\"}} {}",
            read(&f.connections_refused_per_ip),
            read(&f.connections_refused_total)
        );
        header(
            out,
            "mcp_sandbox_header_timeouts_total",
            "counter",
            "Connections dropped because request headers did not arrive in time.",
        );
        let _ = writeln!(out, "mcp_sandbox_header_timeouts_total {}", read(&f.header_timeouts));
        header(
            out,
            "mcp_sandbox_sessions",
            "gauge",
            "Open MCP sessions (SSE and Streamable HTTP).",
        );
        let _ = writeln!(out, "mcp_sandbox_sessions {}", read(&f.sessions));
        header(
            out,
            "mcp_sandbox_sessions_refused_total",
            "counter",
            "MCP sessions refused by a cap (reason: per_tenant, total).",
        );
        let _ = writeln!(
            out,
            "mcp_sandbox_sessions_refused_total{{reason=\"per_tenant\"}} {}\nmcp_sandbox_sessions_refused_total{{reason=\"total\"}} {}",
            read(&f.sessions_refused_per_tenant),
            read(&f.sessions_refused_total)
        );
        header(
            out,
            "mcp_sandbox_sessions_idle_closed_total",
            "counter",
            "MCP sessions closed for idling or for outliving their key.",
        );
        let _ = writeln!(
            out,
            "mcp_sandbox_sessions_idle_closed_total {}",
            read(&f.sessions_idle_closed)
        );
        header(
            out,
            "mcp_sandbox_guest_keys_issued_total",
            "counter",
            "Guest keys handed out.",
        );
        let _ = writeln!(out, "mcp_sandbox_guest_keys_issued_total {}", read(&f.guest_keys));
    }

    /// The Prometheus text exposition of everything counted, with `stats`.
    pub fn render(&self, stats: &Stats) -> String {
        let mut out = String::new();
        header(&mut out, "mcp_sandbox_sandboxes", "gauge", "Sandboxes by status.");
        let mut by_status = stats.by_status.clone();
        for status in SandboxStatus::ALL {
            by_status.entry(status).or_default();
        }
        for (status, n) in &by_status {
            let _ = writeln!(out, "mcp_sandbox_sandboxes{{status=\"{status}\"}} {n}");
        }
        header(
            &mut out,
            "mcp_sandbox_sandboxes_dormant",
            "gauge",
            "Hibernated sandboxes left alone, held with no actor (their next call starts one).",
        );
        let _ = writeln!(out, "mcp_sandbox_sandboxes_dormant {}", stats.dormant);
        let pool = &stats.pool;
        for (name, kind, help, value) in [
            (
                "mcp_sandbox_pool_ready",
                "gauge",
                "Warm sandboxes ready to be handed out.",
                pool.ready as f64,
            ),
            (
                "mcp_sandbox_pool_size",
                "gauge",
                "Warm sandboxes the pool aims to keep now (its target, within the room under max_sandboxes_total).",
                pool.target as f64,
            ),
            (
                "mcp_sandbox_pool_claims_total",
                "counter",
                "Creations served at once from a ready pooled sandbox.",
                pool.claims as f64,
            ),
            (
                "mcp_sandbox_pool_misses_total",
                "counter",
                "Creations that found the pool empty and waited for its next sandbox.",
                pool.misses as f64,
            ),
            (
                "mcp_sandbox_pool_refills_total",
                "counter",
                "Pooled sandboxes made.",
                pool.refills as f64,
            ),
            (
                "mcp_sandbox_pool_refill_seconds_total",
                "counter",
                "Time the pool's refills took, added up (from create to a warm worker).",
                pool.refill_seconds,
            ),
        ] {
            header(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
        for (name, help, value) in [
            (
                "mcp_sandbox_tenant_month_cpu_seconds",
                "CPU seconds used this month (UTC) by the tenants that used the most (at most 10).",
                (|t: &Totals| t.cpu_seconds) as fn(&Totals) -> f64,
            ),
            (
                "mcp_sandbox_tenant_month_sandbox_seconds",
                "Sandbox seconds (running and paused) this month of the same tenants.",
                |t| t.running_seconds + t.paused_seconds,
            ),
            (
                "mcp_sandbox_tenant_month_egress_bytes",
                "Network bytes this month of the same tenants.",
                |t| t.egress_bytes as f64,
            ),
        ] {
            header(&mut out, name, "gauge", help);
            for (tenant, totals) in &stats.top_tenants {
                let tenant = tenant.replace(['\\', '"', '\n'], "_");
                let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {}", value(totals));
            }
        }
        header(
            &mut out,
            "mcp_sandbox_tool_calls_total",
            "counter",
            "Tool calls by tool and outcome.",
        );
        for ((tool, outcome), n) in self.calls.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "mcp_sandbox_tool_calls_total{{tool=\"{tool}\",outcome=\"{outcome}\"}} {n}"
            );
        }
        header(
            &mut out,
            "mcp_sandbox_execution_duration_seconds",
            "histogram",
            "Duration of Python and shell executions, queueing included.",
        );
        for (tool, h) in self.executions.lock().expect("metrics lock").iter() {
            let mut cumulative = 0;
            for (bound, n) in BUCKETS.iter().zip(h.counts) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "mcp_sandbox_execution_duration_seconds_bucket{{tool=\"{tool}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            let (count, sum) = (h.count(), h.sum);
            let _ = writeln!(
                out,
                "mcp_sandbox_execution_duration_seconds_bucket{{tool=\"{tool}\",le=\"+Inf\"}} {count}\n\
                 mcp_sandbox_execution_duration_seconds_sum{{tool=\"{tool}\"}} {sum}\n\
                 mcp_sandbox_execution_duration_seconds_count{{tool=\"{tool}\"}} {count}"
            );
        }
        header(
            &mut out,
            "mcp_sandbox_installs_total",
            "counter",
            "Finished package installs by outcome.",
        );
        let _ = writeln!(
            out,
            "mcp_sandbox_installs_total{{outcome=\"success\"}} {}",
            stats.installs_succeeded
        );
        let _ = writeln!(
            out,
            "mcp_sandbox_installs_total{{outcome=\"failed\"}} {}",
            stats.installs_failed
        );
        header(
            &mut out,
            "mcp_sandbox_rate_limited_total",
            "counter",
            "Requests refused by a rate limit (429).",
        );
        let _ = writeln!(
            out,
            "mcp_sandbox_rate_limited_total {}",
            self.rate_limited.load(Ordering::Relaxed)
        );
        header(
            &mut out,
            "mcp_sandbox_container_restarts_total",
            "counter",
            "Sandbox containers started again, re-created or restarted.",
        );
        let _ = writeln!(out, "mcp_sandbox_container_restarts_total {}", stats.container_restarts);
        header(
            &mut out,
            "mcp_sandbox_egress_denied_total",
            "counter",
            "Connections the egress proxy refused, by reason (policy, address, sni, limit, malformed).",
        );
        for reason in ["policy", "address", "sni", "limit", "malformed"] {
            let n = stats.egress_denied.get(reason).copied().unwrap_or(0);
            let _ = writeln!(out, "mcp_sandbox_egress_denied_total{{reason=\"{reason}\"}} {n}");
        }
        self.render_front(&mut out);
        let r = &stats.resources;
        if let Some(free) = r.disk_free_bytes {
            header(
                &mut out,
                "mcp_sandbox_disk_free_bytes",
                "gauge",
                "Free space on the file system of the sandboxes' disks (the fuller of the state and results folders').",
            );
            let _ = writeln!(out, "mcp_sandbox_disk_free_bytes {free}");
        }
        header(
            &mut out,
            "mcp_sandbox_memory_limits_bytes",
            "gauge",
            "Memory limits of all sandbox containers (pooled ones included), added up.",
        );
        let _ = writeln!(out, "mcp_sandbox_memory_limits_bytes {}", r.memory_limits_bytes);
        if let Some(host) = r.host_memory_bytes {
            header(
                &mut out,
                "mcp_sandbox_host_memory_bytes",
                "gauge",
                "Memory of the host.",
            );
            let _ = writeln!(out, "mcp_sandbox_host_memory_bytes {host}");
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_are_counted_by_outcome_and_executions_timed() {
        let m = Metrics::default();
        let id = Some(Uuid::nil());
        m.observe("execute_python_code", id, async { Ok::<_, SandboxError>(()) })
            .await
            .unwrap();
        let failed = m
            .observe("execute_python_code", id, async {
                Err::<(), _>(SandboxError::NotFound(Uuid::nil()))
            })
            .await;
        assert!(failed.is_err());
        m.rate_limited();
        let text = m.render(&Stats::default());
        assert!(text.contains("mcp_sandbox_tool_calls_total{tool=\"execute_python_code\",outcome=\"ok\"} 1"));
        assert!(text.contains("mcp_sandbox_tool_calls_total{tool=\"execute_python_code\",outcome=\"not_found\"} 1"));
        assert!(text.contains("mcp_sandbox_execution_duration_seconds_count{tool=\"execute_python_code\"} 1"));
        assert!(
            text.contains("mcp_sandbox_execution_duration_seconds_bucket{tool=\"execute_python_code\",le=\"+Inf\"} 1")
        );
        assert!(text.contains("mcp_sandbox_rate_limited_total 1"));
        assert!(text.contains("mcp_sandbox_sandboxes{status=\"paused\"} 0"));
        let mut stats = Stats::default();
        stats.egress_denied.insert("policy", 3);
        let text = m.render(&stats);
        assert!(text.contains("mcp_sandbox_egress_denied_total{reason=\"policy\"} 3"));
        assert!(text.contains("mcp_sandbox_egress_denied_total{reason=\"sni\"} 0"));
        let busy = Totals {
            cpu_seconds: 7.5,
            paused_seconds: 60.0,
            ..Totals::default()
        };
        stats.top_tenants = vec![("alice".into(), busy)];
        let text = m.render(&stats);
        assert!(text.contains("mcp_sandbox_tenant_month_cpu_seconds{tenant=\"alice\"} 7.5"));
        assert!(text.contains("mcp_sandbox_tenant_month_sandbox_seconds{tenant=\"alice\"} 60"));
        m.connection_opened();
        m.session_refused(SessionRefusal::Tenant(1));
        let text = m.render(&Stats::default());
        assert!(text.contains("mcp_sandbox_connections 1"));
        assert!(text.contains("mcp_sandbox_sessions_refused_total{reason=\"per_tenant\"} 1"));
        assert!(text.contains("mcp_sandbox_memory_limits_bytes 0"));
    }
}
