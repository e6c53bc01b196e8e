//! What host agents and the control plane say to each other about the
//! fleet itself (`/internal/v1/hosts/…` on the control plane): a host
//! registers with an enrollment token and its own key, renews its lease,
//! and asks to be drained. Every request after registration is a command
//! the host signs (`hearth-fence`, audience [`CONTROL_AUDIENCE`], subject
//! the host's id, generation its lease epoch).

use hearth_types::{ByteSize, HostId, MilliCpu};
use serde::{Deserialize, Serialize};

/// The audience of commands hosts sign for the control plane.
pub const CONTROL_AUDIENCE: &str = "control";
/// Header carrying the enrollment token at registration.
pub const ENROLLMENT_HEADER: &str = "authorization";

/// `POST /internal/v1/hosts/register` (bearer enrollment token, and a
/// command signed by `public_key`, proving the host holds it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegisterHost {
    pub id: HostId,
    /// Base URL of the host's private API, as the control plane reaches it.
    pub address: String,
    pub capacity_cpu: MilliCpu,
    pub capacity_mem: ByteSize,
    pub version: String,
    /// The store its disks live in.
    pub store_url: String,
    pub disk_free: ByteSize,
    /// The host's Ed25519 public key (base64url), which signs its lease
    /// renewals and drain.
    pub public_key: String,
}

/// The answer to a registration or a renewal.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lease {
    /// The lease epoch: commands for another are refused by the host.
    pub epoch: u64,
    /// Unix milliseconds; the host fences itself before this.
    pub expires_at_ms: u64,
    /// How long a lease lasts; the host renews well within it.
    pub ttl_ms: u64,
    /// The control plane's public keys (base64url): the host accepts
    /// commands signed by any of them (rotation adds one, then retires the
    /// old one).
    pub control_keys: Vec<String>,
}

/// `POST /internal/v1/hosts/{id}/lease`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RenewLease {
    pub epoch: u64,
    pub disk_free: ByteSize,
}

/// `POST /internal/v1/hosts/{id}/drain`: the answer, once every sandbox
/// the host ran was saved or stopped.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Drained {
    /// Sandboxes stopped with their memory saved.
    pub saved: u32,
    /// Sandboxes stopped (disk committed).
    pub stopped: u32,
    /// Sandboxes that could not be stopped cleanly.
    pub failed: u32,
}
