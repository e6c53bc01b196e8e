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

use hearth_types::egress::{
    AccessSpec, AwsRoleSpec, AwsSpec, CallbackSpec, Credentials, EgressSpec, GcpSpec, HeaderSpec,
    RewriteSpec, RuleSpec, SecretValue,
};
use std::time::Duration;

use hearth_types::sandbox::{
    BucketOptions, GitMount, GitRef, GitRefKind, MountSource, MountSpec, RunSpec,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::validate::{check_absolute_path, check_env_vars, check_max_chars};

/// A JSON object kept verbatim.
pub type JsonObject = Map<String, Value>;

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

/// Per-sandbox egress proxy configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Header-injection and provider-auth rules; first match wins.
    #[serde(default, deserialize_with = "crate::de::object_vec")]
    pub rules: Vec<ProxyRule>,
    /// Dynamic header resolution by calling out to a URL.
    #[serde(
        default,
        deserialize_with = "crate::de::object_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub callbacks: Vec<ProxyCallback>,
    /// Egress allow or deny list.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub access_control: Option<AccessControl>,
    /// Deprecated; a non-empty list is refused with a 422 naming it
    /// (Hearth has no bypass list: every connection goes through the
    /// proxy). Answered empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One proxy rule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyRule {
    pub name: String,
    /// Rule kind, e.g. `aws`, `gcp`, `attribution`; free-form.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_paths: Vec<String>,
    /// `"name: value"` entries (lowercase name, exact value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_headers: Vec<String>,
    #[serde(
        default,
        deserialize_with = "crate::de::object_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub headers: Vec<ProxyHeader>,
    /// Plaintext env set in the sandbox while the rule is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// SigV4 signing with static keys: the proxy re-signs the guest's
    /// AWS requests (signed with any dummy key) with these.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub aws: Option<ProxyAws>,
    /// GCP OAuth: the proxy mints access tokens from a service account key
    /// and sets them as `Authorization: Bearer` on Google API requests.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub gcp: Option<ProxyGcp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub azure: Option<JsonObject>,
    /// Refused (relays are not supported); any string, so that the refusal
    /// says that rather than how an id is spelt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_id: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub rewrite: Option<ProxyRewrite>,
}

/// A header a rule injects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyHeader {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: SecretKind,
    /// The value; write-only for `opaque` (reads show `is_set` instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_set: Option<bool>,
}

/// A rule's AWS credentials (`aws_auth` in the SDK): static keys, or an
/// IAM role (`role_arn`, with `session_tags`) that the operator's AWS
/// identity assumes with the workspace's id as external id (a 422 where the
/// operator gave none). `subject_scope` (workload identity) is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyAws {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<ProxySecret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<ProxySecret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub session_tags: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_scope: Option<String>,
}

/// A GCP rule (the SDK's `gcp_auth`): a service account key (its JSON, an
/// `opaque` or `workspace_secret` value) and the OAuth scopes of the tokens
/// minted from it (default `https://www.googleapis.com/auth/cloud-platform`).
/// Workload identity federation is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyGcp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_json: Option<ProxySecret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_identity_provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_scope: Option<String>,
}

impl ProxyGcp {
    fn check(&self, at: &str) -> Result<(), ApiError> {
        let refuse = |field: &str, why: &str| {
            Err(ApiError::validation(
                &format!("{at}.{field}"),
                format!("{at}.{field}: {why}"),
            ))
        };
        // The fields that go with a provider are named before it.
        for (field, set) in [
            (
                "service_account_email",
                self.service_account_email.is_some(),
            ),
            ("subject_scope", self.subject_scope.is_some()),
            (
                "workload_identity_provider",
                self.workload_identity_provider.is_some(),
            ),
        ] {
            if set {
                return refuse(field, "workload identity federation is not supported by Hearth; give service_account_json");
            }
        }
        let Some(key) = &self.service_account_json else {
            return refuse(
                "service_account_json",
                "is required (a service account key's JSON)",
            );
        };
        key.check(&format!("{at}.service_account_json"))?;
        for (i, s) in self.scopes.iter().flatten().enumerate() {
            if s.trim().is_empty() {
                return refuse(&format!("scopes[{i}]"), "must be non-empty");
            }
        }
        Ok(())
    }
}

