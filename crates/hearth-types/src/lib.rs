//! Shared vocabulary of Hearth: typed identifiers and units. No I/O lives here.
//!
//! - [`VmId`]: identity of one microVM incarnation on a host.
//! - [`ByteSize`]: a size in bytes, parsed from human forms such as `512M` or `2GiB`.
//! - [`MilliCpu`]: CPU in thousandths of a vCPU (LangSmith's `cpu_millicores`).
//! - [`WorkspaceId`], [`SandboxId`], [`HostId`], [`SnapshotId`], [`ApiKeyId`]:
//!   control-plane record ids (UUIDs, printed hyphenated), in [`ids`].
//! - [`egress::EgressSpec`]: a sandbox's egress as Hearth describes it,
//!   whichever API it came in through.
//! - [`sandbox::SandboxSpec`]: a sandbox's resolved configuration, as
//!   stored, whichever API created it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub mod body;
pub mod egress;
pub mod extents;
pub mod ids;
pub mod image;
pub mod rules;
pub mod sandbox;
pub use ids::{ApiKeyId, HostId, PoolId, SandboxId, SnapshotId, WorkspaceId};

/// Identity of one VM on a host. Printed as a UUID without dashes so it is
/// safe in paths, QEMU ids and process command lines.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VmId(uuid::Uuid);

impl VmId {
    /// A new time-ordered id.
    pub fn new() -> Self {
        Self(uuid::Uuid::now_v7())
    }
}

impl From<uuid::Uuid> for VmId {
    fn from(u: uuid::Uuid) -> Self {
        Self(u)
    }
}

impl VmId {
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl Default for VmId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.simple())
    }
}

impl fmt::Debug for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VmId({})", self.0.simple())
    }
}

/// A sandbox's default name, and the host name its guest is given:
/// `sandbox-` and the last 12 hex digits of its id (a UUIDv7's random
/// tail; its head is the millisecond it was made). The VM of a sandbox has
/// the sandbox's id, so the two agree and both name the id.
pub fn machine_name(id: &uuid::Uuid) -> String {
    let hex = id.simple().to_string();
    format!("sandbox-{}", &hex[hex.len() - 12..])
}

/// The string was not a valid id.
#[derive(Debug, thiserror::Error)]
#[error("invalid id {input:?}")]
pub struct ParseIdError {
    input: String,
}

impl FromStr for VmId {
    type Err = ParseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| ParseIdError {
                input: s.to_owned(),
            })
    }
}

/// A size in bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const KIB: u64 = 1024;
    pub const MIB: u64 = 1024 * 1024;
    pub const GIB: u64 = 1024 * 1024 * 1024;

    pub const fn mib(n: u64) -> Self {
        Self(n * Self::MIB)
    }
    pub const fn gib(n: u64) -> Self {
        Self(n * Self::GIB)
    }
    pub const fn bytes(self) -> u64 {
        self.0
    }
    /// Whole mebibytes, rounded down.
    pub const fn as_mib(self) -> u64 {
        self.0 / Self::MIB
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= Self::GIB && b.is_multiple_of(Self::GIB) {
            write!(f, "{}GiB", b / Self::GIB)
        } else if b >= Self::MIB && b.is_multiple_of(Self::MIB) {
            write!(f, "{}MiB", b / Self::MIB)
        } else if b >= Self::KIB && b.is_multiple_of(Self::KIB) {
            write!(f, "{}KiB", b / Self::KIB)
        } else {
            write!(f, "{b}B")
        }
    }
}

impl fmt::Debug for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The string was not a size such as `512M`, `2GiB` or `1048576`.
#[derive(Debug, thiserror::Error)]
#[error("invalid size {input:?}: expected a number with an optional unit (K, M, G, T; binary)")]
pub struct ParseSizeError {
    input: String,
}

impl FromStr for ByteSize {
    type Err = ParseSizeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseSizeError {
            input: s.to_owned(),
        };
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| err())?;
        let mult = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => Self::KIB,
            "m" | "mb" | "mib" => Self::MIB,
            "g" | "gb" | "gib" => Self::GIB,
            "t" | "tb" | "tib" => Self::GIB * 1024,
            _ => return Err(err()),
        };
        n.checked_mul(mult).map(Self).ok_or_else(err)
    }
}

/// CPU in thousandths of a vCPU.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Debug, Default,
)]
#[serde(transparent)]
pub struct MilliCpu(pub u32);

impl MilliCpu {
    pub const fn vcpus(n: u32) -> Self {
        Self(n * 1000)
    }
    /// Whole vCPUs a VMM must give the guest: fractions round up.
    pub const fn whole_vcpus(self) -> u32 {
        self.0.div_ceil(1000)
    }
}

/// `e` and its sources, joined, for records and API messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_name_is_the_ids_random_tail() {
        let id: uuid::Uuid = "01a238fb-d61c-7359-abac-90f9285b38b4".parse().unwrap();
        assert_eq!(machine_name(&id), "sandbox-90f9285b38b4");
    }

    #[test]
    fn byte_size_parses_human_forms() {
        assert_eq!("512M".parse::<ByteSize>().unwrap(), ByteSize::mib(512));
        assert_eq!("2GiB".parse::<ByteSize>().unwrap(), ByteSize::gib(2));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert!("12X".parse::<ByteSize>().is_err());
        assert!("".parse::<ByteSize>().is_err());
        assert!("99999999999999999999G".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize::mib(256).to_string(), "256MiB");
    }

    #[test]
    fn vm_id_round_trips() {
        let id = VmId::new();
        assert_eq!(id.to_string().parse::<VmId>().unwrap(), id);
        assert!("nope".parse::<VmId>().is_err());
    }

    #[test]
    fn millicpu_rounds_up() {
        assert_eq!(MilliCpu(500).whole_vcpus(), 1);
        assert_eq!(MilliCpu(2000).whole_vcpus(), 2);
        assert_eq!(MilliCpu(2001).whole_vcpus(), 3);
    }
}
