//! The fleet's hosts as operators see them (`GET /api/v2/sandboxes/hosts`,
//! a Hearth extension): only for a key holding `fleet:read`, which `*` does
//! not include (a workspace's `*` is everything about its own sandboxes;
//! hosts are the operator's).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// One registered host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HostResponse {
    pub id: Uuid,
    /// The host's private API (`inprocess` for the one inside `hearth up`).
    pub address: String,
    /// `ready` (takes sandboxes), `draining` or `down`.
    pub state: String,
    /// Whether its lease is current (it renewed in time).
    pub lease_live: bool,
    /// RFC 3339.
    pub lease_expires_at: String,
    pub capacity_cpu_millicores: u32,
    pub capacity_mem_bytes: u64,
    /// What live sandboxes placed on it have been given.
    pub committed_cpu_millicores: u32,
    pub committed_mem_bytes: u64,
    pub sandboxes: u64,
    /// Free space for new disks, as it last reported.
    pub disk_free_bytes: u64,
    /// Its last check of the object store failed with this; null when it
    /// passed (placement skips a host whose store fails).
    pub store_error: Option<String>,
    /// The host agent's version.
    pub version: String,
    /// RFC 3339.
    pub registered_at: String,
}
