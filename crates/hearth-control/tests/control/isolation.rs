//! Issue 16, held items: every cross-workspace attempt of the security
//! review answered 404 (sandboxes, snapshots by id, name and `name:tag`,
//! sandboxes created from another workspace's snapshot, links, secrets,
//! the data plane). This keeps it so.
//!
//! Workspace A holds a sandbox, two snapshots captured from it (`name`,
//! which is `name:latest`, and `name:v1`), a download link, a service URL
//! and a workspace secret. With workspace B's all-permissions key, every
//! operation of the OpenAPI document (`hearth_api::openapi()`) whose path
//! names a resource is called once per way of naming A's (sandboxes by id
//! and by name, snapshots by id, name and `name:tag`, the secret by name,
//! links by a token of B's re-pointed at A's sandbox, data-plane paths
//! under `/dataplane/{A's id or name}`), under both prefixes (`/api/v2`
//! and `/v2`), plus what the document does not list: creating a sandbox
//! from A's snapshot, the service routes without a trailing path. A
//! WebSocket route is called with a real handshake through the served
//! router; everything else through the router in process.
//!
//! Each attempt must answer 404 `NotFound` in LangSmith's envelope, be the
//! very answer a resource that exists nowhere gets (the same attempt with
//! A's names replaced by fresh ones, `error_id` aside), name none of A's
//! ids, names or values the request did not itself carry, and leave A as
//! it was: A's own reads answer the same bodies, the simulated host still
//! runs A's VM, the store keeps A's snapshots and the database A's sealed
//! secret. Methods the API does not serve on those paths (a PATCH of a
//! snapshot, a GET or PUT of one secret) answer the 405 anyone gets, held
//! to the same rules. B's list endpoints show nothing of A's. As a
//! control, A's own key repeats the reads and the additive requests and
//! finds what B's did not (so B's 404 is the workspace's doing, not a
//! malformed request's).
//!
//! A second test gives B A's names in its own namespace (a sandbox, both
//! snapshot tags, the secret, a proxy rule naming the secret) and checks
//! that each resolves to B's own object, or to nothing, and that A's do
//! not move.
//!
//! On a simulated host (`SimHost`), on SQLite and PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_hostapi::{SimHost, VmState};

use crate::harness;
use hearth_types::{ApiKeyId, VmId, WorkspaceId};
use serde_json::{json, Value};

/// The review counted 24 attempts; the table may only grow.
const REVIEWED_ATTEMPTS: usize = 24;

const BOX: &str = "alpha-box";
const SNAP: &str = "alpha-snap";
const SECRET: &str = "ALPHA_TOKEN";
const SECRET_VALUE: &str = "alpha-secret-value-7f3c";
const GHOST_BOX: &str = "ghost-box";
const GHOST_SNAP: &str = "ghost-snap";
const GHOST_SECRET: &str = "GHOST_TOKEN";
const POOL: &str = "alpha-pool";
const GHOST_POOL: &str = "ghost-pool";
const REGISTRY: &str = "alpha-registry";
const GHOST_REGISTRY: &str = "ghost-registry";
const VOLUME: &str = "alpha-volume";
const GHOST_VOLUME: &str = "ghost-volume";
const REGISTRY_PASSWORD: &str = "alpha-registry-password";
const BOUNDARY: &str = "isolation-boundary";

/// One workspace and its key.
struct Tenant {
    ws: WorkspaceId,
    key_id: ApiKeyId,
    key: String,
}

/// The control plane over one simulated host, its router in process, the
/// same served on loopback (for WebSocket handshakes), and two workspaces.
struct World {
    app: Router,
    /// The control plane's database, to inspect rows.
    db: Db,
    host: Arc<SimHost>,
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    a: Tenant,
    b: Tenant,
}

async fn world(url: &str) -> World {
    let db = Db::connect(url).await.unwrap();
    let mut tenants = Vec::new();
    for name in ["a", "b"] {
        let ws = WorkspaceId::new();
        db.create_workspace(&NewWorkspace {
            id: ws,
            name: name.into(),
            quotas: Quotas::default(),
        })
        .await
        .unwrap();
        let (key_id, key) = hearth_control::auth::create_key(&db, ws, &["*"], "")
            .await
            .unwrap();
        tenants.push(Tenant { ws, key_id, key });
    }
    let (control, host) = harness::sim_control(db.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_control::serve(control.clone(), listener, async {
        let _ = stopped.await;
    }));
    let b = tenants.pop().unwrap();
    let a = tenants.pop().unwrap();
    World {
        app: hearth_control::router(control.clone()),
        db,
        host,
        addr,
        stop,
        server,
        a,
        b,
    }
}

impl World {
    async fn shut(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.server)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }
}

/// A request body.
#[derive(Clone, Debug)]
enum Payload {
    None,
    Json(Value),
    /// A multipart form with one field `file`.
    File,
}

fn multipart() -> Vec<u8> {
    format!(
        "--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         content-type: application/octet-stream\r\n\r\npwned\r\n--{BOUNDARY}--\r\n"
    )
    .into_bytes()
}

/// One request through the router in process: status and body.
async fn http(
    app: &Router,
    key: &str,
    method: &Method,
    target: &str,
    payload: &Payload,
) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method.clone())
        .uri(target)
        .header("x-api-key", key);
    let req = match payload {
        Payload::None => req.body(Body::empty()),
        Payload::Json(v) => req
            .header("content-type", "application/json")
            .body(Body::from(v.to_string())),
        Payload::File => req
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(Body::from(multipart())),
    }
    .unwrap();
    let (status, bytes) = crate::harness::oneshot(app, req).await;
    (status, bytes.to_vec())
}

