//! A sandbox as Hearth describes it, whichever API created it: the
//! resolved, persistent configuration the control plane stores and the
//! host is asked to run. A front door (LangSmith's `POST /boxes`, later
//! E2B's `POST /sandboxes`) parses and validates its own request, resolves
//! its own defaults against the snapshot, and hands the control plane a
//! [`SandboxPlan`]; answers are built back from the stored
//! [`SandboxSpec`] by the door that is asked.
//!
//! This is also the stored form (JSON in the `sandboxes.spec` column), so
//! its fields are named as they are stored and unknown fields are refused:
//! a row that does not parse as this is a row of an older format (see
//! `hearth_api::legacy`), never silently half-read.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::egress::{EgressSpec, RuleSpec};
use crate::{ByteSize, MilliCpu, SnapshotId};

/// A sandbox's resolved configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// The requested name; `None` = the control plane picks one.
    pub name: Option<String>,
    pub snapshot_id: SnapshotId,
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub fs_capacity: ByteSize,
    /// The disk outlives a stop (else every start begins from the snapshot).
    pub persistent: bool,
    /// A stop saves the guest's memory, and the next start resumes it.
    pub preserve_memory_on_stop: bool,
    /// `None` = never idle-stopped.
    #[serde(with = "opt_secs")]
    pub idle_ttl: Option<Duration>,
    /// `None` = never deleted after stop.
    #[serde(with = "opt_secs")]
    pub delete_after_stop: Option<Duration>,
    /// How commands run: the snapshot's settings with the sandbox's own
    /// applied over them.
    pub run: RunSpec,
    /// The sandbox's own environment, above `run.env_vars`.
    pub env_vars: BTreeMap<String, String>,
    /// The snapshot's labels overridden by the sandbox's.
    pub labels: BTreeMap<String, String>,
    /// Where the sandbox may go and what the proxy adds; `None` = the
    /// default policy (the internet, no private addresses).
    #[serde(default)]
    pub egress: Option<EgressSpec>,
    /// Code in the sandbox may call Hearth's API as its creator, with at
    /// most these rights; `None` = no access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<Delegation>,
    /// Directories filled from elsewhere before any user code runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountSpec>,
    /// The proxy rules the mounts' own credentials became (LangSmith's
    /// `mount_config.auth`), each scoped to its mounts' buckets; the proxy
    /// applies them before `egress`'s rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_rules: Vec<RuleSpec>,
    /// Anyone may reach the sandbox's ports by name
    /// (`{port}-{id}.{domain}`, E2B's `allowPublicTraffic`); else only
    /// with its traffic token or a service URL.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_ports: bool,
    /// The `Host` the sandbox's services see in requests to its ports by
    /// name, `${PORT}` standing for the port (E2B's `maskRequestHost`);
    /// `None`: `localhost:{port}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_host: Option<String>,
    /// Ports whose services speak TLS themselves (E2B's `httpsPorts`):
    /// requests to them by name reach them over TLS, their certificate
    /// not checked (it is the sandbox's own, often self-signed).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub tls_ports: BTreeSet<u16>,
    /// Ports served to signed-in members of the workspace (LangSmith's
    /// login-mode service URLs), by port: durable until the sandbox goes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub service_grants: BTreeMap<u16, ServiceGrant>,
    /// A paused sandbox resumes at the next request to it (its envd, or a
    /// port by name; E2B's `autoResume`), where without it such a request
    /// answers that the sandbox is not running. LangSmith's data plane
    /// wakes a stopped sandbox whatever this says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_resume: bool,
    /// How long the sandbox lives whatever its activity (E2B's `timeout`),
    /// and what its end is: its deadline from its creation, and again
    /// from each start that finds it without one (a resume). `None`: no
    /// deadline (LangSmith's idle timer governs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<Lifetime>,
}

