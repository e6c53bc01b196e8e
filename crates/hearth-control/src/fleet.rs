//! Hosts as separate processes (`hearth host serve --control URL`).
//!
//! - **Registration** (`POST /internal/v1/hosts/register`): an enrollment
//!   token (`ControlConfig::host_token`) and a command signed by the host's
//!   own key, which is recorded in `signing_keys`. Each registration starts
//!   a new lease epoch; the answer carries the control plane's public keys.
//! - **Leases** (`POST /internal/v1/hosts/{id}/lease`): signed by the host,
//!   at its epoch; renewed only while the lease is still held (a lost
//!   lease is a 409: the host has fenced itself and must register again).
//!   Each renewal records the host's free disk and its last store check
//!   (`hosts.store_error`): placement skips a host whose store fails until
//!   a renewal says it answers again. This process's own hosts report
//!   theirs through [`Control::record_store_health`].
//! - **Drain** (`POST /internal/v1/hosts/{id}/drain`): the host takes no
//!   new sandbox; those it runs are stopped (memory saved where asked) and
//!   start elsewhere on their next use.
//! - **Failover** ([`Control::fail_over`], from the reapers): a host whose
//!   lease expired more than `failover_grace` ago is marked down and its
//!   live sandboxes are started on other hosts from their last committed
//!   disk; one whose disk was only in that host's own store is `failed`.
//! - Commands to remote hosts go through [`hearth_hostapi::RemoteHost`],
//!   signed with this control plane's key for the host's current epoch.
//! - **Control keys** are sent to hosts with every lease, and a host trusts
//!   exactly those until its next renewal. Each replica refreshes its own
//!   key's `seen_at` at every reaper pass; only keys seen within
//!   [`CONTROL_KEY_WINDOW`] and not retired are sent. The key of a replica
//!   that is gone (the chart gives each pod a new key) so stops being
//!   trusted on its own within the window plus one renewal; `hearth keys
//!   signing retire` ends a key at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_api::ApiError;
use hearth_db::{
    HostRow, HostState, KeyOwnerKind, NewSigningKey, SandboxStatus, StatusExtra, Timestamp,
};
use hearth_fence::{KeyRing, PublicKey};
use hearth_hostapi::fleet::{
    Drained, Lease, RegisterHost, RenewLease, StoreHealth, CONTROL_AUDIENCE,
};
use hearth_hostapi::{HostApi, HostCredentials, RemoteHost};
use hearth_types::HostId;

use crate::domain::state::Move;
use crate::error::{db_error, HttpError, HttpResult};
use crate::extract::{JsonBody, Path};
use crate::Control;

/// Remote hosts this process has talked to, by id, with the epoch and
/// address their client was made for.
#[derive(Default)]
pub(crate) struct Remotes(Mutex<HashMap<HostId, RemoteEntry>>);

/// A remote host's client, with the epoch and address it was made for.
type RemoteEntry = (u64, String, Arc<RemoteHost>);

impl Remotes {
    fn client(
        &self,
        row: &HostRow,
        signer: Option<Arc<hearth_fence::Signer>>,
    ) -> Option<Arc<RemoteHost>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((epoch, address, client)) = map.get(&row.id) {
            if *epoch == row.epoch && *address == row.address {
                return Some(client.clone());
            }
        }
        let Some(signer) = signer else {
            // Every remote host takes only signed commands.
            tracing::error!(host = %row.id, "no signing key: cannot command a remote host");
            return None;
        };
        let credentials = HostCredentials::Signed(signer);
        let client = match RemoteHost::new(&row.address, row.id.to_string(), row.epoch, credentials)
        {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::error!(host = %row.id, error = %e, "cannot make a client for a host");
                return None;
            }
        };
        map.insert(row.id, (row.epoch, row.address.clone(), client.clone()));
        Some(client)
    }
}

/// A remote host's address (in-process hosts are recorded as `in-process`).
pub(crate) fn is_remote(row: &HostRow) -> bool {
    row.address.starts_with("http://") || row.address.starts_with("https://")
}

