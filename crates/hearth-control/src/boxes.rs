//! Handlers of the public API (`/api/v2/sandboxes/…` and `/v2/sandboxes/…`).
//! They only parse the request and call [`crate::Control`].

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_api::boxes::LifecycleRequest;
use hearth_api::{ListSnapshotsQuery, SnapshotTag, SnapshotsByNameResponse};

use crate::auth::Principal;
use crate::error::HttpResult;
use crate::extract::{JsonBody, Path};
use crate::list::snapshot_response;
use crate::Control;

pub async fn create(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let sb = c.create(&who, &body).await?;
    Ok((StatusCode::CREATED, Json(sb)).into_response())
}

pub async fn list(
    State(c): State<Arc<Control>>,
    who: Principal,
    RawQuery(q): RawQuery,
) -> HttpResult<Response> {
    Ok(Json(c.list(&who, q.as_deref().unwrap_or("")).await?).into_response())
}

pub async fn get(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    let row = c.get(&who, &name).await?;
    Ok(Json(c.response_for(&who, &row)?).into_response())
}

/// `GET /boxes/{name}/events`: the sandbox's status history.
pub async fn events(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    Ok(Json(c.sandbox_events(&who, &name).await?).into_response())
}

/// `GET /boxes/{name}/metrics`: what the sandbox costs its host now.
pub async fn metrics(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    Ok(Json(c.sandbox_metrics(&who, &name).await?).into_response())
}

pub async fn update(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    Ok(Json(c.update(&who, &name, &body).await?).into_response())
}

pub async fn delete(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<StatusCode> {
    c.delete(&who, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn status(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    Ok(Json(c.status(&who, &name).await?).into_response())
}

pub async fn start(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let _: LifecycleRequest = hearth_api::parse_body(&body)?;
    Ok(Json(c.start(&who, &name).await?).into_response())
}

pub async fn stop(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let _: LifecycleRequest = hearth_api::parse_body(&body)?;
    Ok(Json(c.stop(&who, &name).await?).into_response())
}

pub async fn list_snapshots(
    State(c): State<Arc<Control>>,
    who: Principal,
    RawQuery(q): RawQuery,
) -> HttpResult<Response> {
    who.require("sandboxes:read")?;
    let pairs = crate::extract::query_pairs(q.as_deref());
    let q = ListSnapshotsQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    let filter = hearth_db::SnapshotFilter {
        name_contains: q.name_contains.clone(),
        status: q.status.and_then(|s| {
            hearth_db::SnapshotStatus::parse(serde_json::to_value(s).ok()?.as_str()?)
        }),
        page_size: q.page_size.or(q.limit).unwrap_or(50),
        cursor: q.cursor.clone(),
        ..hearth_db::SnapshotFilter::default()
    };
    let page = c
        .snapshot_page(&who, &filter, q.offset.unwrap_or(0))
        .await?;
    let items = page
        .items
        .iter()
        .map(|s| snapshot_response(s, vec![s.tag.clone()]))
        .collect();
    Ok(Json(hearth_api::ListSnapshotsResponse::new(
        items,
        page.next_cursor,
    ))
    .into_response())
}

pub async fn get_snapshot(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(reference): Path<String>,
) -> HttpResult<Response> {
    let snap = c.snapshot(&who, &reference).await?;
    Ok(Json(snapshot_response(&snap, vec![snap.tag.clone()])).into_response())
}

pub async fn capture_snapshot(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let snap = c.capture_snapshot(&who, &name, &body).await?;
    Ok((StatusCode::ACCEPTED, Json(snap)).into_response())
}

pub async fn create_snapshot(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let snap = c.create_snapshot(&who, &body).await?;
    Ok((StatusCode::ACCEPTED, Json(snap)).into_response())
}

pub async fn delete_snapshot(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(reference): Path<String>,
) -> HttpResult<StatusCode> {
    c.delete_snapshot(&who, &reference).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn snapshots_by_name(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    let tags = c
        .snapshot_tags(&who, &name)
        .await?
        .into_iter()
        .map(|s| SnapshotTag {
            tag: s.tag,
            snapshot_id: *s.id.as_uuid(),
        })
        .collect();
    Ok(Json(SnapshotsByNameResponse { name, tags }).into_response())
}

pub async fn create_pool(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let p = c.create_pool(&who, &body).await?;
    Ok((StatusCode::CREATED, Json(p)).into_response())
}

pub async fn list_pools(State(c): State<Arc<Control>>, who: Principal) -> HttpResult<Response> {
    Ok(Json(c.list_pools(&who).await?).into_response())
}

pub async fn get_pool(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    Ok(Json(c.get_pool(&who, &name).await?).into_response())
}

pub async fn resize_pool(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    Ok(Json(c.resize_pool(&who, &name, &body).await?).into_response())
}

pub async fn delete_pool(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<StatusCode> {
    c.delete_pool(&who, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn fork(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let forked = c.fork(&who, &name, &body).await?;
    Ok((StatusCode::CREATED, Json(forked)).into_response())
}

/// `POST /boxes/batch-delete`: each named sandbox deleted, or skipped
/// with why.
pub async fn batch_delete(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let req: hearth_api::quota::BatchDeleteRequest = hearth_api::parse_body(&body)?;
    let done = c.delete_many(&who, &req.names).await?;
    Ok(Json(hearth_api::quota::BatchDeleteResponse {
        deleted: done.deleted,
        skipped: done
            .skipped
            .into_iter()
            .map(|(name, reason)| hearth_api::quota::BatchSkipped { name, reason })
            .collect(),
    })
    .into_response())
}

/// `GET /usage`: the workspace's use and limits.
pub async fn usage(State(c): State<Arc<Control>>, who: Principal) -> HttpResult<Response> {
    let u = c.usage(&who).await?;
    let count = |status: &str| u.counts.by_status.get(status).copied().unwrap_or(0);
    Ok(Json(hearth_api::quota::UsageResponse {
        cpu_limit_millicores: u.quotas.max_cpu.map(|c| u64::from(c.0)),
        cpu_used_millicores: u64::from(u.usage.cpu.0),
        memory_limit_bytes: u.quotas.max_mem.map(|m| m.bytes()),
        memory_used_bytes: u.usage.mem.bytes(),
        sandboxes_limit: u.quotas.max_sandboxes,
        sandboxes_used: u.usage.sandboxes,
        sandbox_running_count: count("ready") + count("provisioning"),
        sandbox_stopped_count: count("stopped"),
        sandbox_direct_count: u.counts.by_status.values().sum::<u64>() - count("deleting"),
        sandbox_pool_replicas_count: u.counts.pool_members,
        pools_count: u.counts.pools,
        registries_count: u.counts.registries,
        snapshots_count: u.usage.snapshots,
        templates_count: 0,
    })
    .into_response())
}

/// `GET /usage/costs`: not served (Hearth meters no LangSmith Compute or
/// Storage Units): a 501 naming it.
pub async fn usage_costs(who: Principal) -> HttpResult<Response> {
    who.require("sandboxes:read")?;
    Err(hearth_api::ApiError::new(
        501,
        "NotImplemented",
        "GET /api/v2/sandboxes/usage/costs: Hearth meters no LangSmith Compute or Storage Units; /api/v2/sandboxes/usage answers what the workspace holds",
    )
    .into())
}
