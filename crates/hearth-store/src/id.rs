//! Validated names: key scopes and volumes.
//!
//! Both end up inside object-store keys (`keys/<scope>`, `chunks/<scope>/…`,
//! `volumes/<volume>/…`) and cache paths, so the alphabet is kept to what is
//! safe in both: `[A-Za-z0-9._-]{1,128}`, not starting with '.' (no `..`, no
//! hidden files, no separators).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::StoreError;

/// Longest scope or volume name.
pub const MAX_NAME_LEN: usize = 128;

fn validate(kind: &'static str, value: &str) -> Result<(), StoreError> {
    let reason = if value.is_empty() {
        Some("empty")
    } else if value.len() > MAX_NAME_LEN {
        Some("longer than 128 bytes")
    } else if value.starts_with('.') {
        Some("starts with '.'")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("only A-Z, a-z, 0-9, '.', '_' and '-' are allowed")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(StoreError::InvalidName {
            kind,
            value: value.chars().take(MAX_NAME_LEN).collect(),
            reason,
        }),
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps a name.
            pub fn new(value: impl Into<String>) -> Result<Self, StoreError> {
                let value = value.into();
                validate($kind, &value)?;
                Ok(Self(value))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = StoreError;
            fn from_str(s: &str) -> Result<Self, StoreError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// A key scope: one data key, one dedup domain (typically one per
    /// workload, e.g. per sandbox, or one for a shared base image).
    ScopeId,
    "scope"
);
name_type!(
    /// A volume: a chain of generations of one block device.
    VolumeId,
    "volume"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_rejects() {
        for ok in ["a", "sb-123", "A.b_c-9", &"x".repeat(128)] {
            assert!(ScopeId::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "..",
            "a/b",
            "a b",
            "é",
            &"x".repeat(129),
            "a\0",
        ] {
            assert!(VolumeId::new(bad).is_err(), "{bad:?}");
        }
        let v: VolumeId = "vol-1".parse().unwrap();
        assert_eq!(v.to_string(), "vol-1");
        assert_eq!(serde_json::to_string(&v).unwrap(), "\"vol-1\"");
        assert!(serde_json::from_str::<VolumeId>("\"a/b\"").is_err());
    }
}
