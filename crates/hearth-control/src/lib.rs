//! Hearth's control plane: the LangSmith-compatible sandbox API.
//!
//! - [`Control`]: the service behind every handler (`service.rs`): create
//!   with validation, placement and quota; start, stop, delete; the data
//!   plane's wake-on-request; reconciliation with the hosts.
//! - Public API handlers (`boxes.rs`) under `/api/v2/sandboxes` and
//!   `/v2/sandboxes`; the data plane (`dataplane.rs`, `tunnel.rs`) under
//!   `/dataplane/{sandbox_id}`; `/healthz`, `/readyz`, `/metrics`.
//! - Reapers ([`Control::run_reapers`], `reap.rs`): this process's duties
//!   (its in-process hosts' leases and reconciliation, its control key)
//!   in every replica; the fleet's (idle TTL stops, delete-after-stop,
//!   stuck and abandoned work, failover, remote hosts' reconciliation)
//!   only in the replica holding the `reaper` leader lease.
//!
//! The control plane keeps no sandbox state in memory: the database
//! (`hearth-db`) is the truth. Hosts are in-process (`hearth up` runs one)
//! or remote (`fleet.rs`). Placement holds no lock in the process: it picks
//! a host from the registry, its leases and the load counters the database
//! keeps, and the transaction that commits the sandbox checks that host's
//! room and the workspace's quota again, so replicas on one database place
//! at once without overcommitting (`service.rs`, `PLACEMENT_ATTEMPTS`).

mod api_keys;
pub mod auth;
mod autoscale;
mod boxes;
mod console;
mod dataplane;
mod domain;
mod dp;
mod e2b;
mod egress;
pub mod error;
mod extract;
mod fleet;
mod fork;
mod gc;
mod guard;
mod hosts;
mod links;
mod list;
mod login;
mod metrics;
mod pools;
mod port_tls;
mod reap;
mod reconcile;
mod registries;
mod runtime_tokens;
pub mod secrets;
mod service;
mod services;
mod snapshots;
pub mod tunnel;
mod volumes;
mod workspace_secrets;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use hearth_db::{Db, HostRow, HostState, SnapshotRow, SnapshotStatus, Timestamp};
use hearth_hostapi::HostApi;
use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId, SnapshotId};
use tokio::sync::{broadcast, watch};

pub use autoscale::AutoscaleSetup;
#[doc(hidden)]
pub use e2b::{E2bRoute, ROUTES as E2B_ROUTES};
pub use fleet::CONTROL_KEY_WINDOW;
pub use gc::GC_INTERVAL;
pub use metrics::Metrics;
pub use reap::ReapReport;

