//! [`HostApi`]: everything the control plane may ask of a host agent.
//!
//! One interface, three implementations: the host agent in the same
//! process (`hearth up`; `hearth-host` implements it on its `Host`), a host
//! elsewhere on the network (`crate::remote`, over the host's private
//! HTTP + WebSocket API), and a simulated host for fast control-plane
//! tests (`crate::sim`). The control plane holds only `Arc<dyn HostApi>`.

use async_trait::async_trait;
use hearth_types::{ByteSize, VmId};
use serde::{Deserialize, Serialize};

use crate::guest::GuestClient;
use crate::types::{Captured, ClaimVm, CopyVolume, CreateVm, Resize, SandboxNet, VmRecord};

/// What kind of failure a host reported; the control plane maps it to an
/// answer (404, 409, 503, …) without parsing messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The host has no such VM.
    NotFound,
    /// The VM is not in a state that allows the operation.
    WrongState,
    /// The request itself is wrong (sizes, names).
    Invalid,
    /// The request conflicts with what the host holds.
    Conflict,
    /// The host cannot be reached, or is fenced or draining.
    Unavailable,
    /// The host refused the command (signature, nonce, generation).
    Refused,
    /// Anything else; the message is safe to show.
    Internal,
}

impl ErrorKind {
    const ALL: [ErrorKind; 7] = [
        Self::NotFound,
        Self::WrongState,
        Self::Invalid,
        Self::Conflict,
        Self::Unavailable,
        Self::Refused,
        Self::Internal,
    ];

    /// The kind's name on the wire (the envelope's `error` on the host's
    /// API; the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::WrongState => "wrong_state",
            Self::Invalid => "invalid",
            Self::Conflict => "conflict",
            Self::Unavailable => "unavailable",
            Self::Refused => "refused",
            Self::Internal => "internal",
        }
    }

    /// The kind [`ErrorKind::as_str`] names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// A failed host operation: a kind and a message fit for users (a host
/// redacts its paths and keeps the full chain in its own log).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct HostApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl HostApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(vm: VmId) -> Self {
        Self::new(ErrorKind::NotFound, format!("no vm {vm}"))
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

pub type HostResult<T> = Result<T, HostApiError>;

/// How a VM stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopVm {
    /// Save the guest's memory (LangSmith's `preserve_memory_on_stop`): the
    /// next start resumes the same processes.
    #[serde(default)]
    pub save_memory: bool,
}

/// Builds a snapshot's disk from an OCI image in a registry, or from an
/// image archive inside one of the host's VMs ([`ImportImage::from_vm`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportImage {
    /// `[registry/]name[:tag][@digest]`.
    pub reference: String,
    /// The image is a `docker save` archive inside this VM, not in a
    /// registry (`reference` only names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_vm: Option<VmArchive>,
    /// Plain HTTP (registries on loopback).
    #[serde(default)]
    pub insecure_http: bool,
    /// Size of the disk to build.
    pub capacity: ByteSize,
    /// Store volume the disk becomes.
    pub volume: String,
    /// Credentials for the image's registry (a private registry's, by
    /// `registry_id`); none pulls anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ImportAuth>,
}

/// An image archive inside a VM: the first of `paths` that exists, read
/// through the VM's guest agent (at most `max_bytes`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmArchive {
    pub vm: VmId,
    pub paths: Vec<String>,
    pub max_bytes: u64,
}

/// Registry credentials for an import; `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportAuth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for ImportAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// An imported image: its volumes and its configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedImage {
    pub captured: Captured,
    /// Digest of the image's manifest (`sha256:…`).
    pub digest: String,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    /// `Env`, in order.
    pub env: Vec<(String, String)>,
}

/// What one garbage collection of a host's store freed
/// ([`HostApi::collect_garbage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreGc {
    pub manifests_deleted: u64,
    pub journal_records_deleted: u64,
    pub chunks_deleted: u64,
    pub bytes_deleted: u64,
    pub chunks_kept: u64,
}

/// What one VM costs its host, as the host measures it from outside the
/// guest (its VMM process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmUsage {
    /// CPU time the VMM process has used since it started (its vCPU and
    /// I/O threads, user and system), in nanoseconds.
    pub cpu_ns: u64,
    /// The VMM process's resident memory (the guest RAM it has touched
    /// included), in bytes.
    pub memory_bytes: u64,
}

/// A host's own figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStatus {
    /// Free space for new disks (after the host's reserve).
    pub disk_available: ByteSize,
    /// Each VM's egress counters, by VM id.
    pub egress: Vec<(String, hearth_types::egress::EgressCounters)>,
    /// Each running VM's usage, by VM id (absent from an older host).
    #[serde(default)]
    pub usage: Vec<(String, VmUsage)>,
    /// The host's last check of its object store (absent from an older
    /// host: healthy).
    #[serde(default)]
    pub store: crate::fleet::StoreHealth,
    /// The pool templates the host holds (absent from an older host: none).
    #[serde(default)]
    pub templates: TemplateUsage,
}

