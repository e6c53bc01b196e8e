//! A sandbox's resolved egress policy, built from Hearth's own description
//! of its egress ([`EgressSpec`]), whichever API it came in through.

use std::fmt;
use std::net::IpAddr;

use hearth_types::egress::{
    AccessSpec, Credentials, EgressSpec, HeaderSpec, PolicyDocument, SecretValue,
};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::pattern::{check_path_glob, normalize_name, path_glob_matches, HostPattern};

/// Why a spec cannot become a policy; `field` is the path within the spec
/// (`access_control.allow_list[2]`), which the API prefixes with its own
/// field (`proxy_config.`) in its 422.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        message: message.into(),
    }
}

/// The egress policy of one sandbox with every secret already substituted.
/// Serializable because it travels from the control plane to the host.
/// `Policy::default()` allows every public destination and injects nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<Access>,
    /// Enabled header rules, in order; the first match wins.
    #[serde(default)]
    pub rules: Vec<HeaderRule>,
    #[serde(default)]
    pub callbacks: Vec<Callback>,
    /// The workspace the sandbox belongs to, named in the callbacks the
    /// proxy signs (`identity.tenant_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// Requests to [`DELEGATION_HOST`](crate::DELEGATION_HOST) go to the
    /// control plane as the sandbox's creator (`access_delegation`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delegation: bool,
}

/// `access_control`: an allow list or a deny list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    AllowList(Vec<HostPattern>),
    DenyList(Vec<HostPattern>),
    /// Everything but `deny`; what `allow` matches passes whatever `deny`
    /// says.
    DenyExcept {
        deny: Vec<HostPattern>,
        allow: Vec<HostPattern>,
    },
}

/// One enabled header-injection rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeaderRule {
    pub name: String,
    /// Empty = the rule matches no host.
    pub match_hosts: Vec<HostPattern>,
    /// Any one must match the request path; empty = every path.
    #[serde(default)]
    pub match_paths: Vec<String>,
    /// Every `(lowercase name, exact value)` must be present.
    #[serde(default)]
    pub match_headers: Vec<(String, String)>,
    /// Set on the upstream request, replacing same-name headers.
    pub headers: Vec<(String, String)>,
    /// Names of `headers` whose every value is `plaintext` configuration:
    /// the only ones set on a plain-HTTP request. Values from secrets
    /// (`opaque`, `workspace_secret`) travel only inside TLS, where the
    /// upstream proved it is the host the rule names. LangSmith's rule has
    /// no field to opt a secret in to plain HTTP, so none can. Absent
    /// (a policy from an older control plane): nothing goes over plain HTTP.
    #[serde(default)]
    pub plaintext_headers: Vec<String>,
    /// Re-sign matching requests (AWS SigV4) with these keys; only over
    /// TLS, like every secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsKeys>,
    /// Re-sign matching requests with a session of this IAM role (assumed
    /// with the operator's AWS identity); only over TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_role: Option<AwsRole>,
    /// Send matching requests to `https://host:port` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    /// Set `Authorization: Bearer` from this GCP service account's OAuth
    /// tokens; only over TLS, like every secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp: Option<GcpKey>,
    /// A bucket mount's limits: a matching request outside them is refused
    /// ([`crate::bucket_scope`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<hearth_types::egress::BucketScope>,
}

/// A GCP rule's service account key (its JSON, resolved) and scopes.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct GcpKey {
    pub service_account_json: String,
    pub scopes: Vec<String>,
}

impl fmt::Debug for GcpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcpKey")
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// The hosts a GCP rule matches when it names none: Google's APIs.
pub const GCP_HOSTS: &[&str] = &["*.googleapis.com"];

/// A rewrite rule's destination (always HTTPS, its certificate checked)
/// and what happens to the guest's credential headers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rewrite {
    pub host: String,
    pub port: u16,
    pub credentials: Credentials,
}

/// The headers a rewrite's `credentials` treats as the guest's credentials.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-goog-api-key",
    "x-amz-security-token",
];

impl Rewrite {
    /// Applies `credentials` to the guest's headers.
    pub fn treat_credentials(&self, headers: &mut HeaderMap) {
        for name in CREDENTIAL_HEADERS {
            match self.credentials {
                Credentials::Keep => {}
                Credentials::Strip => {
                    headers.remove(*name);
                }
                Credentials::Redact => {
                    let redacted: Vec<HeaderValue> = headers
                        .get_all(*name)
                        .iter()
                        .map(|v| {
                            let text = String::from_utf8_lossy(v.as_bytes());
                            let value = match text.split_once(' ') {
                                // An auth scheme (`Bearer`, `Basic`) is kept.
                                Some((scheme, _)) if !scheme.is_empty() && *name != "cookie" => {
                                    format!("{scheme} redacted")
                                }
                                _ => "redacted".to_owned(),
                            };
                            HeaderValue::from_str(&value)
                                .unwrap_or(HeaderValue::from_static("redacted"))
                        })
                        .collect();
                    headers.remove(*name);
                    for v in redacted {
                        headers.append(*name, v);
                    }
                }
            }
        }
    }
}

