//! From a create or update body to a resolved [`SandboxSpec`]: defaults,
//! validation and sizing, as pure functions.
//!
//! Creating is two steps because the snapshot lives in the database:
//! [`snapshot_selector`] says which snapshot the body asks for, the control
//! plane looks it up, and [`resolve_create`] checks the body against the
//! snapshot's [`SnapshotFacts`] and returns a [`SandboxPlan`].
//!
//! Sizing rules (LangSmith's "Create a sandbox" reference):
//! - CPU: `cpu_millicores` takes precedence over `vcpus` (a `vcpus` sent
//!   alongside is ignored). `vcpus` ≥ 1, millicores ≥ 1 (fractions allowed);
//!   at most 32 vCPU, because 32 vCPU is the most that 64 GiB of memory can
//!   serve at the ratio's lower bound.
//! - Memory follows CPU at 4 GiB per vCPU. Omitted → 4 GiB × vCPU (rounded
//!   up to a MiB); set → within ±50 % of that, bounds inclusive (1 vCPU:
//!   2–6 GiB); never above 64 GiB. A CPU whose default memory would pass
//!   64 GiB (over 16 vCPU) needs an explicit `mem_bytes`.
//! - Memory without CPU derives the CPU "from the same ratio". Decision:
//!   in whole vCPUs, `ceil(mem / 4 GiB)`, because fractional CPU "is not
//!   available for every sandbox" and must be asked for explicitly. The
//!   derived CPU always satisfies the ±50 % rule except below 2 GiB, where
//!   1 vCPU's minimum applies: `mem_bytes` under 2 GiB without CPU is
//!   rejected, and the message points at `cpu_millicores` (500 millicores
//!   accept 1–3 GiB). So 1 GiB alone → 422, 5 GiB alone → 2 vCPU.
//! - Disk: `fs_capacity_bytes` defaults to the snapshot's and cannot be
//!   smaller. A non-persistent sandbox gets at most 16 GiB per vCPU and
//!   256 GiB in all: without CPU, the CPU is derived from the disk (whole
//!   vCPUs, and the larger of the memory- and disk-derived CPU wins); with
//!   CPU, a larger disk is rejected. The default (snapshot) disk counts too.
//! - A non-persistent sandbox cannot preserve memory on stop.
//!
//! Updates ([`apply_update`]) enforce only the 64 GiB memory maximum on
//! resize, as documented; CPU and memory are not re-derived from each other.
//! Hearth also refuses to shrink the disk: a filesystem image cannot be
//! shrunk safely under a stopped sandbox's data.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_types::sandbox::{RunSpec, SandboxPlan, SandboxSpec};
use hearth_types::{ByteSize, MilliCpu};
use serde::Deserialize;
use uuid::Uuid;

use crate::boxes::{CreateSandboxRequest, SandboxResponse, SandboxStatus, UpdateSandboxRequest};
use crate::error::ApiError;
use crate::nested::{volume_requests, AccessDelegation, ProxyConfig, RunConfig, VolumeAttachment};
use crate::validate::{check_env_vars, check_labels, check_sandbox_name, check_ttl, SnapshotRef};

use hearth_types::rules::show_cpu;
pub use hearth_types::rules::SnapshotSelector;
pub use hearth_types::rules::{
    default_mem, mem_range, Sizing, SizingRequest, DEFAULT_DELETE_AFTER_STOP,
    EPHEMERAL_DISK_PER_VCPU, MAX_CPU, MAX_EPHEMERAL_DISK, MAX_MEM, MEM_PER_VCPU,
};

const GIB: u64 = ByteSize::GIB;
const MIB: u64 = ByteSize::MIB;

/// [`hearth_types::rules::resolve_sizing`], as LangSmith's 422.
pub fn resolve_sizing(req: &SizingRequest) -> Result<Sizing, ApiError> {
    Ok(hearth_types::rules::resolve_sizing(req)?)
}

