//! Snapshot wire types (read side).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::nested::RunConfig;

/// A snapshot's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStatus {
    Building,
    Ready,
    Failed,
    Deleting,
}

/// A snapshot: a filesystem image (optionally with memory) sandboxes boot
/// from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotResponse {
    pub id: Uuid,
    pub name: String,
    /// Tags under `name` resolving to this snapshot; empty = dangling
    /// (reachable by id only).
    pub tags: Vec<String>,
    pub status: SnapshotStatus,
    pub status_message: Option<String>,
    /// Source image, for snapshots built from one.
    pub docker_image: Option<String>,
    pub image_digest: Option<String>,
    pub registry_id: Option<Uuid>,
    /// Source sandbox, for captured snapshots.
    pub source_sandbox_id: Option<Uuid>,
    pub fs_capacity_bytes: u64,
    pub fs_used_bytes: Option<u64>,
    /// Non-null exactly when the snapshot holds memory, i.e. can
    /// warm-restore.
    pub memory_snapshot_size_bytes: Option<u64>,
    pub labels: BTreeMap<String, String>,
    pub description: Option<String>,
    /// What sandboxes booted from it run with; null on old snapshots (root,
    /// image env).
    pub run_config: Option<RunConfig>,
    /// RFC 3339.
    pub created_at: String,
    pub created_by: Option<String>,
    /// RFC 3339.
    pub updated_at: Option<String>,
}

/// Answer of `GET /snapshots`. The Python SDK reads `snapshots`; `items`
/// and `next_cursor` match the cursor-paginated lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ListSnapshotsResponse {
    pub items: Vec<SnapshotResponse>,
    pub next_cursor: Option<String>,
    /// Copy of `items`, read by the Python SDK.
    #[serde(default)]
    pub snapshots: Vec<SnapshotResponse>,
}

impl ListSnapshotsResponse {
    pub fn new(items: Vec<SnapshotResponse>, next_cursor: Option<String>) -> Self {
        Self {
            snapshots: items.clone(),
            items,
            next_cursor,
        }
    }
}

/// One tag under a snapshot name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotTag {
    pub tag: String,
    pub snapshot_id: Uuid,
}

/// Answer of `GET /snapshots-by-name/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotsByNameResponse {
    pub name: String,
    pub tags: Vec<SnapshotTag>,
}
