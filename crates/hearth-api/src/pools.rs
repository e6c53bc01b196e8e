//! Warm pools, a Hearth extension (`/api/v2/sandboxes/pools`): a pool
//! keeps `size` paused VMs of one snapshot and one size ready, and a
//! create of that snapshot and size (the unmodified SDK's
//! `create_sandbox(snapshot_name=…)` included) claims one instead of
//! booting. Unknown fields are refused (422 naming them), as everywhere.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::ApiError;
use crate::spec::{resolve_sizing, Sizing, SizingRequest, SnapshotSelector};
use crate::validate::check_sandbox_name;
use crate::SnapshotRef;

/// Most VMs one pool may keep.
pub const MAX_POOL_SIZE: i64 = 64;

/// Body of `POST /pools`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePoolRequest {
    /// Unique in the workspace; lowercase letters, digits and `-`.
    pub name: String,
    /// The snapshot its VMs boot from: an id, a name (`:latest`) or
    /// `name:tag`; absent, the server's default snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// VMs to keep ready, 0 to 64.
    pub size: i64,
    /// The sandboxes' size, as in a create (the same defaults): a create
    /// claims from the pool only when its size resolves to the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millicores: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_capacity_bytes: Option<i64>,
}

/// Body of `PATCH /pools/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePoolRequest {
    /// VMs to keep ready, 0 to 64.
    pub size: i64,
}

/// What a pool holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolStatus {
    /// Paused VMs a create can claim now.
    pub ready: u32,
    /// VMs booting to join it.
    pub warming: u32,
    /// Creates that took a ready VM.
    pub claims: u64,
    /// Creates of its snapshot and size that found none ready and booted.
    pub misses: u64,
}

/// A pool as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolResponse {
    pub id: Uuid,
    pub name: String,
    pub snapshot_id: Uuid,
    pub size: u32,
    pub cpu_millicores: u32,
    pub mem_bytes: u64,
    pub fs_capacity_bytes: u64,
    pub status: PoolStatus,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// Checks a size (`field` names it in the 422).
pub fn check_pool_size(field: &str, size: i64) -> Result<u32, ApiError> {
    if !(0..=MAX_POOL_SIZE).contains(&size) {
        return Err(ApiError::validation(
            field,
            format!("{field} must be between 0 and {MAX_POOL_SIZE}, got {size}"),
        ));
    }
    Ok(size as u32)
}

impl CreatePoolRequest {
    /// The checked name and size, and the snapshot it names.
    pub fn validate(&self) -> Result<(u32, SnapshotSelector), ApiError> {
        check_sandbox_name("name", &self.name)?;
        let size = check_pool_size("size", self.size)?;
        let sel = match self.snapshot.as_deref().filter(|s| !s.is_empty()) {
            None => SnapshotSelector::Default,
            Some(v) => match Uuid::parse_str(v) {
                Ok(id) => SnapshotSelector::Id(id),
                Err(_) => v
                    .parse::<SnapshotRef>()
                    .map(SnapshotSelector::Ref)
                    .map_err(|e| ApiError::validation("snapshot", format!("snapshot: {e}")))?,
            },
        };
        Ok((size, sel))
    }

    /// The members' size, by a create's rules against the snapshot's disk.
    pub fn sizing(&self, snapshot_fs_capacity: hearth_types::ByteSize) -> Result<Sizing, ApiError> {
        resolve_sizing(&SizingRequest {
            vcpus: self.vcpus,
            cpu_millicores: self.cpu_millicores,
            mem_bytes: self.mem_bytes,
            fs_capacity_bytes: self.fs_capacity_bytes,
            persistent: true,
            snapshot_fs_capacity,
        })
    }
}