/// `idle_ttl_seconds` when omitted.
pub const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(600);
/// How long a create with `wait_for_ready` and no `timeout` blocks (the
/// SDK's default).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads `snapshot_id`, `snapshot` and `snapshot_name`: at most one may be
/// set (empty strings count as unset, like the SDK's truthiness checks;
/// `snapshot` and `snapshot_name` with the same value count once, since
/// they are synonyms). A value that parses as a UUID selects by id, in any
/// of the three fields; anything else is a `name[:tag]` reference.
pub fn snapshot_selector(req: &CreateSandboxRequest) -> Result<SnapshotSelector, ApiError> {
    fn present(v: &Option<String>) -> Option<&str> {
        v.as_deref().filter(|s| !s.is_empty())
    }
    let mut set: Vec<(&str, &str)> = Vec::new();
    if let Some(v) = present(&req.snapshot_id) {
        set.push(("snapshot_id", v));
    }
    if let Some(v) = present(&req.snapshot) {
        set.push(("snapshot", v));
    }
    if let Some(v) = present(&req.snapshot_name) {
        if present(&req.snapshot) != Some(v) {
            set.push(("snapshot_name", v));
        }
    }
    match set.as_slice() {
        [] => Ok(SnapshotSelector::Default),
        [(field, value)] => {
            if let Ok(id) = Uuid::parse_str(value) {
                return Ok(SnapshotSelector::Id(id));
            }
            value
                .parse::<SnapshotRef>()
                .map(SnapshotSelector::Ref)
                .map_err(|e| ApiError::validation(field, format!("{field}: {e}")))
        }
        [_, (second, _), ..] => Err(ApiError::validation(
            second,
            "set at most one of snapshot_id, snapshot and snapshot_name",
        )),
    }
}

/// What resolving a create needs to know about the chosen snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFacts {
    pub id: Uuid,
    /// The snapshot's disk: the default and the minimum.
    pub fs_capacity: ByteSize,
    /// `None` on snapshots recorded before run configs existed.
    pub run_config: Option<RunConfig>,
    pub labels: BTreeMap<String, String>,
    /// The snapshot holds memory (can warm-restore).
    pub has_memory: bool,
    /// Some captured snapshots cannot boot a non-persistent sandbox.
    pub supports_non_persistent: bool,
}

pub use hearth_types::sandbox::RestoreMemory;

/// Validates a create body against its snapshot and resolves every default.
pub fn resolve_create(
    req: &CreateSandboxRequest,
    snapshot: &SnapshotFacts,
) -> Result<SandboxPlan, ApiError> {
    if let Some(name) = &req.name {
        check_sandbox_name("name", name)?;
    }
    let idle_ttl = match req.idle_ttl_seconds {
        Some(s) => check_ttl("idle_ttl_seconds", s)?,
        None => Some(DEFAULT_IDLE_TTL),
    };
    let delete_after_stop = match req.delete_after_stop_seconds {
        Some(s) => check_ttl("delete_after_stop_seconds", s)?,
        None => Some(DEFAULT_DELETE_AFTER_STOP),
    };
    let mut labels = snapshot.labels.clone();
    if let Some(own) = &req.labels {
        check_labels(own)?;
        labels.extend(own.clone());
    }
    let env_vars = req.env_vars.clone().unwrap_or_default();
    check_env_vars("env_vars", &env_vars)?;
    let base_run_config = snapshot.run_config.clone().unwrap_or_default();
    let run_config = match &req.run_config {
        Some(rc) => {
            rc.validate("run_config")?;
            rc.merged_over(&base_run_config)
        }
        None => base_run_config,
    };
    // Refused when set (422 naming them), so none reaches the spec.
    check_tag_value_ids(req.tag_value_ids.as_deref().unwrap_or_default())?;
    let volumes = volume_requests(req.volumes.as_deref().unwrap_or_default())?;
    if let Some(ad) = &req.access_delegation {
        ad.validate()?;
    }
    if let Some(pc) = &req.proxy_config {
        pc.validate()?;
        pc.check_values_present()?;
    }
    let mounts = match &req.mount_config {
        Some(mc) => mc.to_specs(req.proxy_config.as_ref())?,
        None => crate::nested::MountPlan::default(),
    };

    let persistent = req.persistent.unwrap_or(true);
    let preserve_memory_on_stop = req.preserve_memory_on_stop.unwrap_or(false);
    if !persistent && preserve_memory_on_stop {
        return Err(ApiError::validation(
            "preserve_memory_on_stop",
            "preserve_memory_on_stop requires a persistent sandbox (persistent=false discards state at every stop)",
        ));
    }
    if !persistent && !snapshot.supports_non_persistent {
        return Err(ApiError::validation(
            "persistent",
            format!(
                "snapshot {} cannot start a non-persistent sandbox; create it with persistent=true",
                snapshot.id
            ),
        ));
    }
    let restore_memory = match req.restore_memory {
        None => RestoreMemory::IfPresent,
        Some(false) => RestoreMemory::Never,
        Some(true) if snapshot.has_memory => RestoreMemory::Always,
        Some(true) => {
            return Err(ApiError::validation(
                "restore_memory",
                format!(
                    "restore_memory=true but snapshot {} has no captured memory",
                    snapshot.id
                ),
            ))
        }
    };

    let sizing = resolve_sizing(&SizingRequest {
        vcpus: req.vcpus,
        cpu_millicores: req.cpu_millicores,
        mem_bytes: req.mem_bytes,
        fs_capacity_bytes: req.fs_capacity_bytes,
        persistent,
        snapshot_fs_capacity: snapshot.fs_capacity,
    })?;

    let wait_for_ready = if req.wait_for_ready.unwrap_or(false) {
        match req.timeout {
            None => Some(DEFAULT_WAIT_TIMEOUT),
            Some(t) if (0.0..=MAX_WAIT_SECS).contains(&t) => Some(Duration::from_secs_f64(t)),
            Some(t) => {
                return Err(ApiError::validation(
                    "timeout",
                    format!("timeout must be between 0 and {MAX_WAIT_SECS} seconds, got {t}"),
                ))
            }
        }
    } else {
        None
    };

    Ok(SandboxPlan {
        spec: SandboxSpec {
            name: req.name.clone(),
            snapshot_id: snapshot.id.into(),
            cpu: sizing.cpu,
            mem: sizing.mem,
            fs_capacity: sizing.fs_capacity,
            persistent,
            preserve_memory_on_stop,
            idle_ttl,
            delete_after_stop,
            run: run_config.into(),
            env_vars,
            labels,
            egress: req.proxy_config.as_ref().map(ProxyConfig::to_spec),
            delegation: req
                .access_delegation
                .as_ref()
                .map(AccessDelegation::to_spec),
            mounts: mounts.mounts,
            mount_rules: mounts.rules,
            public_ports: false,
            port_host: None,
            tls_ports: Default::default(),
            service_grants: Default::default(),
            auto_resume: false,
            lifetime: None,
        },
        restore_memory,
        wait_for_ready,
        volumes,
    })
}

