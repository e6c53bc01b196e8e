//! Sandbox ("box") wire types: create and update bodies, the sandbox
//! resource, list and status answers, and list query parameters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::error::ApiError;
use crate::nested::{
    AccessDelegation, MountConfig, ProxyConfig, RunConfig, VolumeAttachment, VolumeMountRequest,
};

/// Body of `POST /boxes`. Every field is optional. Integers are read as
/// `i64` so that out-of-range values get a message naming the rule rather
/// than a bare type error; a value of the wrong JSON type is still a 422,
/// and so is a field Hearth does not know.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Sandbox name, unique in the workspace; generated when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Snapshot to boot from by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Snapshot to boot from: a UUID, `name:tag`, or a bare name
    /// (= `name:latest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Older synonym of `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_name: Option<String>,
    /// null = resume from the snapshot's memory if it has any; true = must
    /// resume (rejected if it has none); false = always cold boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_memory: Option<bool>,
    /// Whole vCPUs; `cpu_millicores` takes precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<i64>,
    /// CPU in thousandths of a vCPU (500 = 0.5 vCPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millicores: Option<i64>,
    /// Memory; tied to CPU at 4 GiB per vCPU ± 50 %, at most 64 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<i64>,
    /// Disk; defaults to the snapshot's and cannot be smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_capacity_bytes: Option<i64>,
    /// Stop after this much inactivity; multiple of 60; 0 disables;
    /// default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ttl_seconds: Option<i64>,
    /// Delete this long after stopping; multiple of 60; 0 disables;
    /// default 14 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_after_stop_seconds: Option<i64>,
    /// Keep the filesystem across stops (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
    /// Suspend memory on a voluntary stop (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_memory_on_stop: Option<bool>,
    /// Sandbox-level environment, a layer above `run_config.env_vars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Overrides the snapshot's run config.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub run_config: Option<RunConfig>,
    /// Free-form metadata; snapshot labels are inherited unless overridden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Governed LangSmith tag values: a non-empty list is refused with a
    /// 422 naming it (Hearth has none; use `labels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_value_ids: Option<Vec<String>>,
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub access_delegation: Option<AccessDelegation>,
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub proxy_config: Option<ProxyConfig>,
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    /// Mounts made before the sandbox is ready: git mounts (cloned at the
    /// ref, refreshed every `refresh_interval_seconds`; a private
    /// repository's credentials come from a `proxy_config` header rule),
    /// and `s3` and `gcs` bucket mounts (rclone in the guest, its requests
    /// signed by the egress proxy with the credentials of `auth`, limited
    /// to the mount's bucket, prefix and, when `read_only`, reads).
    /// `azure_blob` and `contexthub` mounts and Azure credentials are
    /// refused with a 422 naming them.
    pub mount_config: Option<MountConfig>,
    /// Workspace volumes to attach (by id or name) at mount paths, at
    /// most 4: one sandbox writes a volume at a time (a second writer is a
    /// 409 naming the first), any number read it (`read_only`: what its
    /// writer last committed). Attaching needs the volume's creator or
    /// sandboxes:exec. Not with a snapshot's memory (restore_memory).
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object_vec",
        skip_serializing_if = "Option::is_none"
    )]
    pub volumes: Option<Vec<VolumeMountRequest>>,
    /// SDK extra: block until the sandbox is ready (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_ready: Option<bool>,
    /// SDK extra: how long to block when `wait_for_ready`, in seconds
    /// (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
}

/// Body of `PATCH /boxes/{name}`. Absent fields stay unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandboxRequest {
    /// New name; must be unique (409 otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ttl_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_after_stop_seconds: Option<i64>,
    /// Resource changes apply at the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millicores: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_capacity_bytes: Option<i64>,
    /// Replaces the whole proxy config; the sandbox must be ready.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub proxy_config: Option<ProxyConfig>,
    /// Merged into the stored run config.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub run_config: Option<RunConfig>,
    /// Governed LangSmith tag values: a non-empty list is refused with a
    /// 422 naming it (Hearth has none; use `labels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_value_ids: Option<Vec<String>>,
}

