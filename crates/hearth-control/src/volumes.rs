//! LangSmith's volume routes (`/api/v2/sandboxes/volumes`): parsing and
//! rendering only; what a volume is and who may do what to it is the
//! domain's (`domain/volumes.rs`).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hearth_api::volumes::{
    CloneVolumeRequest, CreateVolumeRequest, ListVolumesQuery, ListVolumesResponse,
    UpdateVolumeRequest, VolumeAttachmentResponse, VolumeResponse,
};
use hearth_api::ApiError;

use crate::auth::Principal;
use crate::domain::volumes::{NewVolume, VolumeChange, VolumeView};
use crate::error::HttpResult;
use crate::extract::{JsonBody, Path};
use crate::Control;

/// The routes, under `/api/v2/sandboxes`.
pub(crate) fn routes() -> Router<Arc<Control>> {
    Router::new()
        .route("/volumes", get(list).post(create))
        .route(
            "/volumes/{volume}",
            get(retrieve).patch(update).delete(remove),
        )
        .route("/volumes/{volume}/clone", post(clone))
}

fn response(v: &VolumeView) -> Result<VolumeResponse, ApiError> {
    let id = v.row.id.parse().map_err(|_| {
        tracing::error!(volume = %v.row.id, "a stored volume's id is not a UUID");
        ApiError::internal()
    })?;
    Ok(VolumeResponse {
        id,
        name: v.row.name.clone(),
        size_bytes: v.row.size.bytes(),
        status: "ready".into(),
        status_message: None,
        description: v.row.description.clone(),
        labels: v.row.labels.clone(),
        attachments: v
            .attachments
            .iter()
            .map(|a| VolumeAttachmentResponse {
                sandbox_id: *a.sandbox_id.as_uuid(),
                sandbox_name: a.sandbox_name.clone(),
                mount_path: a.mount_path.clone(),
                read_only: a.read_only,
            })
            .collect(),
        source_volume_id: None,
        created_at: v.row.created_at.to_rfc3339(),
        created_by: v.row.created_by.clone(),
        updated_at: v.row.updated_at.to_rfc3339(),
        updated_by: v.row.updated_by.clone(),
    })
}

async fn create(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let req: CreateVolumeRequest = hearth_api::parse_body(&body)?;
    let v = c
        .create_volume(
            &who,
            NewVolume {
                name: req.name,
                size: Some(req.size_bytes),
                description: req.description,
                labels: req.labels.unwrap_or_default(),
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(response(&v)?)).into_response())
}

async fn list(
    State(c): State<Arc<Control>>,
    who: Principal,
    RawQuery(q): RawQuery,
) -> HttpResult<Response> {
    let pairs = crate::extract::query_pairs(q.as_deref());
    let q = ListVolumesQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    let page = c
        .list_volumes(
            &who,
            q.name_contains.as_deref(),
            q.page_size.unwrap_or(hearth_db::MAX_PAGE_SIZE),
            q.cursor.as_deref(),
        )
        .await?;
    let items = page
        .items
        .iter()
        .map(response)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(ListVolumesResponse {
        items,
        next_cursor: page.next_cursor,
    })
    .into_response())
}

async fn retrieve(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(volume): Path<String>,
) -> HttpResult<Response> {
    Ok(Json(response(&c.volume(&who, &volume).await?)?).into_response())
}

async fn update(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(volume): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let req: UpdateVolumeRequest = hearth_api::parse_body(&body)?;
    let change = VolumeChange {
        description: req.description,
        labels: req.labels.map(Option::unwrap_or_default),
    };
    Ok(Json(response(&c.update_volume(&who, &volume, change).await?)?).into_response())
}

async fn remove(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(volume): Path<String>,
) -> HttpResult<StatusCode> {
    if c.delete_volume(&who, &volume).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("volume", &volume).into())
    }
}

async fn clone(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(volume): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let req: CloneVolumeRequest = hearth_api::parse_body(&body)?;
    // Without labels of its own, the source's.
    let inherit_labels = req.labels.is_none();
    let v = c
        .clone_volume(
            &who,
            &volume,
            NewVolume {
                name: req.name,
                size: None,
                description: req.description,
                labels: req.labels.unwrap_or_default(),
            },
            inherit_labels,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(response(&v)?)).into_response())
}
