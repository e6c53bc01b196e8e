//! The rules a sandbox is held to, whichever API door it came through:
//! sizing, labels, environment variables and snapshot references, defined
//! once. A door turns an [`Invalid`] into its own error shape (LangSmith's
//! 422 with the field's location, E2B's 400 naming the field).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{ByteSize, MilliCpu};

const GIB: u64 = ByteSize::GIB;
const MIB: u64 = ByteSize::MIB;

/// A value a rule refuses: the field (a dotted path, as the API names it)
/// and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// A mount's path in the guest, normalised: absolute, no `.`/`..`, and
/// not a directory the system needs (`/`, `/proc`, `/sys`, `/dev`, `/run`,
/// `/etc`, `/bin`, `/sbin`, `/lib*`, `/usr`, `/boot`, `/tmp` and below).
/// Every kind of mount (git, bucket, volume) and both doors follow it.
pub fn mount_path(field: &str, path: &str) -> Result<String, Invalid> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(Invalid::new(
            field,
            format!("{field} must be an absolute path, got '{path}'"),
        ));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") || path.len() > 1024 {
        return Err(Invalid::new(
            field,
            format!("{field} must be a plain absolute path (no '.' or '..', at most 1024 bytes), got '{path}'"),
        ));
    }
    const SYSTEM: &[&str] = &[
        "proc", "sys", "dev", "run", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
        "usr", "boot", "tmp",
    ];
    match parts.first() {
        None => Err(Invalid::new(field, format!("{field} cannot be '/'"))),
        Some(top) if SYSTEM.contains(top) => Err(Invalid::new(
            field,
            format!("{field}: '{path}' is under /{top}, which the system needs; mount somewhere else (e.g. /mnt/…)"),
        )),
        Some(_) => Ok(format!("/{}", parts.join("/"))),
    }
}

/// Whether two mount paths are the same, or one is inside the other.
pub fn paths_nest(a: &str, b: &str) -> bool {
    let below = |outer: &str, inner: &str| {
        let outer = outer.trim_end_matches('/');
        inner.trim_end_matches('/') == outer || inner.starts_with(&format!("{outer}/"))
    };
    below(a, b) || below(b, a)
}

/// Longest volume name.
pub const MAX_VOLUME_NAME_LEN: usize = 63;
/// A volume's size when its create names none (E2B's `Volume.create`).
pub const DEFAULT_VOLUME_SIZE: u64 = 4 << 30;
/// The largest volume.
pub const MAX_VOLUME_SIZE: u64 = 1 << 40;

/// A volume's name: 1–63 of letters, digits, `.`, `_` and `-`, starting
/// with a letter or digit (it names the volume in both APIs' paths).
pub fn check_volume_name(field: &str, name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= MAX_VOLUME_NAME_LEN
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            field,
            format!("{field} must be 1 to {MAX_VOLUME_NAME_LEN} letters, digits, '.', '_' or '-', starting with a letter or digit, got {name:?}"),
        ))
    }
}

/// A volume's size: `bytes` rounded up to a whole GiB, at least 1 GiB and
/// at most [`MAX_VOLUME_SIZE`].
pub fn volume_size(field: &str, bytes: i64) -> Result<u64, Invalid> {
    const GIB: u64 = 1 << 30;
    let Ok(b) = u64::try_from(bytes) else {
        return Err(Invalid::new(
            field,
            format!("{field} must be positive, got {bytes}"),
        ));
    };
    let size = b.div_ceil(GIB).max(1).saturating_mul(GIB);
    if size > MAX_VOLUME_SIZE || b == 0 {
        return Err(Invalid::new(
            field,
            format!("{field} must be between 1 byte (a whole GiB) and {MAX_VOLUME_SIZE} bytes, got {bytes}"),
        ));
    }
    Ok(size)
}

/// Most labels a request may set.
pub const MAX_LABELS: usize = 64;
/// Longest label key, in characters.
pub const MAX_LABEL_KEY_LEN: usize = 128;
/// Longest label value, in characters.
pub const MAX_LABEL_VALUE_LEN: usize = 1024;

/// Longest sandbox name.
pub const MAX_NAME_LEN: usize = 63;

