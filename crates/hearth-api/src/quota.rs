//! Workspace quotas and the 429 they produce.

use hearth_types::{ByteSize, MilliCpu};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, QuotaKind};
use hearth_types::sandbox::SandboxSpec;

/// Per-workspace limits. Defaults are LangSmith's self-hosted ones (Helm
/// `sandboxes.quotas`: 1000 sandboxes, 16 cores, 64 GB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Quotas {
    /// Sandboxes in any state but deleted.
    pub max_sandboxes: u32,
    /// CPU of sandboxes holding resources (provisioning or ready).
    pub max_cpu_millicores: u32,
    /// Memory of sandboxes holding resources.
    pub max_mem_bytes: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_sandboxes: 1000,
            max_cpu_millicores: 16_000,
            max_mem_bytes: 64 * ByteSize::GIB,
        }
    }
}

/// What a workspace holds now, or what a request adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub sandboxes: u32,
    pub cpu: MilliCpu,
    pub mem: ByteSize,
}

impl Default for Usage {
    fn default() -> Self {
        Self {
            sandboxes: 0,
            cpu: MilliCpu(0),
            mem: ByteSize(0),
        }
    }
}

impl Usage {
    /// A create adds one sandbox and, once it runs, its CPU and memory.
    pub fn for_create(spec: &SandboxSpec) -> Self {
        Self {
            sandboxes: 1,
            cpu: spec.cpu,
            mem: spec.mem,
        }
    }

    /// Starting a stopped sandbox adds its CPU and memory only.
    pub fn for_start(spec: &SandboxSpec) -> Self {
        Self {
            sandboxes: 0,
            cpu: spec.cpu,
            mem: spec.mem,
        }
    }
}

impl Quotas {
    /// Whether `adding` fits on top of `current`; the first quota exceeded
    /// is reported (count, then CPU, then memory).
    pub fn check(&self, current: Usage, adding: Usage) -> Result<(), ApiError> {
        let sandboxes = u64::from(current.sandboxes) + u64::from(adding.sandboxes);
        if adding.sandboxes > 0 && sandboxes > u64::from(self.max_sandboxes) {
            return Err(ApiError::quota(
                QuotaKind::SandboxCount,
                u64::from(self.max_sandboxes),
                sandboxes,
            ));
        }
        let cpu = u64::from(current.cpu.0) + u64::from(adding.cpu.0);
        if cpu > u64::from(self.max_cpu_millicores) {
            return Err(ApiError::quota(
                QuotaKind::Cpu,
                u64::from(self.max_cpu_millicores),
                cpu,
            ));
        }
        let mem = current.mem.bytes().saturating_add(adding.mem.bytes());
        if mem > self.max_mem_bytes {
            return Err(ApiError::quota(QuotaKind::Memory, self.max_mem_bytes, mem));
        }
        Ok(())
    }
}

/// `GET /api/v2/sandboxes/usage`: what the workspace holds and may hold.
/// A limit the workspace does not have is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_limit_millicores: Option<u64>,
    pub cpu_used_millicores: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    pub memory_used_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes_limit: Option<u64>,
    /// Sandboxes not being deleted.
    pub sandboxes_used: u64,
    /// Provisioning or ready.
    pub sandbox_running_count: u64,
    pub sandbox_stopped_count: u64,
    /// Sandboxes made by a create (every one: a pool member becomes one
    /// when claimed).
    pub sandbox_direct_count: u64,
    /// Warm pools' paused members not claimed yet.
    pub sandbox_pool_replicas_count: u64,
    pub pools_count: u64,
    pub registries_count: u64,
    pub snapshots_count: u64,
    /// Hearth has no templates apart from snapshots: 0.
    pub templates_count: u64,
}

/// Body of `POST /api/v2/sandboxes/boxes/batch-delete`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchDeleteRequest {
    /// Sandbox names or ids, at most 100.
    #[serde(default)]
    pub names: Vec<String>,
}

/// A sandbox a batch delete did not delete, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchSkipped {
    pub name: String,
    pub reason: String,
}

/// What a batch delete did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchDeleteResponse {
    pub deleted: Vec<String>,
    pub skipped: Vec<BatchSkipped>,
}
