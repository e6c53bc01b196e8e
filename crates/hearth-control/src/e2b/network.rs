//! E2B's `network` of a sandbox: on create (who may reach its ports,
//! where it may go) and its update (`PUT /sandboxes/{id}/network`).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use hearth_types::egress::{AccessSpec, EgressSpec};
use serde::Deserialize;
use serde_json::Value;

use super::api::*;
use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::domain::commands::SandboxChange;
use crate::domain::queries::spec_of;
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::Control;

/// E2B's `network` on create (`SandboxNetworkConfig`) and its update
/// (`PUT /sandboxes/{id}/network`): who may reach the sandbox's ports and
/// where it may go. Served: `allowPublicTraffic`, `maskRequestHost` (the
/// `Host` its services see), `allowOut` and
/// `denyOut` as Hearth's allow or deny list, or a deny list with
/// exceptions (allow takes precedence; the egress proxy judges names as
/// well as addresses), and transform `rules` as the proxy's header rules
/// (`super::rules`), `httpsPorts` (on create) as ports reached over TLS.
/// Refused by name: the rest (a SOCKS `egressProxy`, a non-empty
/// `dnsServers`: a sandbox resolves names through the proxy, which applies
/// the lists to the names themselves).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Network {
    allow_public_traffic: Option<bool>,
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    dns_servers: Option<Value>,
    egress_proxy: Option<Value>,
    mask_request_host: Option<String>,
    https_ports: Option<Value>,
    rules: Option<super::rules::Rules>,
    /// Only on an update: `false` is `denyOut: ["0.0.0.0/0"]`.
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

/// What denies every IPv4 destination in `denyOut`.
pub(super) const ALL_TRAFFIC: &str = "0.0.0.0/0";

impl Network {
    /// Whether anyone may reach the sandbox's ports by name (E2B's
    /// default: yes).
    pub(super) fn public(net: Option<&Network>) -> bool {
        net.and_then(|n| n.allow_public_traffic).unwrap_or(true)
    }

    /// The access list the network asks for (`None`: the default, the
    /// internet), `internet` being the create's `allow_internet_access`.
    pub(super) fn access(
        net: Option<&Network>,
        internet: Option<bool>,
    ) -> E2bResult<Option<AccessSpec>> {
        let empty = Network::default();
        let n = net.unwrap_or(&empty);
        // An empty list asks for what a Hearth sandbox has: no DNS server
        // but the proxy's, which resolves the names the lists allow (E2B's
        // "allowed domains work without a reachable server").
        let asked = |v: &Option<Value>| is_set(v) && *v != Some(Value::Array(Vec::new()));
        for (field, set, why) in [
            (
                "network.dnsServers",
                asked(&n.dns_servers),
                "a Hearth sandbox's only DNS server is its egress proxy, which resolves the \
                 names allowOut allows itself; no other server is reachable (send [] or leave \
                 it out)",
            ),
            (
                "network.egressProxy",
                is_set(&n.egress_proxy),
                "not served by Hearth's E2B API: the sandbox's traffic leaves through Hearth's \
                 own egress proxy",
            ),
        ] {
            if set {
                return Err(not_served(field, why));
            }
        }
        let allow = n.allow_out.clone().unwrap_or_default();
        let deny = n.deny_out.clone().unwrap_or_default();
        let internet = internet.or(n.allow_internet_access);
        let deny_all = internet == Some(false) || deny.iter().any(|d| d.trim() == ALL_TRAFFIC);
        if deny_all {
            return Ok(Some(AccessSpec::AllowList(allow)));
        }
        match (deny.is_empty(), allow.is_empty()) {
            (true, _) => Ok(None),
            (false, true) => Ok(Some(AccessSpec::DenyList(deny))),
            // Allow takes precedence (E2B's rule).
            (false, false) => Ok(Some(AccessSpec::DenyExcept { deny, allow })),
        }
    }
}

/// Most ports `httpsPorts` may name.
const MAX_TLS_PORTS: usize = 64;

/// The placeholder of `maskRequestHost` that stands for the port.
const PORT_PLACEHOLDER: &str = "${PORT}";