/// An AWS rule's static keys, resolved.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct AwsKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// A role session's token (`x-amz-security-token`); none for static keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

impl fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsKeys")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// An IAM role a rule's sessions assume, and the sessions' tags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AwsRole {
    pub role_arn: String,
    #[serde(default)]
    pub session_tags: Vec<(String, String)>,
}

/// The hosts an AWS rule matches when it names none: AWS's own.
pub const AWS_HOSTS: &[&str] = &["*.amazonaws.com", "amazonaws.com"];

/// One header callback.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Callback {
    pub match_hosts: Vec<HostPattern>,
    /// Absolute `http://` or `https://` URL.
    pub url: String,
    pub ttl_seconds: u64,
    /// Sent with the callback POST.
    #[serde(default)]
    pub request_headers: Vec<(String, String)>,
    /// The request itself goes with the callback's POST (`request`).
    #[serde(default)]
    pub full_request: bool,
}

/// Why a destination is refused; Display is the reason guests read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotAllowed { host: String },
    Denied { host: String },
    Private { host: String, ip: IpAddr },
    TooManyConnections,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotAllowed { host } => {
                write!(f, "{host:?} is not in this sandbox's allow_list")
            }
            Refusal::Denied { host } => write!(f, "{host:?} is in this sandbox's deny_list"),
            Refusal::Private { host, ip } => write!(f, "{host:?} is a private address ({ip})"),
            Refusal::TooManyConnections => {
                write!(f, "this sandbox has too many open connections")
            }
        }
    }
}

/// What the name alone decides, before any address is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameVerdict {
    Allowed,
    Refused(Refusal),
    /// Allowed only if the address matches an allow_list IP/CIDR.
    NeedsAddress,
}

impl Policy {
    /// This policy as the host API carries it.
    pub fn to_document(&self) -> Result<PolicyDocument, serde_json::Error> {
        serde_json::to_value(self).map(PolicyDocument::new)
    }

    /// The policy a document carries; an error names what it could not read.
    pub fn from_document(doc: &PolicyDocument) -> Result<Policy, serde_json::Error> {
        Policy::deserialize(doc.as_value())
    }

