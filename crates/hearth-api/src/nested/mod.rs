//! Nested objects of the sandbox body: run config, access delegation, proxy
//! config, mount config and volumes.
//!
//! Hearth does not act on proxy, mount, delegation or volume settings yet; it
//! validates their shape (so a wrong type is a 422 like on LangSmith), stores
//! them and echoes them back. Provider-specific blocks with many optional
//! children (`aws`, `gcp`, `azure`, `s3`, `git`, …) are kept as JSON objects:
//! they must be objects, and every key inside is preserved. Unknown keys of
//! the typed structs are ignored, as at the top level.

use std::collections::{BTreeMap, BTreeSet};

use hearth_types::sandbox::RunSpec;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::validate::{check_absolute_path, check_env_vars};

/// A JSON object kept verbatim.
pub type JsonObject = Map<String, Value>;

mod mounts;
mod proxy;

pub use mounts::*;
pub use proxy::*;

/// The user, working directory and environment commands run with. Applies
/// at three layers — snapshot, sandbox, command — each over the one below:
/// `user` and `work_dir` replace, `env_vars` merge key by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// `name`, `uid`, `name:group` or `uid:gid`; none = the image's `USER`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Absolute working directory; none = the image's `WORKDIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
    /// Environment variables, merged over the layer below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
}

impl From<RunConfig> for RunSpec {
    fn from(rc: RunConfig) -> RunSpec {
        RunSpec {
            user: rc.user,
            work_dir: rc.work_dir,
            env_vars: rc.env_vars,
        }
    }
}

impl From<RunSpec> for RunConfig {
    fn from(rs: RunSpec) -> RunConfig {
        RunConfig {
            user: rs.user,
            work_dir: rs.work_dir,
            env_vars: rs.env_vars,
        }
    }
}

impl RunConfig {
    /// This layer applied over `base`: `user` and `work_dir` replace when
    /// set, `env_vars` merge (this layer wins per key).
    pub fn merged_over(&self, base: &RunConfig) -> RunConfig {
        let env_vars = match (&base.env_vars, &self.env_vars) {
            (None, None) => None,
            (b, o) => {
                let mut merged = b.clone().unwrap_or_default();
                merged.extend(o.clone().unwrap_or_default());
                Some(merged)
            }
        };
        RunConfig {
            user: self.user.clone().or_else(|| base.user.clone()),
            work_dir: self.work_dir.clone().or_else(|| base.work_dir.clone()),
            env_vars,
        }
    }

    /// Checks the layer: non-empty user, absolute work_dir, sane env names.
    pub fn validate(&self, field: &str) -> Result<(), ApiError> {
        if let Some(user) = &self.user {
            if user.trim().is_empty() || user.chars().any(char::is_control) {
                return Err(ApiError::validation(
                    &format!("{field}.user"),
                    format!("{field}.user must be a non-empty user name or uid"),
                ));
            }
        }
        if let Some(dir) = &self.work_dir {
            check_absolute_path(&format!("{field}.work_dir"), dir)?;
        }
        if let Some(env) = &self.env_vars {
            check_env_vars(&format!("{field}.env_vars"), env)?;
        }
        Ok(())
    }
}

/// Lets code inside the sandbox call the LangSmith API as its creator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessDelegation {
    pub mode: AccessDelegationMode,
    /// Granted permissions (`EXPLICIT`); a ceiling re-checked per request.
    #[serde(default)]
    pub permissions: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum AccessDelegationMode {
    /// All of the creator's rights.
    Inherit,
    /// Only the listed permissions.
    Explicit,
}

impl AccessDelegation {
    pub fn validate(&self) -> Result<(), ApiError> {
        if self.mode == AccessDelegationMode::Explicit && self.permissions.is_empty() {
            return Err(ApiError::validation(
                "access_delegation.permissions",
                "access_delegation.permissions is required when mode is EXPLICIT",
            ));
        }
        for (i, p) in self.permissions.iter().enumerate() {
            if p.trim().is_empty() {
                return Err(ApiError::validation(
                    "access_delegation.permissions",
                    format!("access_delegation.permissions[{i}] must be non-empty"),
                ));
            }
        }
        Ok(())
    }

    /// As Hearth stores it.
    pub fn to_spec(&self) -> hearth_types::sandbox::Delegation {
        use hearth_types::sandbox::{Delegation, DelegationMode};
        Delegation {
            mode: match self.mode {
                AccessDelegationMode::Inherit => DelegationMode::Inherit,
                AccessDelegationMode::Explicit => DelegationMode::Explicit,
            },
            permissions: self
                .permissions
                .iter()
                .map(|p| p.trim().to_owned())
                .collect(),
        }
    }

    /// As it was requested.
    pub fn from_spec(d: &hearth_types::sandbox::Delegation) -> AccessDelegation {
        use hearth_types::sandbox::DelegationMode;
        AccessDelegation {
            mode: match d.mode {
                DelegationMode::Inherit => AccessDelegationMode::Inherit,
                DelegationMode::Explicit => AccessDelegationMode::Explicit,
            },
            permissions: d.permissions.clone(),
        }
    }
}