/// Longest `timeout` a create may block for (a day; the SDK's HTTP client
/// waits `timeout + 30` s, so any larger value is a mistake).
const MAX_WAIT_SECS: f64 = 86_400.0;

fn check_tag_value_ids(ids: &[String]) -> Result<(), ApiError> {
    for (i, id) in ids.iter().enumerate() {
        if id.trim().is_empty() {
            // Located at the list, not the index: the SDK reports loc[-1]
            // as the field, and a name says more than `0`.
            return Err(ApiError::validation(
                "tag_value_ids",
                format!("tag_value_ids[{i}] must be non-empty"),
            ));
        }
    }
    if !ids.is_empty() {
        return Err(crate::boxes::tag_values_unsupported("tag_value_ids"));
    }
    Ok(())
}

/// Applies a PATCH body to a stored spec. Name uniqueness (409) and the
/// "proxy config needs a ready sandbox" rule (400) need the database and
/// the sandbox's state, so the caller checks those.
pub fn apply_update(
    current: &SandboxSpec,
    req: &UpdateSandboxRequest,
) -> Result<SandboxSpec, ApiError> {
    let mut spec = current.clone();
    if let Some(name) = &req.name {
        check_sandbox_name("name", name)?;
        spec.name = Some(name.clone());
    }
    if let Some(s) = req.idle_ttl_seconds {
        spec.idle_ttl = check_ttl("idle_ttl_seconds", s)?;
    }
    if let Some(s) = req.delete_after_stop_seconds {
        spec.delete_after_stop = check_ttl("delete_after_stop_seconds", s)?;
    }
    match (req.cpu_millicores, req.vcpus) {
        (Some(m), _) => {
            if !(1..=i64::from(MAX_CPU.0)).contains(&m) {
                return Err(ApiError::validation(
                    "cpu_millicores",
                    format!(
                        "cpu_millicores must be between 1 and {}, got {m}",
                        MAX_CPU.0
                    ),
                ));
            }
            spec.cpu = MilliCpu(m as u32);
        }
        (None, Some(v)) => {
            if !(1..=i64::from(MAX_CPU.whole_vcpus())).contains(&v) {
                return Err(ApiError::validation(
                    "vcpus",
                    format!(
                        "vcpus must be between 1 and {}, got {v}",
                        MAX_CPU.whole_vcpus()
                    ),
                ));
            }
            spec.cpu = MilliCpu::vcpus(v as u32);
        }
        (None, None) => {}
    }
    if let Some(b) = req.mem_bytes {
        if b < 1 || b as u64 > MAX_MEM.bytes() {
            return Err(ApiError::validation(
                "mem_bytes",
                format!("mem_bytes must be between 1 byte and {MAX_MEM}, got {b}"),
            ));
        }
        spec.mem = ByteSize(b as u64);
    }
    if let Some(b) = req.fs_capacity_bytes {
        if b < 1 || (b as u64) < current.fs_capacity.bytes() {
            return Err(ApiError::validation(
                "fs_capacity_bytes",
                format!(
                    "fs_capacity_bytes cannot shrink below the current {}, got {b}",
                    current.fs_capacity
                ),
            ));
        }
        spec.fs_capacity = ByteSize(b as u64);
    }
    if let Some(pc) = &req.proxy_config {
        pc.validate()?;
        let merged = match &current.egress {
            Some(old) => ProxyConfig::from_spec(old).replaced_by(pc),
            None => pc.clone(),
        };
        merged.check_values_present()?;
        spec.egress = Some(merged.to_spec());
    }
    if let Some(rc) = &req.run_config {
        rc.validate("run_config")?;
        let current = RunConfig::from(current.run.clone());
        spec.run = RunSpec::from(rc.merged_over(&current));
    }
    if let Some(ids) = &req.tag_value_ids {
        // Refused when set (422 naming it).
        check_tag_value_ids(ids)?;
    }
    Ok(spec)
}

