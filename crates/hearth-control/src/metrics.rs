//! Prometheus `/metrics`: request counters by status class, lifecycle
//! counters, and per-host committed CPU/memory from the database.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Control;

#[derive(Default)]
pub struct Metrics {
    requests: [AtomicU64; 5],
    created: AtomicU64,
    boot_failed: AtomicU64,
    idle_stopped: AtomicU64,
    hosts_lost: AtomicU64,
    placement_retried: AtomicU64,
    pool_claims: AtomicU64,
    pool_misses: AtomicU64,
    /// Reconcile: hosts read whole, hosts read by their changes, and the
    /// sandbox rows read for them (`reconcile.rs`).
    reconciled_whole: AtomicU64,
    reconciled_changes: AtomicU64,
    reconcile_rows: AtomicU64,
    /// The public listener's connections held and refused (`serve`).
    pub connections: Arc<hearth_listen::Counters>,
}

impl Metrics {
    pub fn created(&self) {
        self.created.fetch_add(1, Ordering::Relaxed);
    }
    pub fn boot_failed(&self) {
        self.boot_failed.fetch_add(1, Ordering::Relaxed);
    }
    pub fn idle_stopped(&self) {
        self.idle_stopped.fetch_add(1, Ordering::Relaxed);
    }
    /// A placement lost its host's last room to a concurrent one (perhaps
    /// another replica's) and placed again.
    pub fn placement_retried(&self) {
        self.placement_retried.fetch_add(1, Ordering::Relaxed);
    }
    /// A create took a ready pool member.
    pub fn pool_claimed(&self) {
        self.pool_claims.fetch_add(1, Ordering::Relaxed);
    }
    /// A create of a pool's shape found no ready member and booted cold.
    pub fn pool_missed(&self) {
        self.pool_misses.fetch_add(1, Ordering::Relaxed);
    }
    /// A host reconciled (`whole`: its whole list, else what changed on
    /// it), reading `rows` sandbox rows.
    pub fn reconciled(&self, whole: bool, rows: usize) {
        let pass = if whole {
            &self.reconciled_whole
        } else {
            &self.reconciled_changes
        };
        pass.fetch_add(1, Ordering::Relaxed);
        self.reconcile_rows
            .fetch_add(rows as u64, Ordering::Relaxed);
    }
    /// (hosts reconciled whole, by their changes, sandbox rows read).
    pub fn reconcile_counts(&self) -> (u64, u64, u64) {
        (
            self.reconciled_whole.load(Ordering::Relaxed),
            self.reconciled_changes.load(Ordering::Relaxed),
            self.reconcile_rows.load(Ordering::Relaxed),
        )
    }
    pub fn host_lost(&self) {
        self.hosts_lost.fetch_add(1, Ordering::Relaxed);
    }
}

pub async fn count(State(c): State<Arc<Control>>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let class = (resp.status().as_u16() / 100).clamp(1, 5) as usize - 1;
    c.metrics.requests[class].fetch_add(1, Ordering::Relaxed);
    resp
}