/// Settings of the control plane.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// Base URL clients reach this server at; `dataplane_url`s derive from it.
    pub public_url: String,
    /// Snapshot used when a create names none.
    pub default_snapshot: (String, String),
    /// How often the reapers run.
    pub reaper_interval: Duration,
    /// How long a host's lease lasts without renewal.
    pub lease: Duration,
    /// A sandbox stuck in `provisioning` this long is marked failed.
    pub stale_provisioning: Duration,
    /// In-flight work whose replica went away: a sandbox left `deleting`
    /// this long is deleted again, a snapshot build whose heartbeat stopped
    /// this long is failed (see `reap.rs`).
    pub orphan_after: Duration,
    /// JSON bodies larger than this are refused with 413.
    pub json_limit: usize,
    /// `POST {dp}/execute` keeps at most this much of each of stdout and
    /// stderr; the rest is read and dropped, and the answer says
    /// `truncated` (the streaming transports need no cap).
    pub exec_output_cap: usize,
    /// Seals secrets kept in the database (see `secrets.rs`).
    pub master_key: secrets::MasterKey,
    /// Lifetime of a download link minted without `expires_in_seconds`.
    pub link_default_ttl: Duration,
    /// No download link or service URL lives longer than this.
    pub link_max_ttl: Duration,
    /// The largest `fs_capacity_bytes` a sandbox may ask for (create and
    /// PATCH); default 256 GiB, LangSmith's maximum.
    pub max_fs_capacity: ByteSize,
    /// `/metrics` needs an API key (on by default; `hearth up` turns it off
    /// only when it listens on loopback).
    pub metrics_require_key: bool,
    /// The enrollment token remote hosts register with; `None`: no remote
    /// hosts (see `fleet.rs`).
    pub host_token: Option<String>,
    /// How long after a remote host's lease expired its sandboxes are
    /// started elsewhere (the host fenced itself before its expiry).
    pub failover_grace: Duration,
    /// Signs commands to remote hosts.
    pub signer: Option<Arc<hearth_fence::Signer>>,
    /// The host autoscaler (run by the replica holding its lease).
    pub autoscale: Option<AutoscaleSetup>,
    /// How often the fleet's store garbage is collected (by one host per
    /// store, asked by the replica holding the `gc` lease; see `gc.rs`);
    /// `None`: never.
    pub gc_interval: Option<Duration>,
    /// The operator's `[network] allow_private`: the private networks a
    /// `proxy_config` callback URL may name at create and PATCH. Each host
    /// checks every callback again, with its own list, when it connects.
    pub allow_private: Vec<ipnet::IpNet>,
    /// The hosts' egress proxies hold an AWS identity to assume the IAM
    /// roles of `aws` rules with `role_arn` (the operator's
    /// `HEARTH_AWS_ROLE_*`); without one such rules are a 422.
    pub aws_roles: bool,
    /// The public listener's header-read timeout and connection caps
    /// (default: derived from this process's descriptor limit).
    pub listener: hearth_listen::Limits,
    /// The domain sandboxes' ports are named under (`name[:port]`, e.g.
    /// `hearth.localhost:8080`): a request for `{port}-{sandbox id}.{domain}`
    /// reaches that port of that sandbox (see `e2b/hosts.rs`), and E2B's
    /// create and connect hand it out as the sandbox's `domain`. `None`:
    /// ports are reached only through service URLs and E2B's
    /// `E2b-Sandbox-Port`.
    pub sandbox_domain: Option<String>,
    /// TLS on the public listener's port, beside plain HTTP (E2B's SDKs
    /// reach sandbox hosts by name only over https).
    pub tls: Option<Arc<hearth_listen::TlsConfig>>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            public_url: "http://127.0.0.1:8080".into(),
            default_snapshot: ("default".into(), "latest".into()),
            reaper_interval: Duration::from_secs(2),
            lease: Duration::from_secs(30),
            stale_provisioning: Duration::from_secs(600),
            orphan_after: Duration::from_secs(120),
            json_limit: 1 << 20,
            exec_output_cap: hearth_hostapi::guest::OUTPUT_CAP,
            master_key: secrets::MasterKey::ephemeral(),
            link_default_ttl: Duration::from_secs(24 * 3600),
            link_max_ttl: Duration::from_secs(7 * 24 * 3600),
            metrics_require_key: true,
            max_fs_capacity: ByteSize::gib(256),
            host_token: None,
            failover_grace: Duration::from_secs(10),
            signer: None,
            autoscale: None,
            gc_interval: None,
            allow_private: Vec::new(),
            aws_roles: false,
            listener: hearth_listen::Limits::for_this_process(),
            sandbox_domain: None,
            tls: None,
        }
    }
}

/// A sandbox's status changed in this process: its row as the change
/// left it, when the changer had it.
#[derive(Clone)]
pub(crate) struct Changed {
    id: SandboxId,
    row: Option<Arc<hearth_db::SandboxRow>>,
}

/// The control plane.
pub struct Control {
    /// The store: read and written only by the domain and this crate's
    /// handlers, never by a caller of the crate.
    pub(crate) db: Db,
    pub(crate) cfg: ControlConfig,
    hosts: HashMap<HostId, Arc<dyn HostApi>>,
    /// Every status change this process makes: a create waiting for its
    /// sandbox acts when its id comes by, not on every other sandbox's.
    changed: broadcast::Sender<Changed>,
    /// Flips to true when the server shuts down (exec sockets close 1001).
    shutting_down: watch::Sender<bool>,
    /// Signs and checks download links.
    links: links::LinkKey,
    metrics: Metrics,
    /// Clients of remote hosts (`fleet.rs`).
    remotes: fleet::Remotes,
    /// Checks the commands hosts sign (nonces, epochs).
    host_verifier: hearth_fence::Verifier,
    pub(crate) autoscale_state: autoscale::AutoscaleState,
    /// Woken when pools need tending before the next reaper pass.
    pub(crate) pools_changed: tokio::sync::Notify,
    /// A deadline was set: the deadline timer looks again.
    pub(crate) deadlines_changed: tokio::sync::Notify,
    /// Held while this process acts on deadlines (the reaper's pass and
    /// the deadline timer both may): one acts, the other skips, so no
    /// deadline is acted on twice at once.
    pub(crate) acting_on_deadlines: tokio::sync::Mutex<()>,
    /// Which workspaces have pools of which snapshots, lately.
    pub(crate) pool_index: pools::PoolIndex,
    /// Where this replica is in each host's change feed (`reconcile.rs`).
    pub(crate) feeds: reconcile::Feeds,
    /// This replica's name in leader leases: unique per process
    /// incarnation (a restarted replica is a new holder).
    pub(crate) replica: String,
}