/// A WebSocket handshake through the served router: the refusal's status
/// and body (a handshake that succeeds is answered 101).
async fn websocket(addr: std::net::SocketAddr, key: &str, target: &str) -> (StatusCode, Vec<u8>) {
    use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
    let mut req = format!("ws://{addr}{target}")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("x-api-key", key.parse().unwrap());
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        tokio_tungstenite::connect_async(req),
    )
    .await
    .expect("the handshake is answered");
    match answer {
        Ok(_) => (StatusCode::SWITCHING_PROTOCOLS, Vec::new()),
        Err(tungstenite::Error::Http(resp)) => {
            (resp.status(), resp.body().clone().unwrap_or_default())
        }
        Err(e) => panic!("handshake to {target}: {e}"),
    }
}

async fn call(w: &World, key: &str, method: Method, target: &str, body: Option<Value>) -> Value {
    let payload = body.map_or(Payload::None, Payload::Json);
    let (s, b) = http(&w.app, key, &method, target, &payload).await;
    let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
    assert!(s.is_success(), "{method} {target}: {s} {v}");
    v
}

/// What A holds, as its own key sees it.
struct Alpha {
    sandbox_id: String,
    /// `SNAP` (tag `latest`) and `SNAP:v1`.
    snapshot_ids: [String; 2],
    download_token: String,
    service_token: String,
    registry_id: String,
    volume_id: String,
    /// A's API key's id.
    key_id: String,
}

impl Alpha {
    /// Every id, name, value and token of A's: B must never be told one
    /// its request did not carry.
    fn identifiers(&self, w: &World) -> Vec<String> {
        let mut all = vec![
            self.sandbox_id.clone(),
            BOX.to_owned(),
            SNAP.to_owned(),
            SECRET.to_owned(),
            SECRET_VALUE.to_owned(),
            w.a.ws.to_string(),
            w.a.key_id.to_string(),
            self.download_token.clone(),
            self.service_token.clone(),
            REGISTRY.to_owned(),
            REGISTRY_PASSWORD.to_owned(),
            self.registry_id.clone(),
            VOLUME.to_owned(),
            self.volume_id.clone(),
        ];
        all.extend(self.snapshot_ids.iter().cloned());
        all
    }
}

/// Waits until the snapshot `reference` of `key`'s workspace is ready.
async fn ready_snapshot(w: &World, key: &str, reference: &str) -> String {
    let path = format!("/api/v2/sandboxes/snapshots/{reference}");
    for _ in 0..500 {
        let v = call(w, key, Method::GET, &path, None).await;
        match v["status"].as_str() {
            Some("ready") => return v["id"].as_str().unwrap().to_owned(),
            Some("building") => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => panic!("snapshot {reference}: {v}"),
        }
    }
    panic!("snapshot {reference} is still building");
}

