//! `proxy_config`: the egress proxy's access list, header rules, cloud
//! signing, rewrites and callbacks, as LangSmith's body gives them, checked
//! and turned into Hearth's `EgressSpec`.

use std::collections::{BTreeMap, BTreeSet};

use hearth_types::egress::{
    AccessSpec, AwsRoleSpec, AwsSpec, CallbackSpec, Credentials, EgressSpec, GcpSpec, HeaderSpec,
    RewriteSpec, RuleSpec, SecretValue,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::validate::{check_env_vars, check_max_chars};

use super::*;

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
    pub(super) fn check(&self, at: &str) -> Result<(), ApiError> {
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
                // E2B's door makes it; LangSmith's reads show both lists.
                AccessSpec::DenyExcept { deny, allow } => AccessControl {
                    allow_list: Some(allow.clone()),
                    deny_list: Some(deny.clone()),
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
    pub(super) fn refuse_unsupported(&self, at: &str) -> Result<(), ApiError> {
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