impl SandboxSpec {
    /// A sandbox of `snapshot_id` with the resources `sizing`, persistent
    /// or not, and nothing else: no name, lifetime, labels, network
    /// policy, mounts or ports (every other field its empty value). The
    /// control plane's own sandboxes start here and set what they need.
    pub fn of_snapshot(
        snapshot_id: SnapshotId,
        sizing: crate::rules::Sizing,
        persistent: bool,
    ) -> Self {
        Self {
            name: None,
            snapshot_id,
            cpu: sizing.cpu,
            mem: sizing.mem,
            fs_capacity: sizing.fs_capacity,
            persistent,
            preserve_memory_on_stop: false,
            idle_ttl: None,
            delete_after_stop: None,
            run: RunSpec::default(),
            env_vars: BTreeMap::new(),
            labels: BTreeMap::new(),
            egress: None,
            delegation: None,
            mounts: Vec::new(),
            mount_rules: Vec::new(),
            public_ports: false,
            port_host: None,
            tls_ports: BTreeSet::new(),
            service_grants: BTreeMap::new(),
            auto_resume: false,
            lifetime: None,
        }
    }
}

/// Who may open a port through its login URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceGrant {
    pub access: ServiceAccess,
    /// Origins whose pages may frame the service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embed_origins: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceAccess {
    /// Keys of the sandbox's workspace with `sandboxes:read`.
    Restricted,
    /// Any key of the sandbox's workspace.
    Workspace,
}

impl ServiceAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceAccess::Restricted => "restricted",
            ServiceAccess::Workspace => "workspace",
        }
    }
}

/// A directory of the sandbox whose files come from elsewhere: made in the
/// guest before the sandbox is ready (a failure fails the start, with the
/// reason), and again at every start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// The caller's name for it, unique in the sandbox.
    pub id: String,
    /// Absolute path in the guest.
    pub path: String,
    pub source: MountSource,
}

/// Where a mount's files come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MountSource {
    /// A clone of a git repository's ref, kept a mirror of it.
    Git(GitMount),
    /// An S3 bucket (or a prefix of one), through a FUSE client in the
    /// guest whose requests the egress proxy signs.
    S3(S3Mount),
    /// A Google Cloud Storage bucket (or a prefix of one), likewise; the
    /// proxy adds its OAuth tokens.
    Gcs(GcsMount),
    /// A volume of the workspace: an ext4 disk of its own in the store,
    /// attached to the VM as a block device and mounted at the path.
    Volume(VolumeMount),
}

/// A workspace volume held by a sandbox (see [`MountSource::Volume`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's id (its disk is the store volume `volume-<id>`).
    pub volume: String,
    /// Its capacity: the filesystem made at its first attach fills it.
    pub size: crate::ByteSize,
    /// Mounted read-only, its writes never kept; else this sandbox is its
    /// one writer, whose writes are committed like a persistent disk's.
    pub read_only: bool,
    /// Which hold of the volume this is (it moves forward at every
    /// attach): the high half of the fence its commits carry, so that a
    /// writer that held it before can commit no more.
    pub hold: u32,
}

impl VolumeMount {
    /// The disk's serial (what the guest finds the device by).
    pub fn serial(&self) -> String {
        let tail: String = self.volume.chars().rev().take(12).collect();
        format!("hv-{}", tail.chars().rev().collect::<String>())
    }

    /// The fence of this hold's commits at placement generation `fence`.
    pub fn fence(&self, fence: u64) -> u64 {
        (u64::from(self.hold) << 32) | (fence & 0xffff_ffff)
    }
}

impl MountSpec {
    /// The volume this mount attaches, if it is one.
    pub fn volume(&self) -> Option<&VolumeMount> {
        match &self.source {
            MountSource::Volume(v) => Some(v),
            _ => None,
        }
    }
}

/// An S3 bucket mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Mount {
    /// `https://host[:port]`: the S3 API's endpoint.
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    /// Only the keys under `prefix/` (no leading or trailing `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// `endpoint/bucket/key` instead of `bucket.endpoint/key`.
    pub path_style: bool,
    /// The client signs its requests (with a dummy key the proxy replaces);
    /// else they go unsigned (a public bucket).
    pub signed: bool,
    /// Uploads are encrypted server side with this KMS key (SSE-KMS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_key: Option<String>,
    #[serde(default)]
    pub options: BucketOptions,
}