/// Checks a sandbox name: 1–63 characters of lowercase letters, digits and
/// `-`, starting and ending with a letter or digit (a DNS label, so the name
/// can appear in host names and URLs unescaped).
///
/// The SDK does not validate names and LangSmith does not document its rule;
/// its own generated names (`snapshot-builder-<hex>`) fit this one.
pub fn check_sandbox_name(field: &str, name: &str) -> Result<(), Invalid> {
    let err = |why: &str| Invalid::new(field, format!("{field} '{name}' is invalid: {why}"));
    if name.is_empty() {
        return Err(err("it must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(err("it must be at most 63 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(err("use only lowercase letters, digits and '-'"));
    }
    let first = name.as_bytes()[0];
    let last = name.as_bytes()[name.len() - 1];
    if first == b'-' || last == b'-' {
        return Err(err("it must start and end with a letter or digit"));
    }
    Ok(())
}

/// Checks a request's labels: at most [`MAX_LABELS`] entries, keys 1–128 and
/// values 0–1024 characters, no control characters. Only the labels the
/// request sets are counted; labels inherited from a snapshot are not.
/// The label Hearth gives the sandboxes that serve a volume's content
/// (its value: the volume's id); no request may set it.
pub const RESERVED_LABEL: &str = "hearth.volume-content";
/// The label Hearth gives the sandboxes that build a template (its value:
/// the build's id); no request may set it.
pub const BUILDER_LABEL: &str = "hearth.template-build";
/// The label of a template build's snapshots (its value: the template's
/// name): a create from one shares its memory with the template's other
/// sandboxes on their host.
pub const TEMPLATE_LABEL: &str = "hearth.template";
/// The name prefix of the template build cache's hidden snapshots; no
/// request may name one.
pub const LAYER_PREFIX: &str = "hearth-layer-";

pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if labels.len() > MAX_LABELS {
        return Err(Invalid::new(
            "labels",
            format!("labels: at most {MAX_LABELS} labels, got {}", labels.len()),
        ));
    }
    for (k, v) in labels {
        let field = format!("labels.{k}");
        if k == RESERVED_LABEL {
            return Err(Invalid::new(
                &field,
                format!("labels: '{k}' is reserved: Hearth marks the sandboxes that serve a volume's content with it"),
            ));
        }
        if k == BUILDER_LABEL {
            return Err(Invalid::new(
                &field,
                format!("labels: '{k}' is reserved: Hearth marks the sandboxes that build templates with it"),
            ));
        }
        let key_chars = k.chars().count();
        if key_chars == 0 || key_chars > MAX_LABEL_KEY_LEN || k.chars().any(char::is_control) {
            return Err(Invalid::new(
                &field,
                format!("labels: key '{k}' must be 1-{MAX_LABEL_KEY_LEN} printable characters"),
            ));
        }
        if v.chars().count() > MAX_LABEL_VALUE_LEN || v.chars().any(char::is_control) {
            return Err(Invalid::new(
                &field,
                format!(
                    "{field}: the value must be at most {MAX_LABEL_VALUE_LEN} printable characters"
                ),
            ));
        }
    }
    Ok(())
}

/// Environment names must be non-empty without `=` or NUL; values without
/// NUL (neither can cross `execve`).
pub fn check_env_vars(field: &str, env: &BTreeMap<String, String>) -> Result<(), Invalid> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Invalid::new(
                &format!("{field}.{k}"),
                format!("{field}: invalid variable name '{k}'"),
            ));
        }
        if v.contains('\0') {
            return Err(Invalid::new(
                &format!("{field}.{k}"),
                format!("{field}: value of '{k}' contains a NUL byte"),
            ));
        }
    }
    Ok(())
}

/// A Docker-style snapshot reference, `name:tag`. A bare name means
/// `name:latest`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotRef {
    pub name: String,
    pub tag: String,
}

/// The tag a bare snapshot name resolves to.
pub const DEFAULT_TAG: &str = "latest";

impl fmt::Display for SnapshotRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// The text is not a `name[:tag]` reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid snapshot reference '{input}': {why}")]
pub struct ParseSnapshotRefError {
    input: String,
    why: &'static str,
}

impl FromStr for SnapshotRef {
    type Err = ParseSnapshotRefError;

    /// Splits at the last `:`. Names and tags may not be empty or contain
    /// whitespace, control characters or `/`; tags follow Docker (letters,
    /// digits, `_`, `.`, `-`, at most 128).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseSnapshotRefError {
            input: s.to_owned(),
            why,
        };
        let (name, tag) = match s.rsplit_once(':') {
            Some((n, t)) => (n, t),
            None => (s, DEFAULT_TAG),
        };
        if name.is_empty() {
            return Err(err("the name is empty"));
        }
        if name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/' || c == ':')
        {
            return Err(err("the name contains whitespace, ':' or '/'"));
        }
        if name.starts_with(LAYER_PREFIX) {
            return Err(err(
                "names starting with 'hearth-layer-' are Hearth's build cache",
            ));
        }
        if tag.is_empty() {
            return Err(err("the tag is empty"));
        }
        if tag.len() > 128
            || !tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        {
            return Err(err("a tag is at most 128 letters, digits, '_', '.' or '-'"));
        }
        Ok(Self {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }
}

