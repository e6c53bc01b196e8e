//! Typed identifiers of control-plane records.
//!
//! LangSmith ids are UUIDs, so these are too: new ones are time-ordered (v7)
//! and every id prints in the hyphenated form the public API returns. Each
//! kind is its own type so a `SandboxId` can never be passed where a
//! `WorkspaceId` is expected.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ParseIdError;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(uuid::Uuid);

        impl $name {
            /// A new time-ordered id.
            pub fn new() -> Self {
                Self(uuid::Uuid::now_v7())
            }
            pub const fn from_uuid(u: uuid::Uuid) -> Self {
                Self(u)
            }
            pub const fn as_uuid(&self) -> &uuid::Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0.hyphenated())
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                uuid::Uuid::parse_str(s)
                    .map(Self)
                    .map_err(|_| ParseIdError {
                        input: s.to_owned(),
                    })
            }
        }

        impl From<uuid::Uuid> for $name {
            fn from(u: uuid::Uuid) -> Self {
                Self(u)
            }
        }
    };
}

uuid_id!(
    /// A tenant: owns sandboxes, snapshots and API keys, and carries quotas.
    WorkspaceId
);
uuid_id!(
    /// One sandbox record (it outlives the VMs that run it).
    SandboxId
);
uuid_id!(
    /// A host agent registered with the control plane.
    HostId
);
uuid_id!(
    /// A filesystem snapshot a sandbox boots from.
    SnapshotId
);
uuid_id!(
    /// An API key record (never the secret itself).
    ApiKeyId
);
uuid_id!(
    /// A warm pool of paused VMs for one snapshot and size.
    PoolId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_hyphenated_and_round_trip() {
        let id = SandboxId::new();
        let s = id.to_string();
        assert_eq!(s.len(), 36);
        assert_eq!(s.matches('-').count(), 4);
        assert_eq!(s.parse::<SandboxId>().unwrap(), id);
        assert!(format!("{id:?}").starts_with("SandboxId("));
        assert!("nope".parse::<WorkspaceId>().is_err());
    }

    #[test]
    fn new_ids_are_time_ordered() {
        let a = HostId::new();
        let b = HostId::new();
        assert!(a < b);
    }
}