    /// Builds the policy from a sandbox's egress spec. `resolve` turns a
    /// header's stored value into the real one (plaintext as is, sealed
    /// opened, templates filled from the workspace's secrets); its error is
    /// reported against the header's field. Disabled rules are dropped.
    pub fn from_spec(
        spec: &EgressSpec,
        resolve: &mut dyn FnMut(&SecretValue) -> Result<String, String>,
    ) -> Result<Policy, PolicyError> {
        let access = match &spec.access {
            None => None,
            Some(AccessSpec::AllowList(list)) => Some(Access::AllowList(patterns(
                "access_control.allow_list",
                list,
            )?)),
            Some(AccessSpec::DenyList(list)) => Some(Access::DenyList(patterns(
                "access_control.deny_list",
                list,
            )?)),
            Some(AccessSpec::DenyExcept { deny, allow }) => Some(Access::DenyExcept {
                deny: patterns("access_control.deny_list", deny)?,
                allow: patterns("access_control.allow_list", allow)?,
            }),
        };
        let mut rules = Vec::new();
        for (i, rule) in spec.rules.iter().enumerate() {
            let at = format!("rules[{i}]");
            let mut match_hosts = patterns(&format!("{at}.match_hosts"), &rule.match_hosts)?;
            let aws = match &rule.aws {
                None => None,
                Some(a) => {
                    if match_hosts.is_empty() {
                        let own: Vec<String> = AWS_HOSTS.iter().map(|h| (*h).to_owned()).collect();
                        match_hosts = patterns(&format!("{at}.match_hosts"), &own)?;
                    }
                    let mut key = |field: &str, v: &SecretValue| {
                        let value = resolve(v).map_err(|m| err(format!("{at}.aws.{field}"), m))?;
                        if value.is_empty() || value.chars().any(|c| c.is_control() || c == ' ') {
                            return Err(err(format!("{at}.aws.{field}"), "is not a valid AWS key"));
                        }
                        Ok(value)
                    };
                    Some(AwsKeys {
                        access_key_id: key("access_key_id", &a.access_key_id)?,
                        secret_access_key: key("secret_access_key", &a.secret_access_key)?,
                        session_token: None,
                    })
                }
            };
            let aws_role = match &rule.aws_role {
                None => None,
                Some(r) => {
                    if match_hosts.is_empty() {
                        let own: Vec<String> = AWS_HOSTS.iter().map(|h| (*h).to_owned()).collect();
                        match_hosts = patterns(&format!("{at}.match_hosts"), &own)?;
                    }
                    Some(AwsRole {
                        role_arn: r.role_arn.clone(),
                        session_tags: r.session_tags.clone().into_iter().collect(),
                    })
                }
            };
            let gcp = match &rule.gcp {
                None => None,
                Some(g) => {
                    if match_hosts.is_empty() {
                        let own: Vec<String> = GCP_HOSTS.iter().map(|h| (*h).to_owned()).collect();
                        match_hosts = patterns(&format!("{at}.match_hosts"), &own)?;
                    }
                    let json = resolve(&g.service_account_json)
                        .map_err(|m| err(format!("{at}.gcp.service_account_json"), m))?;
                    Some(GcpKey {
                        service_account_json: json,
                        scopes: g.scopes.clone(),
                    })
                }
            };
            let rewrite = match &rule.rewrite {
                None => None,
                Some(rw) => {
                    let host = rw.host.trim().trim_matches(['[', ']']);
                    let host = crate::pattern::parse_ip(host)
                        .map(|ip| ip.to_string())
                        .or_else(|| normalize_name(host))
                        .ok_or_else(|| {
                            err(
                                format!("{at}.rewrite.host"),
                                "must be a host name or IP address (no scheme, port or path)",
                            )
                        })?;
                    if rw.port == 0 {
                        return Err(err(format!("{at}.rewrite.port"), "must be 1-65535"));
                    }
                    Some(Rewrite {
                        host,
                        port: rw.port,
                        credentials: rw.credentials,
                    })
                }
            };
            for (j, g) in rule.match_paths.iter().enumerate() {
                check_path_glob(g).map_err(|m| err(format!("{at}.match_paths[{j}]"), m))?;
            }
            let mut match_headers = Vec::new();
            for (j, h) in rule.match_headers.iter().enumerate() {
                let field = format!("{at}.match_headers[{j}]");
                let (name, value) = h
                    .split_once(':')
                    .ok_or_else(|| err(&field, "must be \"name: value\""))?;
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
                check_header_pair(&field, &name, &value)?;
                match_headers.push((name, value));
            }
            let headers = resolve_headers(&format!("{at}.headers"), &rule.headers, resolve)?;
            let mut plaintext_headers: Vec<String> = Vec::new();
            for (name, _) in &headers {
                let every_plain = rule
                    .headers
                    .iter()
                    .filter(|h| h.name.trim().eq_ignore_ascii_case(name))
                    .all(|h| h.value.is_plain());
                if every_plain && !plaintext_headers.contains(name) {
                    plaintext_headers.push(name.clone());
                }
            }
            if !rule.enabled {
                continue;
            }
            rules.push(HeaderRule {
                name: rule.name.clone(),
                match_hosts,
                match_paths: rule.match_paths.clone(),
                match_headers,
                headers,
                plaintext_headers,
                aws,
                aws_role,
                rewrite,
                gcp,
                scope: rule.scope.clone(),
            });
        }
        let mut callbacks = Vec::new();
        for (i, cb) in spec.callbacks.iter().enumerate() {
            let at = format!("callbacks[{i}]");
            let match_hosts = patterns(&format!("{at}.match_hosts"), &cb.match_hosts)?;
            check_callback_url(&format!("{at}.url"), &cb.url)?;
            let range = hearth_types::egress::CallbackSpec::TTL_SECONDS;
            let ttl_seconds = Some(cb.ttl_seconds)
                .filter(|t| range.contains(t))
                .and_then(|t| u64::try_from(t).ok())
                .ok_or_else(|| {
                    err(
                        format!("{at}.ttl_seconds"),
                        format!("must be between {} and {}", range.start(), range.end()),
                    )
                })?;
            let request_headers = resolve_headers(
                &format!("{at}.request_headers"),
                &cb.request_headers,
                resolve,
            )?;
            callbacks.push(Callback {
                match_hosts,
                url: cb.url.trim().to_owned(),
                ttl_seconds,
                request_headers,
                full_request: cb.full_request,
            });
        }
        Ok(Policy {
            access,
            rules,
            callbacks,
            tenant_id: None,
            delegation: false,
        })
    }

    /// The access-control verdict on a name alone (no private-address check).
    pub fn name_verdict(&self, name: &str) -> NameVerdict {
        match &self.access {
            None => NameVerdict::Allowed,
            Some(Access::DenyList(list)) => {
                if list.iter().any(|p| p.matches_name(name)) {
                    NameVerdict::Refused(Refusal::Denied { host: name.into() })
                } else {
                    NameVerdict::NeedsAddress
                }
            }
            Some(Access::AllowList(list)) => {
                if list.iter().any(|p| p.matches_name(name)) {
                    NameVerdict::Allowed
                } else if list.iter().any(|p| !p.is_name_pattern()) {
                    NameVerdict::NeedsAddress
                } else {
                    NameVerdict::Refused(Refusal::NotAllowed { host: name.into() })
                }
            }
            Some(Access::DenyExcept { deny, allow }) => {
                if allow.iter().any(|p| p.matches_name(name)) {
                    NameVerdict::Allowed
                } else if deny.iter().any(|p| p.matches_name(name))
                    && allow.iter().all(|p| p.is_name_pattern())
                {
                    NameVerdict::Refused(Refusal::Denied { host: name.into() })
                } else {
                    NameVerdict::NeedsAddress
                }
            }
        }
    }

