//! `mount_config`: bucket, git and ContextHub mounts and their
//! credentials, checked and turned into Hearth's `MountSpec`s.

use std::collections::BTreeSet;

use hearth_types::egress::{EgressSpec, RuleSpec};
use std::time::Duration;

use hearth_types::sandbox::{BucketOptions, GitMount, GitRef, GitRefKind, MountSource, MountSpec};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::error::ApiError;

use super::*;

/// Bucket, git and ContextHub mounts, and the credentials they use.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub auth: Option<MountAuth>,
    #[serde(default, deserialize_with = "crate::de::object_vec")]
    pub mounts: Vec<Mount>,
}

/// Per-provider credentials for mounts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountAuth {
    /// Signs the S3 mounts' requests: static keys or `role_arn`, as in a
    /// proxy rule's `aws`.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub aws: Option<ProxyAws>,
    /// Authenticates the GCS mounts' requests: `service_account_json`.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub gcp: Option<ProxyGcp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub azure: Option<JsonObject>,
}

/// One mount.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: MountKind,
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache: Option<MountCache>,
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub encryption: Option<MountEncryption>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub s3: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub gcs: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub git: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub contexthub: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub azure_blob: Option<JsonObject>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MountKind {
    S3,
    Gcs,
    Git,
    Contexthub,
    AzureBlob,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountCache {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountEncryption {
    pub kms_key: String,
}

/// What a `mount_config` becomes: the mounts, and the proxy rules their
/// credentials became.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MountPlan {
    pub mounts: Vec<MountSpec>,
    pub rules: Vec<RuleSpec>,
}

impl MountConfig {
    /// The mounts as Hearth runs them: git, S3 and GCS mounts are made,
    /// and `auth`'s credentials become proxy rules scoped to their mounts'
    /// buckets; `contexthub` and `azure_blob` mounts and `azure`
    /// credentials are refused with a 422 naming them, never a silent yes.
    /// `proxy`: the sandbox's proxy config (an enabled `aws` rule there
    /// signs S3 mounts that `auth` does not).
    pub fn to_specs(&self, proxy: Option<&ProxyConfig>) -> Result<MountPlan, ApiError> {
        let auth = self.auth.clone().unwrap_or_default();
        if auth.azure.is_some() {
            return Err(ApiError::validation(
                "mount_config.auth.azure",
                "mount_config.auth.azure: azure_blob mounts and Azure credentials are not supported by Hearth yet",
            ));
        }
        if let Some(aws) = &auth.aws {
            let rule = ProxyRule {
                name: "aws".into(),
                aws: Some(aws.clone()),
                ..ProxyRule::default()
            };
            rule.refuse_unsupported("mount_config.auth")?;
        }
        if let Some(gcp) = &auth.gcp {
            gcp.check("mount_config.auth.gcp")?;
        }
        for (key, kind, set) in [
            ("aws", MountKind::S3, auth.aws.is_some()),
            ("gcp", MountKind::Gcs, auth.gcp.is_some()),
        ] {
            if set && !self.mounts.iter().any(|m| m.kind == kind) {
                let field = format!("mount_config.auth.{key}");
                return Err(ApiError::validation(
                    &field,
                    format!(
                        "{field}: authenticates {} mounts, and mount_config has none",
                        if key == "aws" { "s3" } else { "gcs" }
                    ),
                ));
            }
        }
        let proxy_signs_aws = proxy.is_some_and(|p| {
            p.rules
                .iter()
                .any(|r| r.enabled != Some(false) && r.aws.is_some())
        });
        if self.mounts.is_empty() {
            return Err(ApiError::validation(
                "mount_config.mounts",
                "mount_config.mounts must list at least one mount",
            ));
        }
        let mut ids = BTreeSet::new();
        let mut paths: Vec<&str> = Vec::new();
        let mut plan = MountPlan::default();
        let mut rules = Vec::new();
        let mut scopes = Vec::new();
        for (i, m) in self.mounts.iter().enumerate() {
            let at = format!("mount_config.mounts[{i}]");
            check_mount_id(&format!("{at}.id"), &m.id)?;
            if !ids.insert(m.id.as_str()) {
                return Err(ApiError::validation(
                    &format!("{at}.id"),
                    format!("{at}.id: mount id '{}' is used twice", m.id),
                ));
            }
            let path = hearth_types::rules::mount_path(&format!("{at}.mount_path"), &m.mount_path)?;
            if let Some(other) = paths
                .iter()
                .find(|p| hearth_types::rules::paths_nest(p, &path))
            {
                return Err(ApiError::validation(
                    &format!("{at}.mount_path"),
                    format!("{at}.mount_path: '{path}' is, or is inside or around, the mount at '{other}'"),
                ));
            }
            let (present, key) = match m.kind {
                MountKind::S3 => (m.s3.is_some(), "s3"),
                MountKind::Gcs => (m.gcs.is_some(), "gcs"),
                MountKind::Git => (m.git.is_some(), "git"),
                MountKind::Contexthub => (m.contexthub.is_some(), "contexthub"),
                MountKind::AzureBlob => (m.azure_blob.is_some(), "azure_blob"),
            };
            if !present {
                return Err(ApiError::validation(
                    &format!("{at}.{key}"),
                    format!("{at}.{key} is required for a mount of type {key}"),
                ));
            }
            let refused = match m.kind {
                MountKind::Git | MountKind::S3 | MountKind::Gcs => None,
                MountKind::Contexthub => Some("contexthub mounts are a LangSmith-hosted service"),
                MountKind::AzureBlob => Some("azure_blob mounts are not supported by Hearth yet"),
            };
            if let Some(why) = refused {
                // The whole mount is refused: located at the list (the
                // SDK reports a location's last key).
                return Err(ApiError::validation(
                    "mount_config.mounts",
                    format!("{at}: {why}; nothing would appear at {}", m.mount_path),
                ));
            }
            // What the mount's type takes; anything else set is refused.
            let takes: &[&str] = match m.kind {
                MountKind::S3 => &["s3", "read_only", "cache", "encryption"],
                MountKind::Gcs => &["gcs", "read_only", "cache"],
                _ => &["git"],
            };
            for (field, set) in [
                ("read_only", m.read_only.is_some()),
                ("cache", m.cache.is_some()),
                ("encryption", m.encryption.is_some()),
                ("s3", m.s3.is_some()),
                ("gcs", m.gcs.is_some()),
                ("git", m.git.is_some()),
                ("contexthub", m.contexthub.is_some()),
                ("azure_blob", m.azure_blob.is_some()),
            ] {
                if set && !takes.contains(&field) {
                    let f = format!("{at}.{field}");
                    let why = match field {
                        "contexthub" => "contexthub mounts (a LangSmith-hosted service) are not supported by Hearth".to_owned(),
                        "azure_blob" => "azure_blob mounts are not supported by Hearth yet".to_owned(),
                        _ => format!("does not apply to a {key} mount"),
                    };
                    return Err(ApiError::validation(&f, format!("{f}: {why}")));
                }
            }
            let object = |o: &Option<JsonObject>| Value::Object(o.clone().unwrap_or_default());
            let bad_object = |e: serde_json::Error| {
                ApiError::validation(&format!("{at}.{key}"), format!("{at}.{key}: {e}"))
            };
            let source = match m.kind {
                MountKind::S3 => {
                    let s3: crate::bucket::S3MountConfig =
                        serde_json::from_value(object(&m.s3)).map_err(bad_object)?;
                    let opts = crate::bucket::options(&at, m.read_only, m.cache.as_ref())?;
                    let signed = auth.aws.is_some() || proxy_signs_aws;
                    let spec = s3.to_spec(&at, signed, m.encryption.as_ref(), opts)?;
                    if let Some(aws) = &auth.aws {
                        rules.push(crate::bucket::s3_rule(&m.id, &spec, aws));
                        scopes.push(crate::bucket::s3_scope(&spec));
                    }
                    MountSource::S3(spec)
                }
                MountKind::Gcs => {
                    let gcs: crate::bucket::GcsMountConfig =
                        serde_json::from_value(object(&m.gcs)).map_err(bad_object)?;
                    let opts = crate::bucket::options(&at, m.read_only, m.cache.as_ref())?;
                    let spec = gcs.to_spec(&at, opts)?;
                    if let Some(gcp) = &auth.gcp {
                        rules.push(crate::bucket::gcs_rule(&m.id, &spec, gcp));
                        scopes.push(crate::bucket::gcs_scope(&spec));
                    }
                    MountSource::Gcs(spec)
                }
                _ => {
                    let git: GitMountConfig =
                        serde_json::from_value(object(&m.git)).map_err(bad_object)?;
                    MountSource::Git(git.to_spec(&format!("{at}.git"))?)
                }
            };
            plan.mounts.push(MountSpec {
                id: m.id.clone(),
                path: path.clone(),
                source,
            });
            paths.push(&m.mount_path);
        }
        plan.rules = crate::bucket::to_rule_specs(rules);
        // Each mount's rule signs only what the mount may do.
        for (rule, scope) in plan.rules.iter_mut().zip(scopes) {
            rule.scope = Some(scope);
        }
        Ok(plan)
    }

    /// The mount config a sandbox's answer shows for its mounts, with the
    /// credentials its rules hold (`opaque` values as `is_set` only).
    /// Volumes are not among them (a sandbox shows them as `volumes`).
    pub fn from_specs(specs: &[MountSpec], rules: &[RuleSpec]) -> Option<Self> {
        let specs: Vec<&MountSpec> = specs.iter().filter(|m| m.volume().is_none()).collect();
        if specs.is_empty() {
            return None;
        }
        let as_object = |v: serde_json::Result<Value>| match v {
            Ok(Value::Object(o)) => Some(o),
            _ => None,
        };
        let mounts = specs
            .iter()
            .map(|m| {
                let mut out = Mount {
                    id: m.id.clone(),
                    kind: MountKind::Git,
                    mount_path: m.path.clone(),
                    read_only: None,
                    cache: None,
                    encryption: None,
                    s3: None,
                    gcs: None,
                    git: None,
                    contexthub: None,
                    azure_blob: None,
                };
                let opts = |o: &BucketOptions, out: &mut Mount| {
                    out.read_only = Some(o.read_only);
                    if o.cache_max_bytes.is_some() || o.writeback.is_some() {
                        out.cache = Some(MountCache {
                            max_size_bytes: o.cache_max_bytes,
                            writeback_seconds: o.writeback.map(|d| d.as_secs()),
                        });
                    }
                };
                match &m.source {
                    MountSource::Git(g) => {
                        out.git = as_object(serde_json::to_value(GitMountConfig::from_spec(g)));
                    }
                    MountSource::S3(s) => {
                        out.kind = MountKind::S3;
                        out.s3 = as_object(serde_json::to_value(
                            crate::bucket::S3MountConfig::from_spec(s),
                        ));
                        out.encryption =
                            s.kms_key.clone().map(|kms_key| MountEncryption { kms_key });
                        opts(&s.options, &mut out);
                    }
                    MountSource::Gcs(g) => {
                        out.kind = MountKind::Gcs;
                        out.gcs = as_object(serde_json::to_value(
                            crate::bucket::GcsMountConfig::from_spec(g),
                        ));
                        opts(&g.options, &mut out);
                    }
                    // Filtered out above.
                    MountSource::Volume(_) => {}
                }
                out
            })
            .collect();
        let shown = ProxyConfig::from_spec(&EgressSpec {
            rules: rules.to_vec(),
            ..EgressSpec::default()
        })
        .redacted();
        let mut auth = MountAuth::default();
        for r in shown.rules {
            if let Some(aws) = r.aws {
                auth.aws.get_or_insert(aws);
            }
            if let Some(mut gcp) = r.gcp {
                gcp.scopes = None;
                auth.gcp.get_or_insert(gcp);
            }
        }
        Some(Self {
            auth: Some(auth),
            mounts,
        })
    }
}

/// A mount id: what the SDK allows, bounded.
fn check_mount_id(field: &str, id: &str) -> Result<(), ApiError> {
    if id.trim().is_empty() || id.len() > 128 || id.chars().any(char::is_control) {
        return Err(ApiError::validation(
            field,
            format!("{field} must be 1 to 128 printable characters"),
        ));
    }
    Ok(())
}

/// The `git` object of a git mount (the SDK's `GitMountConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitMountConfig {
    remote_url: String,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    git_ref: Option<GitMountRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refresh_interval_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitMountRef {
    #[serde(rename = "type")]
    kind: GitRefKind,
    name: String,
}

/// Longest refresh interval (a day), and the most characters of a URL or
/// ref name.
const MAX_REFRESH_SECS: u64 = 86_400;
const MAX_GIT_TEXT: usize = 2048;

impl GitMountConfig {
    fn to_spec(&self, at: &str) -> Result<GitMount, ApiError> {
        let field = format!("{at}.remote_url");
        check_git_url(&field, &self.remote_url)?;
        let git_ref = match &self.git_ref {
            None => None,
            Some(r) => {
                let field = format!("{at}.ref.name");
                // What `git check-ref-format` refuses, and anything a
                // command line could take for an option.
                let bad = r.name.is_empty()
                    || r.name.len() > MAX_GIT_TEXT
                    || r.name.starts_with('-')
                    || r.name.starts_with('/')
                    || r.name.ends_with('/')
                    || r.name.ends_with('.')
                    || r.name.ends_with(".lock")
                    || r.name.contains("..")
                    || r.name.contains("@{")
                    || r.name.contains("//")
                    || r.name
                        .chars()
                        .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
                if bad {
                    return Err(ApiError::validation(
                        &field,
                        format!(
                            "{field} is not a valid git branch or tag name: '{}'",
                            r.name
                        ),
                    ));
                }
                Some(GitRef {
                    kind: r.kind,
                    name: r.name.clone(),
                })
            }
        };
        let refresh = match self.refresh_interval_seconds {
            None => None,
            Some(s) if (1..=MAX_REFRESH_SECS).contains(&s) => Some(Duration::from_secs(s)),
            Some(s) => {
                let field = format!("{at}.refresh_interval_seconds");
                return Err(ApiError::validation(
                    &field,
                    format!("{field} must be between 1 and {MAX_REFRESH_SECS}, got {s}"),
                ));
            }
        };
        Ok(GitMount {
            remote_url: self.remote_url.clone(),
            git_ref,
            refresh,
        })
    }

    fn from_spec(g: &GitMount) -> Self {
        Self {
            remote_url: g.remote_url.clone(),
            git_ref: g.git_ref.as_ref().map(|r| GitMountRef {
                kind: r.kind,
                name: r.name.clone(),
            }),
            refresh_interval_seconds: g.refresh.map(|d| d.as_secs()),
        }
    }
}

/// A git remote as the SDK allows it: an absolute `https://` URL with a
/// repository path, no credentials, query, fragment, whitespace or NUL.
fn check_git_url(field: &str, url: &str) -> Result<(), ApiError> {
    let refuse = |why: &str| {
        Err(ApiError::validation(
            field,
            format!("{field} {why}, got '{url}'"),
        ))
    };
    if url.len() > MAX_GIT_TEXT || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("must be at most 2048 characters with no whitespace or control characters");
    }
    let Ok(parsed) = url::Url::parse(url) else {
        return refuse("is not a URL");
    };
    if parsed.scheme() != "https" || parsed.host_str().is_none_or(str::is_empty) {
        return refuse("must be an absolute https:// URL");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return refuse("must not hold credentials (give them with a proxy_config header rule)");
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return refuse("must not have a query or fragment");
    }
    if parsed.path().trim_matches('/').is_empty() {
        return refuse("must name a repository path");
    }
    Ok(())
}
