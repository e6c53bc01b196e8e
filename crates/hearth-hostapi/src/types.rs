//! The host's commands and replies: what the control plane asks of a host
//! agent and what it answers, in process or over the host's private API.

use hearth_types::image::ImageName;
use hearth_types::{ByteSize, MilliCpu, VmId};
use serde::{Deserialize, Serialize};

/// Lifecycle state of a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    Provisioning,
    Ready,
    Paused,
    Stopping,
    Stopped,
    Failed,
    Deleted,
}

impl VmState {
    /// No VMM process runs in these states.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Stopped | Self::Failed | Self::Deleted)
    }
}

/// What the host agent knows about a VM, as reported by its API.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VmRecord {
    pub id: VmId,
    pub image: ImageName,
    pub memory: ByteSize,
    pub cpu: MilliCpu,
    pub state: VmState,
    /// Whether the disk survives a stop.
    #[serde(default = "yes")]
    pub persistent: bool,
    /// Requested root disk size (grown from the image's at first boot).
    #[serde(default)]
    pub disk: Option<ByteSize>,
    /// Why the VM is `failed`, or other context for the state.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub accel: Option<String>,
    /// Unix milliseconds.
    pub created_at_ms: u64,
    #[serde(default)]
    pub boot_ms: Option<u64>,
    /// The placement generation this host holds for the VM; its disk's
    /// commits are fenced on it.
    #[serde(default)]
    pub fence: u64,
    /// The snapshot the VM was created from (its store volumes); `None`:
    /// the built-in image.
    #[serde(default)]
    pub from: Option<BootFrom>,
    /// Guest memory saved by the last stop, to resume from at the next
    /// start.
    #[serde(default)]
    pub saved: Option<MemoryVolumes>,
    /// A pool member no sandbox has claimed yet (see [`CreateVm::pooled`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pooled: bool,
    /// The pool template (the id of the VM it was saved from) whose
    /// memory and disk this VM was restored from, instead of booting cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<VmId>,
}

impl VmRecord {
    /// The record of a VM `req` creates, before its first boot, on a host
    /// whose guests run under `accel`.
    pub fn provisioning(id: VmId, req: &CreateVm, accel: String) -> Self {
        let created_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            id,
            image: req.image,
            memory: req.memory,
            cpu: req.cpu,
            state: VmState::Provisioning,
            persistent: req.persistent,
            disk: req.disk,
            reason: None,
            pid: None,
            accel: Some(accel),
            created_at_ms,
            boot_ms: None,
            fence: req.fence,
            from: req.from.clone(),
            saved: req.saved.clone(),
            pooled: req.pooled,
            template: None,
        }
    }
}

/// A snapshot in the store that a VM boots from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BootFrom {
    /// Volume of the disk.
    pub disk: String,
    /// Volumes of the saved memory and device state, when the snapshot has
    /// memory and the boot resumes from it.
    #[serde(default)]
    pub memory: Option<MemoryVolumes>,
    /// Fail the boot if the memory cannot be resumed (LangSmith's
    /// `restore_memory: true`); otherwise a failed resume cold-boots.
    #[serde(default)]
    pub require_memory: bool,
}

/// Where saved guest memory is kept in the store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemoryVolumes {
    /// Guest RAM, exactly the VM's memory size.
    pub memory: String,
    /// The VMM's device state.
    pub state: String,
    pub memory_size: ByteSize,
}

fn yes() -> bool {
    true
}

