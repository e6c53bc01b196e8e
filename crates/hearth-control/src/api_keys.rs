//! API keys through the API (LangSmith's `/api/v1/api-key` paths, so the
//! console can manage them): list a workspace's active keys, create one
//! (its secret answered once), revoke one. Only a key holding `*` or
//! `keys:manage` may, never a sandbox calling with delegated access, and a
//! new key gets no permission its creator lacks. A key of another
//! workspace does not exist for the caller (404).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use hearth_api::keys::{ApiKeyResponse, CreateApiKeyRequest, CreatedApiKeyResponse};
use hearth_api::ApiError;
use hearth_types::ApiKeyId;

use crate::auth::Principal;
use crate::error::{db_error, HttpResult};
use crate::extract::{JsonBody, Path};
use crate::Control;

/// The permission that manages keys (`*` includes it; `sandboxes:*` does
/// not).
pub const MANAGE: &str = "keys:manage";
/// Longest description, in bytes.
const MAX_DESCRIPTION: usize = 1024;

pub(crate) fn routes() -> Router<Arc<Control>> {
    Router::new()
        .route("/api-key", get(list).post(create))
        .route("/api-key/{api_key_id}", delete(revoke))
}

fn require_manage(who: &Principal) -> Result<(), ApiError> {
    let holds = who.permissions.iter().any(|p| p == "*" || p == MANAGE);
    if holds && !who.is_delegated() {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "managing API keys needs a key with * or {MANAGE}"
        )))
    }
}

fn response(k: &hearth_db::ApiKey) -> ApiKeyResponse {
    ApiKeyResponse {
        id: *k.id.as_uuid(),
        short_key: format!("{}…", k.prefix),
        description: k.description.clone(),
        permissions: k.permissions.clone(),
        created_at: k.created_at.to_rfc3339(),
    }
}

async fn list(
    State(c): State<Arc<Control>>,
    who: Principal,
) -> HttpResult<Json<Vec<ApiKeyResponse>>> {
    require_manage(&who)?;
    let keys =
        c.db.list_api_keys(who.workspace_id)
            .await
            .map_err(db_error)?;
    Ok(Json(
        keys.iter()
            .filter(|k| k.revoked_at.is_none())
            .map(response)
            .collect(),
    ))
}

async fn create(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<(StatusCode, Json<CreatedApiKeyResponse>)> {
    require_manage(&who)?;
    let req: CreateApiKeyRequest = hearth_api::parse_body(&body)?;
    if req.description.len() > MAX_DESCRIPTION || req.description.contains('\0') {
        return Err(ApiError::validation(
            "description",
            format!("at most {MAX_DESCRIPTION} bytes, without NUL"),
        )
        .into());
    }
    let permissions = req.permissions.unwrap_or_else(|| who.permissions.clone());
    if permissions.is_empty() {
        return Err(
            ApiError::validation("permissions", "a key needs at least one permission").into(),
        );
    }
    // `*` holds every permission but the operator's `fleet:read`, which
    // only a key holding it by name may pass on.
    let holds = |p: &str| {
        who.permissions
            .iter()
            .any(|h| h == p || (h == "*" && p != crate::hosts::FLEET_READ))
    };
    if let Some(p) = permissions.iter().find(|p| !holds(p)) {
        return Err(ApiError::forbidden(format!(
            "a key cannot grant {p:?}, which it does not hold itself"
        ))
        .into());
    }
    let perms: Vec<&str> = permissions.iter().map(String::as_str).collect();
    let (id, secret) =
        crate::auth::create_key(&c.db, who.workspace_id, &perms, &req.description).await?;
    let made =
        c.db.list_api_keys(who.workspace_id)
            .await
            .map_err(db_error)?
            .into_iter()
            .find(|k| k.id == id)
            .ok_or_else(|| {
                tracing::error!(key = %id, "a key just created is not in its workspace's list");
                ApiError::internal()
            })?;
    tracing::info!(key = %id, by = %who.key_id, "api key created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedApiKeyResponse {
            api_key: response(&made),
            key: secret,
        }),
    ))
}

async fn revoke(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
) -> HttpResult<StatusCode> {
    require_manage(&who)?;
    let not_found = || ApiError::not_found("api key", &id);
    let key: ApiKeyId = id.parse().map_err(|_| not_found())?;
    match c.db.revoke_api_key(who.workspace_id, key).await {
        Ok(()) => {
            tracing::info!(key = %key, by = %who.key_id, "api key revoked");
            Ok(StatusCode::NO_CONTENT)
        }
        Err(hearth_db::DbError::NotFound { .. }) => Err(not_found().into()),
        Err(e) => Err(db_error(e).into()),
    }
}