/// The state the control plane keeps beside a spec, for building answers.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxMeta {
    pub id: Uuid,
    pub name: String,
    pub status: SandboxStatus,
    pub status_message: Option<String>,
    pub dataplane_url: Option<String>,
    pub stopped_at: Option<String>,
    pub created_at: String,
    pub created_by: Option<String>,
    pub updated_at: String,
    pub updated_by: Option<String>,
    /// `None` when the workspace has no volumes (the key is then absent).
    pub volumes: Option<Vec<VolumeAttachment>>,
    pub last_activity_at: String,
    /// Only for a caller that may see the fleet.
    pub host_id: Option<Uuid>,
}

/// The sandbox resource as the API returns it: CPU in both units, TTLs
/// with 0 for "disabled", opaque proxy secrets redacted.
pub fn sandbox_response(spec: &SandboxSpec, meta: SandboxMeta) -> SandboxResponse {
    SandboxResponse {
        id: meta.id,
        name: meta.name,
        status: meta.status,
        status_message: meta.status_message,
        dataplane_url: meta.dataplane_url,
        snapshot_id: Some(*spec.snapshot_id.as_uuid()),
        vcpus: spec.cpu.whole_vcpus(),
        cpu_millicores: spec.cpu.0,
        mem_bytes: spec.mem.bytes(),
        fs_capacity_bytes: spec.fs_capacity.bytes(),
        size_class: size_class(spec.cpu, spec.mem),
        idle_ttl_seconds: spec.idle_ttl.map_or(0, |d| d.as_secs()),
        delete_after_stop_seconds: spec.delete_after_stop.map_or(0, |d| d.as_secs()),
        stopped_at: meta.stopped_at,
        persistent: spec.persistent,
        preserve_memory_on_stop: spec.preserve_memory_on_stop,
        labels: spec.labels.clone(),
        run_config: spec.run.clone().into(),
        mount_config: crate::nested::MountConfig::from_specs(&spec.mounts, &spec.mount_rules),
        proxy_config: spec
            .egress
            .as_ref()
            .map(|e| ProxyConfig::from_spec(e).redacted()),
        access_delegation: spec.delegation.as_ref().map(AccessDelegation::from_spec),
        volumes: meta.volumes,
        created_at: meta.created_at,
        created_by: meta.created_by,
        updated_at: meta.updated_at,
        updated_by: meta.updated_by,
        last_activity_at: meta.last_activity_at,
        host_id: meta.host_id,
    }
}

/// Hearth's size label, e.g. `2vcpu-8gib` or `0.5vcpu-1536mib`. LangSmith
/// does not document its values; this one is only informative.
pub fn size_class(cpu: MilliCpu, mem: ByteSize) -> String {
    let cpu = show_cpu(cpu.0).trim_end_matches(" vCPU").to_owned();
    let mem = if mem.bytes().is_multiple_of(GIB) {
        format!("{}gib", mem.bytes() / GIB)
    } else {
        format!("{}mib", mem.bytes().div_ceil(MIB))
    };
    format!("{cpu}vcpu-{mem}")
}

/// Reads a sandbox's stored spec: Hearth's own form, or the form rows had
/// before it (LangSmith's create body resolved, with `proxy_config`),
/// which is converted. Fields of the old form that were never acted on
/// (`tag_value_ids`, `access_delegation`, `mount_config`, `volumes`) are
/// dropped: since they were refused they are empty in any row worth
/// reading.
pub fn read_stored_spec(value: &serde_json::Value) -> Result<SandboxSpec, serde_json::Error> {
    match SandboxSpec::deserialize(value) {
        Ok(spec) => Ok(spec),
        Err(e) => match StoredSpecV1::deserialize(value) {
            Ok(old) => Ok(old.into_spec()),
            // The current form's error says more.
            Err(_) => Err(e),
        },
    }
}

