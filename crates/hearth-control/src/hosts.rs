//! `GET /api/v2/sandboxes/hosts`: the fleet's hosts for operators (keys
//! holding `fleet:read`; `*` does not include it): state, lease, capacity,
//! what is committed on each, free disk and store health.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use hearth_api::hosts::HostResponse;
use hearth_api::ApiError;
use hearth_db::Timestamp;

use crate::auth::Principal;
use crate::error::{db_error, HttpResult};
use crate::Control;

/// The operator's permission: the fleet's hosts.
pub const FLEET_READ: &str = "fleet:read";

/// Whether `who` may see the fleet: which hosts exist and where
/// sandboxes run (never through a delegated token).
pub(crate) fn reads_fleet(who: &Principal) -> bool {
    !who.is_delegated() && who.permissions.iter().any(|p| p == FLEET_READ)
}

pub(crate) async fn list(
    State(c): State<Arc<Control>>,
    who: Principal,
) -> HttpResult<Json<Vec<HostResponse>>> {
    if !reads_fleet(&who) {
        return Err(ApiError::forbidden(format!(
            "the fleet's hosts need a key with {FLEET_READ} (which * does not include)"
        ))
        .into());
    }
    let hosts = c.db.list_hosts().await.map_err(db_error)?;
    let loads = c.db.host_load().await.map_err(db_error)?;
    let now = Timestamp::now();
    let mut out = Vec::with_capacity(hosts.len());
    for h in &hosts {
        let load = loads.iter().find(|l| l.host_id == h.id);
        // This process's hosts answer at once (they report nothing with a
        // lease); remote ones reported their free disk with their lease.
        let disk_free = match c.hosts.get(&h.id) {
            Some(local) => match local.status().await {
                Ok(s) => s.disk_available,
                Err(e) => {
                    tracing::warn!(host = %h.id, error = %e, "hosts: an in-process host did not answer");
                    h.disk_free
                }
            },
            None => h.disk_free,
        };
        out.push(HostResponse {
            id: *h.id.as_uuid(),
            address: h.address.clone(),
            state: h.state.as_str().to_owned(),
            lease_live: h.lease_expires_at > now,
            lease_expires_at: h.lease_expires_at.to_rfc3339(),
            capacity_cpu_millicores: h.capacity_cpu.0,
            capacity_mem_bytes: h.capacity_mem.bytes(),
            committed_cpu_millicores: load.map_or(0, |l| l.cpu.0),
            committed_mem_bytes: load.map_or(0, |l| l.mem.bytes()),
            sandboxes: load.map_or(0, |l| l.sandboxes),
            disk_free_bytes: disk_free.bytes(),
            store_error: h.store_error.clone(),
            version: h.version.clone(),
            registered_at: h.registered_at.to_rfc3339(),
        });
    }
    Ok(Json(out))
}