/// Body of `POST /boxes/{name}/start` and `/stop`. The SDK sends `{}` and
/// no field is read, so the body must be an empty JSON object or empty:
/// anything else is a 422, as for every other body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LifecycleRequest {}

/// A sandbox's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStatus {
    Provisioning,
    Ready,
    Failed,
    Stopped,
    Deleting,
}

impl SandboxStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "provisioning",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
            Self::Deleting => "deleting",
        }
    }
}

/// The sandbox resource, as create, get, update, start and list return it.
///
/// Every key the SDK reads is always present (null when unknown), except
/// `access_delegation` and `volumes`, which LangSmith documents as absent
/// when the sandbox has none / volumes are not enabled; the SDK reads both
/// with `.get`, so absence is safe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxResponse {
    pub id: Uuid,
    pub name: String,
    pub status: SandboxStatus,
    /// Why the sandbox failed, when it did.
    pub status_message: Option<String>,
    /// Base URL of the sandbox's data plane (`/execute`, `/upload`, …).
    pub dataplane_url: Option<String>,
    pub snapshot_id: Option<Uuid>,
    /// Whole vCPUs the VM gets (millicores rounded up).
    pub vcpus: u32,
    pub cpu_millicores: u32,
    pub mem_bytes: u64,
    pub fs_capacity_bytes: u64,
    /// Hearth's label for the size, e.g. `2vcpu-8gib`.
    pub size_class: String,
    /// 0 = never idle-stopped.
    pub idle_ttl_seconds: u64,
    /// 0 = never deleted after stop.
    pub delete_after_stop_seconds: u64,
    /// When the sandbox last stopped; null while it runs.
    pub stopped_at: Option<String>,
    pub persistent: bool,
    pub preserve_memory_on_stop: bool,
    pub labels: BTreeMap<String, String>,
    /// What commands run with: the snapshot's run config with the sandbox's
    /// overrides applied (the sandbox's own `env_vars` are not included).
    pub run_config: RunConfig,
    /// The sandbox's git mounts, as created; null without mounts.
    pub mount_config: Option<MountConfig>,
    /// Opaque secrets are reported as `is_set` only.
    pub proxy_config: Option<ProxyConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_delegation: Option<AccessDelegation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<VolumeAttachment>>,
    /// RFC 3339.
    pub created_at: String,
    pub created_by: Option<String>,
    /// RFC 3339.
    pub updated_at: String,
    pub updated_by: Option<String>,
    /// When the sandbox was last used (RFC 3339; a Hearth extension): an
    /// exec, a file transfer, a service request or a start. Its idle time
    /// is now minus this, and `idle_ttl_seconds` counts from it.
    pub last_activity_at: String,
    /// The host it is placed on (a Hearth extension), only for keys
    /// holding `fleet:read`; absent otherwise, so tenants do not learn
    /// which of them share a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<Uuid>,
}

/// Answer of `GET /boxes/{name}/events` (a Hearth extension): the
/// sandbox's status history, oldest first; the newest 100 changes of its
/// status, status message or host are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxEventsResponse {
    pub events: Vec<SandboxEventResponse>,
}

/// One change of a sandbox, as it was after the change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxEventResponse {
    /// When (RFC 3339).
    pub at: String,
    pub status: SandboxStatus,
    pub status_message: Option<String>,
    /// The host it was on then, only for keys holding `fleet:read`
    /// (absent otherwise, as in the sandbox resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<Uuid>,
}

