//! API keys: `X-Api-Key` on every request, stored as a BLAKE3 hash and
//! bound to one workspace. A sandbox outside the caller's workspace does not
//! exist for it (404); runtime access (exec, files, tunnel) needs the
//! sandbox's creator or the `sandboxes:exec` permission (403 otherwise).
//!
//! Code in a sandbox created with `access_delegation` calls the API as the
//! sandbox's creator without a key of its own: the egress proxy of the
//! sandbox's host adds `Authorization: Bearer` with a short-lived EdDSA
//! token (`aud` [`DELEGATION_AUDIENCE`], `sub` the sandbox) signed by the
//! host's key. Each request re-checks everything: the key is registered and
//! not retired and (a host's) belongs to the sandbox's host, the sandbox
//! exists with a delegation, and its creator's key is not revoked; the
//! rights are the creator's current ones, capped by the granted permissions.

use std::sync::Arc;

use crate::domain::error::DomainError;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use hearth_db::SandboxRow;
use hearth_types::{ApiKeyId, WorkspaceId};

use crate::error::Refusal;
use crate::Control;

/// Who is calling.
#[derive(Clone, Debug)]
pub struct Principal {
    pub key_id: ApiKeyId,
    pub workspace_id: WorkspaceId,
    pub permissions: Vec<String>,
    /// The sandbox calling as its creator (`access_delegation`), if one
    /// is: being the creator of a sandbox then grants nothing by itself.
    pub delegated_by: Option<hearth_types::SandboxId>,
}

/// The audience of delegation tokens.
pub const DELEGATION_AUDIENCE: &str = "hearth-delegation";
/// The longest a delegation token may live, and the clock skew allowed.
const DELEGATION_MAX_TTL: u64 = 600;
const DELEGATION_SKEW: u64 = 30;

/// Permissions a key may hold.
pub const PERMISSIONS: &[&str] = &[
    "sandboxes:create",
    "sandboxes:read",
    "sandboxes:update",
    "sandboxes:delete",
    "sandboxes:exec",
    "sandboxes:*",
    // API keys through the API (`api_keys.rs`); `sandboxes:*` does not
    // include it.
    "keys:manage",
    "*",
    // The fleet's hosts (`hosts.rs`), for operators: `*` does not include
    // it, so a workspace's keys never see the fleet unless granted it.
    "fleet:read",
];

impl Principal {
    pub fn can(&self, permission: &str) -> bool {
        self.permissions
            .iter()
            .any(|p| p == "*" || p == "sandboxes:*" || p == permission)
    }

    /// Whether a sandbox calls as its creator (`access_delegation`).
    pub fn is_delegated(&self) -> bool {
        self.delegated_by.is_some()
    }

    /// The identity recorded as `created_by` / `updated_by`.
    pub fn who(&self) -> String {
        self.key_id.to_string()
    }

    pub fn require(&self, permission: &str) -> Result<(), DomainError> {
        if self.can(permission) {
            Ok(())
        } else {
            Err(DomainError::Forbidden(format!(
                "this API key lacks {permission}"
            )))
        }
    }

    /// Exec, files, tunnels, links, captures and runtime tokens: the
    /// creator, or `sandboxes:exec`. The one rule of runtime access, for
    /// both doors.
    pub fn require_runtime(&self, sandbox: &SandboxRow) -> Result<(), DomainError> {
        if sandbox.created_by == self.who() {
            self.require_runtime_as_creator()
        } else {
            self.require("sandboxes:exec")
                .map_err(|_| DomainError::not_creator())
        }
    }

    /// Attaching a volume to a sandbox and opening its content (E2B's
    /// volume content API): runtime access's rule, the volume's creator or
    /// `sandboxes:exec`.
    pub fn may_open_volume(&self, volume: &hearth_db::VolumeRow) -> Result<(), DomainError> {
        let creator = volume.created_by == self.who();
        if (creator && self.require_runtime_as_creator().is_ok()) || self.can("sandboxes:exec") {
            Ok(())
        } else {
            Err(DomainError::Forbidden(format!(
                "volume '{}': attaching it or opening its content needs its creator or \
                 sandboxes:exec",
                volume.name
            )))
        }
    }

    /// [`Self::require_runtime`] on a sandbox this principal creates: a
    /// sandbox calling as its creator (`access_delegation`) is not the
    /// creator for this rule, so it needs `sandboxes:exec`.
    pub fn require_runtime_as_creator(&self) -> Result<(), DomainError> {
        if !self.is_delegated() || self.can("sandboxes:exec") {
            Ok(())
        } else {
            Err(DomainError::not_creator())
        }
    }
}

