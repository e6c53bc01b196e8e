//! E2B's secrets API (`Secret.create/update/list/get_info/exists/destroy`
//! of the e2b SDKs): the workspace's secrets, the ones LangSmith's
//! `/workspaces/current/secrets` keeps and proxy rules fill (E2B's
//! `${e2b.secrets.NAME}` in a transform, `e2b/rules.rs`). Values are
//! write-only: no answer carries one. A secret is found by its id or its
//! name. The rules (names, values, metadata, versions) are the domain's
//! (`Control::create_secret` and its neighbours).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::api::{json_body, page_limit, page_response};
use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::workspace_secrets::SecretInfo;
use crate::Control;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSecret {
    name: String,
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretUpdate {
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

/// E2B's `Secret`: never the value.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecretBody {
    #[serde(rename = "secretID")]
    secret_id: String,
    name: String,
    current_version: u64,
    metadata: BTreeMap<String, String>,
    created_at: String,
    updated_at: String,
}

impl From<SecretInfo> for SecretBody {
    fn from(s: SecretInfo) -> Self {
        Self {
            secret_id: s.id.to_string(),
            name: s.meta.name,
            current_version: s.meta.version,
            metadata: s.meta.metadata,
            created_at: s.meta.created_at.to_rfc3339(),
            updated_at: s.meta.updated_at.to_rfc3339(),
        }
    }
}

/// `POST /secrets`.
pub async fn create(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: NewSecret = json_body(&body?.0)?;
    let made = c
        .create_secret(
            &who,
            &req.name,
            &req.value,
            req.metadata.unwrap_or_default(),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(SecretBody::from(made))).into_response())
}

/// `POST /secrets/{id}`: a new value (a new version).
pub async fn update(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: SecretUpdate = json_body(&body?.0)?;
    let s = c.update_secret(&who, &id, &req.value, req.metadata).await?;
    Ok(Json(SecretBody::from(s)).into_response())
}

/// `GET /secrets/{id}`.
pub async fn get(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let s = c.secret(&who?, &id).await?;
    Ok(Json(SecretBody::from(s)).into_response())
}

/// `DELETE /secrets/{id}`.
pub async fn delete(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    c.remove_secret(&who?, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /secrets?limit=&nextToken=`: by name; the token is the last name
/// of the page before.
pub async fn list(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let (mut limit, mut after) = (100usize, None);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "limit" => limit = page_limit(&v)? as usize,
            "nextToken" => after = Some(v.into_owned()).filter(|t| !t.is_empty()),
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of /secrets"
                )))
            }
        }
    }
    let all = c.secrets(&who?).await?;
    let rest: Vec<SecretInfo> = all
        .into_iter()
        .filter(|s| after.as_deref().is_none_or(|a| s.meta.name.as_str() > a))
        .collect();
    let more = rest.len() > limit;
    let page: Vec<SecretBody> = rest.into_iter().take(limit).map(SecretBody::from).collect();
    let next = more.then(|| page.last().map(|s| s.name.clone())).flatten();
    Ok(page_response(page, next))
}