/// The default scope of a GCP rule's tokens.
pub const GCP_DEFAULT_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// A credential's value: `opaque` (sealed, never returned) or
/// `workspace_secret` (a `{NAME}` template); never `plaintext`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxySecret {
    #[serde(rename = "type")]
    pub kind: SecretKind,
    /// Write-only for `opaque` (reads show `is_set` instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_set: Option<bool>,
}

impl ProxySecret {
    fn to_value(&self) -> SecretValue {
        stored_value(self.kind, &self.value)
    }

    fn from_value(v: &SecretValue) -> ProxySecret {
        let (kind, value) = wire_value(v);
        ProxySecret {
            kind,
            value: Some(value),
            is_set: None,
        }
    }

    fn redact(&mut self) {
        redact_secret(self.kind, &mut self.value, &mut self.is_set);
    }

    fn check(&self, at: &str) -> Result<(), ApiError> {
        if self.is_set.is_some() && self.kind != SecretKind::Opaque {
            return Err(ApiError::validation(
                &format!("{at}.is_set"),
                format!("{at}.is_set is not supported on a value that is not opaque (it keeps a stored opaque value)"),
            ));
        }
        if self.kind == SecretKind::Plaintext {
            return Err(ApiError::validation(
                &format!("{at}.type"),
                format!(
                    "{at}.type: a credential must be opaque or workspace_secret, not plaintext"
                ),
            ));
        }
        if self.value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(ApiError::validation(
                &format!("{at}.value"),
                format!("{at}.value must be non-empty"),
            ));
        }
        if self.value.is_none() && self.kind != SecretKind::Opaque {
            return Err(ApiError::validation(
                &format!("{at}.value"),
                format!("{at}.value is required"),
            ));
        }
        Ok(())
    }
}

impl ProxyAws {
    /// The two keys, by field name.
    pub fn secrets_mut(&mut self) -> impl Iterator<Item = (&'static str, &mut ProxySecret)> {
        [
            ("access_key_id", self.access_key_id.as_mut()),
            ("secret_access_key", self.secret_access_key.as_mut()),
        ]
        .into_iter()
        .filter_map(|(n, s)| s.map(|s| (n, s)))
    }

    fn secrets(&self) -> impl Iterator<Item = (&'static str, &ProxySecret)> {
        [
            ("access_key_id", self.access_key_id.as_ref()),
            ("secret_access_key", self.secret_access_key.as_ref()),
        ]
        .into_iter()
        .filter_map(|(n, s)| s.map(|s| (n, s)))
    }

    fn check(&self, at: &str) -> Result<(), ApiError> {
        let refuse = |field: &str, why: &str| {
            Err(ApiError::validation(
                &format!("{at}.{field}"),
                format!("{at}.{field}: {why}"),
            ))
        };
        if self.subject_scope.is_some() {
            return refuse(
                "subject_scope",
                "workload identity is not supported by Hearth",
            );
        }
        if let Some(role) = &self.role_arn {
            // A role: the operator's AWS identity assumes it; no keys.
            if !role.starts_with("arn:") || role.trim().len() < 20 {
                return refuse(
                    "role_arn",
                    "must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)",
                );
            }
            for (field, set) in [
                ("access_key_id", self.access_key_id.is_some()),
                ("secret_access_key", self.secret_access_key.is_some()),
            ] {
                if set {
                    return refuse(field, "give either role_arn or static keys, not both");
                }
            }
            for (k, v) in self.session_tags.iter().flatten() {
                if k.is_empty() || k.len() > 128 || !v.is_string() {
                    return refuse(
                        "session_tags",
                        "must map tag keys (1-128 characters) to string values",
                    );
                }
            }
            return Ok(());
        }
        if self.session_tags.is_some() {
            return refuse(
                "session_tags",
                "session tags are not supported without role_arn (static keys have no session)",
            );
        }
        for field in ["access_key_id", "secret_access_key"] {
            let present = match field {
                "access_key_id" => self.access_key_id.is_some(),
                _ => self.secret_access_key.is_some(),
            };
            if !present {
                return refuse(
                    field,
                    "is required (static credentials: access_key_id and secret_access_key)",
                );
            }
        }
        // `is_set` misused anywhere is named before any other fault.
        for (name, secret) in self.secrets() {
            if secret.is_set.is_some() {
                secret.check(&format!("{at}.{name}"))?;
            }
        }
        for (name, secret) in self.secrets() {
            secret.check(&format!("{at}.{name}"))?;
        }
        Ok(())
    }
}