/// A volume to attach at create (beta): by `volume` (id or name), or by the
/// explicit `volume_id` / `volume_name` the responses use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMountRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

impl VolumeMountRequest {
    /// The id or name to look the volume up by.
    pub fn volume_ref(&self) -> &str {
        self.volume
            .as_deref()
            .or(self.volume_id.as_deref())
            .or(self.volume_name.as_deref())
            .unwrap_or_default()
    }
}

/// A volume attached to a sandbox, as reads report it (slot order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeAttachment {
    pub volume_id: uuid::Uuid,
    pub volume_name: String,
    pub mount_path: String,
    pub read_only: bool,
}

/// At most this many volumes per sandbox.
pub const MAX_VOLUMES: usize = 4;

/// A create's `volumes` as Hearth's requests: at most [`MAX_VOLUMES`],
/// each naming exactly one volume, at distinct absolute mount paths (the
/// domain resolves the volumes and checks the rest).
pub fn volume_requests(
    volumes: &[VolumeMountRequest],
) -> Result<Vec<hearth_types::sandbox::VolumeRequest>, ApiError> {
    if volumes.len() > MAX_VOLUMES {
        return Err(ApiError::validation(
            "volumes",
            format!(
                "volumes: at most {MAX_VOLUMES} volumes per sandbox, got {}",
                volumes.len()
            ),
        ));
    }
    let mut paths = BTreeSet::new();
    let mut out = Vec::with_capacity(volumes.len());
    for (i, v) in volumes.iter().enumerate() {
        let at = format!("volumes[{i}]");
        let named = [&v.volume, &v.volume_id, &v.volume_name]
            .iter()
            .filter(|r| r.as_deref().is_some_and(|s| !s.trim().is_empty()))
            .count();
        if named != 1 {
            return Err(ApiError::validation(
                &format!("{at}.volume"),
                format!("{at}: set exactly one of volume, volume_id or volume_name"),
            ));
        }
        check_absolute_path(&format!("{at}.mount_path"), &v.mount_path)?;
        if !paths.insert(v.mount_path.trim_end_matches('/')) {
            return Err(ApiError::validation(
                &format!("{at}.mount_path"),
                format!("{at}.mount_path: '{}' is used twice", v.mount_path),
            ));
        }
        out.push(hearth_types::sandbox::VolumeRequest {
            volume: v.volume_ref().to_owned(),
            path: v.mount_path.clone(),
            read_only: v.read_only.unwrap_or(false),
            field: at,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_config_layers() {
        let base = RunConfig {
            user: Some("app".into()),
            work_dir: Some("/srv".into()),
            env_vars: Some(BTreeMap::from([
                ("A".into(), "1".into()),
                ("B".into(), "1".into()),
            ])),
        };
        let over = RunConfig {
            user: None,
            work_dir: Some("/work".into()),
            env_vars: Some(BTreeMap::from([("B".into(), "2".into())])),
        };
        let m = over.merged_over(&base);
        assert_eq!(m.user.as_deref(), Some("app"));
        assert_eq!(m.work_dir.as_deref(), Some("/work"));
        assert_eq!(
            m.env_vars.unwrap(),
            BTreeMap::from([("A".into(), "1".into()), ("B".into(), "2".into())])
        );
        assert_eq!(
            RunConfig::default().merged_over(&RunConfig::default()),
            RunConfig::default()
        );
    }

    #[test]
    fn opaque_secrets_are_redacted_and_carried_over() {
        let cfg: ProxyConfig = serde_json::from_value(serde_json::json!({
            "rules": [{"name": "gh", "headers": [
                {"name": "authorization", "type": "opaque", "value": "s3cret"},
                {"name": "x-team", "type": "plaintext", "value": "blue"}],
                "aws": {"access_key_id": {"type": "opaque", "value": "AKIA"},
                        "secret_access_key": {"type": "workspace_secret", "value": "{K}"}}}]
        }))
        .unwrap();
        let shown = serde_json::to_value(cfg.redacted()).unwrap();
        let rule = &shown["rules"][0];
        assert_eq!(
            rule["headers"][0],
            serde_json::json!({"name": "authorization", "type": "opaque", "is_set": true})
        );
        assert_eq!(rule["headers"][1]["value"], "blue");
        assert_eq!(
            rule["aws"]["access_key_id"],
            serde_json::json!({"type": "opaque", "is_set": true})
        );
        assert_eq!(rule["aws"]["secret_access_key"]["value"], "{K}");

        let update: ProxyConfig = serde_json::from_value(serde_json::json!({
            "rules": [{"name": "gh", "headers": [{"name": "authorization", "type": "opaque"}]}]
        }))
        .unwrap();
        let applied = cfg.replaced_by(&update);
        assert_eq!(applied.rules[0].headers.len(), 1);
        assert_eq!(applied.rules[0].headers[0].value.as_deref(), Some("s3cret"));
    }
}
