//! API keys: `X-Api-Key` on every request, stored as a BLAKE3 hash and
//! bound to one workspace. A sandbox outside the caller's workspace does not
//! exist for it (404); runtime access (exec, files, tunnel) needs the
//! sandbox's creator or the `sandboxes:exec` permission (403 otherwise).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use hearth_api::ApiError;
use hearth_db::SandboxRow;
use hearth_types::{ApiKeyId, WorkspaceId};

use crate::error::HttpError;
use crate::Control;

/// Who is calling.
#[derive(Clone, Debug)]
pub struct Principal {
    pub key_id: ApiKeyId,
    pub workspace_id: WorkspaceId,
    pub permissions: Vec<String>,
}

/// Permissions a key may hold.
pub const PERMISSIONS: &[&str] = &[
    "sandboxes:create",
    "sandboxes:read",
    "sandboxes:update",
    "sandboxes:delete",
    "sandboxes:exec",
    "sandboxes:*",
    "*",
];

impl Principal {
    pub fn can(&self, permission: &str) -> bool {
        self.permissions
            .iter()
            .any(|p| p == "*" || p == "sandboxes:*" || p == permission)
    }

    /// The identity recorded as `created_by` / `updated_by`.
    pub fn who(&self) -> String {
        self.key_id.to_string()
    }

    pub fn require(&self, permission: &str) -> Result<(), ApiError> {
        if self.can(permission) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this API key lacks {permission}"
            )))
        }
    }

    /// Exec, files and tunnels: the creator, or `sandboxes:exec`.
    pub fn require_runtime(&self, sandbox: &SandboxRow) -> Result<(), ApiError> {
        if sandbox.created_by == self.who() || self.can("sandboxes:exec") {
            Ok(())
        } else {
            Err(ApiError::forbidden_not_creator())
        }
    }
}

/// The hash under which a secret is stored.
pub fn hash_key(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

/// A new secret: `hth_` and 40 hex digits of randomness.
pub fn new_secret() -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("hth_{}{}", a, &b[..8])
}

/// Stores a new key for `workspace` and returns its id and secret (the
/// secret is shown once; only its hash is kept).
pub async fn create_key(
    db: &hearth_db::Db,
    workspace: WorkspaceId,
    permissions: &[&str],
    description: &str,
) -> Result<(ApiKeyId, String), ApiError> {
    if let Some(bad) = permissions.iter().find(|p| !PERMISSIONS.contains(p)) {
        return Err(ApiError::validation(
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
        .map_err(crate::error::db_error)?;
    Ok((key.id, secret))
}

impl FromRequestParts<Arc<Control>> for Principal {
    type Rejection = HttpError;

    async fn from_request_parts(
        parts: &mut Parts,
        control: &Arc<Control>,
    ) -> Result<Self, HttpError> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        if key.len() > 256 {
            return Err(ApiError::unauthorized().into());
        }
        let found = control.db.find_api_key(&hash_key(key)).await?;
        let key = found.ok_or_else(ApiError::unauthorized)?;
        Ok(Principal {
            key_id: key.id,
            workspace_id: key.workspace_id,
            permissions: key.permissions,
        })
    }
}