/// Which snapshot a create asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotSelector {
    /// None named: the server's default snapshot.
    Default,
    /// By id.
    Id(uuid::Uuid),
    /// By `name:tag` (a bare name already resolved to `name:latest`).
    Ref(SnapshotRef),
}

/// E2B's name for its default template: the server's default snapshot.
pub const BASE_TEMPLATE: &str = "base";

impl SnapshotSelector {
    /// A template as E2B's SDKs name one: none or [`BASE_TEMPLATE`], the
    /// default snapshot; a UUID, a snapshot by id; else `name[:tag]`.
    pub fn of_template(key: &str) -> Result<Self, ParseSnapshotRefError> {
        if key.is_empty() || key == BASE_TEMPLATE {
            return Ok(Self::Default);
        }
        if let Ok(id) = uuid::Uuid::parse_str(key) {
            return Ok(Self::Id(id));
        }
        key.parse().map(Self::Ref)
    }
}

/// Memory per vCPU of the default ratio.
pub const MEM_PER_VCPU: ByteSize = ByteSize::gib(4);
/// Largest memory of one sandbox.
pub const MAX_MEM: ByteSize = ByteSize::gib(64);
/// Largest CPU of one sandbox (64 GiB is the ratio's lower bound for it).
pub const MAX_CPU: MilliCpu = MilliCpu(32_000);
/// Disk per vCPU of a non-persistent sandbox.
pub const EPHEMERAL_DISK_PER_VCPU: ByteSize = ByteSize::gib(16);
/// Largest disk of a non-persistent sandbox.
pub const MAX_EPHEMERAL_DISK: ByteSize = ByteSize::gib(256);

/// `delete_after_stop_seconds` when omitted: 14 days.
pub const DEFAULT_DELETE_AFTER_STOP: Duration = Duration::from_secs(14 * 24 * 3600);

/// The sizing fields of a create, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizingRequest {
    pub vcpus: Option<i64>,
    pub cpu_millicores: Option<i64>,
    pub mem_bytes: Option<i64>,
    pub fs_capacity_bytes: Option<i64>,
    pub persistent: bool,
    pub snapshot_fs_capacity: ByteSize,
}

/// Resolved resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub fs_capacity: ByteSize,
}