/// A host agent the control plane can drive, with the capacity it offers.
pub struct LocalHost {
    pub id: HostId,
    pub host: Arc<dyn HostApi>,
    pub capacity_cpu: MilliCpu,
    pub capacity_mem: ByteSize,
    /// The object store the host writes (`Host::store_url`; empty: none):
    /// hosts reporting the same URL share a store, which one GC run per
    /// interval collects.
    pub store_url: String,
}

impl Control {
    /// This process's counters (`/metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Registers the hosts, records the built-in snapshots and reconciles
    /// the database with what the hosts run.
    pub async fn open(
        db: Db,
        cfg: ControlConfig,
        hosts: Vec<LocalHost>,
    ) -> Result<Arc<Self>, error::OpenError> {
        let now = Timestamp::now();
        for h in &hosts {
            db.upsert_host(&HostRow {
                id: h.id,
                address: "in-process".into(),
                state: HostState::Ready,
                capacity_cpu: h.capacity_cpu,
                capacity_mem: h.capacity_mem,
                lease_expires_at: now.plus(cfg.lease),
                registered_at: now,
                updated_at: now,
                epoch: 0,
                version: env!("CARGO_PKG_VERSION").into(),
                store_url: h.store_url.clone(),
                disk_free: ByteSize(0),
                store_error: None,
            })
            .await?;
        }
        for (name, image, capacity) in BUILTIN_SNAPSHOTS {
            db.upsert_builtin_snapshot(&SnapshotRow {
                id: SnapshotId::from_uuid(builtin_snapshot_id(name)),
                workspace_id: None,
                name: name.into(),
                tag: "latest".into(),
                status: SnapshotStatus::Ready,
                status_message: None,
                image: image.into(),
                fs_capacity: capacity,
                labels: Default::default(),
                run_config: None,
                docker_image: None,
                created_at: now,
                updated_at: now,
                volume: None,
                memory_bytes: None,
                source_sandbox_id: None,
                image_digest: None,
                description: None,
                memory_reserved: None,
                registry_id: None,
                cpu: None,
            })
            .await?;
        }
        let links = links::LinkKey::load(&db, &cfg.master_key).await?;
        // Waiters that fall further behind re-read (a lag), as after a
        // change of their own.
        let (changed, _) = broadcast::channel(1024);
        let (shutting_down, _) = watch::channel(false);
        let control = Arc::new(Self {
            db,
            cfg,
            hosts: hosts.into_iter().map(|h| (h.id, h.host)).collect(),
            changed,
            shutting_down,
            links,
            metrics: Metrics::default(),
            remotes: fleet::Remotes::default(),
            host_verifier: hearth_fence::Verifier::new(
                hearth_fence::VerifierConfig::new(fleet::AUDIENCE),
                hearth_fence::KeyRing::new(),
            ),
            autoscale_state: autoscale::AutoscaleState::new(),
            pools_changed: tokio::sync::Notify::new(),
            deadlines_changed: tokio::sync::Notify::new(),
            acting_on_deadlines: tokio::sync::Mutex::new(()),
            pool_index: pools::PoolIndex::default(),
            feeds: reconcile::Feeds::default(),
            replica: uuid::Uuid::now_v7().to_string(),
        });
        control.register_control_key().await?;
        control.reconcile(true).await;
        Ok(control)
    }

    /// Tells open data-plane sessions that the server is going away.
    pub fn begin_shutdown(&self) {
        self.shutting_down.send_replace(true);
    }

    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutting_down.subscribe()
    }

    /// Tells the waiters of `id` that its status changed.
    fn bump(&self, id: SandboxId) {
        // An error only says that nobody waits.
        self.changed.send(Changed { id, row: None }).ok();
    }

    /// Tells the waiters of a sandbox what its row is after a change.
    fn bump_row(&self, row: hearth_db::SandboxRow) {
        let id = row.id;
        let row = Some(Arc::new(row));
        self.changed.send(Changed { id, row }).ok();
    }

    /// Whether the server can take work: the database answers and a host is
    /// ready.
    pub async fn ready(&self) -> bool {
        let now = Timestamp::now();
        match self.db.list_hosts().await {
            Ok(hosts) => hosts
                .iter()
                .any(|h| h.state == HostState::Ready && h.lease_expires_at > now),
            Err(e) => {
                tracing::warn!(error = %e, "readiness: cannot read the host registry");
                false
            }
        }
    }
}

