//! E2B's control API (REST, JSON, camelCase): create, get, list, kill,
//! timeout, pause and connect/resume, over Hearth's sandboxes.
//!
//! What an E2B sandbox is in Hearth's terms: persistent, with
//! `preserve_memory_on_stop` (a pause saves its memory and a connect
//! resumes it), no idle stop (its deadline rules instead: E2B's `timeout`,
//! after which it is deleted, or paused with `autoPause`), deleted 14 days
//! after a pause like any stopped sandbox, E2B's `metadata` as its labels
//! and `envVars` as its environment. A template is a snapshot: `base` the
//! server's default, any other name a snapshot's `name[:tag]` or id.
//! Fields Hearth cannot honour are refused with a 400 naming them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::model::{Deadline, OnExpiry, SandboxRow, SandboxStatus, SnapshotRow};
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_types::egress::{AccessSpec, EgressSpec};
use hearth_types::rules::{
    check_env_vars, check_labels, resolve_sizing, SizingRequest, SnapshotSelector,
    DEFAULT_DELETE_AFTER_STOP,
};
use hearth_types::sandbox::{Lifetime, RestoreMemory, SandboxPlan, SandboxSpec, VolumeRequest};
use hearth_types::SandboxId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{E2bError, E2bResult, ENVD_VERSION};
use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::domain::lifetime::Pause;
use crate::domain::queries::spec_of;
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::runtime_tokens::RuntimeTokens;
use crate::Control;

use super::network::{Network, ALL_TRAFFIC};

/// A sandbox's `timeout` when the create names none (E2B's API default).
const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// The longest `timeout` (E2B's own ceiling is a day on its largest plan).
const MAX_TIMEOUT_SECS: i64 = 86_400;
/// How long a create waits for its sandbox to be ready: E2B's create
/// answers with a running sandbox.
const CREATE_WAIT: Duration = Duration::from_secs(300);
/// `clientID` in answers: E2B's names the cluster node; Hearth has one
/// name for the whole deployment.
const CLIENT_ID: &str = "hearth";

/// `POST /sandboxes` and `POST /v2/sandboxes`: every field of SDK
/// 2.63's `NewSandboxV2` (and the v1 body's `secure`); anything else is
/// refused by name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    #[serde(rename = "autoPauseMemory")]
    auto_pause_memory: Option<bool>,
    #[serde(rename = "autoResume")]
    auto_resume: Option<Value>,
    secure: Option<bool>,
    allow_internet_access: Option<bool>,
    network: Option<Network>,
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
    mcp: Option<Value>,
    iam: Option<Value>,
    #[serde(rename = "volumeMounts")]
    volume_mounts: Option<Vec<VolumeMountBody>>,
}

/// A volume to mount at create (`SandboxVolumeMount`): the volume's name
/// (or id) and the path in the sandbox, read-write (E2B's mounts are).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeMountBody {
    name: String,
    path: String,
}

/// A field Hearth does not serve, set to something other than its
/// default: refused, naming it.
pub(super) fn not_served(field: &str, why: &str) -> E2bError {
    E2bError::bad_request(format!("{field}: {why}"))
}

pub(super) fn is_set(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null())
}

/// What an E2B create asks of its sandbox's life: its deadline and what
/// happens then, whether a pause keeps the memory (`autoPauseMemory`,
/// E2B's `on_timeout` `mode`), and whether a request resumes it
/// (`autoResume`).
struct E2bLifecycle {
    lifetime: Lifetime,
    pause_keeps_memory: bool,
    auto_resume: bool,
}