impl Control {
    /// The host `id`, in this process or remote.
    pub(crate) async fn host(&self, id: HostId) -> Option<Arc<dyn HostApi>> {
        if let Some(h) = self.hosts.get(&id) {
            return Some(h.clone());
        }
        let row = match self.db.get_host(id).await {
            Ok(row) => row,
            Err(hearth_db::DbError::NotFound { .. }) => return None,
            Err(e) => {
                tracing::warn!(host = %id, error = %e, "cannot read a host's record; treating it as unreachable");
                return None;
            }
        };
        if !is_remote(&row) || row.state == HostState::Down {
            return None;
        }
        let client = self.remotes.client(&row, self.cfg.signer.clone())?;
        Some(client)
    }

    /// Every host that may run something now: this process's, and remote
    /// ones not marked down.
    /// A database error leaves out the remote hosts, and says so.
    pub(crate) async fn live_hosts(&self) -> Vec<(HostId, Arc<dyn HostApi>)> {
        let mut out: Vec<(HostId, Arc<dyn HostApi>)> =
            self.hosts.iter().map(|(id, h)| (*id, h.clone())).collect();
        match self.remote_hosts().await {
            Ok(remote) => out.extend(remote),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list hosts; only this process's are reached this time")
            }
        }
        out
    }

    /// Remote hosts not marked down whose lease is live.
    pub(crate) async fn remote_hosts(
        &self,
    ) -> Result<Vec<(HostId, Arc<dyn HostApi>)>, hearth_db::DbError> {
        let now = Timestamp::now();
        let rows = self.db.list_hosts().await?;
        // A host past its lease has fenced itself (or is gone): there is
        // nothing to ask it until it registers again.
        Ok(rows
            .iter()
            .filter(|r| is_remote(r) && r.state != HostState::Down && r.lease_expires_at > now)
            .filter_map(|row| {
                let c: Arc<dyn HostApi> = self.remotes.client(row, self.cfg.signer.clone())?;
                Some((row.id, c))
            })
            .collect())
    }

    /// The control plane's public keys, as hosts receive them: not
    /// retired, and refreshed by their replica within
    /// [`CONTROL_KEY_WINDOW`] of `now`.
    async fn control_keys(&self, now: Timestamp) -> Vec<String> {
        let since = now.minus(CONTROL_KEY_WINDOW);
        match self.db.list_signing_keys(KeyOwnerKind::Control, None).await {
            Ok(keys) => keys
                .iter()
                .filter(|k| k.live_since(since))
                .filter_map(|k| PublicKey::from_bytes(&k.public_key).ok())
                .map(|k| k.to_base64())
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot list the control plane's keys");
                Vec::new()
            }
        }
    }

    /// Records this control plane's signing key, so hosts trust it, and
    /// marks it seen now (a restart with the same key file re-registers
    /// nothing but is seen again).
    pub(crate) async fn register_control_key(&self) -> Result<(), hearth_db::DbError> {
        let Some(signer) = &self.cfg.signer else {
            return Ok(());
        };
        let public = signer.key().public();
        let now = Timestamp::now();
        let row = self
            .db
            .register_signing_key(&NewSigningKey {
                key_id: public.id().to_string(),
                owner_kind: KeyOwnerKind::Control,
                owner_id: "control".into(),
                public_key: public.bytes(),
                created_at: now,
            })
            .await?;
        if row.retired_at.is_some() {
            // Hosts will refuse every command it signs: say so loudly.
            tracing::error!(key = %row.key_id, "this control plane's signing key was retired; give it a new key file");
        }
        self.db.touch_signing_key(&row.key_id, now).await
    }

    /// Says this replica still signs with its key (a reaper pass).
    pub(crate) async fn refresh_control_key(&self, now: Timestamp) {
        let Some(signer) = &self.cfg.signer else {
            return;
        };
        let id = signer.key().public().id().to_string();
        if let Err(e) = self.db.touch_signing_key(&id, now).await {
            tracing::warn!(key = %id, error = %e, "cannot refresh this control plane's signing key");
        }
    }

    /// Checks a command a host signed: by one of its registered keys, for
    /// the control plane, about itself, at `epoch` (when given).
    async fn host_command(
        &self,
        host: HostId,
        headers: &HeaderMap,
        action: &str,
        body: &[u8],
    ) -> Result<hearth_fence::Verified, ApiError> {
        let token = headers
            .get(hearth_fence::HEADER_NAME)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                ApiError::new(403, "CommandRefused", "missing_command: no signed command")
            })?;
        let keys = self
            .db
            .list_signing_keys(KeyOwnerKind::Host, Some(&host.to_string()))
            .await
            .map_err(db_error)?;
        let mut ring = KeyRing::new();
        for k in &keys {
            if let Ok(public) = PublicKey::from_bytes(&k.public_key) {
                ring.insert(public, k.retired_at.map(|t| t.unix_ms() as u64));
            }
        }
        // The shared verifier remembers nonces and epochs across hosts;
        // the ring is this host's keys only, so no host signs for another.
        let verified = self
            .host_verifier
            .verify_with(token, action, body, hearth_fence::now_ms(), &ring)
            .map_err(|r| ApiError::new(403, "CommandRefused", format!("{}: {r}", r.reason())))?;
        if verified.subject.as_deref() != Some(host.to_string().as_str()) {
            return Err(ApiError::new(
                403,
                "CommandRefused",
                "wrong_subject: a host signs only for itself",
            ));
        }
        Ok(verified)
    }

    fn lease_answer(&self, epoch: u64, expires: Timestamp, keys: Vec<String>) -> Lease {
        Lease {
            epoch,
            expires_at_ms: expires.unix_ms() as u64,
            ttl_ms: self.cfg.lease.as_millis() as u64,
            control_keys: keys,
        }
    }

    /// Records a store check of one of this process's hosts (the
    /// in-process host of `hearth up`), as a remote host's renewal does.
    pub async fn record_store_health(&self, id: HostId, health: &StoreHealth) {
        if let Err(e) = self.db.set_host_store_error(id, health.error()).await {
            tracing::warn!(host = %id, error = %e, "cannot record a host's store check");
        }
    }

    /// Marks hosts whose lease expired more than the failover grace ago
    /// as down, and starts their sandboxes elsewhere.
    pub(crate) async fn fail_over(self: &Arc<Self>, now: Timestamp) {
        let expired = match self
            .db
            .expired_hosts(now.minus(self.cfg.failover_grace))
            .await
        {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list expired hosts");
                return;
            }
        };
        for host in expired.iter().filter(|h| is_remote(h)) {
            // Decided before the host is marked down: a later pass does
            // not see it again.
            let shared = match self.store_is_shared(host).await {
                Ok(shared) => shared,
                Err(e) => {
                    tracing::warn!(host = %host.id, error = %e, "cannot tell whether a lost host's store is shared; failover waits for the next pass");
                    continue;
                }
            };
            match self.db.mark_host_down(host.id, host.epoch).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(host = %host.id, error = %e, "cannot mark a host down");
                    continue;
                }
            }
            tracing::warn!(host = %host.id, epoch = host.epoch, "host lease expired: failing its sandboxes over");
            self.metrics.host_lost();
            let rows = match self.db.sandboxes_on_host(host.id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(host = %host.id, error = %e, "cannot list a lost host's sandboxes");
                    continue;
                }
            };
            for row in rows
                .iter()
                .filter(|r| matches!(r.status, SandboxStatus::Ready | SandboxStatus::Provisioning))
            {
                self.fail_over_sandbox(row, host, shared).await;
            }
        }
    }

    /// Whether another live host uses the lost host's store (so its disks
    /// can come back there).
    async fn store_is_shared(&self, lost: &HostRow) -> Result<bool, hearth_db::DbError> {
        if lost.store_url.is_empty() {
            return Ok(false);
        }
        if !lost.store_url.starts_with("file:") {
            return Ok(true);
        }
        let now = Timestamp::now();
        Ok(self
            .db
            .list_hosts()
            .await?
            .iter()
            .any(|h| h.id != lost.id && h.store_url == lost.store_url && h.lease_expires_at > now))
    }

    async fn fail_over_sandbox(
        self: &Arc<Self>,
        row: &hearth_db::SandboxRow,
        host: &HostRow,
        shared: bool,
    ) {
        let extra = StatusExtra {
            stopped_at: Some(Some(Timestamp::now())),
            expect_generation: Some(row.generation),
            ..StatusExtra::default()
        };
        if !shared && row.persistent {
            let message = format!(
                "host {} was lost and the sandbox's disk lived only in its store ({}), which no live host shares; it starts again only if that host comes back",
                host.id, host.store_url
            );
            if let Err(e) = self
                .apply_move(row.id, Move::Stranded, Some(&message), extra)
                .await
            {
                tracing::warn!(sandbox = %row.id, error = %e, "cannot record a lost sandbox");
            }
            self.bump(row.id);
            return;
        }
        let message = format!(
            "host {} was lost; restarting on another host from the last committed disk",
            host.id
        );
        let stopped = match self
            .apply_move(row.id, Move::FailOver, Some(&message), extra)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(sandbox = %row.id, error = %e, "sandbox moved on before failover");
                return;
            }
        };
        self.bump(row.id);
        match self.start_row(&stopped).await {
            Ok(_) => tracing::info!(sandbox = %row.id, lost = %host.id, "sandbox failed over"),
            // Stays stopped, with the message; its next use starts it.
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "failover start refused")
            }
        }
    }

    /// Stops every sandbox on `host` (saving memory where asked); they
    /// start elsewhere on their next use.
    async fn drain_host(&self, host: HostId) -> Drained {
        let mut out = Drained::default();
        let rows = match self.db.sandboxes_on_host(host).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(%host, error = %e, "drain: cannot list the host's sandboxes; the next pass retries");
                return out;
            }
        };
        for row in rows.iter().filter(|r| r.status == SandboxStatus::Ready) {
            match self.stop_row(row, Some("the host was drained")).await {
                Ok(_) if row.preserve_memory_on_stop => out.saved += 1,
                Ok(_) => out.stopped += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %row.id, error = %e, "drain: cannot stop");
                    out.failed += 1;
                }
            }
        }
        // Warm pools' members go too (the pools warm new ones elsewhere):
        // a drained host runs nothing.
        match self.db.list_members().await {
            Ok(members) => {
                for m in members.iter().filter(|m| m.host_id == host) {
                    self.remove_member(m, "its host is draining").await;
                }
            }
            Err(e) => {
                tracing::warn!(%host, error = %e, "drain: cannot list pool members; the pools' next tend removes them")
            }
        }
        self.pools_changed.notify_one();
        out
    }
}

