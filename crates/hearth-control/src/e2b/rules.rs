//! E2B's `network.rules`: per-host transforms of a sandbox's outbound
//! HTTPS requests (headers set on them), parsed into the header rules of
//! Hearth's egress proxy, the ones LangSmith's `proxy_config` makes.
//!
//! A key is an exact host (`api.example.com`) or a leading wildcard
//! (`*.example.com`: subdomains at any depth, not the apex), lowercased;
//! E2B takes an exact key first, then the longest wildcard, never merging
//! two: the proxy takes the first rule that matches, so the rules are
//! ordered that way. A key's transforms apply in order (a later value of
//! a header wins). A value is a credential, sealed at rest like an
//! `opaque` header, unless it names a secret as `${e2b.secrets.NAME}`:
//! then it is filled from the workspace's secret `NAME` when the proxy
//! needs it, as a `workspace_secret` header is (the door hands literal
//! values over as `Plain`; `Control::sealed_rules` seals them before
//! anything is stored). Rules grant no access:
//! `allowOut` does. Workload identity tokens (`${e2b.identity…}`) are
//! refused by name.

use std::collections::BTreeMap;

use hearth_types::egress::{HeaderSpec, RuleSpec, SecretValue};
use serde::Deserialize;

use super::{E2bError, E2bResult};

/// One rule of a host's list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Rule {
    #[serde(default)]
    transform: Option<Transform>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Transform {
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
}

/// E2B's rules as written: host pattern → its rules.
pub(super) type Rules = BTreeMap<String, Vec<Rule>>;

/// The name Hearth gives the rule of a host key: E2B's rules are the ones
/// so named, so an update replaces them and leaves a `proxy_config`'s.
pub(super) const RULE_PREFIX: &str = "e2b:";

/// Most host keys, and headers per key.
const MAX_KEYS: usize = 64;
const MAX_HEADERS: usize = 64;

/// The proxy rules of E2B's `rules`, in the order the proxy must try them.
pub(super) fn proxy_rules(rules: &Rules) -> E2bResult<Vec<RuleSpec>> {
    if rules.len() > MAX_KEYS {
        return Err(bad(format!(
            "network.rules: {} hosts, at most {MAX_KEYS}",
            rules.len()
        )));
    }
    let mut out = Vec::new();
    for (key, list) in rules {
        let host = host_key(key)?;
        let mut headers: BTreeMap<String, (String, String)> = BTreeMap::new();
        for rule in list {
            let Some(t) = &rule.transform else { continue };
            for (name, value) in t.headers.iter().flatten() {
                let at = format!("network.rules[{key}].transform.headers[{name}]");
                if name.is_empty() || !name.bytes().all(token) {
                    return Err(bad(format!("{at}: a header name is an HTTP token")));
                }
                if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                    return Err(bad(format!("{at}: the value holds control characters")));
                }
                // Header names are case-insensitive: the later one wins.
                headers.insert(name.to_ascii_lowercase(), (name.clone(), value.clone()));
            }
        }
        if headers.len() > MAX_HEADERS {
            return Err(bad(format!(
                "network.rules[{key}]: {} headers, at most {MAX_HEADERS}",
                headers.len()
            )));
        }
        let headers = headers
            .into_values()
            .map(|(name, value)| header(key, name, &value))
            .collect::<E2bResult<Vec<_>>>()?;
        if headers.is_empty() {
            continue;
        }
        out.push(RuleSpec {
            name: format!("{RULE_PREFIX}{host}"),
            enabled: true,
            match_hosts: vec![host],
            headers,
            ..RuleSpec::default()
        });
    }
    // Exact hosts first, then wildcards, longest suffix first.
    out.sort_by_key(|r| {
        let h = &r.match_hosts[0];
        (h.starts_with("*."), std::cmp::Reverse(h.len()))
    });
    Ok(out)
}

fn bad(message: String) -> E2bError {
    E2bError::bad_request(message)
}

fn token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A rules key, checked and lowercased.
fn host_key(key: &str) -> E2bResult<String> {
    let host = key.trim().to_ascii_lowercase();
    let name = host.strip_prefix("*.").unwrap_or(&host);
    let label_ok = |l: &str| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(bad(format!(
            "network.rules[{key}]: a key is a DNS name or *. and a DNS name (a bare * is not one)"
        )));
    }
    Ok(host)
}