/// A ready busybox sandbox named `name` in `key`'s workspace; its id.
async fn sandbox(w: &World, key: &str, name: &str) -> String {
    let body = json!({
        "name": name, "snapshot": "busybox", "mem_bytes": 1u64 << 30, "cpu_millicores": 500,
        "wait_for_ready": true, "timeout": 30,
    });
    let v = call(w, key, Method::POST, "/api/v2/sandboxes/boxes", Some(body)).await;
    assert_eq!(v["status"], "ready", "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// A's sandbox, snapshots, links and secret.
async fn populate_a(w: &World) -> Alpha {
    let k = &w.a.key;
    let sandbox_id = sandbox(w, k, BOX).await;
    let capture = |name: &'static str, tag: Option<&'static str>| {
        let mut body = json!({ "name": name });
        if let Some(t) = tag {
            body["tag"] = json!(t);
        }
        let path = format!("/api/v2/sandboxes/boxes/{BOX}/snapshot");
        async move { call(w, k, Method::POST, &path, Some(body)).await }
    };
    capture(SNAP, None).await;
    capture(SNAP, Some("v1")).await;
    let latest = ready_snapshot(w, k, &format!("{SNAP}:latest")).await;
    let v1 = ready_snapshot(w, k, &format!("{SNAP}:v1")).await;
    assert_ne!(latest, v1);
    let link = call(
        w,
        k,
        Method::POST,
        &format!("/api/v2/sandboxes/boxes/{BOX}/download-url"),
        Some(json!({"path": "/etc/hostname"})),
    )
    .await;
    let service = call(
        w,
        k,
        Method::POST,
        &format!("/api/v2/sandboxes/boxes/{BOX}/service-url"),
        Some(json!({"port": 8080})),
    )
    .await;
    call(
        w,
        k,
        Method::POST,
        "/api/v1/workspaces/current/secrets",
        Some(json!([{"key": SECRET, "value": SECRET_VALUE}])),
    )
    .await;
    // Empty: its reads stay the same while the attempts run.
    call(
        w,
        k,
        Method::POST,
        "/api/v2/sandboxes/pools",
        Some(json!({"name": POOL, "snapshot": "busybox", "size": 0})),
    )
    .await;
    let registry = call(
        w,
        k,
        Method::POST,
        "/api/v2/sandboxes/registries",
        Some(json!({"name": REGISTRY, "url": "registry.alpha.test",
                    "username": "alpha", "password": REGISTRY_PASSWORD})),
    )
    .await;
    let volume = call(
        w,
        k,
        Method::POST,
        "/api/v2/sandboxes/volumes",
        Some(json!({"name": VOLUME, "size_bytes": 1u64 << 30})),
    )
    .await;
    Alpha {
        registry_id: registry["id"].as_str().unwrap().to_owned(),
        volume_id: volume["id"].as_str().unwrap().to_owned(),
        sandbox_id,
        snapshot_ids: [latest, v1],
        download_token: link["token"].as_str().unwrap().to_owned(),
        service_token: service["token"].as_str().unwrap().to_owned(),
        key_id: w.a.key_id.to_string(),
    }
}

/// Everything observable about A, through A's key, the host and the
/// database; compared before and after every attempt.
async fn fingerprint(w: &World, a: &Alpha) -> Value {
    let k = &w.a.key;
    let mut reads = serde_json::Map::new();
    let mut paths = vec![
        format!("/api/v2/sandboxes/boxes/{}", a.sandbox_id),
        format!("/api/v2/sandboxes/boxes/{BOX}"),
        format!("/api/v2/sandboxes/boxes/{BOX}/status"),
        "/api/v2/sandboxes/boxes".to_owned(),
        "/api/v2/sandboxes/snapshots".to_owned(),
        format!("/api/v2/sandboxes/snapshots-by-name/{SNAP}"),
        format!("/api/v2/sandboxes/snapshots/{SNAP}:v1"),
        format!("/api/v2/sandboxes/snapshots/{SNAP}"),
        "/api/v1/workspaces/current/secrets".to_owned(),
        "/api/v2/sandboxes/pools".to_owned(),
        format!("/api/v2/sandboxes/pools/{POOL}"),
        "/api/v2/sandboxes/registries".to_owned(),
        format!("/api/v2/sandboxes/registries/{REGISTRY}"),
        "/api/v2/sandboxes/volumes".to_owned(),
        format!("/api/v2/sandboxes/volumes/{VOLUME}"),
    ];
    paths.extend(
        a.snapshot_ids
            .iter()
            .map(|id| format!("/api/v2/sandboxes/snapshots/{id}")),
    );
    for path in paths {
        let (s, b) = http(&w.app, k, &Method::GET, &path, &Payload::None).await;
        let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
        reads.insert(path, json!({"status": s.as_u16(), "body": v}));
    }
    let vm = VmId::from(a.sandbox_id.parse::<uuid::Uuid>().unwrap());
    let record = w.host.vm(vm);
    let sealed = w.db.workspace_secret(w.a.ws, SECRET).await.unwrap();
    let registry =
        w.db.registry_by_name(w.a.ws, REGISTRY)
            .await
            .unwrap()
            .map(|r| (r.username, r.password, r.url));
    let volumes: Vec<bool> = a
        .snapshot_ids
        .iter()
        .map(|id| w.host.has_volume(&format!("snap-{id}")))
        .collect();
    json!({
        "reads": reads,
        "vm": serde_json::to_value(&record).unwrap(),
        "vm_ready": record.is_some_and(|r| r.state == VmState::Ready),
        "volumes": volumes,
        "sealed_secret": sealed,
        "registry": registry,
    })
}

/// What differs between two fingerprints, one line per changed read.
fn changes(before: &Value, after: &Value) -> String {
    let short = |v: &Value| v.to_string().chars().take(300).collect::<String>();
    let mut out = Vec::new();
    for (k, v) in after.as_object().unwrap() {
        if k == "reads" {
            for (path, read) in v.as_object().unwrap() {
                if before["reads"][path] != *read {
                    out.push(format!("GET {path}: {}", short(read)));
                }
            }
        } else if before[k] != *v {
            out.push(format!("{k}: {} -> {}", short(&before[k]), short(v)));
        }
    }
    out.join("\n    ")
}

/// One cross-workspace attempt: the request naming A's resource, and the
/// same request naming one that exists nowhere.
struct Attempt {
    label: String,
    method: Method,
    websocket: bool,
    target: String,
    body: Payload,
    ghost_target: String,
    ghost_body: Payload,
    /// (A's value, the ghost's) for each substitution made.
    pairs: Vec<(String, String)>,
    /// Whether A's key, sending the same request, must find the resource
    /// (a read, or a request whose effect on A is additive): the control
    /// that B's 404 is the workspace's doing and not a bad request's.
    control: bool,
    /// 404 `NotFound`, or 405 `MethodNotAllowed` for a method the path
    /// does not serve (for anyone: nothing to tell).
    expect: StatusCode,
}

/// Ways of naming one of A's resources in a path parameter: (how, A's
/// value, a value naming nothing).
type Refs = Vec<(String, String, String)>;

fn sandbox_refs(a: &Alpha) -> Refs {
    vec![
        (
            "id".into(),
            a.sandbox_id.clone(),
            uuid::Uuid::now_v7().to_string(),
        ),
        ("name".into(), BOX.into(), GHOST_BOX.into()),
    ]
}

fn snapshot_refs(a: &Alpha) -> Refs {
    vec![
        (
            "id (latest)".into(),
            a.snapshot_ids[0].clone(),
            uuid::Uuid::now_v7().to_string(),
        ),
        (
            "id (v1)".into(),
            a.snapshot_ids[1].clone(),
            uuid::Uuid::now_v7().to_string(),
        ),
        ("name".into(), SNAP.into(), GHOST_SNAP.into()),
        (
            "name:latest".into(),
            format!("{SNAP}:latest"),
            format!("{GHOST_SNAP}:latest"),
        ),
        (
            "name:tag".into(),
            format!("{SNAP}:v1"),
            format!("{GHOST_SNAP}:v1"),
        ),
    ]
}

/// A path with its parameters filled in: naming A's resources, and
/// naming ones that exist nowhere.
struct Filled {
    /// How A's resources are named, for the report.
    label: String,
    target: String,
    ghost: String,
    /// (A's value, the ghost's) for each parameter filled.
    pairs: Vec<(String, String)>,
}

/// A token of B's (minted by B for its own sandbox) with its claims
/// re-pointed at `sandbox` of `workspace`, keeping B's MAC.
fn repoint(token: &str, workspace: &str, sandbox: &str) -> String {
    let (body, mac) = token.split_once('.').unwrap();
    let mut claims: Value = serde_json::from_slice(&B64.decode(body).unwrap()).unwrap();
    assert!(
        claims["sb"].is_string(),
        "the claims name a sandbox: {claims}"
    );
    claims["ws"] = json!(workspace);
    claims["sb"] = json!(sandbox);
    format!("{}.{mac}", B64.encode(claims.to_string()))
}

/// A body the operation accepts, so that the request reaches the lookup
/// of A's resource (keyed by method and the document's path). A new
/// operation with a body fails the test here until it has one.
fn body_for(method: &str, path: &str, content_type: &str) -> Payload {
    if content_type.starts_with("multipart/") {
        return Payload::File;
    }
    let v = match (method, path) {
        ("patch", "/api/v2/sandboxes/boxes/{name}") => json!({"name": "hijacked"}),
        ("post", "/api/v2/sandboxes/boxes/{name}/download-url") => json!({"path": "/etc/hostname"}),
        ("post", "/api/v2/sandboxes/boxes/{name}/service-url") => json!({"port": 8080}),
        ("post", "/api/v2/sandboxes/boxes/{name}/snapshot") => json!({"name": "stolen"}),
        ("post", "/api/v2/sandboxes/boxes/{name}/fork") => json!({"name": "stolen-child"}),
        (
            "post",
            "/api/v2/sandboxes/boxes/{name}/start" | "/api/v2/sandboxes/boxes/{name}/stop",
        ) => {
            json!({})
        }
        ("post", "/execute" | "/execute/stream/start") => json!({"command": "echo pwned"}),
        ("post", "/execute/stream/resume") => {
            json!({"command_id": "f".repeat(32), "stdout_offset": 0, "stderr_offset": 0})
        }
        ("post", "/glob") => json!({"path": "/", "pattern": "**"}),
        ("patch", "/api/v2/sandboxes/pools/{name}") => json!({"size": 3}),
        ("patch", "/api/v2/sandboxes/registries/{name}") => json!({"username": "hijacked"}),
        ("patch", "/api/v2/sandboxes/volumes/{volume}") => json!({"description": "hijacked"}),
        ("post", "/api/v2/sandboxes/volumes/{volume}/clone") => json!({"name": "stolen-volume"}),
        ("post", "/grep") => json!({"path": "/", "pattern": "root"}),
        _ => panic!("{method} {path} takes a body: add one to body_for"),
    };
    Payload::Json(v)
}

/// Every attempt: the document's operations over each way of naming A's
/// resources, then the extras it does not list.
fn attempts(a: &Alpha, b_download: &str, b_service: &str, a_ws: &str) -> Vec<Attempt> {
    let doc = hearth_api::openapi();
    let ghost_ws = uuid::Uuid::now_v7().to_string();
    let mut out = Vec::new();
    let mut covered_ops = 0usize;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let dataplane = item.get("servers").is_some();
        let params: Vec<String> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_owned)
            .collect();
        if !dataplane && params.is_empty() {
            // Names nothing: the list and create endpoints, checked below.
            continue;
        }
        if path.starts_with("/console/") {
            // The console's page and assets: the same bytes for everyone,
            // no workspace's resource.
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            let Ok(m) = Method::from_bytes(method.to_uppercase().as_bytes()) else {
                continue;
            };
            if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&m.as_str()) {
                continue;
            }
            covered_ops += 1;
            let websocket = op["responses"].get("101").is_some();
            // Tokens are checked below; the rest, unless it would change
            // or remove A's resource.
            let control = !params.iter().any(|p| p == "token")
                && (m == Method::GET
                    || (m == Method::POST
                        && (dataplane
                            || path.ends_with("/download-url")
                            || path.ends_with("/service-url"))));
            let body = op["requestBody"]["content"]
                .as_object()
                .and_then(|c| c.keys().next())
                .map_or(Payload::None, |ct| body_for(method, path, ct));
            let query: Vec<String> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query" && p["required"] == true)
                .map(|p| match p["name"].as_str().unwrap() {
                    "path" => "path=/tmp/pwned".to_owned(),
                    other => panic!("{method} {path}: a required query {other}: add a value"),
                })
                .collect();
            let query = if query.is_empty() {
                String::new()
            } else {
                format!("?{}", query.join("&"))
            };
            // Every combination of the ways of naming each parameter.
            let template = if dataplane {
                format!("/dataplane/{{dp}}{path}")
            } else {
                path.clone()
            };
            let mut combos = vec![Filled {
                label: String::new(),
                target: template.clone(),
                ghost: template,
                pairs: Vec::new(),
            }];
            let mut slots: Vec<(String, Refs)> = Vec::new();
            if dataplane {
                slots.push(("{dp}".into(), sandbox_refs(a)));
            }
            for p in &params {
                let refs = match (p.as_str(), path.as_str()) {
                    ("name", x) if x.starts_with("/api/v2/sandboxes/boxes/") => sandbox_refs(a),
                    ("name", x) if x.starts_with("/api/v2/sandboxes/snapshots-by-name/") => {
                        vec![("name".into(), SNAP.into(), GHOST_SNAP.into())]
                    }
                    ("snapshot_id", _) => snapshot_refs(a),
                    ("name", x) if x.starts_with("/api/v2/sandboxes/pools/") => {
                        vec![("name".into(), POOL.into(), GHOST_POOL.into())]
                    }
                    ("name", x) if x.starts_with("/api/v2/sandboxes/registries/") => {
                        vec![("name".into(), REGISTRY.into(), GHOST_REGISTRY.into())]
                    }
                    ("volume", x) if x.starts_with("/api/v2/sandboxes/volumes/") => {
                        vec![
                            ("name".into(), VOLUME.into(), GHOST_VOLUME.into()),
                            (
                                "id".into(),
                                a.volume_id.clone(),
                                uuid::Uuid::new_v4().to_string(),
                            ),
                        ]
                    }
                    ("api_key_id", _) => {
                        vec![(
                            "id".into(),
                            a.key_id.clone(),
                            uuid::Uuid::now_v7().to_string(),
                        )]
                    }
                    ("key", x) if x.starts_with("/api/v1/workspaces/current/secrets/") => {
                        vec![("name".into(), SECRET.into(), GHOST_SECRET.into())]
                    }
                    ("token", x) => {
                        let mine = if x.starts_with("/services/") {
                            b_service
                        } else {
                            b_download
                        };
                        vec![(
                            "B's token re-pointed at A's sandbox".into(),
                            repoint(mine, a_ws, &a.sandbox_id),
                            repoint(mine, &ghost_ws, &uuid::Uuid::now_v7().to_string()),
                        )]
                    }
                    // Not a resource of A's: the same in both requests.
                    ("path", "/services/{token}/{path}") => {
                        vec![(String::new(), "index.html".into(), "index.html".into())]
                    }
                    _ => panic!("{method} {path}: how does {{{p}}} name A's resource?"),
                };
                slots.push((format!("{{{p}}}"), refs));
            }
            for (slot, refs) in slots {
                let mut next = Vec::new();
                for c in &combos {
                    for (how, real, fake) in &refs {
                        let mut pairs = c.pairs.clone();
                        if real != fake {
                            pairs.push((real.clone(), fake.clone()));
                        }
                        let label = match (c.label.is_empty(), how.is_empty()) {
                            (_, true) => c.label.clone(),
                            (true, false) => how.clone(),
                            (false, false) => format!("{}, {how}", c.label),
                        };
                        next.push(Filled {
                            label,
                            target: c.target.replace(&slot, real),
                            ghost: c.ghost.replace(&slot, fake),
                            pairs,
                        });
                    }
                }
                combos = next;
            }
            for Filled {
                label,
                target,
                ghost,
                pairs,
            } in combos
            {
                // Control-plane paths are served under both prefixes.
                let prefixes: &[&str] = if target.starts_with("/api/") {
                    &["/api", ""]
                } else {
                    &[""]
                };
                for prefix in prefixes {
                    let strip = |t: &str| {
                        if prefix.is_empty() {
                            t.strip_prefix("/api").unwrap_or(t).to_owned()
                        } else {
                            t.to_owned()
                        }
                    };
                    let (t, g) = (strip(&target), strip(&ghost));
                    out.push(Attempt {
                        label: format!("{} {t}{query} (A's {label})", m.as_str()),
                        method: m.clone(),
                        websocket,
                        target: format!("{t}{query}"),
                        body: body.clone(),
                        ghost_target: format!("{g}{query}"),
                        ghost_body: body.clone(),
                        pairs: pairs.clone(),
                        control,
                        expect: StatusCode::NOT_FOUND,
                    });
                }
            }
        }
    }
    assert!(
        covered_ops >= 20,
        "the document lists {covered_ops} operations naming a resource"
    );

    // Creating a sandbox from A's snapshot, every way a create names one.
    let mut creates = Vec::new();
    for field in ["snapshot_id", "snapshot", "snapshot_name"] {
        for (how, real, fake) in snapshot_refs(a) {
            let by_id = how.starts_with("id");
            if field == "snapshot_id" && !by_id {
                continue;
            }
            creates.push((
                format!("create from A's snapshot: {field} = {how}"),
                field,
                real,
                fake,
            ));
        }
    }
    for (label, field, real, fake) in creates {
        let body = |s: &str| {
            Payload::Json(json!({
                field: s, "name": "from-alpha", "wait_for_ready": true, "timeout": 30,
            }))
        };
        for prefix in ["/api/v2", "/v2"] {
            out.push(Attempt {
                label: format!("POST {prefix}/sandboxes/boxes ({label})"),
                method: Method::POST,
                websocket: false,
                target: format!("{prefix}/sandboxes/boxes"),
                body: body(&real),
                ghost_target: format!("{prefix}/sandboxes/boxes"),
                ghost_body: body(&fake),
                pairs: vec![(real.clone(), fake.clone())],
                control: true,
                expect: StatusCode::NOT_FOUND,
            });
        }
    }

    // Pulling with A's registry: its id in a snapshot build.
    let ghost_registry = uuid::Uuid::new_v4().to_string();
    let pull = |id: &str| {
        Payload::Json(json!({
            "name": "with-alpha", "docker_image": "registry.alpha.test/app:v1",
            "fs_capacity_bytes": 1u64 << 30, "registry_id": id,
        }))
    };
    for prefix in ["/api/v2", "/v2"] {
        out.push(Attempt {
            label: format!("POST {prefix}/sandboxes/snapshots (A's registry_id)"),
            method: Method::POST,
            websocket: false,
            target: format!("{prefix}/sandboxes/snapshots"),
            body: pull(&a.registry_id),
            ghost_target: format!("{prefix}/sandboxes/snapshots"),
            ghost_body: pull(&ghost_registry),
            pairs: vec![(a.registry_id.clone(), ghost_registry.clone())],
            control: true,
            expect: StatusCode::NOT_FOUND,
        });
    }

    // Service routes the document folds into `/services/{token}/{path}`.
    let real = repoint(b_service, a_ws, &a.sandbox_id);
    let fake = repoint(b_service, &ghost_ws, &uuid::Uuid::now_v7().to_string());
    for (method, suffix) in [
        (Method::GET, ""),
        (Method::GET, "/"),
        (Method::POST, "/api/run"),
        (Method::DELETE, "/x"),
    ] {
        out.push(Attempt {
            label: format!(
                "{method} /services/{{token}}{suffix} (B's token re-pointed at A's sandbox)"
            ),
            method,
            websocket: false,
            target: format!("/services/{real}{suffix}"),
            body: Payload::None,
            ghost_target: format!("/services/{fake}{suffix}"),
            ghost_body: Payload::None,
            pairs: vec![(real.clone(), fake.clone())],
            control: false,
            expect: StatusCode::NOT_FOUND,
        });
    }

    // Operations the API does not have on paths naming A's resources
    // (snapshots are not updated; secrets are read only by listing and
    // written by `POST /secrets`): the 405 anyone gets.
    let mut unserved: Vec<(Method, String, String, String)> = Vec::new();
    for (_, real, fake) in snapshot_refs(a) {
        for method in [Method::PATCH, Method::PUT] {
            unserved.push((
                method,
                "/v2/sandboxes/snapshots/".into(),
                real.clone(),
                fake.clone(),
            ));
        }
    }
    for method in [Method::GET, Method::PUT, Method::PATCH] {
        unserved.push((
            method,
            "/v1/workspaces/current/secrets/".into(),
            SECRET.into(),
            GHOST_SECRET.into(),
        ));
    }
    for (method, base, real, fake) in unserved {
        for prefix in ["/api", ""] {
            let body = Payload::Json(json!({"name": "hijacked"}));
            out.push(Attempt {
                label: format!("{method} {prefix}{base}{real} (not served)"),
                method: method.clone(),
                websocket: false,
                target: format!("{prefix}{base}{real}"),
                body: body.clone(),
                ghost_target: format!("{prefix}{base}{fake}"),
                ghost_body: body,
                pairs: vec![(real.clone(), fake.clone())],
                control: false,
                expect: StatusCode::METHOD_NOT_ALLOWED,
            });
        }
    }
    out
}