/// Constant-time comparison of the enrollment token.
fn token_matches(given: &str, want: &str) -> bool {
    let (a, b) = (
        blake3::hash(given.as_bytes()),
        blake3::hash(want.as_bytes()),
    );
    a == b
}

pub(crate) async fn register(
    State(c): State<Arc<Control>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let Some(want) = c.cfg.host_token.as_deref() else {
        return Err(ApiError::forbidden(
            "this control plane takes no remote hosts (no host token is set)",
        )
        .into());
    };
    let given = headers
        .get(hearth_hostapi::fleet::ENROLLMENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !token_matches(given, want) {
        return Err(HttpError(ApiError::new(
            401,
            "Unauthorized",
            "invalid or missing host enrollment token",
        )));
    }
    let req: RegisterHost = hearth_api::parse_body(&body)?;
    let public = PublicKey::from_base64(&req.public_key)
        .map_err(|e| ApiError::validation("public_key", e.to_string()))?;
    if !(req.address.starts_with("http://") || req.address.starts_with("https://")) {
        return Err(ApiError::validation("address", "an http:// or https:// URL").into());
    }
    // The registration is signed by the key it registers.
    let token = headers
        .get(hearth_fence::HEADER_NAME)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::new(403, "CommandRefused", "missing_command: no signed command")
        })?;
    let ring = KeyRing::new().with(public.clone(), None);
    c.host_verifier
        .verify_with(
            token,
            "POST /internal/v1/hosts/register",
            &body,
            hearth_fence::now_ms(),
            &ring,
        )
        .map_err(|r| ApiError::new(403, "CommandRefused", format!("{}: {r}", r.reason())))?;
    let key =
        c.db.register_signing_key(&NewSigningKey {
            key_id: public.id().to_string(),
            owner_kind: KeyOwnerKind::Host,
            owner_id: req.id.to_string(),
            public_key: public.bytes(),
            created_at: Timestamp::now(),
        })
        .await
        .map_err(db_error)?;
    if key.retired_at.is_some() {
        // Its renewals would be refused: it must come back with a new key.
        return Err(ApiError::new(
            403,
            "CommandRefused",
            "retired_key: this host's key was retired; give the host a new key (remove its host.key)",
        )
        .into());
    }
    let now = Timestamp::now();
    let expires = now.plus(c.cfg.lease);
    let epoch =
        c.db.register_host(&HostRow {
            id: req.id,
            address: req.address.clone(),
            state: HostState::Ready,
            capacity_cpu: req.capacity_cpu,
            capacity_mem: req.capacity_mem,
            lease_expires_at: expires,
            registered_at: now,
            updated_at: now,
            epoch: 0,
            version: req.version.clone(),
            store_url: req.store_url.clone(),
            disk_free: req.disk_free,
            store_error: None,
        })
        .await
        .map_err(db_error)?;
    tracing::info!(host = %req.id, address = %req.address, epoch, "host registered");
    let keys = c.control_keys(now).await;
    Ok(Json(c.lease_answer(epoch, expires, keys)).into_response())
}

