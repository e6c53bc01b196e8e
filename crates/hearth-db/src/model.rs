//! Records as stored, and the filters that list them.
//!
//! These are database rows, not wire types: the API layer maps them to the
//! LangSmith-shaped responses. Units are typed ([`MilliCpu`], [`ByteSize`],
//! [`Duration`]); the database stores them as BIGINT.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_types::{ApiKeyId, ByteSize, HostId, MilliCpu, SandboxId, SnapshotId, WorkspaceId};

use crate::time::Timestamp;

/// Which database a [`crate::Db`] talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored (and wire) spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// Parses the stored spelling.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = ParseEnumError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s).ok_or_else(|| ParseEnumError {
                    kind: stringify!($name),
                    value: s.to_owned(),
                })
            }
        }
    };
}

/// The string is not one of the enum's spellings.
#[derive(Debug, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct ParseEnumError {
    kind: &'static str,
    value: String,
}

text_enum!(
    /// Lifecycle state of a sandbox (LangSmith's `status`).
    SandboxStatus {
        Provisioning = "provisioning",
        Ready = "ready",
        Failed = "failed",
        Stopped = "stopped",
        Deleting = "deleting",
    }
);

impl SandboxStatus {
    /// States whose CPU and memory count against quotas and host capacity.
    pub const fn is_live(self) -> bool {
        matches!(self, SandboxStatus::Provisioning | SandboxStatus::Ready)
    }
}

text_enum!(
    /// Build state of a snapshot.
    SnapshotStatus {
        Building = "building",
        Ready = "ready",
        Failed = "failed",
        Deleting = "deleting",
    }
);

text_enum!(
    /// Whether a host takes new sandboxes.
    HostState {
        Ready = "ready",
        Draining = "draining",
        Down = "down",
    }
);

/// Per-workspace limits; `None` means unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Quotas {
    /// Sandboxes not in `deleting`.
    pub max_sandboxes: Option<u64>,
    /// Summed over `provisioning` and `ready` sandboxes.
    pub max_cpu: Option<MilliCpu>,
    /// Summed over `provisioning` and `ready` sandboxes.
    pub max_mem: Option<ByteSize>,
    /// One budget for what the workspace keeps in the store: the disks
    /// (`fs_capacity`) of sandboxes not in `deleting` plus its snapshots'
    /// logical sizes (disk, and saved memory when captured with it).
    pub max_storage: Option<ByteSize>,
    /// The workspace's snapshots, in any status, until deleted.
    pub max_snapshots: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewWorkspace {
    pub id: WorkspaceId,
    pub name: String,
    pub quotas: Quotas,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    pub id: WorkspaceId,
    pub name: String,
    pub quotas: Quotas,
    pub created_at: Timestamp,
}

/// An API key to store. The caller hashes the secret; the database never
/// sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewApiKey {
    pub id: ApiKeyId,
    pub workspace_id: WorkspaceId,
    /// Hex digest of the secret (unique).
    pub key_hash: String,
    /// The first characters of the secret, for display.
    pub prefix: String,
    pub description: String,
    /// Such as `sandboxes:exec`.
    pub permissions: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKey {
    pub id: ApiKeyId,
    pub workspace_id: WorkspaceId,
    pub key_hash: String,
    pub prefix: String,
    pub description: String,
    pub permissions: Vec<String>,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

/// A host agent as registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRow {
    pub id: HostId,
    /// Base URL of the host's private API.
    pub address: String,
    pub state: HostState,
    pub capacity_cpu: MilliCpu,
    pub capacity_mem: ByteSize,
    /// The host is presumed dead (and fenced) after this.
    pub lease_expires_at: Timestamp,
    /// Kept from the first registration on upsert.
    pub registered_at: Timestamp,
    pub updated_at: Timestamp,
    /// The lease epoch: one more at every registration (see
    /// [`crate::Db::register_host`]).
    pub epoch: u64,
    /// The host agent's version.
    pub version: String,
    /// The store its disks live in (a sandbox can move to a host with the
    /// same store).
    pub store_url: String,
    /// Free space for new disks, as last reported.
    pub disk_free: ByteSize,
    /// Why the host's last check of its object store failed, as it
    /// reported with its lease; `None` while the store answers. Placement
    /// gives such a host nothing new.
    pub store_error: Option<String>,
}