/// A value as sent (`opaque` ones sealed by then) as Hearth stores it.
fn stored_value(kind: SecretKind, value: &Option<String>) -> SecretValue {
    let v = value.clone().unwrap_or_default();
    match kind {
        SecretKind::Plaintext => SecretValue::Plain(v),
        SecretKind::Opaque => SecretValue::Sealed(v),
        SecretKind::WorkspaceSecret => SecretValue::Template(v),
    }
}

/// A stored value in the API's terms: its type and (stored) value.
fn wire_value(v: &SecretValue) -> (SecretKind, String) {
    match v {
        SecretValue::Plain(v) => (SecretKind::Plaintext, v.clone()),
        SecretValue::Sealed(v) => (SecretKind::Opaque, v.clone()),
        SecretValue::Template(v) => (SecretKind::WorkspaceSecret, v.clone()),
    }
}

/// An `opaque` value as reads show it: `is_set`, never the value.
fn redact_secret(kind: SecretKind, value: &mut Option<String>, is_set: &mut Option<bool>) {
    if kind == SecretKind::Opaque {
        *is_set = Some(value.is_some() || *is_set == Some(true));
        *value = None;
    }
}

/// How a header value is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecretKind {
    /// Stored and echoed as given.
    Plaintext,
    /// Write-only: encrypted at rest, never returned.
    Opaque,
    /// `{NAME}` template resolved from the workspace's secrets.
    WorkspaceSecret,
}

/// Where a rule re-routes matching requests: to `https://host:port`, the
/// path and query kept, with the rule's headers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyRewrite {
    /// The HTTPS host requests are sent to (its certificate is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Its port (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Another sandbox: refused (Hearth has no sandbox links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The credential headers the sandbox sent (`Authorization`,
    /// `Proxy-Authorization`, `Cookie`, API-key headers): `strip` (the
    /// default) removes them, `redact` keeps each with its value
    /// `redacted` (after an auth scheme), `keep` forwards them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

/// A callback that resolves headers for matching hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyCallback {
    pub match_hosts: Vec<String>,
    pub url: String,
    /// How long resolved headers are cached, 60..=3600 s (with
    /// `full_request`, per identical request).
    pub ttl_seconds: i64,
    /// Send the callback the request itself (method, URL, headers, the
    /// body's first 64 KiB, base64) as `request`, not only `host` and
    /// `port`; the callback is then asked again for each different request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_request: Option<bool>,
    /// Headers sent to the callback; `plaintext` or `opaque` only.
    #[serde(
        default,
        deserialize_with = "crate::de::object_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub request_headers: Vec<ProxyHeader>,
}

/// Egress host filtering: exact names, `*.globs`, IPs, CIDRs, `~regex`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessControl {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_list: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_list: Option<Vec<String>>,
}

const MAX_DESCRIPTION_CHARS: usize = 1024;