/// Answer of `GET /boxes/{name}/metrics` (a Hearth extension): what the
/// sandbox costs its host now, as the host measures it from outside the
/// guest. The console charts it; `/metrics` has the same figures for every
/// sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxMetricsResponse {
    pub sandbox_id: Uuid,
    /// When the host was asked (RFC 3339).
    pub measured_at: String,
    /// Whether the sandbox has a running VM; the figures below are null
    /// when it has none.
    pub running: bool,
    /// CPU time of the sandbox's VMM process since it last started (vCPUs
    /// and I/O threads), in seconds: a counter; its rate is the CPU use.
    pub cpu_seconds_total: Option<f64>,
    /// Resident memory of the sandbox's VMM process (the guest RAM it has
    /// touched included), in bytes.
    pub memory_bytes: Option<u64>,
    /// The sandbox's memory size, for scale.
    pub mem_limit_bytes: u64,
    /// The vCPUs the sandbox has, for scale.
    pub vcpus: u32,
    /// The egress proxy's counters for the sandbox since its VM started.
    pub egress: Option<EgressCountersResponse>,
}

/// A sandbox's egress counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EgressCountersResponse {
    /// Bytes from the sandbox to the internet (TLS included).
    pub bytes_out: u64,
    /// Bytes from the internet to the sandbox.
    pub bytes_in: u64,
    pub connections_allowed: u64,
    pub connections_refused: u64,
    pub dns_queries: u64,
    pub dns_refused: u64,
}

/// Answer of `GET /boxes`. The SDK (0.15.1) reads `sandboxes`; newer
/// clients read `items` and `next_cursor`, so both lists are sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ListSandboxesResponse {
    pub items: Vec<SandboxResponse>,
    /// Cursor of the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// Deprecated copy of `items`, read by the Python SDK.
    #[serde(default)]
    pub sandboxes: Vec<SandboxResponse>,
}

impl ListSandboxesResponse {
    pub fn new(items: Vec<SandboxResponse>, next_cursor: Option<String>) -> Self {
        Self {
            sandboxes: items.clone(),
            items,
            next_cursor,
        }
    }
}

/// Answer of `GET /boxes/{name}/status`, the cheap poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatusResponse {
    pub status: SandboxStatus,
    pub status_message: Option<String>,
}

/// What `GET /boxes` can sort by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxSortBy {
    Name,
    Status,
    CreatedAt,
    StoppedAt,
    IdleTtlSeconds,
    DeleteAfterStopSeconds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    Asc,
    #[default]
    Desc,
}

/// Default page size of list endpoints.
pub const DEFAULT_PAGE_SIZE: u32 = 50;
/// Largest page size of list endpoints.
pub const MAX_PAGE_SIZE: u32 = 500;
/// Most `label` filters, and separately most `tag_value_id` filters, one
/// `GET /boxes` may carry; more is a 422. A sandbox holds at most
/// [`crate::validate::MAX_LABELS`] labels, so more distinct label filters
/// could never all match (and each costs the database a clause).
pub const MAX_LIST_FILTERS: usize = 64;

/// Query parameters of `GET /boxes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListSandboxesQuery {
    /// Only `me`: sandboxes the caller created.
    pub created_by: Option<String>,
    /// Repeatable `key` or `key=value`; all must match.
    pub label: Vec<String>,
    pub name_contains: Option<String>,
    #[param(inline)]
    pub status: Option<SandboxStatus>,
    /// Governed tag values to filter by: refused with a 422 naming it
    /// (Hearth has none; filter by `label`).
    pub tag_value_id: Vec<String>,
    #[param(inline)]
    pub sort_by: Option<SandboxSortBy>,
    /// `asc` or `desc`; `sort_direction` is a deprecated alias.
    #[param(inline)]
    pub sort_order: Option<SortOrder>,
    /// 1..=500, default 50.
    pub page_size: Option<u32>,
    /// Opaque cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Deprecated offset pagination.
    pub limit: Option<u32>,
    /// Deprecated offset pagination.
    pub offset: Option<u64>,
}

