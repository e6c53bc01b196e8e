//! The Hearth host agent: the only privileged process on a node.
//!
//! - [`host::Host`]: boots VMs from Hearth's guest artifacts through a
//!   [`hearth_vmm`] backend (QEMU; any [`hearth_vmm::Vmm`] through
//!   [`Host::start_with`]), drives the VM state machine ([`vm::VmState`]),
//!   notices dead VMMs and broken guest channels at once, and after a restart
//!   accounts for (and cleans up) every VM a previous run started.
//! - [`guest::GuestClient`]: the typed client of one guest agent over its
//!   held stream (exec with replay, files, TCP dial, info).
//! - [`block`]: the block service: root disks as generations in the
//!   store ([`hearth_store`]), served to QEMU over NBD.
//! - [`clock`]: each guest's wall clock kept on the host's.
//! - [`network`]: each VM's network namespace and TAP, and the egress
//!   proxy ([`hearth_egress`]) that is its only way out.
//! - `fake` (feature `fake`): a fake VMM whose guest is a task speaking the
//!   guest protocol, so that host logic is tested without QEMU.
//! - [`store_check`]: the periodic, bounded check of the object store,
//!   whose result ([`Host::store_health`]) a host in a fleet reports with
//!   its lease so that placement skips it while the store fails.
//! - [`api`]: the host's private HTTP + WebSocket API, which a remote
//!   control plane drives with signed commands; a standalone host serves
//!   it on loopback to holders of its token. No caller is unauthenticated.

pub mod api;
pub mod block;
pub mod clock;
pub mod disks;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod fleet;
/// The guest client lives in `hearth-hostapi` (the control plane uses it
/// too); re-exported under its old path.
pub mod guest {
    pub use hearth_hostapi::guest::*;
}
pub mod host;
mod local;
pub mod lock;
pub mod memory;
pub mod mounts;
pub mod network;
pub mod store_check;
mod usage;
pub mod vm;

pub use guest::{
    stream_io, ExecHandle, ExecOutput, ExecUpdate, FileVersion, GuestClient, GuestError,
};
pub use hearth_hostapi::{
    BootFrom, Captured, CreateVm, MemoryVolumes, Resize, SandboxNet, VmRecord, VmState,
};
pub use host::{
    error_chain, GuestImages, Host, HostConfig, HostError, JailSettings, Liveness, Storage,
    StoreSettings,
};
pub use local::InProcessHost;
pub use network::Network;
pub use vm::Vm;
