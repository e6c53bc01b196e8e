//! A sandbox's `proxy_config` on its way to the host's egress proxy.
//!
//! - **At rest**: `opaque` header values are sealed under the master key
//!   before the spec is stored (reads show only `is_set`), so a copy of
//!   the database holds no usable credential.
//! - **Checked**: every pattern, header and callback URL is validated when
//!   the config arrives (422 naming the field; a callback URL naming a
//!   private address or `localhost` is refused unless the operator's
//!   `allow_private` covers it), and every `workspace_secret` it names
//!   must exist.
//! - **Resolved** only when a host needs it (create, start, PATCH):
//!   `opaque` values are opened, `{NAME}` templates of `workspace_secret`
//!   values are filled from the workspace's secrets, and the result goes
//!   to the host in memory ([`hearth_hostapi::SandboxNet`]); it is never
//!   written to disk and never enters the guest. The guest gets only the
//!   enabled rules' `env_vars` (dummy values for tools that insist on a
//!   variable).

use std::collections::{BTreeMap, BTreeSet};

use crate::domain::error::DomainError;
use hearth_api::nested::{MountConfig, ProxyConfig, ProxyHeader, ProxyRule, SecretKind};
use hearth_egress::Policy;
use hearth_hostapi::SandboxNet;
use hearth_types::egress::{EgressSpec, SecretValue};
use hearth_types::WorkspaceId;

use crate::secrets::MasterKey;
use crate::Control;

/// Associated data of a sealed `opaque` value: it opens only for the
/// workspace that stored it.
fn opaque_aad(workspace: WorkspaceId) -> String {
    format!("proxy-opaque:{workspace}")
}

/// Checks a config as it arrives on the API; `allow_private` is the
/// operator's list of private networks callbacks may reach.
/// (The config's own rules are `ProxyConfig::validate`'s, which create and
/// update run on it.)
pub(crate) fn check(cfg: &ProxyConfig, allow_private: &[ipnet::IpNet]) -> Result<(), DomainError> {
    hearth_egress::validate_spec(&cfg.to_spec(), allow_private).map_err(policy_error)
}

/// A spec's error as the API reports it: at `proxy_config.<path>`.
fn policy_error(e: hearth_egress::PolicyError) -> DomainError {
    let field = format!("proxy_config.{}", e.field);
    DomainError::invalid(&field, format!("{field}: {}", e.message))
}

/// Every header of a config (rules' and callbacks').
fn headers_mut(cfg: &mut ProxyConfig) -> impl Iterator<Item = &mut ProxyHeader> {
    cfg.rules
        .iter_mut()
        .flat_map(|r| r.headers.iter_mut())
        .chain(
            cfg.callbacks
                .iter_mut()
                .flat_map(|c| c.request_headers.iter_mut()),
        )
}

impl Control {
    /// Header rules another door made (E2B's `network.rules`), checked as
    /// a `proxy_config`'s are, their `Plain` values (credentials as given)
    /// sealed as `opaque` ones are.
    pub(crate) fn sealed_rules(
        &self,
        workspace: WorkspaceId,
        mut rules: Vec<hearth_types::egress::RuleSpec>,
    ) -> Result<Vec<hearth_types::egress::RuleSpec>, DomainError> {
        let spec = EgressSpec {
            rules: rules.clone(),
            ..EgressSpec::default()
        };
        hearth_egress::validate_spec(&spec, &self.cfg.allow_private).map_err(policy_error)?;
        for h in rules.iter_mut().flat_map(|r| r.headers.iter_mut()) {
            if let SecretValue::Plain(plain) = &h.value {
                let sealed = self
                    .cfg
                    .master_key
                    .seal(&opaque_aad(workspace), plain.as_bytes())
                    .map_err(|e| {
                        tracing::error!(error = %e, "cannot seal a header value");
                        DomainError::Internal
                    })?;
                h.value = SecretValue::Sealed(sealed);
            }
        }
        Ok(rules)
    }
}