    /// The access-control verdict on a connection to `ip`, known as `name`
    /// when a name is known: allow_list passes if the name or the address
    /// matches; deny_list refuses if either matches.
    pub fn check(&self, name: Option<&str>, ip: IpAddr) -> Result<(), Refusal> {
        let host = name.map_or_else(|| ip.to_string(), str::to_owned);
        match &self.access {
            None => Ok(()),
            Some(Access::AllowList(list)) => {
                let ok = list
                    .iter()
                    .any(|p| p.matches_ip(ip) || name.is_some_and(|n| p.matches_name(n)));
                if ok {
                    Ok(())
                } else {
                    Err(Refusal::NotAllowed { host })
                }
            }
            Some(Access::DenyList(list)) => {
                let hit = list
                    .iter()
                    .any(|p| p.matches_ip(ip) || name.is_some_and(|n| p.matches_name(n)));
                if hit {
                    Err(Refusal::Denied { host })
                } else {
                    Ok(())
                }
            }
            Some(Access::DenyExcept { deny, allow }) => {
                let hit = |list: &[HostPattern]| {
                    list.iter()
                        .any(|p| p.matches_ip(ip) || name.is_some_and(|n| p.matches_name(n)))
                };
                if hit(allow) || !hit(deny) {
                    Ok(())
                } else {
                    Err(Refusal::Denied { host })
                }
            }
        }
    }

    /// Whether some rule or callback could apply to requests to `host`
    /// (decides whether TLS to it is intercepted).
    pub fn could_rewrite(&self, host: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.match_hosts.iter().any(|p| p.matches_name(host)))
            || self.callback_for(host).is_some()
    }

    /// The first rule matching a request, if any.
    pub fn rule_for(&self, host: &str, path: &str, headers: &HeaderMap) -> Option<&HeaderRule> {
        self.rules.iter().find(|r| r.matches(host, path, headers))
    }

    /// Checks what only resolved secrets show: each GCP rule's key is a
    /// service account key Hearth can sign with. For a policy built from
    /// real values (not [`validate_spec`]'s placeholders) from `spec`,
    /// whose fields the errors name.
    pub fn check_credentials(&self, spec: &EgressSpec) -> Result<(), PolicyError> {
        // The policy's rules are the spec's enabled ones, in order.
        let enabled = spec.rules.iter().enumerate().filter(|(_, r)| r.enabled);
        for ((i, _), rule) in enabled.zip(&self.rules) {
            if let Some(g) = &rule.gcp {
                crate::gcp::ServiceAccount::parse(&g.service_account_json)
                    .map_err(|m| err(format!("rules[{i}].gcp.service_account_json"), m))?;
            }
        }
        Ok(())
    }

    /// The first callback matching `host`, with its index.
    pub fn callback_for(&self, host: &str) -> Option<(usize, &Callback)> {
        self.callbacks
            .iter()
            .enumerate()
            .find(|(_, c)| c.match_hosts.iter().any(|p| p.matches_name(host)))
    }
}

impl HeaderRule {
    /// The headers to set on a request that goes upstream over TLS or not.
    pub fn headers_for(&self, tls: bool) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter(|(name, _)| tls || self.plaintext_headers.contains(name))
            .cloned()
            .collect()
    }

    fn matches(&self, host: &str, path: &str, headers: &HeaderMap) -> bool {
        self.match_hosts.iter().any(|p| p.matches_name(host))
            && (self.match_paths.is_empty()
                || self.match_paths.iter().any(|g| path_glob_matches(g, path)))
            && self.match_headers.iter().all(|(name, value)| {
                headers
                    .get_all(name.as_str())
                    .iter()
                    .any(|v| v.as_bytes() == value.as_bytes())
            })
    }
}

/// Checks a `proxy_config` without resolving any secret: patterns, globs,
/// header names and values, callback URLs. The error names the field.
///
/// A callback URL that is private on its face (a special address, or
/// `localhost`) is refused unless inside `allow_private`, the operator's
/// exceptions; names are checked again, resolved, when the host connects.
pub fn validate_spec(spec: &EgressSpec, allow_private: &[ipnet::IpNet]) -> Result<(), PolicyError> {
    // Stored values are checked as they are (templates and sealed values
    // are checked again once resolved, by `Policy::from_spec`).
    let mut placeholder = |v: &SecretValue| {
        let (SecretValue::Plain(s) | SecretValue::Sealed(s) | SecretValue::Template(s)) = v;
        Ok(if s.is_empty() {
            "x".to_owned()
        } else {
            s.clone()
        })
    };
    let policy = Policy::from_spec(spec, &mut placeholder)?;
    for (i, rule) in spec.rules.iter().enumerate() {
        let Some(rw) = &rule.rewrite else { continue };
        if let Some(ip) = crate::private::refused_on_its_face(rw.host.trim(), allow_private) {
            return Err(err(
                format!("rules[{i}].rewrite.host"),
                format!(
                    "names a private address ({ip}); a rewrite reaches only public addresses \
                     and the networks the operator allows ([network] allow_private)"
                ),
            ));
        }
    }
    for (i, cb) in policy.callbacks.iter().enumerate() {
        let host = cb
            .url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_owned))
            .unwrap_or_default();
        if let Some(ip) = crate::private::refused_on_its_face(&host, allow_private) {
            return Err(err(
                format!("callbacks[{i}].url"),
                format!(
                    "names a private address ({ip}); callbacks reach only public addresses \
                     and the networks the operator allows ([network] allow_private)"
                ),
            ));
        }
    }
    Ok(())
}