/// The built-in images as snapshots every workspace sees: name, image,
/// disk size. `code-interpreter-v1` is named as `e2b-code-interpreter`'s
/// default template.
pub(crate) const BUILTIN_SNAPSHOTS: [(&str, &str, ByteSize); 3] = [
    ("default", "default", ByteSize::gib(2)),
    ("busybox", "busybox", ByteSize::mib(64)),
    ("code-interpreter-v1", "code-interpreter", ByteSize::gib(4)),
];

/// Stable ids of the built-in snapshots.
pub fn builtin_snapshot_id(name: &str) -> uuid::Uuid {
    let hash = blake3::hash(format!("hearth:snapshot:{name}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash.as_bytes()[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// The path segment of LangSmith's batch delete, which a sandbox may also
/// be named.
const BATCH_DELETE: &str = "batch-delete";

fn sandbox_routes() -> Router<Arc<Control>> {
    Router::new()
        .route("/boxes", post(boxes::create).get(boxes::list))
        // A sandbox may be named `batch-delete`: its GET, PATCH and DELETE
        // are that sandbox's, as on any other name.
        .route(
            "/boxes/batch-delete",
            post(boxes::batch_delete)
                .get(|c, who| boxes::get(c, who, crate::extract::Path(BATCH_DELETE.into())))
                .patch(|c, who, body| {
                    boxes::update(c, who, crate::extract::Path(BATCH_DELETE.into()), body)
                })
                .delete(|c, who| boxes::delete(c, who, crate::extract::Path(BATCH_DELETE.into()))),
        )
        .route("/usage", get(boxes::usage))
        .route("/usage/costs", get(boxes::usage_costs))
        .route(
            "/boxes/{name}",
            get(boxes::get).patch(boxes::update).delete(boxes::delete),
        )
        .route("/boxes/{name}/status", get(boxes::status))
        .route("/boxes/{name}/metrics", get(boxes::metrics))
        .route("/boxes/{name}/events", get(boxes::events))
        .route("/boxes/{name}/start", post(boxes::start))
        .route("/boxes/{name}/stop", post(boxes::stop))
        .route("/boxes/{name}/download-url", post(links::mint))
        .route("/boxes/{name}/service-url", post(links::mint_service))
        // Listing shared ports is not served: GET is a 405 naming the
        // path, never a 404.
        .route("/boxes/{name}/service-urls", delete(login::revoke))
        .route(
            "/snapshots",
            get(boxes::list_snapshots).post(boxes::create_snapshot),
        )
        .route(
            "/snapshots/{reference}",
            get(boxes::get_snapshot).delete(boxes::delete_snapshot),
        )
        .route("/boxes/{name}/snapshot", post(boxes::capture_snapshot))
        .route("/boxes/{name}/fork", post(boxes::fork))
        .route("/snapshots-by-name/{name}", get(boxes::snapshots_by_name))
        .route("/hosts", get(hosts::list))
        .route("/pools", post(boxes::create_pool).get(boxes::list_pools))
        .route(
            "/pools/{name}",
            get(boxes::get_pool)
                .patch(boxes::resize_pool)
                .delete(boxes::delete_pool),
        )
        .merge(registries::routes())
        .merge(volumes::routes())
}

/// The whole HTTP surface.
pub fn router(control: Arc<Control>) -> Router {
    // JSON bodies are limited by `extract::JsonBody` (answering 413 in the
    // envelope); axum's default limit would answer in plain text first.
    let api = sandbox_routes().layer(DefaultBodyLimit::disable());
    let dataplane = Router::new()
        .route("/dataplane/{id}/execute/ws", get(dataplane::execute_ws))
        .route(
            "/dataplane/{id}/execute",
            post(dataplane::execute).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/dataplane/{id}/upload",
            post(dataplane::upload).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/dataplane/{id}/execute/stream/start",
            post(dataplane::execute_stream_start),
        )
        .route(
            "/dataplane/{id}/execute/stream/resume",
            post(dataplane::execute_stream_resume),
        )
        .route("/dataplane/{id}/download", get(dataplane::download))
        .route("/dataplane/{id}/glob", post(dataplane::glob))
        .route("/dataplane/{id}/grep", post(dataplane::grep))
        .route("/dataplane/{id}/tunnel", get(dataplane::tunnel))
        .route("/downloads/{token}", get(links::fetch))
        .route(
            "/services/login/signin",
            get(login::old_sign_in).post(login::old_sign_in),
        )
        .route("/services/login/{sandbox}/{port}", any(login::proxy_root))
        .route("/services/login/{sandbox}/{port}/", any(login::proxy_root))
        .route(
            "/services/login/{sandbox}/{port}/{*rest}",
            any(login::proxy),
        )
        .route("/services/{token}", any(services::proxy_root))
        .route("/services/{token}/", any(services::proxy_root))
        .route("/services/{token}/{*rest}", any(services::proxy));
    Router::new()
        .nest("/api/v2/sandboxes", api.clone())
        .nest("/v2/sandboxes", api)
        .nest(
            "/api/v1/workspaces/current",
            workspace_secrets::routes().layer(DefaultBodyLimit::disable()),
        )
        .nest(
            "/v1/workspaces/current",
            workspace_secrets::routes().layer(DefaultBodyLimit::disable()),
        )
        .nest("/api/v1", api_keys::routes())
        .nest("/v1", api_keys::routes())
        .merge(dataplane)
        .merge(e2b::routes())
        .merge(console::routes())
        .route("/internal/v1/hosts/register", post(fleet::register))
        .route("/internal/v1/hosts/{id}/lease", post(fleet::renew))
        .route("/internal/v1/hosts/{id}/drain", post(fleet::drain))
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/readyz", get(readyz))
        .route("/.well-known/jwks.json", get(fleet::jwks))
        .route("/metrics", get(metrics::render))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            control.clone(),
            e2b::hosts::route,
        ))
        .layer(axum::middleware::from_fn_with_state(
            control.clone(),
            guard::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            control.clone(),
            metrics::count,
        ))
        .with_state(control)
}

async fn readyz(State(c): State<Arc<Control>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    if c.ready().await {
        Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        error::HttpError(hearth_api::ApiError::no_hosts()).into_response()
    }
}

/// No route: under E2B's paths a 501 in its shape naming the path (an
/// SDK reads a 404 as "does not exist"), else LangSmith's 404.
async fn not_found(uri: axum::http::Uri) -> axum::response::Response {
    use axum::response::IntoResponse;
    if e2b::door_of(uri.path()) == Some(e2b::Door::Control) {
        return e2b::not_served_route(uri).await.into_response();
    }
    error::HttpError(hearth_api::ApiError::new(
        404,
        "NotFound",
        format!("no route for {}", uri.path()),
    ))
    .into_response()
}

/// A route without this method: a 405 in the shape of the path's door.
async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let refusal = crate::domain::error::DomainError::MethodNotAllowed(format!(
        "{method} is not allowed on {}",
        uri.path()
    ));
    if e2b::door_of(uri.path()).is_some() {
        return e2b::E2bError::from(refusal).into_response();
    }
    error::HttpError::from(refusal).into_response()
}

