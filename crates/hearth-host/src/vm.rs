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

use hearth_types::VmId;
use tokio::sync::watch;

use crate::guest::GuestClient;
pub use hearth_hostapi::types::{BootFrom, MemoryVolumes, VmRecord, VmState};

/// A VM and its live handles.
pub struct Vm {
    pub id: VmId,
    record: watch::Sender<VmRecord>,
    record_path: PathBuf,
    /// Persistent per-VM directory (disk overlay, record).
    pub dir: PathBuf,
    /// Runtime directory on tmpfs (sockets, logs, memory file).
    pub run_dir: PathBuf,
    pub(crate) instance: Mutex<Option<Arc<dyn hearth_vmm::DynInstance>>>,
    pub(crate) guest: Mutex<Option<GuestClient>>,
    /// The VM's namespace and proxy attachment while it runs.
    pub(crate) net: Mutex<Option<crate::network::VmNet>>,
    /// Its egress policy and environment, as last given by the control
    /// plane (kept in memory only: it holds resolved secrets).
    pub(crate) net_config: Mutex<Option<crate::network::SandboxNet>>,
    /// Its jail uid slot while its VMM runs (see `JailSettings`).
    pub(crate) jail_slot: Mutex<Option<u32>>,
    /// Held through each sync of the guest's clock: a step is relative to
    /// the offset its own sync measured, so two must not interleave.
    pub(crate) clock: tokio::sync::Mutex<()>,
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
            clock: tokio::sync::Mutex::new(()),
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
            clock: tokio::sync::Mutex::new(()),
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

    /// Moves to `to` if [`legal`] allows it from the current state; returns
    /// whether it moved.
    pub(crate) fn transition(&self, to: VmState, reason: Option<String>) -> bool {
        self.transition_from(&ALL_STATES, to, reason)
    }

    /// Moves to `to` only from one of `from` (and only if [`legal`]):
    /// how a watcher that saw the VMM die marks it failed without
    /// overriding a stop that began meanwhile.
    pub(crate) fn transition_from(
        &self,
        from: &[VmState],
        to: VmState,
        reason: Option<String>,
    ) -> bool {
        let mut moved = false;
        self.record.send_if_modified(|r| {
            let allowed = from.contains(&r.state) && legal(r.state, to);
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

    pub(crate) fn instance(&self) -> Option<Arc<dyn hearth_vmm::DynInstance>> {
        self.instance
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

const ALL_STATES: [VmState; 7] = [
    VmState::Provisioning,
    VmState::Ready,
    VmState::Paused,
    VmState::Stopping,
    VmState::Stopped,
    VmState::Failed,
    VmState::Deleted,
];

/// Every legal move of a VM's state, in one table (a state never moves to
/// itself):
///
/// | from         | to                                                  |
/// |--------------|-----------------------------------------------------|
/// | provisioning | ready (booted), stopping, failed, deleted           |
/// | ready        | paused, stopping, failed, deleted                   |
/// | paused       | ready (resumed), stopping, failed, deleted          |
/// | stopping     | stopped, provisioning (resumed after a capture), failed (the agent restarted mid-stop), deleted |
/// | stopped      | provisioning (start), deleted                       |
/// | failed       | provisioning (start), deleted                       |
/// | deleted      | nothing                                             |
pub(crate) fn legal(from: VmState, to: VmState) -> bool {
    use VmState::*;
    matches!(
        (from, to),
        (Provisioning, Ready | Stopping | Failed | Deleted)
            | (Ready, Paused | Stopping | Failed | Deleted)
            | (Paused, Ready | Stopping | Failed | Deleted)
            | (Stopping, Stopped | Provisioning | Failed | Deleted)
            | (Stopped | Failed, Provisioning | Deleted)
    )
}

#[cfg(test)]
mod transition_tests {
    use super::*;
    use VmState::*;

    #[test]
    fn the_table_is_what_the_lifecycle_needs_and_nothing_more() {
        let legal_moves: Vec<(VmState, VmState)> = ALL_STATES
            .iter()
            .flat_map(|&a| ALL_STATES.iter().map(move |&b| (a, b)))
            .filter(|&(a, b)| legal(a, b))
            .collect();
        assert_eq!(
            legal_moves,
            [
                (Provisioning, Ready),
                (Provisioning, Stopping),
                (Provisioning, Failed),
                (Provisioning, Deleted),
                (Ready, Paused),
                (Ready, Stopping),
                (Ready, Failed),
                (Ready, Deleted),
                (Paused, Ready),
                (Paused, Stopping),
                (Paused, Failed),
                (Paused, Deleted),
                (Stopping, Provisioning),
                (Stopping, Stopped),
                (Stopping, Failed),
                (Stopping, Deleted),
                (Stopped, Provisioning),
                (Stopped, Deleted),
                (Failed, Provisioning),
                (Failed, Deleted),
            ]
        );
        // Nothing leaves deleted, nothing stays put, and a VM with no VMM
        // (stopped, failed) only starts or goes.
        for s in ALL_STATES {
            assert!(!legal(Deleted, s));
            assert!(!legal(s, s));
        }
        assert!(!legal(Stopped, Ready) && !legal(Failed, Stopping));
        // What recovery needs: a VM left stopping by a dead agent fails.
        assert!(legal(Stopping, Failed));
    }
}