/// Seals the `opaque` values of a config that came from the API (call it
/// before merging stored values in, which are sealed already).
pub(crate) fn seal_opaque(
    key: &MasterKey,
    workspace: WorkspaceId,
    cfg: &mut ProxyConfig,
) -> Result<(), DomainError> {
    let seal = |v: &mut Option<String>| -> Result<(), DomainError> {
        if let Some(plain) = v {
            let sealed = key
                .seal(&opaque_aad(workspace), plain.as_bytes())
                .map_err(|e| {
                    tracing::error!(error = %e, "cannot seal an opaque proxy value");
                    DomainError::Internal
                })?;
            *v = Some(sealed);
        }
        Ok(())
    };
    for rule in &mut cfg.rules {
        for (_, secret) in rule.credentials_mut() {
            if secret.kind == SecretKind::Opaque {
                seal(&mut secret.value)?;
            }
        }
    }
    for h in headers_mut(cfg) {
        if h.kind == SecretKind::Opaque {
            seal(&mut h.value)?;
        }
    }
    Ok(())
}

/// Seals the `opaque` credentials of a `mount_config.auth` that came from
/// the API, as [`seal_opaque`] does a proxy config's.
pub(crate) fn seal_mount_auth(
    key: &MasterKey,
    workspace: WorkspaceId,
    mc: Option<&mut MountConfig>,
) -> Result<(), DomainError> {
    let Some(auth) = mc.and_then(|m| m.auth.as_mut()) else {
        return Ok(());
    };
    // Sealed as the rules they become: one sealing for both kinds.
    let mut cfg = ProxyConfig {
        rules: vec![
            ProxyRule {
                aws: auth.aws.take(),
                ..ProxyRule::default()
            },
            ProxyRule {
                gcp: auth.gcp.take(),
                ..ProxyRule::default()
            },
        ],
        ..ProxyConfig::default()
    };
    seal_opaque(key, workspace, &mut cfg)?;
    let mut rules = cfg.rules.into_iter();
    auth.aws = rules.next().and_then(|r| r.aws);
    auth.gcp = rules.next().and_then(|r| r.gcp);
    Ok(())
}

/// The egress a sandbox's proxy enforces: its own, with the rules its
/// mounts' credentials became first (each scoped to its mount's bucket).
fn with_mount_rules(sandbox: &hearth_types::sandbox::SandboxSpec) -> Option<EgressSpec> {
    if sandbox.mount_rules.is_empty() {
        return sandbox.egress.clone();
    }
    let mut egress = sandbox.egress.clone().unwrap_or_default();
    let own = std::mem::take(&mut egress.rules);
    egress.rules = sandbox.mount_rules.iter().cloned().chain(own).collect();
    Some(egress)
}

/// The `{NAME}` references of a `workspace_secret` value.
fn template_names(value: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = value;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        let name = &after[..close];
        if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            names.push(name);
        }
        rest = &after[close + 1..];
    }
    names
}

/// Fills `{NAME}` references from `secrets`.
fn expand(value: &str, secrets: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = value.to_owned();
    for name in template_names(value) {
        let secret = secrets
            .get(name)
            .ok_or_else(|| format!("workspace secret {name} is not set"))?;
        out = out.replace(&format!("{{{name}}}"), secret);
    }
    Ok(out)
}

impl Control {
    /// The resolved network settings of a sandbox whose stored spec is
    /// `sandbox` (its egress with sealed `opaque` values), for its host:
    /// the policy, the rules' environment and, with `access_delegation`,
    /// the API endpoint the proxy serves for it.
    pub(crate) async fn sandbox_net(
        &self,
        workspace: WorkspaceId,
        sandbox: &hearth_types::sandbox::SandboxSpec,
    ) -> Result<SandboxNet, DomainError> {
        let egress = with_mount_rules(sandbox);
        let (mut policy, mut env) = self.egress_policy(workspace, egress.as_ref()).await?;
        if sandbox.delegation.is_some() {
            policy.delegation = true;
            policy.tenant_id = Some(workspace.to_string());
            env.insert(
                "LANGSMITH_ENDPOINT".into(),
                format!("http://{}", hearth_egress::DELEGATION_HOST),
            );
            // The SDK wants a key; the proxy replaces it with the grant.
            env.insert("LANGSMITH_API_KEY".into(), "delegated".into());
        }
        let policy = policy.to_document().map_err(|e| {
            tracing::error!(error = %e, "cannot write a sandbox's egress policy for its host");
            DomainError::Internal
        })?;
        Ok(SandboxNet {
            policy,
            env,
            mounts: sandbox.mounts.clone(),
        })
    }