pub(crate) async fn renew(
    State(c): State<Arc<Control>>,
    Path(id): Path<HostId>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let action = format!("POST /internal/v1/hosts/{id}/lease");
    let verified = c.host_command(id, &headers, &action, &body).await?;
    let req: RenewLease = hearth_api::parse_body(&body)?;
    if verified.generation != req.epoch {
        return Err(ApiError::validation("epoch", "the body's epoch is not the command's").into());
    }
    let now = Timestamp::now();
    let expires = now.plus(c.cfg.lease);
    let renewed =
        c.db.renew_lease_at_epoch(
            id,
            req.epoch,
            now,
            expires,
            req.disk_free,
            req.store.error(),
        )
        .await
        .map_err(db_error)?;
    if !renewed {
        return Err(ApiError::conflict(format!(
            "host {id} no longer holds the lease of epoch {}: fence and register again",
            req.epoch
        ))
        .into());
    }
    // The key still signs for this host: its callback tokens stay in the
    // JWKS (see `jwks`).
    if let Err(e) = c.db.touch_signing_key(verified.key_id.as_str(), now).await {
        tracing::warn!(host = %id, key = %verified.key_id, error = %e, "cannot refresh the host's signing key");
    }
    let keys = c.control_keys(now).await;
    Ok(Json(c.lease_answer(req.epoch, expires, keys)).into_response())
}

