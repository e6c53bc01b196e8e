//! A sandbox's egress as Hearth describes it, whichever API it came in
//! through: what the sandbox may reach, which headers are added for which
//! requests (their values still sealed or templated), which callbacks
//! resolve headers, and the environment the rules give the guest. A front
//! door (LangSmith's `proxy_config`, later E2B's network options) parses
//! into this; the egress proxy builds its policy from it, resolving the
//! secrets only then. Names of fields follow the API's where they mean the
//! same, so an error's path reads the same at either end.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where the sandbox may go, and what the proxy adds on the way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSpec {
    pub access: Option<AccessSpec>,
    /// Header rules in order; the first that matches a request wins.
    pub rules: Vec<RuleSpec>,
    pub callbacks: Vec<CallbackSpec>,
    /// The owner's note, kept and shown, never acted on.
    pub description: Option<String>,
}

/// An allow list or a deny list of host patterns (exact names, `*.globs`,
/// IPs, CIDRs, `~regex`), or a deny list with exceptions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessSpec {
    AllowList(Vec<String>),
    DenyList(Vec<String>),
    /// Everything but `deny`, where `allow` takes precedence (E2B's
    /// `denyOut` with `allowOut`).
    DenyExcept {
        deny: Vec<String>,
        allow: Vec<String>,
    },
}

/// A header-injection rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub name: String,
    /// The owner's note, kept and shown, never acted on.
    pub description: Option<String>,
    /// A disabled rule is kept (and reported) but does nothing.
    pub enabled: bool,
    pub match_hosts: Vec<String>,
    /// Any one must match the request's path; empty = every path.
    pub match_paths: Vec<String>,
    /// `"name: value"`: every one must be on the request.
    pub match_headers: Vec<String>,
    pub headers: Vec<HeaderSpec>,
    /// Plaintext environment for the guest while the rule is enabled.
    pub env: BTreeMap<String, String>,
    /// Sign matching requests with these AWS keys (SigV4) instead of
    /// adding headers; `match_hosts` empty = AWS's own hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsSpec>,
    /// Sign matching requests with a session of this IAM role, which the
    /// operator's AWS identity assumes (the workspace's id as external id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_role: Option<AwsRoleSpec>,
    /// Authenticate matching requests with OAuth access tokens minted from
    /// a GCP service account key; `match_hosts` empty = Google's APIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp: Option<GcpSpec>,
    /// Send matching requests to another HTTPS destination instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<RewriteSpec>,
    /// What a bucket mount's rule may sign: a request the rule matches
    /// outside it is refused by the proxy (never sent, signed or not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<BucketScope>,
}

/// A bucket mount's limits on its rule's credential: its `read_only` and
/// its key `prefix`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketScope {
    pub api: BucketApi,
    pub bucket: String,
    /// Only reads (`GET`, `HEAD`) are signed.
    pub read_only: bool,
    /// Only keys under this prefix (no surrounding slashes) are signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// How a bucket's requests name the bucket and its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketApi {
    /// S3, `/{bucket}/{key}` (path style).
    S3PathStyle,
    /// S3, `{bucket}.host/{key}` (virtual-hosted).
    S3VirtualHost,
    /// GCS's JSON API (`/storage/v1/b/{bucket}/o/{object}` and its upload
    /// and download paths).
    Gcs,
}

/// A GCP service account key (its JSON, sealed or templated) and the
/// scopes of the tokens minted from it (empty: cloud-platform).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpSpec {
    pub service_account_json: SecretValue,
    pub scopes: Vec<String>,
}

/// Where a rewrite rule sends the requests it matches: `https://host:port`
/// (the path and query kept), with the rule's headers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewriteSpec {
    pub host: String,
    pub port: u16,
    pub credentials: Credentials,
}

/// What a rewrite does with the credential headers the guest sent
/// (`Authorization`, `Proxy-Authorization`, `Cookie`, API-key headers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credentials {
    /// Removed.
    #[default]
    Strip,
    /// Kept with the value replaced by `redacted` (after an auth scheme).
    Redact,
    /// Forwarded unchanged.
    Keep,
}