/// Serves until `shutdown` resolves: then no new connection is accepted,
/// open ones finish their requests, and this returns once they have. Open
/// WebSockets are closed by the runtime going away (clients reconnect).
///
/// Through [`hearth_listen::serve`], bounded by `cfg.listener` (header-read
/// timeout, connections per peer and in total; see that crate), with
/// larger head limits than hyper's ([`guard::HEAD_BUFFER`],
/// [`guard::HEAD_MAX_FIELDS`]): heads past the API's own limits then reach
/// [`guard::guard`], which answers them in the envelope, where hyper would
/// answer with an empty body.
pub async fn serve(
    control: Arc<Control>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut options = listen_options(&control, "api");
    options.counters = control.metrics.connections.clone();
    options.tls = control.cfg.tls.clone();
    let app = router(control.clone());
    let shutdown = async move {
        shutdown.await;
        control.begin_shutdown();
    };
    hearth_listen::serve(listener, app, options, shutdown).await
}

/// Serves the same API on the operator's unix socket
/// ([`hearth_listen::serve_unix`]: caps of its own, so a flood of TCP
/// connections cannot lock the operator's CLI out) until `shutdown`. Keys
/// are checked as on TCP: the socket only spares its callers the TCP caps.
pub async fn serve_unix(
    control: Arc<Control>,
    listener: tokio::net::UnixListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let options = listen_options(&control, "operator socket");
    hearth_listen::serve_unix(listener, router(control), options, shutdown).await
}

fn listen_options(control: &Control, name: &'static str) -> hearth_listen::Options {
    let mut options = hearth_listen::Options::new(name, control.cfg.listener);
    options.max_buf_size = Some(guard::HEAD_BUFFER);
    options.max_headers = Some(guard::HEAD_MAX_FIELDS);
    options
}