fn patterns(field: &str, list: &[String]) -> Result<Vec<HostPattern>, PolicyError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| HostPattern::parse(s).map_err(|m| err(format!("{field}[{i}]"), m)))
        .collect()
}

fn resolve_headers(
    field: &str,
    headers: &[HeaderSpec],
    resolve: &mut dyn FnMut(&SecretValue) -> Result<String, String>,
) -> Result<Vec<(String, String)>, PolicyError> {
    let mut out = Vec::new();
    for (j, h) in headers.iter().enumerate() {
        let at = format!("{field}[{j}]");
        let name = h.name.trim().to_ascii_lowercase();
        let value = resolve(&h.value).map_err(|m| err(format!("{at}.value"), m))?;
        check_header_pair(&at, &name, &value)?;
        out.push((name, value));
    }
    Ok(out)
}

fn check_header_pair(field: &str, name: &str, value: &str) -> Result<(), PolicyError> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        err(
            format!("{field}.name"),
            format!("{name:?} is not a valid header name"),
        )
    })?;
    HeaderValue::from_str(value)
        .map_err(|_| err(format!("{field}.value"), "is not a valid header value"))?;
    Ok(())
}

fn check_callback_url(field: &str, url: &str) -> Result<(), PolicyError> {
    let uri: http::Uri = url
        .trim()
        .parse()
        .map_err(|_| err(field, "must be an absolute http(s) URL"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http") | Some("https"));
    let host_ok = uri
        .host()
        .is_some_and(|h| normalize_name(h).is_some() || crate::pattern::parse_ip(h).is_some());
    if !scheme_ok || !host_ok {
        return Err(err(field, "must be an absolute http(s) URL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_api::nested::{
        AccessControl, ProxyCallback, ProxyConfig, ProxyHeader, ProxyRule, SecretKind,
    };

    /// A stored value as it is (what these tests resolve secrets to).
    fn raw(v: &SecretValue) -> String {
        let (SecretValue::Plain(s) | SecretValue::Sealed(s) | SecretValue::Template(s)) = v;
        s.clone()
    }

    fn validate_config(
        cfg: &ProxyConfig,
        allow_private: &[ipnet::IpNet],
    ) -> Result<(), PolicyError> {
        validate_spec(&cfg.to_spec(), allow_private)
    }

    fn plain(name: &str, value: &str) -> ProxyHeader {
        ProxyHeader {
            name: name.into(),
            kind: SecretKind::Plaintext,
            value: Some(value.into()),
            is_set: None,
        }
    }

    fn policy(cfg: &ProxyConfig) -> Policy {
        Policy::from_spec(&cfg.to_spec(), &mut |v| Ok(raw(v))).unwrap()
    }

    fn allow(list: &[&str]) -> ProxyConfig {
        ProxyConfig {
            access_control: Some(AccessControl {
                allow_list: Some(list.iter().map(|s| s.to_string()).collect()),
                deny_list: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn allow_list_by_name_or_address() {
        let p = policy(&allow(&[
            "good.test",
            "*.ok.test",
            "192.0.2.0/24",
            "~api[0-9]\\.x\\.test",
        ]));
        let ip = "203.0.113.1".parse().unwrap();
        assert!(p.check(Some("good.test"), ip).is_ok());
        assert!(p.check(Some("a.b.ok.test"), ip).is_ok());
        assert!(p.check(Some("api7.x.test"), ip).is_ok());
        assert!(p
            .check(Some("any.test"), "192.0.2.7".parse().unwrap())
            .is_ok());
        let refused = p.check(Some("evil.test"), ip).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "\"evil.test\" is not in this sandbox's allow_list"
        );
        assert_eq!(p.name_verdict("evil.test"), NameVerdict::NeedsAddress);
        let names_only = policy(&allow(&["good.test"]));
        assert!(matches!(
            names_only.name_verdict("evil.test"),
            NameVerdict::Refused(_)
        ));
    }

    #[test]
    fn deny_list_by_name_or_address() {
        let cfg = ProxyConfig {
            access_control: Some(AccessControl {
                allow_list: None,
                deny_list: Some(vec!["evil.test".into(), "198.51.100.0/24".into()]),
            }),
            ..Default::default()
        };
        let p = policy(&cfg);
        let ip = "203.0.113.1".parse().unwrap();
        assert!(p.check(Some("fine.test"), ip).is_ok());
        assert_eq!(
            p.check(Some("EVIL.test."), ip).unwrap_err().to_string(),
            "\"EVIL.test.\" is in this sandbox's deny_list"
        );
        assert!(p.check(None, "198.51.100.4".parse().unwrap()).is_err());
        assert!(p
            .check(Some("fine.test"), "198.51.100.4".parse().unwrap())
            .is_err());
    }

    /// E2B's `denyOut` with `allowOut`: what the allow list matches
    /// passes whatever the deny list says; the rest of the deny list is
    /// refused; everything else passes.
    #[test]
    fn a_deny_list_with_exceptions_lets_the_exceptions_through() {
        let spec = hearth_types::egress::EgressSpec {
            access: Some(AccessSpec::DenyExcept {
                deny: vec!["10.0.0.0/8".into(), "evil.test".into()],
                allow: vec!["10.1.2.3".into(), "ok.evil.test".into()],
            }),
            ..Default::default()
        };
        let p = Policy::from_spec(&spec, &mut |v| Ok(raw(v))).unwrap();
        let ip = |s: &str| s.parse().unwrap();
        assert!(p.check(None, ip("10.1.2.3")).is_ok());
        assert!(p.check(None, ip("10.9.9.9")).is_err());
        assert!(p.check(Some("elsewhere.test"), ip("203.0.113.1")).is_ok());
        assert!(p.check(Some("evil.test"), ip("203.0.113.1")).is_err());
        // An exception by name, though its address is denied.
        assert!(p.check(Some("ok.evil.test"), ip("10.9.9.9")).is_ok());
        assert_eq!(p.name_verdict("ok.evil.test"), NameVerdict::Allowed);
        // A denied name may still reach an allowed address: judged on it.
        assert_eq!(p.name_verdict("evil.test"), NameVerdict::NeedsAddress);
        let names = Policy::from_spec(
            &hearth_types::egress::EgressSpec {
                access: Some(AccessSpec::DenyExcept {
                    deny: vec!["evil.test".into()],
                    allow: vec!["ok.evil.test".into()],
                }),
                ..Default::default()
            },
            &mut |v| Ok(raw(v)),
        )
        .unwrap();
        assert!(matches!(
            names.name_verdict("evil.test"),
            NameVerdict::Refused(_)
        ));
    }

    fn rule(name: &str, hosts: &[&str]) -> ProxyRule {
        ProxyRule {
            name: name.into(),
            match_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            headers: vec![plain("authorization", &format!("Bearer {name}"))],
            ..Default::default()
        }
    }

    #[test]
    fn rules_first_match_wins_and_disabled_are_skipped() {
        let mut off = rule("off", &["api.test"]);
        off.enabled = Some(false);
        let mut paths = rule("paths", &["api.test"]);
        paths.match_paths = vec!["/v1/*".into()];
        let mut hdrs = rule("hdrs", &["api.test"]);
        hdrs.match_headers = vec!["X-Tenant: blue".into()];
        let cfg = ProxyConfig {
            rules: vec![
                off,
                paths,
                hdrs,
                rule("any", &["*.test"]),
                rule("none", &[]),
            ],
            ..Default::default()
        };
        let p = policy(&cfg);
        let mut h = HeaderMap::new();
        assert_eq!(p.rule_for("api.test", "/v1/x", &h).unwrap().name, "paths");
        assert_eq!(p.rule_for("api.test", "/v2", &h).unwrap().name, "any");
        h.insert("x-tenant", HeaderValue::from_static("blue"));
        assert_eq!(p.rule_for("api.test", "/v2", &h).unwrap().name, "hdrs");
        assert!(p.rule_for("api.other", "/", &h).is_none());
        assert!(p.could_rewrite("b.test"));
        assert!(!p.could_rewrite("b.other"));
    }

    #[test]
    fn validation_names_the_field() {
        let e = validate_config(&allow(&["ok.test", "fine.test", "~("]), &[]).unwrap_err();
        assert_eq!(e.field, "access_control.allow_list[2]");
        let mut bad_rule = rule("r", &["a.test"]);
        bad_rule.headers = vec![plain("bad name", "v")];
        let e = validate_config(
            &ProxyConfig {
                rules: vec![bad_rule],
                ..Default::default()
            },
            &[],
        )
        .unwrap_err();
        assert_eq!(e.field, "rules[0].headers[0].name");
        let mut bad_value = rule("r", &["a.test"]);
        bad_value.headers = vec![plain("x", "line\nbreak")];
        assert!(validate_config(
            &ProxyConfig {
                rules: vec![bad_value],
                ..Default::default()
            },
            &[]
        )
        .is_err());
        let cb = |url: &str| ProxyConfig {
            callbacks: vec![ProxyCallback {
                match_hosts: vec!["a.test".into()],
                url: url.into(),
                ttl_seconds: 60,
                full_request: None,
                request_headers: vec![],
            }],
            ..Default::default()
        };
        assert!(validate_config(&cb("https://hooks.example.com/x"), &[]).is_ok());
        for bad in ["ftp://x.test/", "/relative", "not a url"] {
            let e = validate_config(&cb(bad), &[]).unwrap_err();
            assert_eq!(e.field, "callbacks[0].url", "{bad}");
        }
        let e = validate_config(
            &ProxyConfig {
                rules: vec![ProxyRule {
                    match_headers: vec!["no-colon".into()],
                    ..rule("r", &["a.test"])
                }],
                ..Default::default()
            },
            &[],
        )
        .unwrap_err();
        assert_eq!(e.field, "rules[0].match_headers[0]");
    }

    fn callback_cfg(urls: &[&str]) -> ProxyConfig {
        ProxyConfig {
            callbacks: urls
                .iter()
                .map(|url| ProxyCallback {
                    match_hosts: vec!["a.test".into()],
                    url: url.to_string(),
                    ttl_seconds: 60,
                    full_request: None,
                    request_headers: vec![],
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Security review (issue 16), finding 3: a callback URL naming the
    /// host itself, the metadata address or a private network is a 422 on
    /// its field, unless the operator allows that network.
    #[test]
    fn finding3_callback_to_private_address_is_refused_at_validation() {
        for bad in [
            "http://127.0.0.1:8080/api/v2/sandboxes/boxes",
            "http://localhost:8080/",
            "http://LOCALHOST./",
            "http://svc.localhost/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1:8080/",
            "http://[::1]:8080/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fd00::1]/",
            "https://0.0.0.0/",
        ] {
            let e = validate_config(&callback_cfg(&["https://hooks.example.com/", bad]), &[])
                .unwrap_err();
            assert_eq!(e.field, "callbacks[1].url", "{bad}");
            assert!(e.to_string().contains("private address"), "{bad}: {e}");
        }
        // Names are judged when the host connects (resolved then).
        assert!(validate_config(&callback_cfg(&["https://hooks.example.com/x"]), &[]).is_ok());
        // The operator's exceptions apply.
        let allow: Vec<ipnet::IpNet> = vec![
            "10.0.0.0/8".parse().unwrap(),
            "127.0.0.1/32".parse().unwrap(),
        ];
        assert!(validate_config(&callback_cfg(&["http://10.0.0.1:8080/"]), &allow).is_ok());
        assert!(validate_config(&callback_cfg(&["http://localhost:8080/"]), &allow).is_ok());
        assert!(validate_config(&callback_cfg(&["http://169.254.169.254/"]), &allow).is_err());
    }

    /// A rewrite's destination is a host name or address (no URL), on a
    /// real port, and not private on its face unless the operator allows it.
    #[test]
    fn rewrite_destinations_are_checked() {
        let cfg = |host: &str, port: u16| ProxyConfig {
            rules: vec![ProxyRule {
                name: "gw".into(),
                match_hosts: vec!["api.example.com".into()],
                rewrite: Some(hearth_api::nested::ProxyRewrite {
                    host: Some(host.into()),
                    port: Some(port),
                    sandbox: None,
                    credentials: None,
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(validate_config(&cfg("gateway.example.com", 8443), &[]).is_ok());
        for (host, port, field) in [
            ("https://gateway.example.com", 443, "rules[0].rewrite.host"),
            ("gateway.example.com/v1", 443, "rules[0].rewrite.host"),
            ("gateway.example.com", 0, "rules[0].rewrite.port"),
            ("127.0.0.1", 443, "rules[0].rewrite.host"),
            ("localhost", 443, "rules[0].rewrite.host"),
            ("169.254.169.254", 443, "rules[0].rewrite.host"),
        ] {
            let e = validate_config(&cfg(host, port), &[]).unwrap_err();
            assert_eq!(e.field, field, "{host}:{port}: {e}");
        }
        let allow: Vec<ipnet::IpNet> = vec!["127.0.0.1/32".parse().unwrap()];
        assert!(validate_config(&cfg("127.0.0.1", 443), &allow).is_ok());
        // Stored with its credentials treatment, `strip` by default.
        let spec = cfg("gateway.example.com", 8443).to_spec();
        let rw = spec.rules[0].rewrite.as_ref().unwrap();
        assert_eq!(rw.credentials, Credentials::Strip);
        assert_eq!(
            ProxyConfig::from_spec(&spec).rules[0]
                .rewrite
                .as_ref()
                .unwrap()
                .credentials
                .as_deref(),
            Some("strip")
        );
    }

    /// A GCP rule's key is checked once resolved, naming the rule's own
    /// field (a disabled rule before it counts); reads never return it.
    #[test]
    fn gcp_keys_are_checked_once_resolved_and_never_read_back() {
        let gcp = |name: &str, json: &str, enabled: bool| ProxyRule {
            name: name.into(),
            enabled: Some(enabled),
            gcp: Some(hearth_api::nested::ProxyGcp {
                service_account_json: Some(hearth_api::nested::ProxySecret {
                    kind: SecretKind::Opaque,
                    value: Some(json.into()),
                    is_set: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cfg = ProxyConfig {
            rules: vec![
                gcp("off", "{}", false),
                gcp("on", r#"{"client_email": "a@b"}"#, true),
            ],
            ..Default::default()
        };
        let spec = cfg.to_spec();
        // Placeholders pass validation; the resolved key is what is checked.
        assert!(validate_spec(&spec, &[]).is_ok());
        let policy = Policy::from_spec(&spec, &mut |v| Ok(raw(v))).unwrap();
        assert_eq!(
            policy.rules[0].match_hosts,
            vec![HostPattern::parse("*.googleapis.com").unwrap()]
        );
        let e = policy.check_credentials(&spec).unwrap_err();
        assert_eq!(e.field, "rules[1].gcp.service_account_json", "{e}");
        assert!(!e.message.contains("a@b"), "{e}");
        let not_pem =
            r#"{"type": "service_account", "client_email": "a@b", "private_key": "nope"}"#;
        let cfg = ProxyConfig {
            rules: vec![gcp("on", not_pem, true)],
            ..Default::default()
        };
        let spec = cfg.to_spec();
        let policy = Policy::from_spec(&spec, &mut |v| Ok(raw(v))).unwrap();
        let e = policy.check_credentials(&spec).unwrap_err();
        assert!(e.message.contains("PKCS#8"), "{e}");
        // Reads show only that it is set.
        let read = cfg.redacted();
        let key = read.rules[0]
            .gcp
            .as_ref()
            .unwrap()
            .service_account_json
            .as_ref()
            .unwrap();
        assert_eq!((key.value.as_deref(), key.is_set), (None, Some(true)));
    }

    #[test]
    fn a_redacted_credential_keeps_its_scheme() {
        let rw = Rewrite {
            host: "h".into(),
            port: 443,
            credentials: Credentials::Redact,
        };
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer abc"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        h.insert("cookie", HeaderValue::from_static("a=b; c=d"));
        h.insert("x-other", HeaderValue::from_static("o"));
        rw.treat_credentials(&mut h);
        assert_eq!(h["authorization"], "Bearer redacted");
        assert_eq!(h["x-api-key"], "redacted");
        assert_eq!(h["cookie"], "redacted");
        assert_eq!(h["x-other"], "o");
        let strip = Rewrite {
            credentials: Credentials::Strip,
            ..rw
        };
        strip.treat_credentials(&mut h);
        assert!(!h.contains_key("authorization") && !h.contains_key("cookie"));
        assert_eq!(h["x-other"], "o");
    }

    /// Security review (issue 16), finding 2: only `plaintext` values may be
    /// set on plain-HTTP requests; secrets only inside TLS.
    #[test]
    fn finding2_secret_headers_are_only_for_tls() {
        let mut r = rule("r", &["a.test"]);
        r.headers = vec![
            plain("X-Plain", "p"),
            ProxyHeader {
                name: "Authorization".into(),
                kind: SecretKind::WorkspaceSecret,
                value: Some("Bearer {TOKEN}".into()),
                is_set: None,
            },
            ProxyHeader {
                name: "X-Key".into(),
                kind: SecretKind::Opaque,
                value: Some("k".into()),
                is_set: None,
            },
            // A name given a plaintext and a secret value is a secret.
            plain("x-key", "also"),
        ];
        let p = policy(&ProxyConfig {
            rules: vec![r],
            ..Default::default()
        });
        let rule = &p.rules[0];
        assert_eq!(rule.plaintext_headers, vec!["x-plain".to_owned()]);
        assert_eq!(
            rule.headers_for(false),
            vec![("x-plain".into(), "p".into())]
        );
        assert_eq!(rule.headers_for(true).len(), 4);
        // A policy from an older control plane (no list): nothing in clear.
        let mut json = serde_json::to_value(&p).unwrap();
        json["rules"][0]
            .as_object_mut()
            .unwrap()
            .remove("plaintext_headers");
        let old: Policy = serde_json::from_value(json).unwrap();
        assert!(old.rules[0].headers_for(false).is_empty());
    }

    #[test]
    fn secrets_are_resolved_and_errors_located() {
        let mut r = rule("r", &["a.test"]);
        r.headers = vec![ProxyHeader {
            name: "X-Key".into(),
            kind: SecretKind::WorkspaceSecret,
            value: Some("{KEY}".into()),
            is_set: None,
        }];
        let cfg = ProxyConfig {
            rules: vec![r],
            ..Default::default()
        };
        let p = Policy::from_spec(&cfg.to_spec(), &mut |v| {
            Ok(raw(v).replace("{KEY}", "s3cret"))
        })
        .unwrap();
        assert_eq!(p.rules[0].headers, vec![("x-key".into(), "s3cret".into())]);
        let e =
            Policy::from_spec(&cfg.to_spec(), &mut |_| Err("no secret KEY".into())).unwrap_err();
        assert_eq!(e.field, "rules[0].headers[0].value");
        let json = serde_json::to_string(&p).unwrap();
        let back: Policy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
    }
}