async fn send(w: &World, attempt: &Attempt, ghost: bool) -> (StatusCode, Vec<u8>) {
    let (target, body) = if ghost {
        (&attempt.ghost_target, &attempt.ghost_body)
    } else {
        (&attempt.target, &attempt.body)
    };
    if attempt.websocket {
        websocket(w.addr, &w.b.key, target).await
    } else {
        http(&w.app, &w.b.key, &attempt.method, target, body).await
    }
}

/// The refusal `expect` (404 `NotFound`, 405 `MethodNotAllowed`) in the
/// envelope: its body without `error_id`, with the ghost's names turned
/// back into A's when `ghost`.
fn refusal_body(
    expect: StatusCode,
    status: StatusCode,
    body: &[u8],
    pairs: &[(String, String)],
    ghost: bool,
) -> Result<String, String> {
    let text = String::from_utf8_lossy(body);
    if status != expect {
        return Err(format!("answered {status}: {text}"));
    }
    let mut v: Value =
        serde_json::from_slice(body).map_err(|_| format!("body is not JSON: {text}"))?;
    let detail = v["detail"]
        .as_object_mut()
        .ok_or_else(|| format!("not in the envelope: {text}"))?;
    for f in ["error", "error_id", "message"] {
        if !detail.get(f).is_some_and(Value::is_string) {
            return Err(format!("detail.{f} is not a string: {text}"));
        }
    }
    let error = match expect {
        StatusCode::NOT_FOUND => "NotFound",
        _ => "MethodNotAllowed",
    };
    if detail["error"] != error {
        return Err(format!("detail.error is not {error}: {text}"));
    }
    // The router's own 404: the request named no route at all.
    if detail["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("no route for"))
    {
        return Err(format!("no such route: {text}"));
    }
    let id = detail.remove("error_id").unwrap();
    if uuid::Uuid::parse_str(id.as_str().unwrap()).is_err() {
        return Err(format!("error_id is not a UUID: {text}"));
    }
    let mut s = v.to_string();
    if ghost {
        for (real, fake) in pairs {
            s = s.replace(fake.as_str(), real);
        }
    }
    Ok(s)
}

/// Runs every attempt with B's key; the problems found, one line each.
async fn run_attempts(w: &World, a: &Alpha, list: &[Attempt]) -> Vec<String> {
    let ids = a.identifiers(w);
    let baseline = fingerprint(w, a).await;
    let mut problems = Vec::new();
    for attempt in list {
        let (s, body) = send(w, attempt, false).await;
        let real = refusal_body(attempt.expect, s, &body, &attempt.pairs, false);
        let (gs, gbody) = send(w, attempt, true).await;
        let ghost = refusal_body(attempt.expect, gs, &gbody, &attempt.pairs, true);
        match (&real, &ghost) {
            (Err(e), _) => problems.push(format!("{}: {e}", attempt.label)),
            (Ok(_), Err(e)) => problems.push(format!("{}: (ghost) {e}", attempt.label)),
            (Ok(r), Ok(g)) if r != g => problems.push(format!(
                "{}: tells A's resource from one that does not exist:\n    A's:   {r}\n    ghost: {g}",
                attempt.label
            )),
            _ => {}
        }
        let sent = match &attempt.body {
            Payload::Json(v) => format!("{} {v}", attempt.target),
            _ => attempt.target.clone(),
        };
        let text = String::from_utf8_lossy(&body);
        for s in &ids {
            if text.contains(s.as_str()) && !sent.contains(s.as_str()) {
                problems.push(format!("{}: the answer names {s}: {text}", attempt.label));
            }
        }
        let now = fingerprint(w, a).await;
        if now != baseline {
            problems.push(format!(
                "{}: A changed:\n    {}",
                attempt.label,
                changes(&baseline, &now)
            ));
            // Every later attempt would see the change too.
            return problems;
        }
    }
    problems
}

/// The controls: A's key repeats the attempts marked `control` and finds
/// A's resource (anything but a 404 `NotFound` or a 405); the problems.
async fn run_controls(w: &World, list: &[Attempt]) -> (usize, Vec<String>) {
    let mut problems = Vec::new();
    let mut count = 0;
    for attempt in list.iter().filter(|a| a.control) {
        count += 1;
        let (s, body) = if attempt.websocket {
            websocket(w.addr, &w.a.key, &attempt.target).await
        } else {
            http(
                &w.app,
                &w.a.key,
                &attempt.method,
                &attempt.target,
                &attempt.body,
            )
            .await
        };
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if (s == StatusCode::NOT_FOUND && v["detail"]["error"] == "NotFound")
            || s == StatusCode::METHOD_NOT_ALLOWED
        {
            problems.push(format!(
                "{}: with A's own key: {s} {}",
                attempt.label,
                String::from_utf8_lossy(&body)
            ));
        }
    }
    (count, problems)
}

/// B's list endpoints, under both prefixes: 200, B's own objects there,
/// nothing of A's.
async fn check_b_lists(w: &World, a: &Alpha, b_box: &str) -> (usize, Vec<String>) {
    let ids = a.identifiers(w);
    let mut problems = Vec::new();
    let mut count = 0;
    for prefix in ["/api", ""] {
        for (path, own) in [
            ("/v2/sandboxes/boxes", Some(b_box)),
            ("/v2/sandboxes/boxes?name_contains=alpha", None),
            ("/v2/sandboxes/boxes?page_size=500", Some(b_box)),
            ("/v2/sandboxes/snapshots", Some("bravo-snap")),
            ("/v2/sandboxes/snapshots?name_contains=alpha", None),
            ("/v2/sandboxes/snapshots?page_size=500", Some("bravo-snap")),
            ("/v1/workspaces/current/secrets", Some("BRAVO_TOKEN")),
        ] {
            count += 1;
            let target = format!("{prefix}{path}");
            let (s, body) = http(&w.app, &w.b.key, &Method::GET, &target, &Payload::None).await;
            let text = String::from_utf8_lossy(&body);
            if s != StatusCode::OK {
                problems.push(format!("B's GET {target}: {s} {text}"));
                continue;
            }
            if let Some(own) = own {
                if !text.contains(own) {
                    problems.push(format!("B's GET {target} lacks B's own {own}: {text}"));
                }
            }
            for x in &ids {
                if text.contains(x.as_str()) {
                    problems.push(format!("B's GET {target} names A's {x}: {text}"));
                }
            }
        }
    }
    (count, problems)
}

/// B's own sandbox, snapshot, secret and links (so that B's lists hold
/// something and B has tokens to re-point); (sandbox id, download token,
/// service token).
async fn populate_b(w: &World) -> (String, String, String) {
    let k = &w.b.key;
    let id = sandbox(w, k, "bravo-box").await;
    call(
        w,
        k,
        Method::POST,
        "/api/v2/sandboxes/boxes/bravo-box/snapshot",
        Some(json!({"name": "bravo-snap"})),
    )
    .await;
    ready_snapshot(w, k, "bravo-snap").await;
    call(
        w,
        k,
        Method::POST,
        "/api/v1/workspaces/current/secrets",
        Some(json!([{"key": "BRAVO_TOKEN", "value": "bravo"}])),
    )
    .await;
    let link = call(
        w,
        k,
        Method::POST,
        "/api/v2/sandboxes/boxes/bravo-box/download-url",
        Some(json!({"path": "/etc/hostname"})),
    )
    .await;
    let service = call(
        w,
        k,
        Method::POST,
        "/api/v2/sandboxes/boxes/bravo-box/service-url",
        Some(json!({"port": 8080})),
    )
    .await;
    let token = |v: &Value| v["token"].as_str().unwrap().to_owned();
    (id, token(&link), token(&service))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_cross_workspace_attempts_are_all_404() {
    for url in hearth_db::testing::backend_urls().await {
        let started = Instant::now();
        let w = world(&url.url).await;
        let a = populate_a(&w).await;
        let (b_box, b_download, b_service) = populate_b(&w).await;
        // The tokens B re-points redeem as they are (the simulated guest
        // then refuses to serve files or ports): a re-pointed one's 404
        // is the workspace's doing.
        for target in [
            format!("/downloads/{b_download}"),
            format!("/services/{b_service}/"),
        ] {
            let (s, body) = http(&w.app, &w.b.key, &Method::GET, &target, &Payload::None).await;
            let body = String::from_utf8_lossy(&body);
            assert!(
                s != StatusCode::NOT_FOUND && s != StatusCode::GONE,
                "{target}: {s} {body}"
            );
        }

        let list = attempts(&a, &b_download, &b_service, &w.a.ws.to_string());
        let vms = w.host.vm_count();
        let mut problems = run_attempts(&w, &a, &list).await;
        let (lists, more) = check_b_lists(&w, &a, &b_box).await;
        problems.extend(more);
        if w.host.vm_count() != vms {
            problems.push(format!(
                "the host holds {} VMs, {vms} before the attempts",
                w.host.vm_count()
            ));
        }
        assert!(
            problems.is_empty(),
            "{}: {} problems in {} cross-workspace attempts:\n  {}",
            url.url,
            problems.len(),
            list.len(),
            problems.join("\n  ")
        );
        let not_found = list
            .iter()
            .filter(|a| a.expect == StatusCode::NOT_FOUND)
            .count();
        assert!(
            not_found >= REVIEWED_ATTEMPTS,
            "only {not_found} attempts answered 404"
        );
        let fp = fingerprint(&w, &a).await;
        assert_eq!(fp["vm_ready"], true, "{fp}");
        assert_eq!(fp["volumes"], json!([true, true]), "{fp}");
        // Last, as they may add to A: the same requests with A's key find
        // what B's did not.
        let (controls, problems) = run_controls(&w, &list).await;
        assert!(
            problems.is_empty(),
            "{}: the controls failed:\n  {}",
            url.url,
            problems.join("\n  ")
        );
        eprintln!(
            "-- {}: {not_found} attempts 404 ({controls} repeated by A, found), {} 405; \
             {lists} list reads of B's; {:?}",
            url.url,
            list.len() - not_found,
            started.elapsed()
        );
        w.shut().await;
    }
}

/// A 422 on `proxy_config`: its message with `names` replaced by `as_`.
fn proxy_refusal(s: StatusCode, body: &[u8], names: (&str, &str)) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(
        v["detail"][0]["loc"],
        json!(["body", "proxy_config"]),
        "{v}"
    );
    v.to_string().replace(names.0, names.1)
}

fn proxy_config(secret: &str) -> Value {
    json!({"rules": [{
        "name": "api", "match_hosts": ["api.example.com"],
        "headers": [{"name": "authorization", "type": "workspace_secret",
                     "value": format!("Bearer {{{secret}}}")}],
    }]})
}

/// B gives its own objects A's names (a sandbox, both snapshot tags, the
/// secret), uses them and deletes them: each answers for B's object, and
/// A's stay as they were. A proxy rule of B's naming A's secret is refused
/// as one naming a secret no workspace has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_cross_workspace_names_stay_per_workspace() {
    for url in hearth_db::testing::backend_urls().await {
        let started = Instant::now();
        let w = world(&url.url).await;
        let a = populate_a(&w).await;
        let baseline = fingerprint(&w, &a).await;
        let k = &w.b.key;
        let unchanged = |step: &str, now: Value| {
            assert!(
                now == baseline,
                "{}: after B's {step}, A changed:\n    {}",
                url.url,
                changes(&baseline, &now)
            );
        };

        // A sandbox named as A's, renamed away and back.
        let mine = sandbox(&w, k, BOX).await;
        assert_ne!(mine, a.sandbox_id);
        unchanged("create", fingerprint(&w, &a).await);
        for name in ["alpha-box-b", BOX] {
            let v = call(
                &w,
                k,
                Method::PATCH,
                &format!("/api/v2/sandboxes/boxes/{mine}"),
                Some(json!({ "name": name })),
            )
            .await;
            assert_eq!(v["name"], name, "{v}");
        }
        unchanged("renames", fingerprint(&w, &a).await);
        let v = call(
            &w,
            k,
            Method::GET,
            &format!("/api/v2/sandboxes/boxes/{BOX}"),
            None,
        )
        .await;
        assert_eq!(
            v["id"],
            mine.as_str(),
            "B's name resolves to B's sandbox: {v}"
        );

        // Snapshots under A's name and both of A's tags.
        let capture = format!("/api/v2/sandboxes/boxes/{BOX}/snapshot");
        call(&w, k, Method::POST, &capture, Some(json!({"name": SNAP}))).await;
        call(
            &w,
            k,
            Method::POST,
            &capture,
            Some(json!({"name": SNAP, "tag": "v1"})),
        )
        .await;
        let latest = ready_snapshot(&w, k, &format!("{SNAP}:latest")).await;
        let v1 = ready_snapshot(&w, k, &format!("{SNAP}:v1")).await;
        for id in [&latest, &v1] {
            assert!(
                !a.snapshot_ids.contains(id),
                "B's snapshot {id} is one of A's"
            );
        }
        unchanged("captures", fingerprint(&w, &a).await);
        let v = call(
            &w,
            k,
            Method::GET,
            &format!("/api/v2/sandboxes/snapshots-by-name/{SNAP}"),
            None,
        )
        .await;
        let ids: Vec<&str> = v["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["snapshot_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 2, "{v}");
        assert!(
            ids.contains(&latest.as_str()) && ids.contains(&v1.as_str()),
            "{v}"
        );
        // A sandbox of B's from `SNAP:v1` boots from B's snapshot.
        let v = call(
            &w,
            k,
            Method::POST,
            "/api/v2/sandboxes/boxes",
            Some(json!({"snapshot": format!("{SNAP}:v1"), "name": "from-own",
                        "cpu_millicores": 500, "mem_bytes": 1u64 << 30,
                        "wait_for_ready": true, "timeout": 30})),
        )
        .await;
        assert_eq!(v["snapshot_id"], v1.as_str(), "{v}");
        call(
            &w,
            k,
            Method::DELETE,
            "/api/v2/sandboxes/boxes/from-own",
            None,
        )
        .await;
        unchanged("create from its own snapshot", fingerprint(&w, &a).await);

        // The secret under A's name: stored, listed and deleted as B's.
        let secrets = "/api/v1/workspaces/current/secrets";
        let v = call(
            &w,
            k,
            Method::POST,
            secrets,
            Some(json!([{"key": SECRET, "value": "bravo-value"}])),
        )
        .await;
        assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
        let sealed = w.db.workspace_secret(w.b.ws, SECRET).await.unwrap();
        assert!(sealed.is_some_and(|s| s != baseline["sealed_secret"]));
        unchanged("secret", fingerprint(&w, &a).await);

        // Deleting them deletes B's.
        for path in [
            format!("/api/v2/sandboxes/snapshots/{SNAP}:v1"),
            format!("/api/v2/sandboxes/snapshots/{SNAP}"),
            format!("/api/v2/sandboxes/boxes/{BOX}"),
            format!("{secrets}/{SECRET}"),
        ] {
            let (s, body) = http(&w.app, k, &Method::DELETE, &path, &Payload::None).await;
            assert_eq!(
                s,
                StatusCode::NO_CONTENT,
                "{path}: {}",
                String::from_utf8_lossy(&body)
            );
            unchanged(&format!("DELETE {path}"), fingerprint(&w, &a).await);
        }
        // A null value deletes nothing of A's either.
        call(
            &w,
            k,
            Method::POST,
            secrets,
            Some(json!([{"key": SECRET, "value": null}])),
        )
        .await;
        unchanged("null upsert", fingerprint(&w, &a).await);

        // A proxy rule naming A's secret: the 422 of a secret no one has,
        // on create and on PATCH, and nothing is booted.
        let vms = w.host.vm_count();
        let bravo = sandbox(&w, k, "bravo-box").await;
        let create = |secret: &str| {
            Payload::Json(
                json!({"name": "proxied", "snapshot": "busybox", "cpu_millicores": 500,
                                 "mem_bytes": 1u64 << 30, "proxy_config": proxy_config(secret)}),
            )
        };
        let patch = |secret: &str| Payload::Json(json!({"proxy_config": proxy_config(secret)}));
        for (method, path, body) in [
            (
                Method::POST,
                "/api/v2/sandboxes/boxes".to_owned(),
                &create as &dyn Fn(&str) -> Payload,
            ),
            (
                Method::PATCH,
                format!("/api/v2/sandboxes/boxes/{bravo}"),
                &patch,
            ),
        ] {
            let (s, b) = http(&w.app, k, &method, &path, &body(SECRET)).await;
            assert!(!String::from_utf8_lossy(&b).contains(SECRET_VALUE));
            let real = proxy_refusal(s, &b, (SECRET, "<name>"));
            let (s, b) = http(&w.app, k, &method, &path, &body(GHOST_SECRET)).await;
            let ghost = proxy_refusal(s, &b, (GHOST_SECRET, "<name>"));
            assert_eq!(real, ghost, "{method} {path}");
        }
        assert_eq!(w.host.vm_count(), vms + 1, "only bravo-box was booted");
        unchanged("proxy rules", fingerprint(&w, &a).await);
        // The control: the same rule is A's to use.
        let (s, b) = http(
            &w.app,
            &w.a.key,
            &Method::POST,
            "/api/v2/sandboxes/boxes",
            &create(SECRET),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));

        eprintln!("-- {}: {:?}", url.url, started.elapsed());
        w.shut().await;
    }
}
