//! The host agent's error.

use hearth_types::VmId;

use crate::vm::VmState;

/// Why a host operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("no vm {0}")]
    NotFound(VmId),
    #[error("vm {id} is {state:?}, not {wanted}")]
    WrongState {
        id: VmId,
        state: VmState,
        wanted: &'static str,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("prepare guest artifacts")]
    Image(#[from] hearth_image::ImageError),
    #[error("vm {id}: {what}")]
    Io {
        id: VmId,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("vmm")]
    Vmm(#[from] hearth_vmm::VmmError),
    #[error("vm {id} did not become ready: {reason}")]
    Boot { id: VmId, reason: String },
    #[error("guest")]
    Guest(#[from] crate::guest::GuestError),
    #[error("storage")]
    Store(#[from] hearth_store::StoreError),
    #[error(transparent)]
    KeyFile(#[from] hearth_fence::keyfile::KeyFileError),
    #[error("{0} needs the store (this host keeps qcow2 overlays)")]
    NeedsStore(&'static str),
}
