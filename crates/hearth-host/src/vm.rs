//! One VM as the host agent tracks it: its state machine, its VMM instance,
//! its guest channel and its on-disk record.
//!
//! ```text
//! provisioning ──► ready ◄──► paused
//!      │             │
//!      ▼             ▼
//!    failed ◄──── stopping ──► stopped ──► deleted
//! ```
//! Any state but `deleted` may become `failed` (VMM died, guest channel
//! lost, boot failed). Every transition is written to the VM's record, so a
//! restarted host agent can account for every VM it started.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use hearth_image::ImageName;
use hearth_types::{ByteSize, MilliCpu, VmId};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::guest::GuestClient;

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

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A VM and its live handles.
pub struct Vm {
    pub id: VmId,
    record: watch::Sender<VmRecord>,
    record_path: PathBuf,
    /// Persistent per-VM directory (disk overlay, record).
    pub dir: PathBuf,
    /// Runtime directory on tmpfs (sockets, logs, memory file).
    pub run_dir: PathBuf,
    pub(crate) instance: Mutex<Option<Arc<crate::host::Instance>>>,
    pub(crate) guest: Mutex<Option<GuestClient>>,
    /// The VM's namespace and proxy attachment while it runs.
    pub(crate) net: Mutex<Option<crate::network::VmNet>>,
    /// Its egress policy and environment, as last given by the control
    /// plane (kept in memory only: it holds resolved secrets).
    pub(crate) net_config: Mutex<Option<crate::network::SandboxNet>>,
    /// Its jail uid slot while its VMM runs (see `JailSettings`).
    pub(crate) jail_slot: Mutex<Option<u32>>,
}

impl Vm {
    pub(crate) fn new(record: VmRecord, dir: PathBuf, run_dir: PathBuf) -> Self {
        let record_path = dir.join("vm.json");
        let id = record.id;
        let (tx, _) = watch::channel(record);
        let vm = Self {
            id,
            record: tx,
            record_path,
            dir,
            run_dir,
            instance: Mutex::new(None),
            guest: Mutex::new(None),
            net: Mutex::new(None),
            net_config: Mutex::new(None),
            jail_slot: Mutex::new(None),
        };
        vm.persist();
        vm
    }

    /// The host end of raw port `name` (one of [`crate::HostConfig::raw_ports`]).
    pub fn raw_port_path(&self, name: &str) -> PathBuf {
        hearth_vmm::qemu::cmdline::RunFiles::raw_port(&self.run_dir, name)
    }

    pub(crate) fn load(dir: &Path, run_root: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join("vm.json")).ok()?;
        let record: VmRecord = serde_json::from_str(&text).ok()?;
        let run_dir = run_root.join(record.id.to_string());
        let id = record.id;
        let (tx, _) = watch::channel(record);
        Some(Self {
            id,
            record: tx,
            record_path: dir.join("vm.json"),
            dir: dir.to_path_buf(),
            run_dir,
            instance: Mutex::new(None),
            guest: Mutex::new(None),
            net: Mutex::new(None),
            net_config: Mutex::new(None),
            jail_slot: Mutex::new(None),
        })
    }

    pub fn record(&self) -> VmRecord {
        self.record.borrow().clone()
    }

    pub fn state(&self) -> VmState {
        self.record.borrow().state
    }

    /// Waits for the next state change.
    pub fn subscribe(&self) -> watch::Receiver<VmRecord> {
        self.record.subscribe()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut VmRecord)) {
        self.record.send_modify(f);
        self.persist();
    }

    /// Moves to `to` unless the VM is already in a terminal state; returns
    /// whether it moved. `failed` never overwrites `stopping`→`stopped`.
    pub(crate) fn transition(&self, to: VmState, reason: Option<String>) -> bool {
        let mut moved = false;
        self.record.send_if_modified(|r| {
            let allowed = match (r.state, to) {
                (VmState::Deleted, _) => false,
                (_, VmState::Deleted) => true,
                (s, VmState::Failed) => !s.is_terminal() && s != VmState::Stopping,
                (s, _) if s.is_terminal() => to == VmState::Provisioning,
                _ => true,
            };
            if allowed {
                r.state = to;
                if reason.is_some() {
                    r.reason = reason;
                }
                moved = true;
            }
            allowed
        });
        if moved {
            tracing::info!(vm = %self.id, state = ?to, "vm state");
            self.persist();
        }
        moved
    }

    fn persist(&self) {
        let record = self.record();
        if record.state == VmState::Deleted {
            return;
        }
        let tmp = self.record_path.with_extension("json.tmp");
        let write = serde_json::to_vec_pretty(&record)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|_| std::fs::rename(&tmp, &self.record_path));
        if let Err(e) = write {
            tracing::warn!(vm = %self.id, error = %e, "cannot write vm record");
        }
    }

    /// The guest client, when the VM is ready.
    pub fn guest(&self) -> Option<GuestClient> {
        self.guest.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn instance(&self) -> Option<Arc<crate::host::Instance>> {
        self.instance
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
