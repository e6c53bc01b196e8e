//! What host agents and the control plane say to each other about the
//! fleet itself (`/internal/v1/hosts/…` on the control plane): a host
//! registers with an enrollment token and its own key, renews its lease,
//! and asks to be drained. Every request after registration is a command
//! the host signs (`hearth-fence`, audience [`CONTROL_AUDIENCE`], subject
//! the host's id, generation its lease epoch). Each renewal carries what
//! placement needs to know of the host since the last: its free disk and
//! whether its object store answers ([`StoreHealth`]).

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
    /// The host's last check of its store. Absent (a host older than the
    /// field) reads as [`StoreHealth::Ok`], which is what such a host
    /// proved when it registered.
    #[serde(default)]
    pub store: StoreHealth,
}

/// A host's last check of its object store (`Store::probe`: write, read
/// back and delete one small object, within a deadline). A host whose
/// store fails cannot fetch an image's chunks or commit and flush a disk,
/// so placement gives it nothing new until a check succeeds again; what it
/// runs keeps running (flushes wait for the store).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum StoreHealth {
    /// The last check succeeded (or none has run yet: a host in a fleet
    /// registers only once one has).
    #[default]
    Ok,
    /// The last check failed or did not finish in time.
    Failing {
        /// Why, as the store (or the deadline) said.
        error: String,
    },
}

impl StoreHealth {
    pub fn is_ok(&self) -> bool {
        matches!(self, StoreHealth::Ok)
    }

    /// Why the last check failed; `None` when it did not.
    pub fn error(&self) -> Option<&str> {
        match self {
            StoreHealth::Ok => None,
            StoreHealth::Failing { error } => Some(error),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_without_store_health_reads_as_healthy() {
        // What a host from before the field sends.
        let old: RenewLease = serde_json::from_str(r#"{"epoch":3,"disk_free":1024}"#).unwrap();
        assert_eq!(old.store, StoreHealth::Ok);
        let failing = RenewLease {
            epoch: 3,
            disk_free: ByteSize(1024),
            store: StoreHealth::Failing {
                error: "timed out".into(),
            },
        };
        let wire = serde_json::to_value(&failing).unwrap();
        assert_eq!(
            wire["store"],
            serde_json::json!({"state": "failing", "error": "timed out"})
        );
        let back: RenewLease = serde_json::from_value(wire).unwrap();
        assert_eq!(back.store.error(), Some("timed out"));
        assert!(!back.store.is_ok());
    }
}