/// How long after its signer last used it a key stays in the JWKS: longer
/// than any token it signed lives (callback tokens: 5 minutes) plus a
/// verifier's cache of the set (the SDK's: 5 minutes).
pub(crate) const JWKS_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// `GET /.well-known/jwks.json`: the public keys tokens Hearth signs verify
/// with (LangSmith's SDK fetches them from the API's origin): every
/// control-plane and host key not retired and in use within
/// [`JWKS_WINDOW`]. Public, like any JWKS; verifiers cache it.
pub(crate) async fn jwks(State(c): State<Arc<Control>>) -> HttpResult<Response> {
    let since = Timestamp::now().minus(JWKS_WINDOW);
    let mut set = hearth_fence::jwt::JwkSet::default();
    for kind in [KeyOwnerKind::Control, KeyOwnerKind::Host] {
        let rows = c.db.list_signing_keys(kind, None).await.map_err(db_error)?;
        set.keys.extend(
            rows.iter()
                .filter(|k| k.live_since(since))
                .filter_map(|k| PublicKey::from_bytes(&k.public_key).ok())
                .map(|k| hearth_fence::jwt::Jwk::of(&k)),
        );
    }
    Ok((
        [(axum::http::header::CACHE_CONTROL, "public, max-age=300")],
        Json(set),
    )
        .into_response())
}

pub(crate) async fn drain(
    State(c): State<Arc<Control>>,
    Path(id): Path<HostId>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let action = format!("POST /internal/v1/hosts/{id}/drain");
    c.host_command(id, &headers, &action, &body).await?;
    c.db.set_host_state(id, HostState::Draining)
        .await
        .map_err(db_error)?;
    tracing::info!(host = %id, "draining host");
    let drained = c.drain_host(id).await;
    tracing::info!(host = %id, saved = drained.saved, stopped = drained.stopped, failed = drained.failed, "host drained");
    Ok(Json(drained).into_response())
}

/// The audience hosts sign for; re-exported for the verifier's set-up.
pub(crate) const AUDIENCE: &str = CONTROL_AUDIENCE;

/// How long a control key stays trusted by hosts after its replica last
/// refreshed it (every reaper pass, seconds apart). Generous against clock
/// skew between replicas and a database blip; short enough that the key
/// of a pod that is gone does not stay valid for long.
pub const CONTROL_KEY_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);