/// The hash under which a secret is stored. A secret in its E2B form
/// ([`e2b_form`]) is the same key.
pub fn hash_key(secret: &str) -> String {
    let canonical = secret
        .strip_prefix(E2B_PREFIX)
        .filter(|hex| is_secret_hex(hex))
        .map(|hex| format!("{SECRET_PREFIX}{hex}"));
    let secret = canonical.as_deref().unwrap_or(secret);
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

const SECRET_PREFIX: &str = "hth_";
const E2B_PREFIX: &str = "e2b_";
/// Hex digits after a secret's prefix.
const SECRET_HEX: usize = 40;

fn is_secret_hex(s: &str) -> bool {
    s.len() == SECRET_HEX && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new secret: `hth_` and 40 hex digits of randomness.
pub fn new_secret() -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("{SECRET_PREFIX}{}{}", a, &b[..8])
}

/// The same key as E2B's SDKs take it: `e2b_` and the same 40 hex digits
/// (e2b releases before 2.63 refuse a key of another form before sending
/// it). `None` for a secret not of Hearth's form.
pub fn e2b_form(secret: &str) -> Option<String> {
    secret
        .strip_prefix(SECRET_PREFIX)
        .filter(|hex| is_secret_hex(hex))
        .map(|hex| format!("{E2B_PREFIX}{hex}"))
}

/// Stores a new key for `workspace` and returns its id and secret (the
/// secret is shown once; only its hash is kept).
pub async fn create_key(
    db: &hearth_db::Db,
    workspace: WorkspaceId,
    permissions: &[&str],
    description: &str,
) -> Result<(ApiKeyId, String), DomainError> {
    if let Some(bad) = permissions.iter().find(|p| !PERMISSIONS.contains(p)) {
        return Err(DomainError::invalid(
            "permissions",
            format!(
                "unknown permission {bad:?}; known: {}",
                PERMISSIONS.join(", ")
            ),
        ));
    }
    let secret = new_secret();
    let key = db
        .create_api_key(&hearth_db::NewApiKey {
            id: ApiKeyId::new(),
            workspace_id: workspace,
            key_hash: hash_key(&secret),
            prefix: secret[..8].to_owned(),
            description: description.to_owned(),
            permissions: permissions.iter().map(|p| p.to_string()).collect(),
        })
        .await
        .map_err(DomainError::from)?;
    Ok((key.id, secret))
}

impl FromRequestParts<Arc<Control>> for Principal {
    type Rejection = Refusal;

    async fn from_request_parts(
        parts: &mut Parts,
        control: &Arc<Control>,
    ) -> Result<Self, Refusal> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .or_else(|| websocket_key(&parts.headers));
        let Some(key) = key else {
            let bearer = parts
                .headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or(DomainError::Unauthenticated(None))?;
            return Ok(delegated(control, bearer.trim()).await?);
        };
        if key.len() > 256 {
            return Err(DomainError::Unauthenticated(None).into());
        }
        let found = control
            .db
            .find_api_key(&hash_key(key))
            .await
            .map_err(DomainError::from)?;
        let key = found.ok_or(DomainError::Unauthenticated(None))?;
        Ok(Principal {
            key_id: key.id,
            workspace_id: key.workspace_id,
            permissions: key.permissions,
            delegated_by: None,
        })
    }
}

/// The subprotocol a WebSocket offers to say it speaks Hearth's exec
/// protocol with a key in a second subprotocol ([`WS_KEY_PREFIX`]); the
/// server selects this one.
pub const WS_PROTOCOL: &str = "hearth";
/// The prefix of the subprotocol that carries an API key on a WebSocket
/// opened by a browser (the console), which cannot set `X-Api-Key` there:
/// `new WebSocket(url, ["hearth", "hearth.key.<key>"])`. Like the header,
/// nothing ambient: a page must know the key to send it.
pub const WS_KEY_PREFIX: &str = "hearth.key.";

/// The API key offered as a WebSocket subprotocol, if any.
fn websocket_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_KEY_PREFIX))
        .filter(|k| !k.is_empty())
}

#[derive(serde::Deserialize)]
struct DelegationClaims {
    aud: String,
    sub: String,
    iat: u64,
    exp: u64,
}