impl ProxyConfig {
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Some(d) = &self.description {
            check_max_chars("proxy_config.description", d, MAX_DESCRIPTION_CHARS)?;
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let at = format!("proxy_config.rules[{i}]");
            if rule.name.trim().is_empty() {
                return Err(ApiError::validation(
                    &format!("{at}.name"),
                    format!("{at}.name must be non-empty"),
                ));
            }
            if let Some(d) = &rule.description {
                check_max_chars(&format!("{at}.description"), d, MAX_DESCRIPTION_CHARS)?;
            }
            for (j, h) in rule.headers.iter().enumerate() {
                check_header(&format!("{at}.headers[{j}]"), h)?;
            }
            if let Some(env) = &rule.env_vars {
                check_env_vars(&format!("{at}.env_vars"), env)?;
            }
        }
        let mut names = BTreeSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if !names.insert(rule.name.as_str()) {
                return Err(ApiError::validation(
                    &format!("proxy_config.rules[{i}].name"),
                    format!(
                        "proxy_config.rules[{i}].name: rule name '{}' is used twice",
                        rule.name
                    ),
                ));
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            rule.refuse_unsupported(&format!("proxy_config.rules[{i}]"))?;
        }
        if !self.no_proxy.is_empty() {
            return Err(ApiError::validation(
                "proxy_config.no_proxy",
                "proxy_config.no_proxy: a bypass list is not supported by Hearth; every connection goes through the proxy",
            ));
        }
        for (i, cb) in self.callbacks.iter().enumerate() {
            let at = format!("proxy_config.callbacks[{i}]");
            let ttl = hearth_types::egress::CallbackSpec::TTL_SECONDS;
            if !ttl.contains(&cb.ttl_seconds) {
                return Err(ApiError::validation(
                    &format!("{at}.ttl_seconds"),
                    format!(
                        "{at}.ttl_seconds must be between {} and {}",
                        ttl.start(),
                        ttl.end()
                    ),
                ));
            }
            if cb.url.trim().is_empty() {
                return Err(ApiError::validation(
                    &format!("{at}.url"),
                    format!("{at}.url must be non-empty"),
                ));
            }
            for (j, h) in cb.request_headers.iter().enumerate() {
                let hat = format!("{at}.request_headers[{j}]");
                check_header(&hat, h)?;
                if h.kind == SecretKind::WorkspaceSecret {
                    return Err(ApiError::validation(
                        &format!("{hat}.type"),
                        format!("{hat}.type must be plaintext or opaque"),
                    ));
                }
            }
        }
        if let Some(ac) = &self.access_control {
            if ac.allow_list.is_some() && ac.deny_list.is_some() {
                return Err(ApiError::validation(
                    "proxy_config.access_control",
                    "proxy_config.access_control takes allow_list or deny_list, not both",
                ));
            }
        }
        Ok(())
    }

    /// The config as Hearth's own egress spec (call after [`Self::validate`],
    /// which refuses what has no place in it): the egress proxy never sees
    /// LangSmith's wire format. `opaque` values stay as stored (sealed);
    /// `workspace_secret` values become templates.
    pub fn to_spec(&self) -> EgressSpec {
        let header = |h: &ProxyHeader| HeaderSpec {
            name: h.name.clone(),
            value: stored_value(h.kind, &h.value),
        };
        EgressSpec {
            access: self.access_control.as_ref().and_then(|ac| {
                match (&ac.allow_list, &ac.deny_list) {
                    (Some(list), _) => Some(AccessSpec::AllowList(list.clone())),
                    (None, Some(list)) => Some(AccessSpec::DenyList(list.clone())),
                    (None, None) => None,
                }
            }),
            rules: self
                .rules
                .iter()
                .map(|r| RuleSpec {
                    name: r.name.clone(),
                    description: r.description.clone(),
                    enabled: r.enabled != Some(false),
                    match_hosts: r.match_hosts.clone(),
                    match_paths: r.match_paths.clone(),
                    match_headers: r.match_headers.clone(),
                    headers: r.headers.iter().map(header).collect(),
                    env: r.env_vars.clone().unwrap_or_default(),
                    aws_role: r.aws.as_ref().and_then(|a| {
                        a.role_arn.as_ref().map(|role| AwsRoleSpec {
                            role_arn: role.trim().to_owned(),
                            session_tags: a
                                .session_tags
                                .iter()
                                .flatten()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or_default().to_owned())
                                })
                                .collect(),
                        })
                    }),
                    aws: r
                        .aws
                        .as_ref()
                        .filter(|a| a.role_arn.is_none())
                        .map(|a| AwsSpec {
                            access_key_id: a
                                .access_key_id
                                .as_ref()
                                .map(ProxySecret::to_value)
                                .unwrap_or(SecretValue::Sealed(String::new())),
                            secret_access_key: a
                                .secret_access_key
                                .as_ref()
                                .map(ProxySecret::to_value)
                                .unwrap_or(SecretValue::Sealed(String::new())),
                        }),
                    gcp: r.gcp.as_ref().map(|g| GcpSpec {
                        service_account_json: g
                            .service_account_json
                            .as_ref()
                            .map(ProxySecret::to_value)
                            .unwrap_or(SecretValue::Sealed(String::new())),
                        scopes: g.scopes.clone().unwrap_or_default(),
                    }),
                    rewrite: r.rewrite.as_ref().map(|rw| RewriteSpec {
                        host: rw.host.clone().unwrap_or_default().trim().to_owned(),
                        port: rw.port.unwrap_or_default(),
                        credentials: match rw.credentials.as_deref() {
                            Some("redact") => Credentials::Redact,
                            Some("keep") => Credentials::Keep,
                            _ => Credentials::Strip,
                        },
                    }),
                    scope: None,
                })
                .collect(),
            callbacks: self
                .callbacks
                .iter()
                .map(|c| CallbackSpec {
                    match_hosts: c.match_hosts.clone(),
                    url: c.url.clone(),
                    ttl_seconds: c.ttl_seconds,
                    request_headers: c.request_headers.iter().map(header).collect(),
                    full_request: c.full_request == Some(true),
                })
                .collect(),
            description: self.description.clone(),
        }
    }

    /// A stored spec in LangSmith's terms, as stored (sealed `opaque`
    /// values in `value`; [`Self::redacted`] before showing it). The
    /// inverse of [`Self::to_spec`] up to spelling: an omitted `enabled`
    /// comes back `true`, empty `env_vars` omitted.
    pub fn from_spec(spec: &EgressSpec) -> ProxyConfig {
        let header = |h: &HeaderSpec| {
            let (kind, value) = wire_value(&h.value);
            ProxyHeader {
                name: h.name.clone(),
                kind,
                value: Some(value),
                is_set: None,
            }
        };
        ProxyConfig {
            rules: spec
                .rules
                .iter()
                .map(|r| ProxyRule {
                    name: r.name.clone(),
                    enabled: Some(r.enabled),
                    description: r.description.clone(),
                    match_hosts: r.match_hosts.clone(),
                    match_paths: r.match_paths.clone(),
                    match_headers: r.match_headers.clone(),
                    headers: r.headers.iter().map(header).collect(),
                    env_vars: (!r.env.is_empty()).then(|| r.env.clone()),
                    kind: (r.aws.is_some() || r.aws_role.is_some())
                        .then(|| "aws".to_owned())
                        .or_else(|| r.gcp.as_ref().map(|_| "gcp".to_owned())),
                    gcp: r.gcp.as_ref().map(|g| ProxyGcp {
                        service_account_json: Some(ProxySecret::from_value(
                            &g.service_account_json,
                        )),
                        scopes: (!g.scopes.is_empty()).then(|| g.scopes.clone()),
                        ..ProxyGcp::default()
                    }),
                    aws: match (&r.aws, &r.aws_role) {
                        (Some(a), _) => Some(ProxyAws {
                            access_key_id: Some(ProxySecret::from_value(&a.access_key_id)),
                            secret_access_key: Some(ProxySecret::from_value(&a.secret_access_key)),
                            ..ProxyAws::default()
                        }),
                        (None, Some(role)) => Some(ProxyAws {
                            role_arn: Some(role.role_arn.clone()),
                            session_tags: (!role.session_tags.is_empty()).then(|| {
                                role.session_tags
                                    .iter()
                                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                                    .collect()
                            }),
                            ..ProxyAws::default()
                        }),
                        (None, None) => None,
                    },
                    rewrite: r.rewrite.as_ref().map(|rw| ProxyRewrite {
                        host: Some(rw.host.clone()),
                        port: Some(rw.port),
                        sandbox: None,
                        credentials: Some(
                            match rw.credentials {
                                Credentials::Strip => "strip",
                                Credentials::Redact => "redact",
                                Credentials::Keep => "keep",
                            }
                            .to_owned(),
                        ),
                    }),
                    ..ProxyRule::default()
                })
                .collect(),
            callbacks: spec
                .callbacks
                .iter()
                .map(|c| ProxyCallback {
                    match_hosts: c.match_hosts.clone(),
                    url: c.url.clone(),
                    ttl_seconds: c.ttl_seconds,
                    full_request: c.full_request.then_some(true),
                    request_headers: c.request_headers.iter().map(header).collect(),
                })
                .collect(),
            access_control: spec.access.as_ref().map(|a| match a {
                AccessSpec::AllowList(l) => AccessControl {
                    allow_list: Some(l.clone()),
                    deny_list: None,
                },
                AccessSpec::DenyList(l) => AccessControl {
                    allow_list: None,
                    deny_list: Some(l.clone()),
                },
            }),
            no_proxy: Vec::new(),
            description: spec.description.clone(),
        }
    }

    /// The config as reads return it: `opaque` values are never sent back,
    /// only `is_set: true`, wherever they appear (headers, and secret objects
    /// such as `{"type": "opaque", "value": …}` inside provider blocks).
    pub fn redacted(&self) -> ProxyConfig {
        let mut out = self.clone();
        for rule in &mut out.rules {
            rule.headers.iter_mut().for_each(redact_header);
            rule.credentials_mut().for_each(|(_, s)| s.redact());
            if let Some(block) = &mut rule.azure {
                redact_object(block);
            }
        }
        for cb in &mut out.callbacks {
            cb.request_headers.iter_mut().for_each(redact_header);
        }
        out
    }

    /// After a create, or an update applied over the stored config: every
    /// header has its value. An opaque header sent without a value keeps
    /// the stored one, so without one (on a create, or a header the sandbox
    /// did not have) it is refused.
    pub fn check_values_present(&self) -> Result<(), ApiError> {
        let rules = self.rules.iter().enumerate().flat_map(|(i, r)| {
            r.headers
                .iter()
                .enumerate()
                .map(move |(j, h)| (format!("proxy_config.rules[{i}].headers[{j}]"), h))
        });
        let callbacks = self.callbacks.iter().enumerate().flat_map(|(i, c)| {
            c.request_headers.iter().enumerate().map(move |(j, h)| {
                (
                    format!("proxy_config.callbacks[{i}].request_headers[{j}]"),
                    h,
                )
            })
        });
        for (at, h) in rules.chain(callbacks) {
            if h.value.is_none() {
                return Err(ApiError::validation(
                    &format!("{at}.is_set"),
                    format!("{at}.is_set: keeping a stored value is not supported here: the sandbox has no stored value for this header; send its value"),
                ));
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            for (name, secret) in rule.credentials() {
                if secret.value.is_none() {
                    let at = format!("proxy_config.rules[{i}].{name}");
                    return Err(ApiError::validation(
                        &format!("{at}.is_set"),
                        format!("{at}.is_set: the sandbox has no stored value for this credential; send its value"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Applies an update's config over this (stored) one: the update
    /// replaces the whole config, but an `opaque` header sent without a
    /// value keeps the stored value of the same rule and header name, so
    /// rotating one secret does not require re-sending the others.
    pub fn replaced_by(&self, update: &ProxyConfig) -> ProxyConfig {
        let mut out = update.clone();
        for rule in &mut out.rules {
            let Some(old_rule) = self.rules.iter().find(|r| r.name == rule.name) else {
                continue;
            };
            for (name, secret) in rule.credentials_mut() {
                if secret.kind != SecretKind::Opaque || secret.value.is_some() {
                    continue;
                }
                if let Some((_, old)) = old_rule
                    .credentials()
                    .find(|(n, o)| *n == name && o.kind == SecretKind::Opaque)
                {
                    secret.value = old.value.clone();
                }
            }
            for h in &mut rule.headers {
                if h.kind != SecretKind::Opaque || h.value.is_some() {
                    continue;
                }
                if let Some(old) = old_rule
                    .headers
                    .iter()
                    .find(|o| o.name == h.name && o.kind == SecretKind::Opaque)
                {
                    h.value = old.value.clone();
                }
            }
        }
        // A callback's opaque request headers likewise, by its URL.
        for cb in &mut out.callbacks {
            let Some(old_cb) = self.callbacks.iter().find(|c| c.url == cb.url) else {
                continue;
            };
            for h in &mut cb.request_headers {
                if h.kind != SecretKind::Opaque || h.value.is_some() {
                    continue;
                }
                if let Some(old) = old_cb
                    .request_headers
                    .iter()
                    .find(|o| o.name == h.name && o.kind == SecretKind::Opaque)
                {
                    h.value = old.value.clone();
                }
            }
        }
        out
    }
}

impl ProxyRule {
    /// The rule's credentials (provider keys), by their path in the rule.
    pub fn credentials_mut(&mut self) -> impl Iterator<Item = (&'static str, &mut ProxySecret)> {
        let aws = self.aws.iter_mut().flat_map(|a| {
            a.secrets_mut().map(|(n, s)| {
                let path = match n {
                    "access_key_id" => "aws.access_key_id",
                    _ => "aws.secret_access_key",
                };
                (path, s)
            })
        });
        let gcp = self
            .gcp
            .iter_mut()
            .filter_map(|g| g.service_account_json.as_mut())
            .map(|s| ("gcp.service_account_json", s));
        aws.chain(gcp)
    }

    /// [`ProxyRule::credentials_mut`], read only.
    pub fn credentials(&self) -> impl Iterator<Item = (&'static str, &ProxySecret)> {
        let aws = self.aws.iter().flat_map(|a| {
            a.secrets().map(|(n, s)| {
                let path = match n {
                    "access_key_id" => "aws.access_key_id",
                    _ => "aws.secret_access_key",
                };
                (path, s)
            })
        });
        let gcp = self
            .gcp
            .iter()
            .filter_map(|g| g.service_account_json.as_ref())
            .map(|s| ("gcp.service_account_json", s));
        aws.chain(gcp)
    }

    /// Refuses what the proxy would not do: provider credentials, relays,
    /// rewrites, rule types other than header injection, and a header rule
    /// that names no host (it would match nothing).
    fn refuse_unsupported(&self, at: &str) -> Result<(), ApiError> {
        let refuse = |field: &str, why: &str| {
            Err(ApiError::validation(
                &format!("{at}.{field}"),
                format!("{at}.{field}: {why}"),
            ))
        };
        if self.aws.is_some() && self.gcp.is_some() {
            return refuse(
                "gcp",
                "a rule has one provider: put aws and gcp in rules of their own",
            );
        }
        if let Some(aws) = &self.aws {
            aws.check(&format!("{at}.aws"))?;
            if self.rewrite.is_some() {
                return refuse(
                    "rewrite",
                    "an aws rule signs requests for the host they name; it cannot also rewrite them",
                );
            }
            if !matches!(self.kind.as_deref(), None | Some("aws")) {
                return refuse("type", "a rule with aws credentials is of type aws");
            }
            if !self.headers.is_empty() {
                return refuse(
                    "headers",
                    "an aws rule signs requests; put headers in a rule of their own",
                );
            }
            // Its hosts default to AWS's own (`*.amazonaws.com`); any
            // given (an S3-compatible endpoint) replace them.
            return Ok(());
        }
        if let Some(gcp) = &self.gcp {
            gcp.check(&format!("{at}.gcp"))?;
            if self.rewrite.is_some() {
                return refuse("rewrite", "a gcp rule authenticates requests to Google's APIs; it cannot also rewrite them");
            }
            if !matches!(self.kind.as_deref(), None | Some("gcp")) {
                return refuse("type", "a rule with gcp credentials is of type gcp");
            }
            if !self.headers.is_empty() {
                return refuse(
                    "headers",
                    "a gcp rule sets Authorization; put headers in a rule of their own",
                );
            }
            // Its hosts default to Google's APIs (`*.googleapis.com`).
            return Ok(());
        }
        if self.azure.is_some() {
            return refuse("azure", "Azure credential rules are not supported by Hearth yet; the proxy would add no token");
        }
        if self.relay_id.is_some() {
            return refuse("relay_id", "relays are not supported by Hearth");
        }
        if let Some(rw) = &self.rewrite {
            if rw.sandbox.is_some() {
                return refuse(
                    "rewrite.sandbox",
                    "rewriting to another sandbox is not supported (it needs sandbox links, which Hearth does not have); rewrite to an HTTPS host",
                );
            }
            if rw.host.as_deref().is_none_or(|h| h.trim().is_empty()) {
                return refuse(
                    "rewrite.host",
                    "is required (the HTTPS host requests are sent to)",
                );
            }
            if rw.port.is_none_or(|p| p == 0) {
                return refuse("rewrite.port", "is required, 1-65535");
            }
            if let Some(c) = &rw.credentials {
                if !matches!(c.as_str(), "strip" | "redact" | "keep") {
                    return refuse("rewrite.credentials", "must be strip, redact or keep");
                }
            }
        }
        match self.kind.as_deref() {
            None | Some("") | Some("headers") => {}
            Some("aws") => return refuse("aws", "a rule of type aws needs its aws credentials"),
            Some("gcp") => {
                return refuse("gcp", "a rule of type gcp needs its gcp service account")
            }
            Some("attribution") => {
                return refuse("type", "attribution rules are not supported by Hearth yet");
            }
            Some(other) => {
                let why =
                    format!("{other:?} rules are not supported by Hearth (header rules only)");
                return refuse("type", &why);
            }
        }
        if self.match_hosts.is_empty() {
            return refuse(
                "match_hosts",
                "a header rule needs at least one host; without one it matches nothing",
            );
        }
        Ok(())
    }
}

fn check_header(at: &str, h: &ProxyHeader) -> Result<(), ApiError> {
    if h.name.trim().is_empty() {
        return Err(ApiError::validation(
            &format!("{at}.name"),
            format!("{at}.name must be non-empty"),
        ));
    }
    // Only an opaque value can be kept from the stored config (`is_set`
    // without a value, on an update); any other header without a value
    // would send nothing.
    if h.is_set.is_some() && h.kind != SecretKind::Opaque {
        return Err(ApiError::validation(
            &format!("{at}.is_set"),
            format!("{at}.is_set is not supported on a header that is not opaque (it keeps a stored opaque value)"),
        ));
    }
    if h.value.is_none() && h.kind != SecretKind::Opaque {
        return Err(ApiError::validation(
            &format!("{at}.value"),
            format!("{at}.value is required (only an opaque header's stored value is kept)"),
        ));
    }
    Ok(())
}

fn redact_header(h: &mut ProxyHeader) {
    redact_secret(h.kind, &mut h.value, &mut h.is_set);
}

fn redact_object(obj: &mut JsonObject) {
    let is_opaque = obj.get("type").and_then(Value::as_str) == Some("opaque");
    if is_opaque {
        if obj.remove("value").is_some() {
            obj.insert("is_set".to_owned(), Value::Bool(true));
        }
        return;
    }
    for v in obj.values_mut() {
        redact_value(v);
    }
}

fn redact_value(v: &mut Value) {
    match v {
        Value::Object(o) => redact_object(o),
        Value::Array(a) => a.iter_mut().for_each(redact_value),
        _ => {}
    }
}

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
            let path = check_mount_path(&format!("{at}.mount_path"), &m.mount_path)?;
            if let Some(other) = paths
                .iter()
                .find(|p| nested_path(p, &path) || nested_path(&path, p))
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
    pub fn from_specs(specs: &[MountSpec], rules: &[RuleSpec]) -> Option<Self> {
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

/// Whether `inner` is `outer` or below it.
fn nested_path(outer: &str, inner: &str) -> bool {
    let outer = outer.trim_end_matches('/');
    inner.trim_end_matches('/') == outer || inner.starts_with(&format!("{outer}/"))
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

/// A mount's path in the guest, normalised: absolute, no `.`/`..`, and
/// not a directory the system needs (`/`, `/proc`, `/sys`, `/dev`, `/run`,
/// `/etc`, `/bin`, `/sbin`, `/lib*`, `/usr`, `/boot`, `/tmp` and below).
fn check_mount_path(field: &str, path: &str) -> Result<String, ApiError> {
    check_absolute_path(field, path)?;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") || path.len() > 1024 {
        return Err(ApiError::validation(
            field,
            format!("{field} must be a plain absolute path (no '.' or '..', at most 1024 bytes), got '{path}'"),
        ));
    }
    const SYSTEM: &[&str] = &[
        "proc", "sys", "dev", "run", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
        "usr", "boot", "tmp",
    ];
    match parts.first() {
        None => Err(ApiError::validation(field, format!("{field} cannot be '/'"))),
        Some(top) if SYSTEM.contains(top) => Err(ApiError::validation(
            field,
            format!("{field}: '{path}' is under /{top}, which the system needs; mount somewhere else (e.g. /mnt/…)"),
        )),
        Some(_) => Ok(format!("/{}", parts.join("/"))),
    }
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

/// Checks a create's `volumes`: at most [`MAX_VOLUMES`], each naming exactly
/// one volume, at distinct absolute mount paths.
pub fn validate_volumes(volumes: &[VolumeMountRequest]) -> Result<(), ApiError> {
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
    }
    if !volumes.is_empty() {
        return Err(ApiError::validation(
            "volumes",
            "volumes: named volumes are not supported by Hearth yet; nothing would be attached",
        ));
    }
    Ok(())
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