/// Applies the sizing rules of the module docs.
pub fn resolve_sizing(req: &SizingRequest) -> Result<Sizing, Invalid> {
    // CPU as asked, with the field that asked for it.
    let explicit_cpu: Option<(&str, u32)> = match (req.cpu_millicores, req.vcpus) {
        (Some(m), _) => {
            if m < 1 {
                return Err(Invalid::new(
                    "cpu_millicores",
                    format!("cpu_millicores must be at least 1, got {m}"),
                ));
            }
            if m > i64::from(MAX_CPU.0) {
                return Err(Invalid::new(
                    "cpu_millicores",
                    format!("cpu_millicores must be at most {}, got {m}", MAX_CPU.0),
                ));
            }
            Some(("cpu_millicores", m as u32))
        }
        (None, Some(v)) => {
            if v < 1 {
                return Err(Invalid::new(
                    "vcpus",
                    format!("vcpus must be at least 1, got {v}"),
                ));
            }
            if v > i64::from(MAX_CPU.whole_vcpus()) {
                return Err(Invalid::new(
                    "vcpus",
                    format!("vcpus must be at most {}, got {v}", MAX_CPU.whole_vcpus()),
                ));
            }
            Some(("vcpus", v as u32 * 1000))
        }
        (None, None) => None,
    };

    let asked_mem = match req.mem_bytes {
        None => None,
        Some(b) if b < 1 => {
            return Err(Invalid::new(
                "mem_bytes",
                format!("mem_bytes must be positive, got {b}"),
            ))
        }
        Some(b) if b as u64 > MAX_MEM.bytes() => {
            return Err(Invalid::new(
                "mem_bytes",
                format!(
                    "mem_bytes must be at most {MAX_MEM}, got {}",
                    show(b as u64)
                ),
            ))
        }
        Some(b) => Some(b as u64),
    };

    let snapshot_fs = req.snapshot_fs_capacity.bytes();
    let fs = match req.fs_capacity_bytes {
        None => snapshot_fs,
        Some(b) if b < 1 => {
            return Err(Invalid::new(
                "fs_capacity_bytes",
                format!("fs_capacity_bytes must be positive, got {b}"),
            ))
        }
        Some(b) if (b as u64) < snapshot_fs => {
            return Err(Invalid::new(
                "fs_capacity_bytes",
                format!(
                    "fs_capacity_bytes cannot be smaller than the snapshot's {}, got {}",
                    show(snapshot_fs),
                    show(b as u64)
                ),
            ))
        }
        Some(b) => b as u64,
    };
    let fs_note = if req.fs_capacity_bytes.is_none() {
        " (the snapshot's disk)"
    } else {
        ""
    };
    if !req.persistent && fs > MAX_EPHEMERAL_DISK.bytes() {
        return Err(Invalid::new(
            "fs_capacity_bytes",
            format!(
                "fs_capacity_bytes: a non-persistent sandbox gets at most {MAX_EPHEMERAL_DISK} of disk, got {}{fs_note}",
                show(fs)
            ),
        ));
    }

    let (cpu, derived_from) = match explicit_cpu {
        Some((_, m)) => (m, None),
        None => {
            let from_mem = asked_mem.map_or(1, |b| b.div_ceil(MEM_PER_VCPU.bytes()));
            let from_disk = if req.persistent {
                1
            } else {
                fs.div_ceil(EPHEMERAL_DISK_PER_VCPU.bytes())
            };
            let vcpus = from_mem.max(from_disk).max(1);
            let why = if asked_mem.is_none() && from_disk <= 1 {
                None
            } else if from_disk > from_mem {
                Some("derived from fs_capacity_bytes at 16 GiB of disk per vCPU")
            } else {
                Some("derived from mem_bytes at 4 GiB per vCPU")
            };
            // Both bounds keep this within u32: mem ≤ 64 GiB, disk ≤ 256 GiB.
            (vcpus as u32 * 1000, why)
        }
    };

    let mem = match asked_mem {
        Some(b) => {
            let (lo, hi) = mem_range(cpu);
            if b < lo || b > hi {
                let derived = derived_from.map(|d| format!(", {d}")).unwrap_or_default();
                let hint = if explicit_cpu.is_none() && b < 2 * GIB {
                    "; for less memory set cpu_millicores (e.g. 500 accepts 1-3 GiB)"
                } else {
                    ""
                };
                return Err(Invalid::new(
                    "mem_bytes",
                    format!(
                        "mem_bytes {} is outside {}-{} allowed for {}{derived} (4 GiB per vCPU, within 50%){hint}",
                        show(b),
                        show(lo),
                        show(hi.min(MAX_MEM.bytes())),
                        show_cpu(cpu),
                    ),
                ));
            }
            b
        }
        None => {
            let d = default_mem(cpu);
            if d > MAX_MEM.bytes() {
                let field = explicit_cpu.map_or("vcpus", |(f, _)| f);
                let (lo, _) = mem_range(cpu);
                return Err(Invalid::new(
                    field,
                    format!(
                        "{field}: {} defaults to {} of memory (4 GiB per vCPU), above the {MAX_MEM} maximum; set mem_bytes between {} and {MAX_MEM}",
                        show_cpu(cpu),
                        show(d),
                        show(lo),
                    ),
                ));
            }
            d
        }
    };

    if !req.persistent && explicit_cpu.is_some() {
        let cap = u64::from(cpu) * EPHEMERAL_DISK_PER_VCPU.bytes() / 1000;
        if fs > cap {
            return Err(Invalid::new(
                "fs_capacity_bytes",
                format!(
                    "fs_capacity_bytes: a non-persistent sandbox gets at most 16 GiB of disk per vCPU: {} allows {}, got {}{fs_note}; request more CPU or a persistent sandbox",
                    show_cpu(cpu),
                    show(cap),
                    show(fs)
                ),
            ));
        }
    }

    Ok(Sizing {
        cpu: MilliCpu(cpu),
        mem: ByteSize(mem),
        fs_capacity: ByteSize(fs),
    })
}

/// Memory when only CPU is given: 4 GiB per vCPU, rounded up to a MiB.
pub fn default_mem(millicores: u32) -> u64 {
    (u64::from(millicores) * (MEM_PER_VCPU.bytes() / MIB)).div_ceil(1000) * MIB
}

/// Inclusive memory bounds for a CPU: 4 GiB per vCPU ± 50 %.
pub fn mem_range(millicores: u32) -> (u64, u64) {
    // ratio = 4 GiB × m / 1000; lo = ratio / 2 (rounded up), hi = 1.5 ratio
    // (rounded down), exact in u128.
    let m = u128::from(millicores);
    let per = u128::from(MEM_PER_VCPU.bytes());
    let lo = (per * m).div_ceil(2000);
    let hi = per * m * 3 / 2000;
    (lo as u64, hi as u64)
}