/// A Google Cloud Storage bucket mount (Google's JSON API at
/// `storage.googleapis.com`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcsMount {
    pub bucket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default)]
    pub options: BucketOptions,
}

/// How a bucket mount behaves in the guest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketOptions {
    /// Writes fail with EROFS.
    #[serde(default)]
    pub read_only: bool,
    /// The most the local cache of written and read files may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_max_bytes: Option<u64>,
    /// How long a closed file waits in the cache before it is uploaded.
    #[serde(default, with = "opt_secs", skip_serializing_if = "Option::is_none")]
    pub writeback: Option<Duration>,
}

/// A git mount: `remote_url` cloned at `git_ref` (the remote's default
/// branch when `None`) and, every `refresh`, fetched again and reset to it
/// (changes made in the sandbox under the mount are then lost: it mirrors
/// the ref).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitMount {
    /// An `https://` URL with no credentials (the egress proxy's rules add
    /// those).
    pub remote_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<GitRef>,
    /// `None`: cloned once per start, never refreshed.
    #[serde(default, with = "opt_secs", skip_serializing_if = "Option::is_none")]
    pub refresh: Option<Duration>,
}

/// A branch or a tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitRef {
    pub kind: GitRefKind,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GitRefKind {
    Branch,
    Tag,
}

/// The access a sandbox was delegated, as it was requested: its rights are
/// worked out at each request (the creator's current ones, capped by
/// `permissions` when `Explicit`), so access the creator loses is lost here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delegation {
    pub mode: DelegationMode,
    pub permissions: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelegationMode {
    /// All of the creator's rights.
    Inherit,
    /// The listed permissions the creator still holds.
    Explicit,
}

/// How commands run in a sandbox when a request does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// `name`, `uid`, `name:group` or `uid:gid`; none = the image's `USER`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Absolute working directory; none = the image's `WORKDIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
    /// Environment; `None` (not set) and empty are told apart because the
    /// API answers with what was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
}

impl SandboxSpec {
    /// A command's environment by default: the run settings' with the
    /// sandbox's own over them.
    pub fn command_env(&self) -> BTreeMap<String, String> {
        let mut env = self.run.env_vars.clone().unwrap_or_default();
        env.extend(self.env_vars.clone());
        env
    }
}

/// How a create treats the snapshot's memory (that request only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestoreMemory {
    /// Resume from memory when the snapshot has it, else cold boot.
    #[default]
    IfPresent,
    /// Resume from memory; the door refused the create if there is none.
    Always,
    /// Always cold boot.
    Never,
}

/// A validated create, ready for the control plane: the spec plus the
/// settings of this request only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPlan {
    pub spec: SandboxSpec,
    pub restore_memory: RestoreMemory,
    /// Block until ready for at most this long; `None` = answer at once
    /// while the sandbox provisions.
    pub wait_for_ready: Option<Duration>,
    /// Workspace volumes to attach, as the door named them; the domain
    /// resolves them into `spec.mounts`.
    pub volumes: Vec<VolumeRequest>,
}

/// A volume a create asks for (LangSmith's `volumes[]`, E2B's
/// `volumeMounts[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    /// The volume's id or name.
    pub volume: String,
    /// Where it is mounted in the guest.
    pub path: String,
    pub read_only: bool,
    /// The request's name for it in errors (`volumes[0]`).
    pub field: String,
}

/// How long a sandbox lives whatever its activity, and what its end is
/// ([`SandboxSpec::lifetime`]): its deadline is written with it, so it
/// never exists without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifetime {
    #[serde(with = "secs")]
    pub timeout: Duration,
    pub on_expiry: OnExpiry,
}

/// What happens to a sandbox at its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpiry {
    /// It is deleted, disk and all.
    Delete,
    /// It is paused (E2B's `autoPause`): stopped with its memory saved
    /// when the sandbox keeps memory over a stop (else with its disk
    /// alone, E2B's filesystem mode); a later start resumes it.
    Pause,
}