/// A host's pool templates: how many, and the guest RAM they hold (shared
/// by the pool members restored from them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateUsage {
    pub count: u32,
    pub memory_bytes: u64,
}

/// The host agent's commands, as the control plane sees them.
///
/// Every command about one VM carries `fence`, the sandbox's placement
/// generation as the control plane knows it: a remote host refuses a
/// command older than the generation it holds, so a stale or replayed
/// decision never acts (see `hearth-fence`).
#[async_trait]
pub trait HostApi: Send + Sync {
    /// Boots a new VM (or one whose record this host lost: `existing`), at
    /// generation `req.fence`.
    async fn create_vm(&self, req: CreateVm) -> HostResult<VmRecord>;
    /// Starts a stopped VM at generation `fence`, applying `resize`.
    async fn start_vm(&self, id: VmId, fence: u64, resize: Resize) -> HostResult<VmRecord>;
    async fn stop_vm(&self, id: VmId, fence: u64, how: StopVm) -> HostResult<VmRecord>;
    /// Stops the VM and removes it, its disk included.
    async fn delete_vm(&self, id: VmId, fence: u64) -> HostResult<()>;
    /// Drops this host's copy (the VM moved; its stored disk stays).
    async fn forget_vm(&self, id: VmId, fence: u64) -> HostResult<()>;
    /// Binds the paused pool member `id` (created with
    /// [`CreateVm::pooled`]) to its sandbox at generation `fence`: applies
    /// `claim`'s network, resumes it and gives its guest a fresh identity
    /// before anything else runs. Answers once it is ready; a VM that is
    /// no unclaimed member is a `WrongState`.
    async fn claim_vm(&self, id: VmId, fence: u64, claim: ClaimVm) -> HostResult<VmRecord>;
    /// A new egress policy and environment, applied at once.
    async fn set_network(&self, id: VmId, fence: u64, net: SandboxNet) -> HostResult<()>;
    async fn get_vm(&self, id: VmId, fence: u64) -> HostResult<VmRecord>;
    async fn list_vms(&self) -> HostResult<Vec<VmRecord>>;
    /// The VMs that changed (and those removed) since `since`, a cursor
    /// this host answered before ([`crate::changes`]). A host that keeps
    /// no feed answers its whole list, marked complete.
    async fn vm_changes(&self, since: Option<crate::ChangeCursor>) -> HostResult<crate::VmChanges> {
        let _ = since;
        Ok(crate::VmChanges::complete(self.list_vms().await?))
    }
    /// Commits the VM's disk (and, with `include_memory`, its memory) as
    /// the snapshot volume `volume`.
    async fn capture(
        &self,
        id: VmId,
        fence: u64,
        volume: &str,
        include_memory: bool,
    ) -> HostResult<Captured>;
    async fn import_image(&self, req: ImportImage) -> HostResult<ImportedImage>;
    /// Removes a deleted snapshot's data.
    async fn delete_snapshot_data(&self, captured: &Captured) -> HostResult<()>;
    /// Makes the store volume `to` a copy of `from`'s newest generation
    /// (its chunks shared, none copied); nothing when `from` has none. `to`
    /// must not exist yet. A workspace volume's clone.
    async fn copy_volume_data(&self, copy: &CopyVolume) -> HostResult<()>;
    async fn status(&self) -> HostResult<HostStatus>;
    /// The disk space a new sandbox may take here ([`HostStatus::disk_available`])
    /// without the rest of the status: placement asks it on every create,
    /// and the whole status reads every VM's usage.
    async fn disk_available(&self) -> HostResult<ByteSize> {
        Ok(self.status().await?.disk_available)
    }
    /// Collects the garbage of this host's store (`hearth_store::Store::gc`,
    /// safe beside every other host's commits). The control plane asks one
    /// host per store, under its `gc` leader lease: hosts hold the store's
    /// credentials, the control plane the schedule.
    async fn collect_garbage(&self) -> HostResult<StoreGc>;
    /// The VM's guest agent: typed operations over guest streams (exec,
    /// files, search, TCP). Hosts expose guest streams, not LangSmith's
    /// protocol, which the control plane speaks.
    async fn guest(&self, id: VmId, fence: u64) -> HostResult<GuestClient>;
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn kind_names_are_the_serde_names() {
        for k in ErrorKind::ALL {
            let serde = serde_json::to_value(k).unwrap();
            assert_eq!(serde.as_str(), Some(k.as_str()));
            assert_eq!(ErrorKind::from_name(k.as_str()), Some(k));
        }
        assert_eq!(ErrorKind::from_name("NotFound"), None);
    }
}