/// A transform's header: sealed as given, or a template of the workspace
/// secrets it names.
fn header(key: &str, name: String, value: &str) -> E2bResult<HeaderSpec> {
    let at = format!("network.rules[{key}].transform.headers[{name}]");
    const SECRET: &str = "${e2b.secrets.";
    if value.contains("${e2b.") && !value.contains(SECRET) || value.contains("${e2b.identity") {
        return Err(bad(format!(
            "{at}: only ${{e2b.secrets.NAME}} placeholders are served (workload identity tokens are not)"
        )));
    }
    if !value.contains(SECRET) {
        // A credential as given: sealed by the domain before it is kept.
        return Ok(HeaderSpec {
            name,
            value: SecretValue::Plain(value.to_owned()),
        });
    }
    // `${e2b.secrets.NAME}` → `{NAME}`; any other brace would read as a
    // template of its own, so it is refused.
    let mut template = String::new();
    let mut rest = value;
    while let Some(at_open) = rest.find(SECRET) {
        let (before, after) = rest.split_at(at_open);
        let after = &after[SECRET.len()..];
        let close = after
            .find('}')
            .ok_or_else(|| bad(format!("{at}: an unclosed ${{e2b.secrets.…}}")))?;
        let secret = &after[..close];
        if !crate::workspace_secrets::valid_name(secret) {
            return Err(bad(format!(
                "{at}: secret {secret:?}: Hearth's secrets are named with letters, digits and _ (not starting with a digit)"
            )));
        }
        template.push_str(before);
        template.push('{');
        template.push_str(secret);
        template.push('}');
        rest = &after[close + 1..];
    }
    template.push_str(rest);
    let braces = template.matches(['{', '}']).count();
    if braces != 2 * value.matches(SECRET).count() {
        return Err(bad(format!(
            "{at}: a value that names secrets holds no other braces"
        )));
    }
    Ok(HeaderSpec {
        name,
        value: SecretValue::Template(template),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(json: serde_json::Value) -> E2bResult<Vec<RuleSpec>> {
        proxy_rules(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn exact_hosts_come_first_then_the_longest_wildcard() {
        let got = rules(serde_json::json!({
            "*.example.com": [{"transform": {"headers": {"X-A": "1"}}}],
            "*.api.example.com": [{"transform": {"headers": {"X-A": "2"}}}],
            "API.example.com": [
                {"transform": {"headers": {"X-A": "3", "X-B": "b"}}},
                {"transform": {"headers": {"x-a": "4"}}},
            ],
            "quiet.example.com": [{}],
        }))
        .unwrap();
        let hosts: Vec<&str> = got.iter().map(|r| r.match_hosts[0].as_str()).collect();
        assert_eq!(
            hosts,
            ["api.example.com", "*.api.example.com", "*.example.com"]
        );
        assert_eq!(got[0].name, "e2b:api.example.com");
        // A later value of a header wins; each value is handed over as
        // given (the domain seals it).
        let h: Vec<(&str, &SecretValue)> = got[0]
            .headers
            .iter()
            .map(|h| (h.name.as_str(), &h.value))
            .collect();
        let (four, b) = (
            SecretValue::Plain("4".into()),
            SecretValue::Plain("b".into()),
        );
        assert_eq!(h, [("x-a", &four), ("X-B", &b)]);
    }

    #[test]
    fn secrets_become_templates_and_the_rest_is_refused_by_name() {
        let got = rules(serde_json::json!({
            "api.test": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.API_TOKEN}"}}}],
        }))
        .unwrap();
        assert_eq!(
            got[0].headers[0].value,
            SecretValue::Template("Bearer {API_TOKEN}".into())
        );
        for (bad, names) in [
            (serde_json::json!({"*": [{}]}), "network.rules[*]"),
            (serde_json::json!({"a b": [{}]}), "network.rules[a b]"),
            (
                serde_json::json!({"x.test": [{"transform": {"headers": {"A": "${e2b.identity.tokens.aws}"}}}]}),
                "workload identity",
            ),
            (
                serde_json::json!({"x.test": [{"transform": {"headers": {"A": "${e2b.secrets.bad-name}"}}}]}),
                "bad-name",
            ),
            (
                serde_json::json!({"x.test": [{"transform": {"headers": {"A": "{x} ${e2b.secrets.K}"}}}]}),
                "no other braces",
            ),
            (
                serde_json::json!({"x.test": [{"transform": {"headers": {"A B": "v"}}}]}),
                "HTTP token",
            ),
        ] {
            let e = rules(bad.clone()).unwrap_err();
            assert!(e.message.contains(names), "{bad}: {}", e.message);
        }
        // Unknown fields are refused by the parser, never ignored.
        assert!(serde_json::from_value::<Rules>(
            serde_json::json!({"x.test": [{"transform": {"body": "x"}}]})
        )
        .is_err());
    }
}