/// The principal a delegation token stands for; any failure is a 401 that
/// says which check failed (the caller is code in a sandbox, which knows
/// its own sandbox anyway).
async fn delegated(control: &Control, token: &str) -> Result<Principal, DomainError> {
    use hearth_db::KeyOwnerKind;
    let refuse =
        |why: &str| DomainError::Unauthenticated(Some(format!("delegated access refused: {why}")));
    let kid = hearth_fence::jwt::key_id(token).map_err(|e| refuse(&e.to_string()))?;
    let key = control
        .db
        .signing_key(&kid)
        .await
        .map_err(DomainError::from)?
        .filter(|k| k.retired_at.is_none())
        .ok_or_else(|| refuse("the token's key is unknown or retired"))?;
    let public = hearth_fence::PublicKey::from_bytes(&key.public_key)
        .map_err(|_| refuse("the token's key is unusable"))?;
    let claims: DelegationClaims =
        hearth_fence::jwt::verify(token, &public).map_err(|e| refuse(&e.to_string()))?;
    let now = hearth_fence::now_ms() / 1000;
    if claims.aud != DELEGATION_AUDIENCE
        || claims.exp + DELEGATION_SKEW < now
        || claims.iat > now + DELEGATION_SKEW
        || claims.exp.saturating_sub(claims.iat) > DELEGATION_MAX_TTL
    {
        return Err(refuse("the token is expired or not a delegation token"));
    }
    let id: hearth_types::SandboxId = claims
        .sub
        .parse()
        .map_err(|_| refuse("the token names no sandbox"))?;
    let sandbox = match control.db.get_sandbox_by_id(id).await {
        Ok(s) => s,
        Err(hearth_db::DbError::NotFound { .. }) => return Err(refuse("the sandbox is gone")),
        Err(e) => return Err(DomainError::from(e)),
    };
    // A host vouches only for the sandboxes it holds.
    if key.owner_kind == KeyOwnerKind::Host
        && sandbox.host_id.map(|h| h.to_string()).as_deref() != Some(key.owner_id.as_str())
    {
        return Err(refuse("the token's host does not hold the sandbox"));
    }
    delegation_of(control, &sandbox)
        .await?
        .map_err(|why| refuse(&why))
}

/// The principal a sandbox with `access_delegation` calls as, checked now:
/// the sandbox is not being deleted and has a delegation, its creator's key
/// is live, and the rights are that key's current ones capped by the
/// delegation. `Ok(Err(why))` when it calls as no one. Delegation tokens
/// and the runtime tokens a delegated sandbox obtained are both checked
/// with it, so ending the delegation ends them.
pub(crate) async fn delegation_of(
    control: &Control,
    sandbox: &SandboxRow,
) -> Result<Result<Principal, String>, DomainError> {
    let refuse = |why: &str| Ok(Err(why.to_owned()));
    if sandbox.status == hearth_db::SandboxStatus::Deleting {
        return refuse("the sandbox is being deleted");
    }
    let spec = crate::domain::queries::spec_of(sandbox)?;
    let Some(delegation) = spec.delegation else {
        return refuse("the sandbox was created without access_delegation");
    };
    let Ok(creator_id) = sandbox.created_by.parse::<ApiKeyId>() else {
        return refuse("the sandbox's creator is not an API key");
    };
    let Some(creator) = control
        .db
        .active_api_key(creator_id)
        .await
        .map_err(DomainError::from)?
    else {
        return refuse("the sandbox's creator's API key was revoked");
    };
    let as_creator = Principal {
        key_id: creator.id,
        workspace_id: creator.workspace_id,
        permissions: creator.permissions.clone(),
        delegated_by: Some(sandbox.id),
    };
    let permissions = match delegation.mode {
        hearth_types::sandbox::DelegationMode::Inherit => creator.permissions,
        hearth_types::sandbox::DelegationMode::Explicit => delegation
            .permissions
            .into_iter()
            .filter(|p| as_creator.can(p))
            .collect(),
    };
    Ok(Ok(Principal {
        permissions,
        ..as_creator
    }))
}

/// The principal of API key `key`, if it is live (not revoked).
pub(crate) async fn principal_of_key(
    control: &Control,
    key: ApiKeyId,
) -> Result<Option<Principal>, DomainError> {
    let found = control
        .db
        .active_api_key(key)
        .await
        .map_err(DomainError::from)?;
    Ok(found.map(|k| Principal {
        key_id: k.id,
        workspace_id: k.workspace_id,
        permissions: k.permissions,
        delegated_by: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_e2b_form_is_the_same_key() {
        let secret = new_secret();
        let e2b = e2b_form(&secret).expect("an e2b form");
        // What e2b 2.45.1's validate_api_key asks: "e2b_" and hex.
        assert!(e2b.starts_with("e2b_") && e2b[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(hash_key(&e2b), hash_key(&secret));
        // Anything else is hashed as given: no other key is reached.
        for other in [
            e2b.to_uppercase(),
            format!("{e2b}0"),
            e2b[..e2b.len() - 1].to_owned(),
            secret.replacen("hth_", "xyz_", 1),
        ] {
            assert_ne!(hash_key(&other), hash_key(&secret), "{other}");
        }
        assert_eq!(e2b_form("e2b_0123"), None);
        assert_eq!(e2b_form(&e2b), None);
    }
}
