//! The seam between Hearth's control plane and its host agents.
//!
//! - [`types`]: the host's commands and replies ([`CreateVm`],
//!   [`Resize`], [`VmRecord`], [`Captured`], [`SandboxNet`], …), serde
//!   types that travel in process or over the host's private API.
//! - [`HostApi`]: the interface the control plane drives hosts through,
//!   with [`HostApiError`] (a kind and a message fit for users).
//! - [`guest::GuestClient`]: the typed client of a guest agent over the
//!   multiplexed guest stream (exec with replay, files, search, TCP dial),
//!   whether the mux runs over the VM's serial port (on the host) or over
//!   a WebSocket to a remote host.
//! - [`changes`]: a host's change feed ([`HostApi::vm_changes`]), so
//!   reconciling a host costs what changed on it.
//! - [`clock`]: how the host keeps its guest's wall clock on its own
//!   ([`GuestClient::sync_clock`]).
//!
//! - [`RemoteHost`]: a host elsewhere, over its private HTTP API with
//!   signed commands (or, for a local client of a standalone host, its API
//!   token: [`HostCredentials`]), and its guest streams over a WebSocket.
//!
//! `hearth-control` depends on this crate and never on `hearth-host`.

pub mod api;
pub mod changes;
pub mod clock;
pub mod fleet;
pub mod guest;
pub mod pipe;
pub mod remote;
pub mod routes;
pub mod sim;
pub mod types;

pub use api::{
    ErrorKind, HostApi, HostApiError, HostResult, HostStatus, ImportAuth, ImportImage,
    ImportedImage, StopVm, StoreGc, TemplateUsage, VmArchive, VmUsage,
};
pub use changes::{ChangeCursor, ChangeJournal, VmChanges};
pub use guest::{
    stream_io, ExecHandle, ExecOutput, ExecUpdate, FileReader, FileVersion, GuestClient, GuestError,
};
pub use remote::{HostCredentials, RemoteHost};
pub use sim::SimHost;
pub use types::{
    BootFrom, Captured, ClaimVm, CopyVolume, CreateVm, MemoryVolumes, Resize, SandboxNet, VmRecord,
    VmState,
};