impl NewSandbox {
    /// The lifecycle the create asks for, after refusing what Hearth
    /// cannot honour and what E2B's API does not accept together.
    fn lifecycle(&self) -> E2bResult<E2bLifecycle> {
        let pause = self.auto_pause == Some(true);
        let auto_resume = match self.auto_resume.as_ref().filter(|v| !v.is_null()) {
            None => false,
            Some(ar) => match ar.get("enabled") {
                Some(Value::Bool(b)) => *b,
                None | Some(Value::Null) => false,
                Some(other) => {
                    return Err(E2bError::bad_request(format!(
                        "autoResume.enabled: a boolean, got {other}"
                    )))
                }
            },
        };
        if self.auto_pause_memory.is_some() && !pause {
            return Err(E2bError::bad_request(
                "autoPauseMemory: only with autoPause (what a pause at the timeout keeps)",
            ));
        }
        let pause_keeps_memory = self.auto_pause_memory != Some(false);
        if auto_resume && !pause {
            return Err(E2bError::bad_request(
                "autoResume: only a sandbox that pauses at its timeout (autoPause) resumes",
            ));
        }
        if auto_resume && !pause_keeps_memory {
            return Err(E2bError::bad_request(
                "autoResume: a sandbox paused without its memory (autoPauseMemory false) is resumed with connect, not by requests",
            ));
        }
        if self.secure == Some(false) {
            return Err(not_served(
                "secure",
                "every Hearth sandbox's envd requires its access token",
            ));
        }
        for (field, set) in [("mcp", is_set(&self.mcp)), ("iam", is_set(&self.iam))] {
            if set {
                return Err(not_served(field, "not served by Hearth's E2B API"));
            }
        }
        let timeout = timeout_secs(self.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
        let on_expiry = if pause {
            OnExpiry::Pause
        } else {
            OnExpiry::Delete
        };
        Ok(E2bLifecycle {
            lifetime: Lifetime { timeout, on_expiry },
            pause_keeps_memory,
            auto_resume,
        })
    }
}

pub(super) fn timeout_secs(s: i64) -> E2bResult<Duration> {
    if !(1..=MAX_TIMEOUT_SECS).contains(&s) {
        return Err(E2bError::bad_request(format!(
            "timeout: must be between 1 and {MAX_TIMEOUT_SECS} seconds, got {s}"
        )));
    }
    Ok(Duration::from_secs(s as u64))
}

/// E2B's `Sandbox` (create and connect).
#[derive(Serialize)]
pub(super) struct SandboxBody {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    #[serde(rename = "envdVersion")]
    envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    envd_access_token: String,
    alias: String,
    /// Opens the sandbox's ports by name when they are not public.
    #[serde(rename = "trafficAccessToken", skip_serializing_if = "Option::is_none")]
    traffic_access_token: Option<String>,
    /// Where its ports are named (`{port}-{id}.{domain}`), if configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
}

/// E2B's `SandboxDetail` / `ListedSandbox`.
#[derive(Serialize)]
struct DetailBody {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    alias: String,
    #[serde(rename = "startedAt")]
    started_at: String,
    #[serde(rename = "endAt")]
    end_at: String,
    #[serde(rename = "cpuCount")]
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    state: &'static str,
    #[serde(rename = "envdVersion")]
    envd_version: &'static str,
    metadata: BTreeMap<String, String>,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    /// Only for a sandbox made with a lifetime (through E2B's API).
    #[serde(skip_serializing_if = "Option::is_none")]
    lifecycle: Option<LifecycleBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<NetworkBody>,
    /// The volumes it holds, by name (`SandboxVolumeMount`).
    #[serde(rename = "volumeMounts", skip_serializing_if = "Vec::is_empty")]
    volume_mounts: Vec<VolumeMountOut>,
}

/// A volume a sandbox holds, as E2B's detail reports it.
#[derive(Serialize)]
struct VolumeMountOut {
    name: String,
    path: String,
}

/// The volumes `row`'s sandbox holds.
fn volume_mounts(row: &SandboxRow) -> Vec<VolumeMountOut> {
    let Ok(spec) = spec_of(row) else {
        return Vec::new();
    };
    crate::domain::volumes::volume_mounts(&spec)
        .into_iter()
        .map(|(name, m, _)| VolumeMountOut {
            name: name.to_owned(),
            path: m.path.clone(),
        })
        .collect()
}

/// E2B's `SandboxNetworkConfig` as a sandbox's detail reports it: what
/// Hearth keeps of it (transform rules' values are sealed: not shown).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NetworkBody {
    allow_public_traffic: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    mask_request_host: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allow_out: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    deny_out: Vec<String>,
}

/// The network E2B reports of a sandbox its spec says.
fn network(row: &SandboxRow) -> Option<NetworkBody> {
    let spec = spec_of(row).ok()?;
    let (allow_out, deny_out) = match spec.egress.and_then(|e| e.access) {
        Some(AccessSpec::AllowList(allow)) => (allow, vec![ALL_TRAFFIC.to_owned()]),
        Some(AccessSpec::DenyList(deny)) => (Vec::new(), deny),
        Some(AccessSpec::DenyExcept { deny, allow }) => (allow, deny),
        None => (Vec::new(), Vec::new()),
    };
    Some(NetworkBody {
        allow_public_traffic: spec.public_ports,
        mask_request_host: spec.port_host,
        allow_out,
        deny_out,
    })
}