/// `GET /metrics`; with `metrics_require_key`, only for a valid API key
/// (the page shows host ids and committed capacity).
pub async fn render(
    State(c): State<Arc<Control>>,
    who: Result<crate::auth::Principal, crate::error::Refusal>,
) -> Response {
    if c.cfg.metrics_require_key {
        if let Err(e) = who {
            return e.into_response();
        }
    }
    let m = &c.metrics;
    let mut out = String::new();
    out.push_str("# HELP hearth_http_requests_total HTTP responses by status class.\n# TYPE hearth_http_requests_total counter\n");
    for (i, n) in m.requests.iter().enumerate() {
        let _ = writeln!(
            out,
            "hearth_http_requests_total{{class=\"{}xx\"}} {}",
            i + 1,
            n.load(Ordering::Relaxed)
        );
    }
    for (name, help, v) in [
        (
            "hearth_sandboxes_created_total",
            "Sandboxes created.",
            &m.created,
        ),
        (
            "hearth_sandbox_boots_failed_total",
            "Sandbox boots that failed.",
            &m.boot_failed,
        ),
        (
            "hearth_sandboxes_idle_stopped_total",
            "Sandboxes stopped by their idle timeout.",
            &m.idle_stopped,
        ),
        (
            "hearth_hosts_lost_total",
            "Hosts whose lease expired (their sandboxes failed over).",
            &m.hosts_lost,
        ),
        (
            "hearth_placements_retried_total",
            "Placements that lost a host's last room to a concurrent one and placed again.",
            &m.placement_retried,
        ),
        (
            "hearth_pool_claims_total",
            "Creates that took a ready warm-pool member instead of booting.",
            &m.pool_claims,
        ),
        (
            "hearth_pool_misses_total",
            "Creates of a warm pool's snapshot and size that found no ready member and booted cold.",
            &m.pool_misses,
        ),
        (
            "hearth_reconcile_hosts_whole_total",
            "Host passes of reconcile that read the host's whole VM list and all its sandbox rows.",
            &m.reconciled_whole,
        ),
        (
            "hearth_reconcile_hosts_changed_total",
            "Host passes of reconcile that read only what changed on the host since the last.",
            &m.reconciled_changes,
        ),
        (
            "hearth_reconcile_rows_read_total",
            "Sandbox rows reconcile read.",
            &m.reconcile_rows,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            v.load(Ordering::Relaxed)
        );
    }
    let hosts = match (c.db.list_hosts().await, c.db.host_load().await) {
        (Ok(hosts), Ok(loads)) => Some((hosts, loads)),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "/metrics: the hosts' gauges are left out: the database did not answer");
            None
        }
    };
    if let Some((hosts, loads)) = hosts {
        out.push_str("# HELP hearth_host_store_ok Whether the host's last store check (reported with its lease) succeeded; placement skips a host at 0.\n# TYPE hearth_host_store_ok gauge\n");
        for h in &hosts {
            let _ = writeln!(
                out,
                "hearth_host_store_ok{{host=\"{}\"}} {}",
                h.id,
                u8::from(h.store_error.is_none())
            );
        }
        out.push_str("# HELP hearth_host_committed_cpu_millicores CPU committed to live sandboxes.\n# TYPE hearth_host_committed_cpu_millicores gauge\n");
        for h in &hosts {
            let load = loads.iter().find(|l| l.host_id == h.id);
            let _ = writeln!(
                out,
                "hearth_host_committed_cpu_millicores{{host=\"{}\"}} {}\nhearth_host_capacity_cpu_millicores{{host=\"{}\"}} {}\nhearth_host_sandboxes{{host=\"{}\"}} {}",
                h.id,
                load.map_or(0, |l| l.cpu.0),
                h.id,
                h.capacity_cpu.0,
                h.id,
                load.map_or(0, |l| l.sandboxes),
            );
        }
    }
    let conns = &m.connections;
    out.push_str(&format!(
        "# HELP hearth_http_connections Connections the API listener holds (upgraded ones included).\n\
         # TYPE hearth_http_connections gauge\nhearth_http_connections {}\n\
         # HELP hearth_http_connections_refused_total Connections refused past a cap.\n\
         # TYPE hearth_http_connections_refused_total counter\n\
         hearth_http_connections_refused_total{{cap=\"per_peer\"}} {}\n\
         hearth_http_connections_refused_total{{cap=\"total\"}} {}\n",
        conns.open(),
        conns.refused_peer(),
        conns.refused_total(),
    ));
    pool_metrics(&c, &mut out).await;
    egress_metrics(&c, &mut out).await;
    autoscale_metrics(&c, &mut out);
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