/// What a host has committed: the sum over its `provisioning` and `ready`
/// sandboxes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLoad {
    pub host_id: HostId,
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub sandboxes: u64,
}

/// What a workspace holds, as its quotas count it (see `quota.rs`), from
/// the counters the database keeps with every write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceUsage {
    /// Sandboxes not `deleting`.
    pub sandboxes: u64,
    /// CPU of `provisioning` and `ready` sandboxes.
    pub cpu: MilliCpu,
    /// Memory of `provisioning` and `ready` sandboxes.
    pub mem: ByteSize,
    /// Disks of sandboxes not `deleting`.
    pub disk: ByteSize,
    pub snapshots: u64,
    /// Snapshots' disks and saved (or reserved) memory.
    pub snapshot_bytes: ByteSize,
}

/// What a workspace holds, counted ([`crate::Db::workspace_counts`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceCounts {
    /// Sandboxes by status (`ready`, `stopped`, …).
    pub by_status: BTreeMap<String, u64>,
    pub pools: u64,
    /// Warm pool members (paused VMs) of its pools.
    pub pool_members: u64,
    pub registries: u64,
    pub volumes: u64,
}

/// A snapshot record. `workspace_id == None` marks a built-in snapshot,
/// visible to every workspace.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotRow {
    pub id: SnapshotId,
    pub workspace_id: Option<WorkspaceId>,
    pub name: String,
    pub tag: String,
    pub status: SnapshotStatus,
    pub status_message: Option<String>,
    /// Which built-in root image backs it.
    pub image: String,
    pub fs_capacity: ByteSize,
    pub labels: BTreeMap<String, String>,
    pub run_config: Option<serde_json::Value>,
    pub docker_image: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The store volume holding the disk; `None` for a built-in image
    /// (named by `image`).
    pub volume: Option<String>,
    /// Size of the saved guest memory; `None` when it has none.
    pub memory_bytes: Option<ByteSize>,
    /// While a capture with memory is `building`: the memory it may save
    /// (the guest's RAM), charged to the storage quota until the build
    /// records `memory_bytes` or fails. `None` otherwise.
    pub memory_reserved: Option<ByteSize>,
    /// The sandbox it was captured from.
    pub source_sandbox_id: Option<SandboxId>,
    /// Digest of the OCI image it was built from.
    pub image_digest: Option<String>,
    pub description: Option<String>,
    /// The private registry it was pulled with (`registry_id`), if any.
    pub registry_id: Option<String>,
    /// The CPUs of the VM whose memory it saved (a resume has them);
    /// `None` without memory.
    pub cpu: Option<MilliCpu>,
}

/// A sandbox record: the durable truth about one sandbox.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxRow {
    pub id: SandboxId,
    pub workspace_id: WorkspaceId,
    /// Unique within the workspace.
    pub name: String,
    pub status: SandboxStatus,
    pub status_message: Option<String>,
    pub snapshot_id: SnapshotId,
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub fs_capacity: ByteSize,
    /// Zero disables idle stop. Stored in whole seconds.
    pub idle_ttl: Duration,
    /// Zero disables deletion after stop. Stored in whole seconds.
    pub delete_after_stop: Duration,
    pub persistent: bool,
    pub preserve_memory_on_stop: bool,
    pub labels: BTreeMap<String, String>,
    pub run_config: serde_json::Value,
    /// The rest of the create request (proxy_config, mount_config,
    /// access_delegation, volumes, tag_value_ids, env_vars).
    pub spec: serde_json::Value,
    pub host_id: Option<HostId>,
    /// Placement fence token; bumps on every placement.
    pub generation: u64,
    pub created_at: Timestamp,
    pub created_by: String,
    /// Also the optimistic-concurrency token: every write through this crate
    /// moves it strictly forward.
    pub updated_at: Timestamp,
    pub updated_by: String,
    pub stopped_at: Option<Timestamp>,
    pub last_activity_at: Timestamp,
}