/// E2B's `SandboxLifecycle`.
#[derive(Serialize)]
struct LifecycleBody {
    #[serde(rename = "autoResume")]
    auto_resume: bool,
    #[serde(rename = "onTimeout")]
    on_timeout: &'static str,
}

/// The lifecycle E2B reports of a sandbox its spec says.
fn lifecycle(row: &SandboxRow) -> Option<LifecycleBody> {
    let spec = spec_of(row).ok()?;
    let life = spec.lifetime?;
    Some(LifecycleBody {
        auto_resume: spec.auto_resume,
        on_timeout: match life.on_expiry {
            OnExpiry::Pause => "pause",
            OnExpiry::Delete => "kill",
        },
    })
}

/// E2B's state of a sandbox: `running` or `paused`; `None` for one being
/// deleted or failed (gone, as E2B sees it: it has no failed state, and a
/// failed sandbox cannot be resumed as a paused one is).
fn state(row: &SandboxRow) -> Option<&'static str> {
    match row.status {
        SandboxStatus::Provisioning | SandboxStatus::Ready => Some("running"),
        SandboxStatus::Stopped => Some("paused"),
        SandboxStatus::Failed | SandboxStatus::Deleting => None,
    }
}

/// When the sandbox ends as E2B reports it: its deadline; without one
/// (made through LangSmith's API), when its idle timer would stop it, or
/// never (the end of year 9999).
fn end_at(row: &SandboxRow, deadline: Option<&Deadline>) -> String {
    match deadline {
        Some(d) => d.expires_at.to_rfc3339(),
        None if !row.idle_ttl.is_zero() => row.last_activity_at.plus(row.idle_ttl).to_rfc3339(),
        None => "9999-12-31T23:59:59Z".into(),
    }
}

impl Control {
    pub(super) async fn e2b_snapshot(&self, row: &SandboxRow) -> (String, String) {
        match self.made_from(row).await {
            Some(s) => (s.id.to_string(), s.name),
            None => (row.snapshot_id.to_string(), String::new()),
        }
    }

    async fn e2b_detail(
        &self,
        row: &SandboxRow,
        deadline: Option<&Deadline>,
        tokens: Option<&RuntimeTokens>,
    ) -> Option<DetailBody> {
        let state = state(row)?;
        let (template_id, alias) = self.e2b_snapshot(row).await;
        Some(DetailBody {
            template_id,
            sandbox_id: row.id.to_string(),
            client_id: CLIENT_ID,
            alias,
            started_at: row.created_at.to_rfc3339(),
            end_at: end_at(row, deadline),
            cpu_count: row.cpu.0.div_ceil(1000),
            memory_mb: row.mem.bytes() >> 20,
            disk_size_mb: row.fs_capacity.bytes() >> 20,
            state,
            envd_version: ENVD_VERSION,
            metadata: row.labels.clone(),
            envd_access_token: tokens.map(|t| t.envd.clone()),
            domain: self.cfg.sandbox_domain.clone(),
            lifecycle: lifecycle(row),
            network: network(row),
            volume_mounts: volume_mounts(row),
        })
    }

    pub(super) fn e2b_sandbox(
        &self,
        row: &SandboxRow,
        snap: (String, String),
        tokens: RuntimeTokens,
    ) -> SandboxBody {
        SandboxBody {
            template_id: snap.0,
            sandbox_id: row.id.to_string(),
            client_id: CLIENT_ID,
            envd_version: ENVD_VERSION,
            envd_access_token: tokens.envd,
            alias: snap.1,
            traffic_access_token: (!spec_of(row).is_ok_and(|s| s.public_ports))
                .then_some(tokens.traffic),
            domain: self.cfg.sandbox_domain.clone(),
        }
    }

    /// A sandbox of the caller's workspace by its E2B id (Hearth's id; a
    /// name is not an E2B id).
    pub(super) async fn e2b_find(&self, who: &Principal, id: &str) -> E2bResult<SandboxRow> {
        let not_found = || E2bError::not_found(format!("sandbox {id} not found"));
        let id: SandboxId = id.parse().map_err(|_| not_found())?;
        // Another workspace's is not found, as one that never was; a
        // failure to look is the failure it is.
        self.live_sandbox(who, id).await.map_err(|e| {
            if matches!(e, DomainError::NotFound { .. }) {
                not_found()
            } else {
                e.into()
            }
        })
    }
}