/// Each sandbox's egress through its host's proxy, labelled with the
/// sandbox id as the API shows it.
/// Each sandbox's figures as its host measures them: egress counters, and
/// the CPU time and resident memory of its VMM.
async fn egress_metrics(c: &Control, out: &mut String) {
    let mut rows = Vec::new();
    let mut usage = Vec::new();
    let mut templates = Vec::new();
    for (host_id, host) in c.live_hosts().await {
        match host.status().await {
            Ok(status) => {
                rows.extend(status.egress);
                usage.extend(status.usage);
                templates.push((host_id, status.templates));
            }
            Err(e) => tracing::debug!(error = %e, "a host's per-VM figures are unavailable"),
        }
    }
    let _ = writeln!(
        out,
        "# HELP hearth_pool_templates Pool templates a host holds (the memory and disk its pool members are restored from).
# TYPE hearth_pool_templates gauge
# HELP hearth_pool_template_memory_bytes Guest RAM a host's pool templates hold, shared by the members restored from them.
# TYPE hearth_pool_template_memory_bytes gauge"
    );
    for (host_id, t) in &templates {
        let _ = writeln!(
            out,
            "hearth_pool_templates{{host_id=\"{host_id}\"}} {}\nhearth_pool_template_memory_bytes{{host_id=\"{host_id}\"}} {}",
            t.count, t.memory_bytes
        );
    }
    let id_of =
        |vm: &str| uuid::Uuid::parse_str(vm).map_or_else(|_| vm.to_owned(), |u| u.to_string());
    let _ = writeln!(
        out,
        "# HELP hearth_sandbox_cpu_seconds_total CPU time of the sandbox's VMM process (vCPUs and I/O threads).\n# TYPE hearth_sandbox_cpu_seconds_total counter"
    );
    for (vm, u) in &usage {
        let _ = writeln!(
            out,
            "hearth_sandbox_cpu_seconds_total{{sandbox_id=\"{}\"}} {:.3}",
            id_of(vm),
            u.cpu_ns as f64 / 1e9
        );
    }
    let _ = writeln!(
        out,
        "# HELP hearth_sandbox_memory_bytes Resident memory of the sandbox's VMM process (guest RAM it touched included).\n# TYPE hearth_sandbox_memory_bytes gauge"
    );
    for (vm, u) in &usage {
        let _ = writeln!(
            out,
            "hearth_sandbox_memory_bytes{{sandbox_id=\"{}\"}} {}",
            id_of(vm),
            u.memory_bytes
        );
    }
    type Field = fn(&hearth_egress::EgressCounters) -> u64;
    let series: [(&str, &str, Field); 6] = [
        (
            "bytes_in_total",
            "Bytes from upstream to the sandbox.",
            |m| m.bytes_in,
        ),
        (
            "bytes_out_total",
            "Bytes from the sandbox to upstream.",
            |m| m.bytes_out,
        ),
        (
            "connections_allowed_total",
            "Connections the proxy let through.",
            |m| m.connections_allowed,
        ),
        (
            "connections_refused_total",
            "Connections the proxy refused.",
            |m| m.connections_refused,
        ),
        ("dns_queries_total", "DNS queries answered.", |m| {
            m.dns_queries
        }),
        ("dns_refused_total", "DNS queries refused by policy.", |m| {
            m.dns_refused
        }),
    ];
    for (name, help, field) in series {
        let _ = writeln!(
            out,
            "# HELP hearth_sandbox_egress_{name} {help}\n# TYPE hearth_sandbox_egress_{name} counter"
        );
        for (vm, m) in &rows {
            let _ = writeln!(
                out,
                "hearth_sandbox_egress_{name}{{sandbox_id=\"{}\"}} {}",
                id_of(vm),
                field(m)
            );
        }
    }
}

/// The elected autoscaler's last decision (only the leader has one).
fn autoscale_metrics(c: &Control, out: &mut String) {
    let Some(d) = c.autoscale_state.last.lock().ok().and_then(|l| l.clone()) else {
        return;
    };
    for (name, help, v) in [
        (
            "hearth_host_pool_desired_replicas",
            "Hosts the autoscaler asked for.",
            d.desired,
        ),
        (
            "hearth_host_pool_current_replicas",
            "Hosts the scaling backend reported.",
            d.current,
        ),
        (
            "hearth_host_pool_target_replicas",
            "The formula's clamped target, before stabilization.",
            d.target,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
}

/// Each warm pool's size and its members by state (by pool id; the name
/// is a label too, unique only within its workspace).
async fn pool_metrics(c: &Control, out: &mut String) {
    let (pools, members) = match (c.db.list_pools(None).await, c.db.list_members().await) {
        (Ok(p), Ok(m)) => (p, m),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "/metrics: the pools' gauges are left out: the database did not answer");
            return;
        }
    };
    if pools.is_empty() {
        return;
    }
    out.push_str("# HELP hearth_pool_size Warm-pool members each pool keeps.\n# TYPE hearth_pool_size gauge\n");
    for p in &pools {
        let _ = writeln!(
            out,
            "hearth_pool_size{{pool=\"{}\",name=\"{}\"}} {}",
            p.id, p.name, p.size
        );
    }
    out.push_str("# HELP hearth_pool_members Warm-pool members by state (ready: paused, claimable; warming: booting).\n# TYPE hearth_pool_members gauge\n");
    for p in &pools {
        let mine = members.iter().filter(|m| m.pool_id == p.id);
        let ready = mine
            .clone()
            .filter(|m| m.status == hearth_db::MemberStatus::Ready)
            .count();
        let warming = mine.count() - ready;
        for (state, n) in [("ready", ready), ("warming", warming)] {
            let _ = writeln!(
                out,
                "hearth_pool_members{{pool=\"{}\",name=\"{}\",state=\"{state}\"}} {n}",
                p.id, p.name
            );
        }
    }
}