/// The stored spec before Hearth had its own (kept to read older rows).
#[derive(Deserialize)]
struct StoredSpecV1 {
    name: Option<String>,
    snapshot_id: Uuid,
    cpu: MilliCpu,
    mem: ByteSize,
    fs_capacity: ByteSize,
    persistent: bool,
    preserve_memory_on_stop: bool,
    idle_ttl: u64,
    delete_after_stop: u64,
    run_config: RunConfig,
    env_vars: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    proxy_config: Option<ProxyConfig>,
}

impl StoredSpecV1 {
    fn into_spec(self) -> SandboxSpec {
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        SandboxSpec {
            name: self.name,
            snapshot_id: self.snapshot_id.into(),
            cpu: self.cpu,
            mem: self.mem,
            fs_capacity: self.fs_capacity,
            persistent: self.persistent,
            preserve_memory_on_stop: self.preserve_memory_on_stop,
            idle_ttl: secs(self.idle_ttl),
            delete_after_stop: secs(self.delete_after_stop),
            run: self.run_config.into(),
            env_vars: self.env_vars,
            labels: self.labels,
            egress: self.proxy_config.as_ref().map(ProxyConfig::to_spec),
            delegation: None,
            mounts: Vec::new(),
            mount_rules: Vec::new(),
            public_ports: false,
            port_host: None,
            tls_ports: Default::default(),
            service_grants: Default::default(),
            auto_resume: false,
            lifetime: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_bounds() {
        assert_eq!(mem_range(1000), (2 * GIB, 6 * GIB));
        assert_eq!(mem_range(500), (GIB, 3 * GIB));
        assert_eq!(default_mem(1000), 4 * GIB);
        assert_eq!(default_mem(250), GIB);
        assert_eq!(default_mem(333), 1364 * MIB);
        let (lo, hi) = mem_range(333);
        assert!(lo <= default_mem(333) && default_mem(333) <= hi);
    }

    #[test]
    fn size_classes() {
        assert_eq!(size_class(MilliCpu(2000), ByteSize::gib(8)), "2vcpu-8gib");
        assert_eq!(
            size_class(MilliCpu(500), ByteSize::mib(1536)),
            "0.5vcpu-1536mib"
        );
        assert_eq!(show_cpu(1250), "1.25 vCPU");
    }

    #[test]
    fn rows_stored_before_hearth_had_its_own_spec_still_read() {
        let snapshot = Uuid::now_v7();
        let old = serde_json::json!({
            "name": "old", "snapshot_id": snapshot, "cpu": 1000, "mem": 4 * GIB,
            "fs_capacity": 8 * GIB, "persistent": true, "preserve_memory_on_stop": false,
            "idle_ttl": 600, "delete_after_stop": 0,
            "run_config": {"user": "root", "env_vars": {"A": "1"}},
            "env_vars": {"B": "2"}, "labels": {"team": "x"},
            "tag_value_ids": [], "access_delegation": null, "mount_config": null, "volumes": [],
            "proxy_config": {"rules": [{"name": "r", "match_hosts": ["api.test"],
                "headers": [{"name": "x-key", "type": "opaque", "value": "sealed:abc"}]}],
                "access_control": {"allow_list": ["api.test"]}},
        });
        let spec = read_stored_spec(&old).unwrap();
        assert_eq!(spec.snapshot_id, snapshot.into());
        assert_eq!(spec.idle_ttl, Some(Duration::from_secs(600)));
        assert_eq!(spec.delete_after_stop, None);
        assert_eq!(spec.run.user.as_deref(), Some("root"));
        assert_eq!(spec.command_env().len(), 2);
        let egress = spec.egress.clone().unwrap();
        assert_eq!(
            egress.rules[0].headers[0].value,
            hearth_types::egress::SecretValue::Sealed("sealed:abc".into())
        );
        assert!(matches!(
            egress.access,
            Some(hearth_types::egress::AccessSpec::AllowList(_))
        ));
        // Written back, it is in the current form, which reads as itself.
        let now = serde_json::to_value(&spec).unwrap();
        assert!(now.get("proxy_config").is_none());
        assert_eq!(read_stored_spec(&now).unwrap(), spec);
        // Neither form: the current form's error.
        let err = read_stored_spec(&serde_json::json!({"cpu": "x"})).unwrap_err();
        assert!(!err.to_string().is_empty());
    }
}