/// A JSON object body; a field of the wrong type or unknown is a 400
/// naming it.
pub(super) fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> E2bResult<T> {
    hearth_types::body::parse_object(body).map_err(|e| E2bError::bad_request(e.message))
}

/// A body the SDK may leave out: empty is the defaults.
pub(super) fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> E2bResult<T> {
    if body.is_empty() {
        Ok(T::default())
    } else {
        json_body(body)
    }
}

/// Who an E2B sandbox's commands and file operations act as by default.
pub(crate) const E2B_DEFAULT_USER: &str = "user";

/// The template of a create as a snapshot selector.
fn template(t: &str) -> E2bResult<SnapshotSelector> {
    SnapshotSelector::of_template(t).map_err(|e| E2bError::bad_request(format!("templateID: {e}")))
}

/// The plan of an E2B create against its template's snapshot, living
/// as `life` says.
fn plan(req: &NewSandbox, snap: &SnapshotRow, life: E2bLifecycle) -> E2bResult<SandboxPlan> {
    let sizing = resolve_sizing(&SizingRequest {
        vcpus: None,
        cpu_millicores: None,
        mem_bytes: None,
        fs_capacity_bytes: None,
        persistent: true,
        snapshot_fs_capacity: snap.fs_capacity,
    })?;
    let mut labels = snap.labels.clone();
    if let Some(own) = &req.metadata {
        check_labels(own).map_err(|e| E2bError::bad_request(format!("metadata: {}", e.message)))?;
        labels.extend(own.clone());
    }
    let env_vars = req.env_vars.clone().unwrap_or_default();
    check_env_vars("envVars", &env_vars)?;
    let mut run = crate::domain::queries::snapshot_run(snap).unwrap_or_default();
    // E2B's sandboxes act as `user` unless asked otherwise (its base
    // template's default user): every image Hearth ships has that user; a
    // snapshot keeps the user it was made with.
    if run.user.is_none() && snap.volume.is_none() {
        run.user = Some(E2B_DEFAULT_USER.into());
    }
    let egress = Network::access(req.network.as_ref(), req.allow_internet_access)?.map(|access| {
        EgressSpec {
            access: Some(access),
            ..EgressSpec::default()
        }
    });
    Ok(SandboxPlan {
        spec: SandboxSpec {
            name: None,
            snapshot_id: snap.id,
            cpu: sizing.cpu,
            mem: sizing.mem,
            fs_capacity: sizing.fs_capacity,
            persistent: true,
            preserve_memory_on_stop: life.pause_keeps_memory,
            idle_ttl: None,
            delete_after_stop: Some(DEFAULT_DELETE_AFTER_STOP),
            run: run.into(),
            env_vars,
            labels,
            egress,
            delegation: None,
            mounts: Vec::new(),
            mount_rules: Vec::new(),
            public_ports: Network::public(req.network.as_ref()),
            port_host: Network::port_host(req.network.as_ref())?,
            tls_ports: Network::tls_ports(req.network.as_ref())?,
            service_grants: Default::default(),
            auto_resume: life.auto_resume,
            lifetime: Some(life.lifetime),
        },
        restore_memory: RestoreMemory::IfPresent,
        wait_for_ready: Some(CREATE_WAIT),
        volumes: req
            .volume_mounts
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, m)| VolumeRequest {
                volume: m.name.clone(),
                path: m.path.clone(),
                read_only: false,
                field: format!("volumeMounts[{i}]"),
            })
            .collect(),
    })
}