/// Extra effects of [`crate::Db::set_status`], and the conditions it is
/// fenced on.
#[derive(Clone, Debug, Default)]
pub struct StatusExtra {
    /// `Some(x)` sets `stopped_at` to `x` (`Some(None)` clears it).
    pub stopped_at: Option<Option<Timestamp>>,
    /// `Some(x)` sets `host_id` to `x` (`Some(None)` clears it).
    pub host_id: Option<Option<HostId>>,
    /// Increment `generation` (a new placement).
    pub bump_generation: bool,
    /// Apply only if the current generation is this one; else `Stale`.
    pub expect_generation: Option<u64>,
    /// Apply only if the current status is one of these (empty: any); else
    /// `Stale`.
    pub expect_status: Vec<SandboxStatus>,
    /// The sandbox becomes live (a start): apply only if its CPU and memory
    /// fit its workspace's quotas beside the other live sandboxes; else
    /// `Quota`. Serialized with quota-checked inserts.
    pub within_quota: bool,
    /// The sandbox lands on a host (a start, or a boot placed again): apply
    /// only if the host it ends on (`host_id`, or the one it has) has room
    /// for its CPU and memory now; else `NoRoom`. Serialized with every
    /// other write to that host's load.
    pub host_room: bool,
    /// Record where the sandbox's memory was saved (the JSON of its
    /// volumes) in the same transaction: a stop that saved memory is
    /// recorded with it, or not at all.
    pub saved_memory: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SortOrder {
    Asc,
    #[default]
    Desc,
}

/// Sort keys of the sandbox list (LangSmith's `sort_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SandboxSort {
    Name,
    Status,
    #[default]
    CreatedAt,
    /// Never-stopped sandboxes sort as if stopped at the epoch.
    StoppedAt,
    IdleTtl,
    DeleteAfterStop,
}

/// Sort keys of the snapshot list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SnapshotSort {
    Name,
    Status,
    #[default]
    CreatedAt,
}

pub const DEFAULT_PAGE_SIZE: u32 = 50;
pub const MAX_PAGE_SIZE: u32 = 1000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Case-insensitive substring of the name.
    pub name_contains: Option<String>,
    pub status: Option<SandboxStatus>,
    /// `(key, None)`: the label is present; `(key, Some(v))`: it equals `v`.
    /// All must match.
    pub labels: Vec<(String, Option<String>)>,
    pub created_by: Option<String>,
    /// Made from this snapshot.
    pub snapshot_id: Option<hearth_types::SnapshotId>,
    /// Made at or after this time.
    pub created_since: Option<crate::Timestamp>,
    pub sort_by: SandboxSort,
    pub sort_order: SortOrder,
    /// Clamped to `1..=MAX_PAGE_SIZE`.
    pub page_size: u32,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl Default for SandboxFilter {
    fn default() -> Self {
        Self {
            name_contains: None,
            status: None,
            labels: Vec::new(),
            created_by: None,
            snapshot_id: None,
            created_since: None,
            sort_by: SandboxSort::default(),
            sort_order: SortOrder::default(),
            page_size: DEFAULT_PAGE_SIZE,
            cursor: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFilter {
    pub name_contains: Option<String>,
    pub status: Option<SnapshotStatus>,
    /// Only snapshots captured from a sandbox (not built from an image,
    /// not built-in); with `from_sandbox`, only those of that sandbox.
    pub captured_only: bool,
    pub from_sandbox: Option<SandboxId>,
    pub sort_by: SnapshotSort,
    pub sort_order: SortOrder,
    pub page_size: u32,
    pub cursor: Option<String>,
}

impl Default for SnapshotFilter {
    fn default() -> Self {
        Self {
            name_contains: None,
            status: None,
            captured_only: false,
            from_sandbox: None,
            sort_by: SnapshotSort::default(),
            sort_order: SortOrder::default(),
            page_size: DEFAULT_PAGE_SIZE,
            cursor: None,
        }
    }
}

/// One page of a list.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass back as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}