impl ListSandboxesQuery {
    /// Builds the query from decoded `key=value` pairs (repeated keys
    /// allowed). An unknown key is a 422, and so is `tag_value_id`:
    /// Hearth has no governed tags to filter by.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ApiError> {
        let mut q = Self::default();
        for (k, v) in pairs {
            check_query_value(k, v)?;
            match k {
                "created_by" => {
                    if v != "me" {
                        return Err(ApiError::invalid_query(k, "created_by only accepts 'me'"));
                    }
                    q.created_by = Some(v.to_owned());
                }
                "label" => q.label.push(v.to_owned()),
                "name_contains" => q.name_contains = Some(v.to_owned()),
                "status" => q.status = Some(parse_enum(k, v)?),
                "tag_value_id" => return Err(tag_values_unsupported(k)),
                "sort_by" => q.sort_by = Some(parse_enum(k, v)?),
                "sort_order" | "sort_direction" => q.sort_order = Some(parse_enum(k, v)?),
                "page_size" => q.page_size = Some(parse_page_size(k, v)?),
                "cursor" => q.cursor = Some(v.to_owned()),
                "limit" => q.limit = Some(parse_page_size(k, v)?),
                "offset" => q.offset = Some(parse_offset(k, v)?),
                _ => return Err(unknown_query(k)),
            }
        }
        check_offset_and_cursor(q.offset, q.cursor.as_deref())?;
        for (param, n) in [
            ("label", q.label.len()),
            ("tag_value_id", q.tag_value_id.len()),
        ] {
            if n > MAX_LIST_FILTERS {
                return Err(ApiError::invalid_query(
                    param,
                    format!("{param}: at most {MAX_LIST_FILTERS} filters, got {n}"),
                ));
            }
        }
        Ok(q)
    }

    /// The `label` filters as `(key, Some(value))` or `(key, None)`.
    pub fn label_filters(&self) -> Vec<(&str, Option<&str>)> {
        self.label
            .iter()
            .map(|l| match l.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (l.as_str(), None),
            })
            .collect()
    }
}

/// Query parameters of `GET /snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListSnapshotsQuery {
    /// Case-insensitive substring of the name.
    pub name_contains: Option<String>,
    /// `building`, `ready`, `failed` or `deleting`.
    #[param(inline)]
    pub status: Option<crate::snapshots::SnapshotStatus>,
    /// 1..=500, default 50.
    pub page_size: Option<u32>,
    pub cursor: Option<String>,
    /// Offset pagination (what the Python SDK uses): 1..=500, default 50.
    pub limit: Option<u32>,
    pub offset: Option<u64>,
}

impl ListSnapshotsQuery {
    /// Builds the query from decoded `key=value` pairs; an unknown key is a
    /// 422.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ApiError> {
        let mut q = Self::default();
        for (k, v) in pairs {
            check_query_value(k, v)?;
            match k {
                "name_contains" => q.name_contains = Some(v.to_owned()),
                "status" => q.status = Some(parse_enum(k, v)?),
                "page_size" => q.page_size = Some(parse_page_size(k, v)?),
                "cursor" => q.cursor = Some(v.to_owned()),
                "limit" => q.limit = Some(parse_page_size(k, v)?),
                "offset" => q.offset = Some(parse_offset(k, v)?),
                _ => return Err(unknown_query(k)),
            }
        }
        check_offset_and_cursor(q.offset, q.cursor.as_deref())?;
        Ok(q)
    }
}

/// Deepest offset a list accepts: offset pagination walks the pages before
/// it, so it is bounded; a cursor reaches any depth.
pub const MAX_LIST_OFFSET: u64 = 10_000;

pub(crate) fn unknown_query(param: &str) -> ApiError {
    let shown: String = param.chars().take(64).collect();
    ApiError::invalid_query(
        &shown,
        format!("{shown}: unknown query parameter; Hearth does not support it"),
    )
}

/// `tag_value_ids`/`tag_value_id`: LangSmith's governed tag values, which
/// Hearth does not have (nothing could be attached or filtered by them).
pub fn tag_values_unsupported(field: &str) -> ApiError {
    ApiError::validation(
        field,
        format!("{field}: governed tag values are not supported by Hearth; use labels"),
    )
}