    /// [`Self::sandbox_net`] of the sandbox `id`, its volumes' holds given.
    pub(crate) async fn held_sandbox_net(
        &self,
        id: hearth_types::SandboxId,
        workspace: WorkspaceId,
        sandbox: &hearth_types::sandbox::SandboxSpec,
    ) -> Result<SandboxNet, DomainError> {
        let mut net = self.sandbox_net(workspace, sandbox).await?;
        self.fill_volume_holds(id, &mut net.mounts).await?;
        Ok(net)
    }

    /// The proxy's policy for `spec` with its secrets resolved, and the
    /// environment its rules give the guest.
    async fn egress_policy(
        &self,
        workspace: WorkspaceId,
        spec: Option<&EgressSpec>,
    ) -> Result<(Policy, BTreeMap<String, String>), DomainError> {
        let Some(spec) = spec else {
            return Ok(Default::default());
        };
        if !self.cfg.aws_roles {
            if let Some(i) = spec.rules.iter().position(|r| r.aws_role.is_some()) {
                let field = format!("proxy_config.rules[{i}].aws.role_arn");
                return Err(DomainError::invalid(
                    &field,
                    format!("{field}: assuming IAM roles is not supported by this Hearth: its operator has given it no AWS identity (HEARTH_AWS_ROLE_ACCESS_KEY_ID and HEARTH_AWS_ROLE_SECRET_ACCESS_KEY)"),
                ));
            }
        }
        let mut wanted = BTreeSet::new();
        for v in spec.values() {
            if let SecretValue::Template(t) = v {
                wanted.extend(template_names(t).into_iter().map(str::to_owned));
            }
        }
        let mut secrets = BTreeMap::new();
        for name in wanted {
            match crate::workspace_secrets::resolve_workspace_secret(self, workspace, &name)
                .await?
            {
                Some(v) => {
                    secrets.insert(name, v);
                }
                None => {
                    return Err(DomainError::invalid(
                        "proxy_config",
                        format!("proxy_config names the workspace secret {name}, which is not set (hearth secrets set {name})"),
                    ))
                }
            }
        }
        let key = &self.cfg.master_key;
        let mut resolve = |v: &SecretValue| -> Result<String, String> {
            match v {
                SecretValue::Plain(v) => Ok(v.clone()),
                SecretValue::Sealed(v) => key
                    .open(&opaque_aad(workspace), v)
                    .map_err(|e| e.to_string())
                    .and_then(|b| String::from_utf8(b).map_err(|_| "not UTF-8".to_owned())),
                SecretValue::Template(v) => expand(v, &secrets),
            }
        };
        let mut policy = Policy::from_spec(spec, &mut resolve).map_err(policy_error)?;
        policy.check_credentials(spec).map_err(policy_error)?;
        policy.tenant_id = Some(workspace.to_string());
        Ok((policy, spec.env()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand_and_name_what_is_missing() {
        assert_eq!(template_names("Bearer {TOKEN} {x_2}"), ["TOKEN", "x_2"]);
        assert!(template_names("{not a name} {").is_empty());
        let secrets = BTreeMap::from([("TOKEN".to_owned(), "s3cr3t".to_owned())]);
        assert_eq!(expand("Bearer {TOKEN}", &secrets).unwrap(), "Bearer s3cr3t");
        assert!(expand("{MISSING}", &secrets)
            .unwrap_err()
            .contains("MISSING"));
    }

    #[test]
    fn opaque_values_are_sealed_and_open_only_for_their_workspace() {
        let key = MasterKey::ephemeral();
        let ws = WorkspaceId::new();
        let mut cfg: ProxyConfig = serde_json::from_value(serde_json::json!({
            "rules": [{"name": "r", "match_hosts": ["api.test"],
                       "headers": [{"name": "x-key", "type": "opaque", "value": "hunter2"}]}]
        }))
        .unwrap();
        seal_opaque(&key, ws, &mut cfg).unwrap();
        let sealed = cfg.rules[0].headers[0].value.clone().unwrap();
        assert!(!sealed.contains("hunter2"));
        assert_eq!(key.open(&opaque_aad(ws), &sealed).unwrap(), b"hunter2");
        assert!(key.open(&opaque_aad(WorkspaceId::new()), &sealed).is_err());
    }
}
