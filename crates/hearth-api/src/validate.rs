//! Field-level rules shared by create and update: names, labels, TTLs,
//! environment variables, paths and snapshot references.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::ApiError;

pub use hearth_types::rules::{
    ParseSnapshotRefError, SnapshotRef, DEFAULT_TAG, MAX_LABELS, MAX_LABEL_KEY_LEN,
    MAX_LABEL_VALUE_LEN,
};

/// [`hearth_types::rules::check_labels`], as LangSmith's 422.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    Ok(hearth_types::rules::check_labels(labels)?)
}

/// [`hearth_types::rules::check_env_vars`], as LangSmith's 422.
pub fn check_env_vars(field: &str, env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    Ok(hearth_types::rules::check_env_vars(field, env)?)
}

/// Longest sandbox name.
pub use hearth_types::rules::MAX_NAME_LEN;
/// Upper bound of `idle_ttl_seconds` (and, by analogy,
/// `delete_after_stop_seconds`): the largest multiple of 60 that fits an
/// `i32`, which is what LangSmith documents as the maximum.
pub const MAX_TTL_SECONDS: i64 = 2_147_483_640;

pub use hearth_types::rules::check_sandbox_name;

/// Checks a TTL in seconds and turns it into a duration, `0` meaning
/// disabled (`None`). Range 0..=[`MAX_TTL_SECONDS`], a multiple of 60: the
/// SDK refuses other values before sending, so enforcing it here keeps other
/// clients (curl, TypeScript) to the same rule.
pub fn check_ttl(field: &str, seconds: i64) -> Result<Option<Duration>, ApiError> {
    if !(0..=MAX_TTL_SECONDS).contains(&seconds) {
        return Err(ApiError::validation(
            field,
            format!("{field} must be between 0 and {MAX_TTL_SECONDS}, got {seconds}"),
        ));
    }
    if seconds % 60 != 0 {
        return Err(ApiError::validation(
            field,
            format!("{field} must be a multiple of 60 seconds, got {seconds}"),
        ));
    }
    Ok((seconds > 0).then(|| Duration::from_secs(seconds as u64)))
}

/// An absolute path without NUL.
pub fn check_absolute_path(field: &str, path: &str) -> Result<(), ApiError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ApiError::validation(
            field,
            format!("{field} must be an absolute path, got '{path}'"),
        ));
    }
    Ok(())
}

pub(crate) fn check_max_chars(field: &str, s: &str, max: usize) -> Result<(), ApiError> {
    if s.chars().count() > max {
        return Err(ApiError::validation(
            field,
            format!("{field} must be at most {max} characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_refs() {
        let r: SnapshotRef = "python".parse().unwrap();
        assert_eq!(r.to_string(), "python:latest");
        let r: SnapshotRef = "python:3.12-slim".parse().unwrap();
        assert_eq!((r.name.as_str(), r.tag.as_str()), ("python", "3.12-slim"));
        for bad in ["", ":x", "py:", "a b", "a/b:c", "a:b:c", "a:t@g"] {
            assert!(
                bad.parse::<SnapshotRef>().is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn names() {
        for good in [
            "a",
            "box-1",
            "snapshot-builder-0123456789ab",
            &"x".repeat(63),
        ] {
            check_sandbox_name("name", good).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a b", &"x".repeat(64)] {
            let e = ApiError::from(check_sandbox_name("name", bad).unwrap_err());
            assert_eq!((e.status, e.field()), (422, Some("name")), "{bad:?}");
        }
    }

    #[test]
    fn ttls() {
        assert_eq!(check_ttl("t", 0).unwrap(), None);
        assert_eq!(check_ttl("t", 600).unwrap(), Some(Duration::from_secs(600)));
        assert!(check_ttl("t", MAX_TTL_SECONDS).is_ok());
        for bad in [-60, 61, MAX_TTL_SECONDS + 60] {
            assert_eq!(check_ttl("t", bad).unwrap_err().field(), Some("t"));
        }
    }
}