/// `POST /sandboxes`, `POST /v2/sandboxes`.
pub async fn create(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: NewSandbox = json_body(&body?.0)?;
    let life = req.lifecycle()?;
    // E2B's create hands out the sandbox's runtime tokens: its caller
    // must be one who may use the sandbox it makes.
    who.require_runtime_as_creator()?;
    let snap = c
        .resolve_snapshot(who.workspace_id, &template(&req.template_id)?)
        .await?;
    let mut plan = plan(&req, &snap, life)?;
    let rules = Network::proxy_rules(req.network.as_ref())?;
    if !rules.is_empty() {
        let rules = c.sealed_rules(who.workspace_id, rules)?;
        plan.spec.egress.get_or_insert_with(Default::default).rules = rules;
    }
    let row = c.create_sandbox(&who, &snap, plan).await?;
    if row.status != SandboxStatus::Ready {
        let why = row.status_message.clone().unwrap_or_default();
        return Err(E2bError::new(
            500,
            format!(
                "sandbox {} did not start: {} {why}",
                row.id,
                row.status.as_str()
            ),
        ));
    }
    let tokens = c.runtime_tokens(&who, &row)?;
    let body = c.e2b_sandbox(&row, (snap.id.to_string(), snap.name.clone()), tokens);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /sandboxes/{id}`.
pub async fn detail(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let who = who?;
    who.require("sandboxes:read")?;
    let row = c.e2b_find(&who, &id).await?;
    let deadline = c.deadline(row.id).await?;
    // The envd token only for a caller with runtime access (the creator,
    // or sandboxes:exec); a reader sees the sandbox, not its insides.
    let tokens = c.runtime_tokens(&who, &row).ok();
    if row.status == SandboxStatus::Failed {
        return Err(E2bError::not_found(format!(
            "sandbox {id} failed: {}",
            row.status_message
                .as_deref()
                .unwrap_or("no reason was recorded")
        )));
    }
    let body = c
        .e2b_detail(&row, deadline.as_ref(), tokens.as_ref())
        .await
        .ok_or_else(|| E2bError::not_found(format!("sandbox {id} not found")))?;
    Ok(Json(body).into_response())
}

/// The list's query: `state` (comma-separated, or repeated), `metadata`
/// (a URL-encoded `k=v&k2=v2`), `template` (an id or a name, as a create
/// takes it), `startedAfter` (RFC 3339), `limit`, `nextToken`, `order`.
#[derive(Default)]
struct ListQuery {
    running: bool,
    paused: bool,
    labels: Vec<(String, Option<String>)>,
    template: Option<SnapshotSelector>,
    started_after: Option<crate::domain::model::Timestamp>,
    limit: Option<u32>,
    next_token: Option<String>,
    order: crate::domain::model::SortOrder,
}

fn list_query(raw: Option<&str>) -> E2bResult<ListQuery> {
    let mut q = ListQuery::default();
    let mut states = false;
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "state" => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    states = true;
                    match s {
                        "running" => q.running = true,
                        "paused" => q.paused = true,
                        other => {
                            return Err(E2bError::bad_request(format!(
                                "state: unknown state {other:?} (running or paused)"
                            )))
                        }
                    }
                }
            }
            "metadata" => {
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    q.labels.push((mk.into_owned(), Some(mv.into_owned())));
                }
            }
            "limit" => {
                q.limit = Some(page_limit(&v)?);
            }
            "template" => {
                q.template = Some(template(&v).map_err(|_| {
                    E2bError::bad_request(format!("template: {v:?} is not a template id or name"))
                })?);
            }
            "startedAfter" => {
                q.started_after = Some(
                    crate::domain::model::Timestamp::parse_rfc3339(&v).ok_or_else(|| {
                        E2bError::bad_request(format!(
                            "startedAfter: {v:?} is not an RFC 3339 time"
                        ))
                    })?,
                );
            }
            "nextToken" => q.next_token = Some(v.into_owned()).filter(|t| !t.is_empty()),
            "order" => {
                q.order = match &*v {
                    "asc" => crate::domain::model::SortOrder::Asc,
                    "desc" => crate::domain::model::SortOrder::Desc,
                    other => {
                        return Err(E2bError::bad_request(format!(
                            "order: {other:?} is neither asc nor desc"
                        )))
                    }
                }
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter Hearth's E2B list serves"
                )))
            }
        }
    }
    if !states {
        q.running = true;
        q.paused = true;
    }
    Ok(q)
}

/// A list's `limit`: 1 to 1,000.
pub(super) fn page_limit(v: &str) -> E2bResult<u32> {
    v.parse()
        .ok()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| E2bError::bad_request(format!("limit: must be 1 to 1000, got {v:?}")))
}

/// A list's failure: a `nextToken` this server did not give is the
/// caller's mistake.
pub(super) fn page_error(e: DomainError) -> E2bError {
    match e {
        DomainError::Invalid(_, i) if i.field == "cursor" => {
            E2bError::bad_request("nextToken: not a token this list gave")
        }
        e => e.into(),
    }
}

/// One page of a list, the next page's token in `x-next-token`.
pub(super) fn page_response<T: Serialize>(items: Vec<T>, next: Option<String>) -> Response {
    let mut resp = Json(items).into_response();
    if let Some(v) = next.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-next-token", v);
    }
    resp
}

/// `GET /sandboxes`, `GET /v2/sandboxes`: a page of the workspace's
/// sandboxes, newest first; the next page's token in `x-next-token`.
pub async fn list(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let q = list_query(raw.as_deref())?;
    // A template that does not exist has no sandboxes.
    let snapshot_id = match &q.template {
        Some(sel) => match c.find_snapshot(who.workspace_id, sel).await? {
            Some(s) => Some(s.id),
            None => return Ok(page_response(Vec::<DetailBody>::new(), None)),
        },
        None => None,
    };
    let filter = crate::domain::model::SandboxFilter {
        snapshot_id,
        created_since: q.started_after,
        // One state is one status; both (the default) take every row and
        // leave out those being deleted.
        status: match (q.running, q.paused) {
            (true, false) => Some(SandboxStatus::Ready),
            (false, true) => Some(SandboxStatus::Stopped),
            _ => None,
        },
        labels: q.labels,
        sort_by: crate::domain::model::SandboxSort::CreatedAt,
        sort_order: q.order,
        page_size: q.limit.unwrap_or(100),
        cursor: q.next_token,
        ..crate::domain::model::SandboxFilter::default()
    };
    let page = c.sandbox_page(&who, &filter, 0).await.map_err(page_error)?;
    let ids: Vec<SandboxId> = page.items.iter().map(|r| r.id).collect();
    let deadlines = c.deadlines(&ids).await?;
    let mut out = Vec::with_capacity(page.items.len());
    for row in &page.items {
        if let Some(d) = c.e2b_detail(row, deadlines.get(&row.id), None).await {
            out.push(d);
        }
    }
    Ok(page_response(out, page.next_cursor))
}

/// `DELETE /sandboxes/{id}`.
pub async fn kill(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let who = who?;
    // Refused before the lookup, so that a key that may not delete learns
    // nothing of which ids exist (the domain checks again).
    who.require("sandboxes:delete")?;
    let row = c.e2b_find(&who, &id).await?;
    c.delete_sandbox(&who, &row).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeoutBody {
    timeout: i64,
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends `timeout` seconds
/// from now (sooner or later than before), as its deadline says.
pub async fn set_timeout(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<StatusCode> {
    let who = who?;
    let req: TimeoutBody = json_body(&body?.0)?;
    let timeout = timeout_secs(req.timeout)?;
    let row = c.e2b_find(&who, &id).await?;
    c.end_in(&who, &row, timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    memory: Option<bool>,
    #[serde(rename = "requireHealthyGuest")]
    require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: a stop that saves the memory (or, with
/// `memory: false`, keeps only the disk: the next connect boots it); its
/// deadline stops with it (a paused sandbox is kept until deleted, or 14
/// days, as any stopped sandbox).
pub async fn pause(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<StatusCode> {
    let who = who?;
    let req: PauseBody = optional_body(&body?.0)?;
    let row = c.e2b_find(&who, &id).await?;
    c.pause(
        &who,
        &row,
        Pause {
            healthy: req.require_healthy_guest == Some(true),
            keep_memory: req.memory != Some(false),
        },
        "paused through the E2B API",
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConnectBody {
    timeout: Option<i64>,
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/connect` (and `/v2/…/connect`, `/…/resume`): a
/// paused sandbox is resumed (201), a running one answered as it is
/// (200). `timeout` sets the deadline of a resumed sandbox, and moves a
/// running one's later (never sooner); a sandbox made through LangSmith's
/// API, which has none, is given one (`Control::extend_on_connect`).
pub async fn connect(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: ConnectBody = optional_body(&body?.0)?;
    if req.memory == Some(false) {
        return Err(not_served(
            "memory",
            "a resume without the saved memory is not served",
        ));
    }
    let timeout = req.timeout.map(timeout_secs).transpose()?;
    let row = c.e2b_find(&who, &id).await?;
    let (row, resumed) = c.connect(&who, row, timeout).await?;
    let snap = c.e2b_snapshot(&row).await;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let tokens = c.runtime_tokens(&who, &row)?;
    Ok((status, Json(c.e2b_sandbox(&row, snap, tokens))).into_response())
}

/// E2B calls Hearth does not serve yet (metrics, logs, snapshots,
/// network updates, refreshes): a 501 that says so, never a 404 that
/// the SDK would read as a missing sandbox.
pub async fn not_served_route(uri: axum::http::Uri) -> E2bError {
    E2bError::new(
        501,
        format!("{} is not served by Hearth's E2B API", uri.path()),
    )
}