/// Serde for `Duration` as whole seconds.
mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(v.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

/// Serde for `Option<Duration>` as whole seconds, 0 = `None`.
mod opt_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(v.map_or(0, |d| d.as_secs()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let secs = u64::deserialize(d)?;
        Ok((secs > 0).then(|| Duration::from_secs(secs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{AccessSpec, HeaderSpec, RuleSpec, SecretValue};

    fn spec() -> SandboxSpec {
        SandboxSpec {
            name: Some("box".into()),
            snapshot_id: SnapshotId::new(),
            cpu: MilliCpu(500),
            mem: ByteSize::gib(2),
            fs_capacity: ByteSize::gib(4),
            persistent: true,
            preserve_memory_on_stop: false,
            idle_ttl: Some(Duration::from_secs(600)),
            delete_after_stop: None,
            run: RunSpec {
                user: Some("root".into()),
                work_dir: None,
                env_vars: Some(BTreeMap::from([("A".into(), "1".into())])),
            },
            env_vars: BTreeMap::from([("A".into(), "2".into()), ("B".into(), "3".into())]),
            labels: BTreeMap::new(),
            egress: Some(EgressSpec {
                access: Some(AccessSpec::AllowList(vec!["*.example".into()])),
                rules: vec![RuleSpec {
                    name: "r".into(),
                    enabled: true,
                    match_hosts: vec!["api.example".into()],
                    headers: vec![HeaderSpec {
                        name: "authorization".into(),
                        value: SecretValue::Sealed("v1:abc".into()),
                    }],
                    ..RuleSpec::default()
                }],
                callbacks: vec![],
                description: None,
            }),
            delegation: Some(Delegation {
                mode: DelegationMode::Explicit,
                permissions: vec!["sandboxes:read".into()],
            }),
            mounts: vec![
                MountSpec {
                    id: "repo".into(),
                    path: "/mnt/repo".into(),
                    source: MountSource::Git(GitMount {
                        remote_url: "https://git.example/r.git".into(),
                        git_ref: Some(GitRef {
                            kind: GitRefKind::Tag,
                            name: "v1".into(),
                        }),
                        refresh: Some(Duration::from_secs(30)),
                    }),
                },
                MountSpec {
                    id: "data".into(),
                    path: "/mnt/data".into(),
                    source: MountSource::S3(S3Mount {
                        endpoint: "https://s3.example".into(),
                        region: "eu-west-1".into(),
                        bucket: "b".into(),
                        prefix: Some("p".into()),
                        path_style: true,
                        signed: true,
                        kms_key: None,
                        options: BucketOptions {
                            read_only: true,
                            cache_max_bytes: Some(1 << 20),
                            writeback: Some(Duration::from_secs(2)),
                        },
                    }),
                },
            ],
            mount_rules: vec![RuleSpec {
                name: "mount_config.auth.aws".into(),
                enabled: true,
                match_hosts: vec!["s3.example".into()],
                ..RuleSpec::default()
            }],
            public_ports: true,
            port_host: None,
            tls_ports: Default::default(),
            service_grants: BTreeMap::from([(
                8080,
                ServiceGrant {
                    access: ServiceAccess::Workspace,
                    embed_origins: vec!["https://app.example".into()],
                },
            )]),
            auto_resume: true,
            lifetime: Some(Lifetime {
                timeout: Duration::from_secs(300),
                on_expiry: OnExpiry::Pause,
            }),
        }
    }

    #[test]
    fn the_stored_form_round_trips_and_refuses_what_it_does_not_know() {
        let s = spec();
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["idle_ttl"], 600);
        assert_eq!(json["delete_after_stop"], 0);
        assert_eq!(
            serde_json::from_value::<SandboxSpec>(json.clone()).unwrap(),
            s
        );
        let mut older = json;
        older["proxy_config"] = serde_json::Value::Null;
        let err = serde_json::from_value::<SandboxSpec>(older).unwrap_err();
        assert!(err.to_string().contains("proxy_config"), "{err}");
    }

    #[test]
    fn the_sandbox_environment_is_over_the_run_settings() {
        let env = spec().command_env();
        assert_eq!(env["A"], "2");
        assert_eq!(env["B"], "3");
    }
}
