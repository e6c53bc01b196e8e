//! Snapshot wire types (read side).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::ApiError;
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

/// Body of `POST /boxes/{name}/snapshot`: capture a snapshot of a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CaptureSnapshotRequest {
    pub name: String,
    /// Defaults to `latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Capture the running sandbox's memory too, so that sandboxes created
    /// from the snapshot resume its processes. Default false.
    #[serde(default)]
    pub include_memory: bool,
    /// Export this Docker image inside the sandbox (as `docker load` kept
    /// it: LangSmith's Dockerfile snapshots) instead of its root
    /// filesystem; its `User`, `WorkingDir` and `Env` become the run config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_capacity_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Replaces the captured sandbox's `user`/`work_dir`, merges `env_vars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_config: Option<RunConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Body of `POST /snapshots`: build a snapshot from an OCI (Docker) image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    pub name: String,
    /// `registry/repository:tag` or `@sha256:…`; Docker Hub names
    /// (`python:3.12`) resolve to `docker.io/library/…`.
    pub docker_image: String,
    pub fs_capacity_bytes: i64,
    /// Defaults to the image's own tag, else `latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// A private registry of the workspace (`/registries`) to pull with:
    /// its credentials, sent only to its own host (the image must be on
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_id: Option<Uuid>,
    /// Overrides the image's `User`, `WorkingDir`; `env_vars` merge over its
    /// `Env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_config: Option<RunConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Longest snapshot description.
pub const MAX_DESCRIPTION: usize = 1024;

impl CaptureSnapshotRequest {
    /// The checked request: its `name:tag`.
    pub fn validate(&self) -> Result<crate::SnapshotRef, ApiError> {
        if let Some(image) = &self.docker_image {
            check_image_ref(image)?;
        }
        if self.checkpoint.is_some() {
            return Err(ApiError::validation(
                "checkpoint",
                "checkpoints are not supported; capture the sandbox itself",
            ));
        }
        check_description(self.description.as_deref())?;
        if let Some(l) = &self.labels {
            crate::validate::check_labels(l)?;
        }
        snapshot_ref("name", &self.name, self.tag.as_deref())
    }
}

impl CreateSnapshotRequest {
    /// The checked request: its `name:tag` and capacity.
    pub fn validate(&self) -> Result<(crate::SnapshotRef, u64), ApiError> {
        check_image_ref(&self.docker_image)?;
        let capacity = u64::try_from(self.fs_capacity_bytes)
            .ok()
            .filter(|&c| c >= 16 << 20)
            .ok_or_else(|| {
                ApiError::validation(
                    "fs_capacity_bytes",
                    "fs_capacity_bytes must be at least 16 MiB",
                )
            })?;
        check_description(self.description.as_deref())?;
        if let Some(l) = &self.labels {
            crate::validate::check_labels(l)?;
        }
        // The image's own tag when none is given.
        let image_tag = self
            .docker_image
            .rsplit_once(':')
            .filter(|(_, t)| !t.contains('/'))
            .map(|(_, t)| t);
        let tag = self.tag.as_deref().or(image_tag);
        Ok((snapshot_ref("name", &self.name, tag)?, capacity))
    }
}

/// `docker_image`: a non-empty reference of at most 512 bytes (the image
/// itself is judged where it is pulled or read).
fn check_image_ref(image: &str) -> Result<(), ApiError> {
    if image.trim().is_empty() || image.len() > 512 {
        return Err(ApiError::validation(
            "docker_image",
            "docker_image must be an image reference of at most 512 bytes",
        ));
    }
    Ok(())
}

fn check_description(d: Option<&str>) -> Result<(), ApiError> {
    match d {
        Some(d) if d.len() > MAX_DESCRIPTION => Err(ApiError::validation(
            "description",
            format!("description is longer than {MAX_DESCRIPTION} bytes"),
        )),
        _ => Ok(()),
    }
}

fn snapshot_ref(
    field: &str,
    name: &str,
    tag: Option<&str>,
) -> Result<crate::SnapshotRef, ApiError> {
    if name.contains(':') {
        return Err(ApiError::validation(field, "the name may not contain ':'"));
    }
    let text = format!("{name}:{}", tag.unwrap_or(crate::validate::DEFAULT_TAG));
    text.parse()
        .map_err(|e: crate::validate::ParseSnapshotRefError| {
            ApiError::validation(field, e.to_string())
        })
}