/// A request to boot a VM.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateVm {
    /// The id to use (the control plane passes its sandbox id); new if absent.
    #[serde(default)]
    pub id: Option<VmId>,
    /// Keep the disk across stop/start (false: every start is a fresh disk).
    #[serde(default = "default_true")]
    pub persistent: bool,
    /// Size of the root disk; the image's own size when absent or smaller.
    #[serde(default)]
    pub disk: Option<ByteSize>,
    #[serde(default = "default_image")]
    pub image: ImageName,
    #[serde(default = "default_memory")]
    pub memory: ByteSize,
    #[serde(default = "default_cpu")]
    pub cpu: MilliCpu,
    /// The placement generation of this boot (the control plane's
    /// sandbox generation): disk commits are fenced on it.
    #[serde(default)]
    pub fence: u64,
    /// Boot from a snapshot in the store instead of the built-in image's
    /// disk; with its memory, the VM resumes where the snapshot was taken.
    #[serde(default)]
    pub from: Option<BootFrom>,
    /// The VM existed before (on another host, or this host lost its
    /// record): a persistent disk comes back from its last committed
    /// generation instead of starting fresh.
    #[serde(default)]
    pub existing: bool,
    /// The VM's egress policy and environment (when the host has a
    /// network); `None` keeps what the host holds, else the default policy.
    #[serde(default)]
    pub network: Option<SandboxNet>,
    /// Memory an earlier stop saved (on this or another host): the boot
    /// resumes from it (a cold boot when it cannot).
    #[serde(default)]
    pub saved: Option<MemoryVolumes>,
    /// A warm pool's member: booted like any VM (its id is the one the
    /// sandbox that claims it will have), then paused once its guest
    /// answers, with its disk, network namespace and jail in place. Only
    /// [`crate::HostApi::claim_vm`] runs it again; `network` should be
    /// absent (a claim brings the sandbox's).
    #[serde(default)]
    pub pooled: bool,
    /// Several VMs are about to be made from this snapshot's memory (a
    /// fork's children): the host makes one template of it, and each VM
    /// maps its pages copy-on-write instead of loading the stream into
    /// memory of its own. Without `from.memory` (a built-in image's
    /// create): the VM is a copy of the host's template of a fresh boot
    /// of its shape when the host holds one (a fresh identity at once),
    /// else it boots and the host makes one for the next.
    #[serde(default)]
    pub share_memory: bool,
}

/// What a claim binds to a pool member: the sandbox's egress policy and
/// environment. The member's id, resources, disk and fence stay.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimVm {
    #[serde(default)]
    pub network: SandboxNet,
}

fn default_true() -> bool {
    true
}
fn default_image() -> ImageName {
    ImageName::Default
}
fn default_memory() -> ByteSize {
    ByteSize::mib(512)
}
fn default_cpu() -> MilliCpu {
    MilliCpu::vcpus(1)
}

impl Default for CreateVm {
    fn default() -> Self {
        Self {
            id: None,
            persistent: true,
            disk: None,
            image: default_image(),
            memory: default_memory(),
            cpu: default_cpu(),
            fence: 0,
            from: None,
            existing: false,
            network: None,
            saved: None,
            pooled: false,
            share_memory: false,
        }
    }
}

/// A volume of the store to copy, and the copy's name (see
/// `copy_volume_data`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CopyVolume {
    pub from: String,
    pub to: String,
}

/// A snapshot's volumes in the store (see `capture`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Captured {
    /// Volume of the disk.
    pub disk: String,
    pub disk_size: ByteSize,
    pub memory: Option<MemoryVolumes>,
    /// How long the VM's vCPUs were frozen for a capture with its memory
    /// (it runs on afterwards); `None` when it was not frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_ms: Option<u64>,
}

/// Resources a start may change (see `start_vm`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Resize {
    /// The placement generation of this boot, when it moved on.
    pub fence: Option<u64>,
    pub memory: Option<ByteSize>,
    pub cpu: Option<MilliCpu>,
    pub disk: Option<ByteSize>,
    /// A new egress policy and environment (see [`CreateVm::network`]).
    pub network: Option<SandboxNet>,
}

/// What the control plane gives a VM at every start, claim and update, and
/// the host keeps only in memory: the resolved egress policy (secrets
/// included; never written to disk), the environment its commands get (a
/// proxy rule's dummy credentials), and the sandbox's mounts, which the
/// host makes in the guest before the VM is ready (`hearth-host`'s
/// `mounts.rs`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SandboxNet {
    #[serde(default)]
    pub policy: hearth_types::egress::PolicyDocument,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<hearth_types::sandbox::MountSpec>,
}
