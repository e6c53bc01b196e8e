//! Runtime tokens: bearers that open a sandbox's files, processes or ports
//! without an API key (E2B's `envdAccessToken` and `trafficAccessToken`).
//!
//! One rule decides who gets one, the rule LangSmith's data plane applies
//! to exec, files and tunnels: [`Principal::require_runtime`] (the
//! sandbox's creator, or `sandboxes:exec`). A token names its kind, its
//! sandbox, the API key that obtained it and, when a sandbox obtained it
//! through `access_delegation`, that sandbox; it expires
//! ([`RUNTIME_TOKEN_TTL`]). Every use checks it again from the records: the
//! key is live, the delegation still stands, and the holder's current
//! rights still give runtime access to the sandbox. So revoking the key, or
//! deleting the delegating sandbox, ends every token obtained through it.
//!
//! Tokens are sealed with the deployment's link key under their own
//! context ([`crate::links::LinkKey::seal`]): stateless, the same on every
//! control-plane replica, never valid as a download link or a service URL.

use std::time::Duration;

use crate::domain::error::DomainError;
use hearth_db::{SandboxRow, Timestamp};
use hearth_types::{ApiKeyId, SandboxId};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::Control;

/// How long a runtime token lives: a day, E2B's longest sandbox lifetime.
/// An SDK that holds a sandbox longer connects again for fresh tokens.
pub const RUNTIME_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// The MAC context of runtime tokens.
const CONTEXT: &str = "hearth runtime token v1";
/// Claims format.
const VERSION: u8 = 1;

/// What a runtime token opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// envd: files and processes (E2B's `X-Access-Token`).
    Envd,
    /// The sandbox's ports when it is not public
    /// (`E2B-Traffic-Access-Token`).
    Traffic,
}

/// What a runtime token pins. Short names: it travels in every request.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    v: u8,
    kind: RuntimeKind,
    sb: SandboxId,
    /// The API key that obtained the token.
    k: ApiKeyId,
    /// The sandbox that obtained it through its delegation, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<SandboxId>,
    /// Expiry, unix milliseconds.
    exp: i64,
}

/// A sandbox's runtime tokens, as handed to a caller with runtime access.
#[derive(Debug, Clone)]
pub struct RuntimeTokens {
    pub envd: String,
    pub traffic: String,
}

/// Why a runtime token opens nothing; each says so in its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a runtime token of this deployment, of this kind, for this
    /// sandbox.
    Invalid,
    Expired,
    /// The key (or delegation) that obtained it is gone, or no longer has
    /// runtime access to the sandbox.
    Revoked(String),
    /// Its sandbox is gone.
    Gone,
}

impl std::fmt::Display for TokenRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenRefusal::Invalid => f.write_str("the access token does not open this sandbox"),
            TokenRefusal::Expired => f.write_str(
                "the access token has expired: connect to the sandbox again for a new one",
            ),
            TokenRefusal::Revoked(why) => write!(f, "the access token was revoked: {why}"),
            TokenRefusal::Gone => f.write_str("the access token's sandbox no longer exists"),
        }
    }
}

impl Control {
    /// The runtime tokens of `row` for `who`: refused (403, LangSmith's
    /// message) unless `who` has runtime access to it.
    pub(crate) fn runtime_tokens(
        &self,
        who: &Principal,
        row: &SandboxRow,
    ) -> Result<RuntimeTokens, DomainError> {
        who.require_runtime(row)?;
        let expires_at = Timestamp::now().plus(RUNTIME_TOKEN_TTL);
        let mint = |kind| {
            self.links.seal(
                CONTEXT,
                &Claims {
                    v: VERSION,
                    kind,
                    sb: row.id,
                    k: who.key_id,
                    via: who.delegated_by,
                    exp: expires_at.unix_ms(),
                },
            )
        };
        Ok(RuntimeTokens {
            envd: mint(RuntimeKind::Envd),
            traffic: mint(RuntimeKind::Traffic),
        })
    }

    /// The sandbox `token` opens as `kind`, checked now against the
    /// records (see the module's documentation). Errors reading them are
    /// returned, not taken for a refusal.
    pub(crate) async fn check_runtime_token(
        &self,
        kind: RuntimeKind,
        id: SandboxId,
        token: &str,
    ) -> Result<Result<SandboxRow, TokenRefusal>, DomainError> {
        let claims: Option<Claims> = self.links.open(CONTEXT, token);
        let Some(claims) = claims.filter(|c| c.v == VERSION && c.kind == kind && c.sb == id) else {
            return Ok(Err(TokenRefusal::Invalid));
        };
        if Timestamp::now().unix_ms() >= claims.exp {
            return Ok(Err(TokenRefusal::Expired));
        }
        let holder = match claims.via {
            None => crate::auth::principal_of_key(self, claims.k)
                .await?
                .ok_or_else(|| "the API key that obtained it was revoked".to_owned()),
            Some(via) => match self.db.get_sandbox_by_id(via).await {
                Ok(row) => crate::auth::delegation_of(self, &row)
                    .await?
                    .map_err(|why| format!("the delegation that obtained it ended: {why}")),
                Err(hearth_db::DbError::NotFound { .. }) => {
                    Err("the sandbox that obtained it through its delegation is gone".to_owned())
                }
                Err(e) => return Err(DomainError::from(e)),
            },
        };
        let holder = match holder {
            // A delegation whose creator's key changed is another holder.
            Ok(h) if h.key_id == claims.k => h,
            Ok(_) => {
                return Ok(Err(TokenRefusal::Revoked(
                    "the key that obtained it no longer holds the delegation".into(),
                )))
            }
            Err(why) => return Ok(Err(TokenRefusal::Revoked(why))),
        };
        let row = match self.db.get_sandbox_by_id(id).await {
            Ok(row) if row.status != hearth_db::SandboxStatus::Deleting => row,
            Ok(_) | Err(hearth_db::DbError::NotFound { .. }) => return Ok(Err(TokenRefusal::Gone)),
            Err(e) => return Err(DomainError::from(e)),
        };
        if holder.workspace_id != row.workspace_id || holder.require_runtime(&row).is_err() {
            return Ok(Err(TokenRefusal::Revoked(
                "its holder no longer has runtime access to the sandbox".into(),
            )));
        }
        Ok(Ok(row))
    }
}