/// Static AWS credentials a rule signs with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsSpec {
    pub access_key_id: SecretValue,
    pub secret_access_key: SecretValue,
}

/// An IAM role a rule's sessions assume, with the session's tags.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsRoleSpec {
    pub role_arn: String,
    pub session_tags: BTreeMap<String, String>,
}

/// A header and where its value comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderSpec {
    pub name: String,
    pub value: SecretValue,
}

/// A header's value as stored: resolved only when a host needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretValue {
    /// Configuration, not a secret: may also travel over plain HTTP.
    Plain(String),
    /// Sealed under the control plane's master key.
    Sealed(String),
    /// `{NAME}` references filled from the workspace's secrets.
    Template(String),
}

impl SecretValue {
    /// Whether the value is configuration rather than a secret.
    pub fn is_plain(&self) -> bool {
        matches!(self, Self::Plain(_))
    }
}

/// A callback that resolves headers for matching hosts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackSpec {
    pub match_hosts: Vec<String>,
    pub url: String,
    pub ttl_seconds: i64,
    /// Sent with the callback's request.
    pub request_headers: Vec<HeaderSpec>,
    /// Send the callback the request it is asked about (method, URL,
    /// headers, the body's first 64 KiB), not only its host and port.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full_request: bool,
}

impl CallbackSpec {
    /// How long a callback's answer may be cached, in seconds: the one
    /// range both the API doors and the egress proxy hold it to.
    pub const TTL_SECONDS: std::ops::RangeInclusive<i64> = 60..=3600;
}

impl EgressSpec {
    /// The guest's environment from the enabled rules (the first rule that
    /// sets a name wins).
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for rule in self.rules.iter().filter(|r| r.enabled) {
            for (k, v) in &rule.env {
                env.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        env
    }

    /// Every secret's value (rules' headers and keys, callbacks' headers).
    pub fn values(&self) -> impl Iterator<Item = &SecretValue> {
        self.rules
            .iter()
            .flat_map(|r| r.headers.iter())
            .chain(self.callbacks.iter().flat_map(|c| c.request_headers.iter()))
            .map(|h| &h.value)
            .chain(
                self.rules
                    .iter()
                    .filter_map(|r| r.aws.as_ref())
                    .flat_map(|a| [&a.access_key_id, &a.secret_access_key]),
            )
            .chain(
                self.rules
                    .iter()
                    .filter_map(|r| r.gcp.as_ref())
                    .map(|g| &g.service_account_json),
            )
    }
}

/// A sandbox's resolved egress policy as the host API carries it: a
/// document the control plane writes from the proxy's policy
/// (`hearth_egress::Policy::to_document`) and the host's proxy reads back
/// (`Policy::from_document`). The host API only carries it, so it does not
/// name the proxy's types; a host whose proxy cannot read it refuses the
/// command that brought it. It holds the secrets the proxy injects, so its
/// `Debug` shows only its size.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PolicyDocument(serde_json::Value);

impl PolicyDocument {
    pub fn new(value: serde_json::Value) -> Self {
        Self(value)
    }

    pub fn as_value(&self) -> &serde_json::Value {
        &self.0
    }
}

/// The empty document: the default policy (every public destination,
/// nothing injected).
impl Default for PolicyDocument {
    fn default() -> Self {
        Self(serde_json::Value::Object(serde_json::Map::new()))
    }
}

impl std::fmt::Debug for PolicyDocument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.0.as_object().map_or(0, serde_json::Map::len);
        write!(f, "PolicyDocument({keys} fields, secrets not shown)")
    }
}

/// A snapshot of one sandbox's egress counters, as its host reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressCounters {
    /// Guest → upstream (as read from the guest, TLS included).
    pub bytes_out: u64,
    /// Upstream → guest.
    pub bytes_in: u64,
    pub connections_allowed: u64,
    pub connections_refused: u64,
    pub dns_queries: u64,
    pub dns_refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_documents_debug_shows_no_secret() {
        let doc = PolicyDocument::new(
            serde_json::json!({"rules": [{"headers": [["x-api-key", "s3cret"]]}]}),
        );
        let shown = format!("{doc:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(shown, "PolicyDocument(1 fields, secrets not shown)");
    }
}
