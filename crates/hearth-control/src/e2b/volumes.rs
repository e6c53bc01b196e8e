//! E2B's volumes API (`Volume.create/connect/get_info/list/destroy` of the
//! e2b SDKs) over the workspace's volumes, the ones LangSmith's
//! `/api/v2/sandboxes/volumes` shows (`domain/volumes.rs` decides what a
//! volume is). `volumeMounts` on a create attaches them (`api.rs`). A
//! volume is found by its id or its name. An answer's `token` opens its
//! content API (`volume_content.rs`) for a caller who may open it (empty,
//! opening nothing, for others), and its `domain` is the deployment's.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::api::json_body;
use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::domain::volumes::{NewVolume, VolumeView};
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::Control;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewVolumeBody {
    name: String,
}

/// E2B's `VolumeAndToken`.
#[derive(Serialize)]
struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
    /// The content API's bearer token.
    token: String,
    /// Where the SDK sends content calls (`api.{domain}`), unless told
    /// (`E2B_VOLUME_API_URL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
}

/// E2B's `Volume` (in lists).
#[derive(Serialize)]
struct VolumeBody {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
}

fn with_token(c: &Control, who: &Principal, v: VolumeView) -> VolumeAndToken {
    VolumeAndToken {
        token: c.volume_token(who, &v.row),
        volume_id: v.row.id,
        name: v.row.name,
        domain: c.cfg.sandbox_domain.clone(),
    }
}

/// `POST /volumes`: a volume of [`hearth_types::rules::DEFAULT_VOLUME_SIZE`].
pub async fn create(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: NewVolumeBody = json_body(&body?.0)?;
    let made = c
        .create_volume(
            &who,
            NewVolume {
                name: req.name,
                size: None,
                description: None,
                labels: Default::default(),
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(with_token(&c, &who, made))).into_response())
}

/// `GET /volumes/{id}`.
pub async fn get(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let who = who?;
    let v = c.volume(&who, &id).await?;
    Ok(Json(with_token(&c, &who, v)).into_response())
}

/// `DELETE /volumes/{id}`: 404 when there is none (the SDK's `False`).
pub async fn delete(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    if c.delete_volume(&who?, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(crate::domain::error::DomainError::NotFound {
            kind: "volume",
            name: id,
        }
        .into())
    }
}

/// `GET /volumes`: every volume of the workspace, by name.
pub async fn list(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    if let Some((k, _)) = form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).next() {
        return Err(E2bError::bad_request(format!(
            "{k}: not a query parameter of /volumes"
        )));
    }
    let who = who?;
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = c
            .list_volumes(&who, None, LIST_PAGE, cursor.as_deref())
            .await?;
        out.extend(page.items.into_iter().map(|v| VolumeBody {
            volume_id: v.row.id,
            name: v.row.name,
        }));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(Json(out).into_response())
}

/// The page size a whole list is read in.
const LIST_PAGE: u32 = 100;