pub(crate) fn parse_offset(param: &str, v: &str) -> Result<u64, ApiError> {
    let n = parse_number(param, v)?;
    if n > MAX_LIST_OFFSET {
        return Err(ApiError::invalid_query(
            param,
            format!("{param} must be at most {MAX_LIST_OFFSET}; page with the cursor beyond it"),
        ));
    }
    Ok(n)
}

pub(crate) fn check_offset_and_cursor(
    offset: Option<u64>,
    cursor: Option<&str>,
) -> Result<(), ApiError> {
    if offset.is_some_and(|o| o > 0) && cursor.is_some() {
        return Err(ApiError::invalid_query(
            "offset",
            "offset and cursor cannot be combined: page with one or the other",
        ));
    }
    Ok(())
}

/// No query value may hold a NUL byte: none can match anything, and
/// PostgreSQL refuses NUL in text.
pub(crate) fn check_query_value(param: &str, v: &str) -> Result<(), ApiError> {
    if v.contains('\0') {
        return Err(ApiError::invalid_query(
            param,
            format!("{param} must not contain a NUL byte"),
        ));
    }
    Ok(())
}

fn parse_enum<T: serde::de::DeserializeOwned>(param: &str, v: &str) -> Result<T, ApiError> {
    serde_json::from_value(serde_json::Value::String(v.to_owned()))
        .map_err(|_| ApiError::invalid_query(param, format!("{param}: unknown value '{v}'")))
}

fn parse_number<T: std::str::FromStr>(param: &str, v: &str) -> Result<T, ApiError> {
    v.parse().map_err(|_| {
        ApiError::invalid_query(param, format!("{param} must be a non-negative integer"))
    })
}

pub(crate) fn parse_page_size(param: &str, v: &str) -> Result<u32, ApiError> {
    let n: u32 = parse_number(param, v)?;
    if !(1..=MAX_PAGE_SIZE).contains(&n) {
        return Err(ApiError::invalid_query(
            param,
            format!("{param} must be between 1 and {MAX_PAGE_SIZE}"),
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(query: &[(&str, String)]) -> Result<ListSandboxesQuery, ApiError> {
        ListSandboxesQuery::from_pairs(query.iter().map(|(k, v)| (*k, v.as_str())))
    }

    #[test]
    fn list_filters_are_capped_and_nul_free() {
        let labels = |n: usize| -> Vec<(&str, String)> {
            (0..n).map(|i| ("label", format!("k{i}=v"))).collect()
        };
        assert_eq!(list(&labels(MAX_LIST_FILTERS)).unwrap().label.len(), 64);
        let e = list(&labels(MAX_LIST_FILTERS + 1)).unwrap_err();
        assert_eq!((e.status, e.field()), (422, Some("label")));
        let tags: Vec<(&str, String)> =
            (0..1000).map(|i| ("tag_value_id", i.to_string())).collect();
        assert_eq!(list(&tags).unwrap_err().field(), Some("tag_value_id"));
        for param in ["name_contains", "label", "cursor", "unknown"] {
            let e = list(&[(param, "a\0b".to_owned())]).unwrap_err();
            assert_eq!((e.status, e.field()), (422, Some(param)));
        }
        let e = ListSnapshotsQuery::from_pairs([("name_contains", "\0")]).unwrap_err();
        assert_eq!(e.field(), Some("name_contains"));
    }

    #[test]
    fn lifecycle_bodies_are_objects_or_empty() {
        for ok in [&b""[..], b"  ", b"{}"] {
            crate::parse_body::<LifecycleRequest>(ok).unwrap();
        }
        // A field is refused, naming it: nothing would read it.
        let e = crate::parse_body::<LifecycleRequest>(b"{\"anything\": [1]}").unwrap_err();
        assert_eq!((e.status, e.field()), (422, Some("anything")));
        assert!(e.message.contains("unknown field"), "{}", e.message);
        for bad in [&b"[[[["[..], b"[]", b"\"x\"", b"1", b"null", b"{"] {
            let e = crate::parse_body::<LifecycleRequest>(bad).unwrap_err();
            assert_eq!(e.status, 422, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