impl Network {
    /// The `Host` its services see (`maskRequestHost`), checked: a host
    /// name or address and an optional port, `${PORT}` anywhere in it.
    pub(super) fn port_host(net: Option<&Network>) -> E2bResult<Option<String>> {
        let Some(mask) = net.and_then(|n| n.mask_request_host.as_deref()) else {
            return Ok(None);
        };
        let bad = |why: &str| {
            E2bError::bad_request(format!(
                "network.maskRequestHost: {why}, as \"${{PORT}}-app.example.com\" or \"localhost:${{PORT}}\"; got {mask:?}"
            ))
        };
        let sample = mask.replace(PORT_PLACEHOLDER, "65535");
        if mask.is_empty() || mask.len() > 253 {
            return Err(bad("a host of 1 to 253 characters"));
        }
        let ok = sample
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
            && sample.parse::<axum::http::uri::Authority>().is_ok();
        if !ok {
            return Err(bad("a host name or address with an optional port"));
        }
        Ok(Some(mask.to_owned()))
    }

    /// The ports whose services speak TLS (`httpsPorts`), checked.
    pub(super) fn tls_ports(net: Option<&Network>) -> E2bResult<BTreeSet<u16>> {
        let Some(v) = net
            .and_then(|n| n.https_ports.as_ref())
            .filter(|v| !v.is_null())
        else {
            return Ok(BTreeSet::new());
        };
        let bad = || {
            E2bError::bad_request(format!(
                "network.httpsPorts: a list of ports (1 to 65535), got {v}"
            ))
        };
        let list = v.as_array().ok_or_else(bad)?;
        if list.len() > MAX_TLS_PORTS {
            return Err(E2bError::bad_request(format!(
                "network.httpsPorts: at most {MAX_TLS_PORTS} ports, got {}",
                list.len()
            )));
        }
        list.iter()
            .map(|p| {
                p.as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0)
                    .ok_or_else(bad)
            })
            .collect()
    }

    /// The proxy's header rules of `rules` (none when there are none).
    pub(super) fn proxy_rules(
        net: Option<&Network>,
    ) -> E2bResult<Vec<hearth_types::egress::RuleSpec>> {
        match net.and_then(|n| n.rules.as_ref()) {
            Some(r) => super::rules::proxy_rules(r),
            None => Ok(Vec::new()),
        }
    }
}

/// `PUT /sandboxes/{id}/network`: the sandbox's new egress lists and
/// transform rules, in force when this answers 204 (pushed to the running
/// VM first, as LangSmith's PATCH of `proxy_config`). The update is whole:
/// what it leaves out is cleared. Rules of a `proxy_config` the sandbox
/// has stay; only E2B's are replaced.
pub async fn update_network(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<StatusCode> {
    let who = who?;
    // Refused before the lookup (see `kill`).
    who.require("sandboxes:update")?;
    let net: Network = json_body(&body?.0)?;
    for (field, set) in [
        ("allowPublicTraffic", net.allow_public_traffic.is_some()),
        ("maskRequestHost", net.mask_request_host.is_some()),
        ("httpsPorts", is_set(&net.https_ports)),
    ] {
        if set {
            return Err(not_served(
                field,
                "set on create; an update does not change it",
            ));
        }
    }
    let access = Network::access(Some(&net), None)?;
    let rules = Network::proxy_rules(Some(&net))?;
    let row = c.e2b_find(&who, &id).await?;
    let rules = c.sealed_rules(who.workspace_id, rules)?;
    let mut spec = spec_of(&row)?;
    let mut egress = spec.egress.take().unwrap_or_default();
    egress.access = access;
    egress
        .rules
        .retain(|r| !r.name.starts_with(super::rules::RULE_PREFIX));
    egress.rules.splice(0..0, rules);
    spec.egress = (egress != EgressSpec::default()).then_some(egress);
    let change = SandboxChange {
        name: None,
        spec,
        network: true,
    };
    c.update_sandbox(&who, &row, change).await?;
    Ok(StatusCode::NO_CONTENT)
}
