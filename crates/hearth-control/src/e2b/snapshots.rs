//! E2B's snapshots of a sandbox: `POST /sandboxes/{id}/snapshots` and
//! `GET /snapshots`.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::model::SnapshotRow;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_types::rules::{SnapshotRef, DEFAULT_TAG};
use serde::{Deserialize, Serialize};

use super::api::*;
use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::domain::commands::Capture;
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::Control;

/// Body of `POST /sandboxes/{id}/snapshots`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    /// `name` or `name:tag`.
    name: Option<String>,
    /// `false`: the filesystem only (sandboxes made from it boot cold).
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
#[derive(Serialize)]
struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

fn snapshot_info(s: &SnapshotRow) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.to_string(),
        names: vec![if s.tag == DEFAULT_TAG {
            s.name.clone()
        } else {
            format!("{}:{}", s.name, s.tag)
        }],
    }
}

/// How long a snapshot may take to be stored before the request fails
/// (it goes on building; the snapshot list shows it once ready).
const SNAPSHOT_WAIT: Duration = Duration::from_secs(600);

/// `POST /sandboxes/{id}/snapshots`: a snapshot of the running sandbox,
/// with its memory unless `memory: false`, answered once it is stored.
/// Its id is a template: `Sandbox.create(snapshot_id)` resumes it. The
/// sandbox runs on (it is frozen only while its memory is copied).
pub async fn create_snapshot(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: SnapshotBody = optional_body(&body?.0)?;
    let row = c.e2b_find(&who, &id).await?;
    let reference = req
        .name
        .as_deref()
        .map(str::parse::<SnapshotRef>)
        .transpose()
        .map_err(|e| E2bError::bad_request(format!("name: {e}")))?;
    let capture = Capture {
        reference,
        include_memory: req.memory.unwrap_or(true),
        ..Capture::default()
    };
    let building = c.capture(&who, &row.id.to_string(), &capture).await?;
    let deadline = tokio::time::Instant::now() + SNAPSHOT_WAIT;
    loop {
        let now = c.snapshot(&who, &building.id.to_string()).await?;
        match now.status {
            crate::domain::model::SnapshotStatus::Ready => {
                return Ok((StatusCode::CREATED, Json(snapshot_info(&now))).into_response())
            }
            crate::domain::model::SnapshotStatus::Building
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            crate::domain::model::SnapshotStatus::Building => {
                return Err(E2bError::new(
                    504,
                    format!("snapshot {} is still being stored", now.id),
                ))
            }
            _ => {
                return Err(E2bError::new(
                    500,
                    format!(
                        "snapshot of {id} failed: {}",
                        now.status_message
                            .unwrap_or_else(|| now.status.as_str().to_owned())
                    ),
                ))
            }
        }
    }
}

/// `GET /snapshots`: the workspace's snapshots captured from sandboxes
/// (through either API), newest first, `sandboxID` and `name` (a name,
/// `name:tag` or an id) filtering, paged by `limit` and `nextToken`
/// (`x-next-token`).
pub async fn list_snapshots(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let mut filter = crate::domain::model::SnapshotFilter {
        captured_only: true,
        status: Some(crate::domain::model::SnapshotStatus::Ready),
        page_size: 100,
        ..Default::default()
    };
    let mut name = None;
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "sandboxID" => match c.e2b_find(&who, &v).await {
                Ok(row) => filter.from_sandbox = Some(row.id),
                // Another workspace's or no sandbox: it has no snapshots
                // this caller may see.
                Err(_) => return Ok(Json(Vec::<SnapshotInfo>::new()).into_response()),
            },
            "name" => name = Some(v.into_owned()),
            "limit" => filter.page_size = page_limit(&v)?,
            "nextToken" => filter.cursor = Some(v.into_owned()).filter(|t| !t.is_empty()),
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter Hearth's snapshot list serves"
                )))
            }
        }
    }
    if let Some(n) = name {
        // One snapshot by id or name[:tag], when it is one of the listed.
        // A name that is not one is the caller's mistake, said as such.
        if n.parse::<uuid::Uuid>().is_err() {
            n.parse::<SnapshotRef>()
                .map_err(|e| E2bError::bad_request(format!("name: {e}")))?;
        }
        let found = c.snapshot(&who, &n).await.ok();
        let listed = found.filter(|s| {
            s.status == crate::domain::model::SnapshotStatus::Ready
                && s.source_sandbox_id.is_some()
                && filter
                    .from_sandbox
                    .is_none_or(|f| s.source_sandbox_id == Some(f))
        });
        return Ok(Json(listed.iter().map(snapshot_info).collect::<Vec<_>>()).into_response());
    }
    let page = c
        .snapshot_page(&who, &filter, 0)
        .await
        .map_err(page_error)?;
    let items: Vec<_> = page.items.iter().map(snapshot_info).collect();
    Ok(page_response(items, page.next_cursor))
}