pub fn show(bytes: u64) -> String {
    ByteSize(bytes).to_string()
}

pub fn show_cpu(millicores: u32) -> String {
    if millicores.is_multiple_of(1000) {
        format!("{} vCPU", millicores / 1000)
    } else {
        let frac = format!("{:03}", millicores % 1000);
        format!("{}.{} vCPU", millicores / 1000, frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_e2b_template_key_selects_a_snapshot() {
        for key in ["", BASE_TEMPLATE] {
            assert_eq!(
                SnapshotSelector::of_template(key),
                Ok(SnapshotSelector::Default)
            );
        }
        let id = uuid::Uuid::new_v4();
        assert_eq!(
            SnapshotSelector::of_template(&id.to_string()),
            Ok(SnapshotSelector::Id(id))
        );
        assert_eq!(
            SnapshotSelector::of_template("app:v1"),
            Ok(SnapshotSelector::Ref("app:v1".parse().unwrap()))
        );
        assert!(SnapshotSelector::of_template("app:").is_err());
    }

    #[test]
    fn a_refusal_names_its_field() {
        let e = resolve_sizing(&SizingRequest {
            vcpus: Some(0),
            cpu_millicores: None,
            mem_bytes: None,
            fs_capacity_bytes: None,
            persistent: true,
            snapshot_fs_capacity: ByteSize::gib(1),
        })
        .unwrap_err();
        assert_eq!(e.field, "vcpus");
        let mut env = BTreeMap::new();
        env.insert("A=B".to_owned(), "x".to_owned());
        assert_eq!(
            check_env_vars("envVars", &env).unwrap_err().field,
            "envVars.A=B"
        );
        // Nothing asked: one vCPU, 4 GiB, the snapshot's disk.
        let s = resolve_sizing(&SizingRequest {
            vcpus: None,
            cpu_millicores: None,
            mem_bytes: None,
            fs_capacity_bytes: None,
            persistent: true,
            snapshot_fs_capacity: ByteSize::gib(1),
        })
        .unwrap();
        assert_eq!(
            (s.cpu, s.mem, s.fs_capacity),
            (MilliCpu(1000), ByteSize::gib(4), ByteSize::gib(1))
        );
    }
}

/// Which quota a create, start or snapshot would exceed.
///
/// LangSmith's SDK derives `QuotaExceededError.quota_type` from words of
/// the message: "sandbox" with "count" or "limit" → `sandbox_count`, else
/// "cpu", "memory", "storage" in that order. [`QuotaKind::refusal`] words
/// each message so exactly its own kind matches (no "sandbox" outside the
/// count message, no "cpu" in the memory message, …); a test in
/// `hearth-api` ports the SDK's function to pin this. LangSmith has no
/// snapshot quotas: the snapshot count message matches none of the SDK's
/// words, so its `quota_type` stays unset rather than wrong. Both doors
/// say a quota refusal in these words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    SandboxCount,
    Cpu,
    Memory,
    /// Bytes kept in the store: sandboxes' disks and snapshots, one budget.
    Storage,
    /// Hearth's own: the workspace's count of snapshots.
    SnapshotCount,
}

impl QuotaKind {
    /// The SDK's `quota_type` for this kind (`snapshot_count`, which the
    /// SDK does not know, is left unset by it).
    pub fn sdk_name(self) -> &'static str {
        match self {
            Self::SandboxCount => "sandbox_count",
            Self::Cpu => "cpu",
            Self::Memory => "memory",
            Self::Storage => "storage",
            Self::SnapshotCount => "snapshot_count",
        }
    }

    /// The refusal in words: `used` is what the workspace would hold with
    /// the request granted, `limit` the quota.
    pub fn refusal(self, limit: u64, used: u64) -> String {
        match self {
            Self::SandboxCount => {
                format!("sandbox count quota exceeded: {used} sandboxes requested, limit {limit}")
            }
            Self::Cpu => {
                format!("cpu quota exceeded: {used} millicores requested of {limit} allowed")
            }
            Self::Memory => {
                format!("memory quota exceeded: {used} bytes requested of {limit} allowed")
            }
            // Not "memory": the SDK would read a memory quota.
            Self::Storage => format!(
                "storage quota exceeded: {used} bytes requested of {limit} allowed \
                 (disks and snapshots share it)"
            ),
            // Not "sandbox": the SDK would read the sandbox count.
            Self::SnapshotCount => {
                format!("snapshot count quota exceeded: {used} snapshots requested, limit {limit}")
            }
        }
    }
}
