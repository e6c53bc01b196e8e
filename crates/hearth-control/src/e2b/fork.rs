//! `POST /sandboxes/{id}/fork`: E2B's fork, over Hearth's.

use std::sync::Arc;

use crate::domain::model::{OnExpiry, SandboxStatus};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_types::sandbox::Lifetime;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::api::*;
use super::E2bResult;
use crate::auth::Principal;
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::Control;

/// Body of `POST /sandboxes/{id}/fork`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    /// The children's lifetime in seconds (E2B's default: 15).
    timeout: Option<i64>,
    /// Children to make (E2B allows 1 to 20, Hearth 1 to 16).
    count: Option<i64>,
}

/// E2B's default lifetime of a fork's children, in seconds.
const FORK_DEFAULT_TIMEOUT_SECS: i64 = 15;

/// One entry of a fork's answer: the child, or why it did not start.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ForkEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<SandboxBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

/// `POST /sandboxes/{id}/fork`: Hearth's fork ([`Control::fork_sandbox`]:
/// children resume the parent's memory and processes, with disks that
/// share its chunks and identities of their own), each child given E2B's
/// deadline (`timeout`, killed at its end). 201 with one entry per child:
/// its sandbox, or the error it failed with.
pub async fn fork(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: ForkBody = optional_body(&body?.0)?;
    let timeout = timeout_secs(req.timeout.unwrap_or(FORK_DEFAULT_TIMEOUT_SECS))?;
    let parent = c.e2b_find(&who, &id).await?;
    let forked = c
        .fork_sandbox(
            &who,
            &parent.id.to_string(),
            req.count.unwrap_or(1),
            None,
            Some(Lifetime {
                timeout,
                on_expiry: OnExpiry::Delete,
            }),
        )
        .await?;
    let snap = c.e2b_snapshot(&parent).await;
    let mut entries = Vec::with_capacity(forked.children.len());
    for child in &forked.children {
        let tokens = c.runtime_tokens(&who, child)?;
        entries.push(if child.status == SandboxStatus::Ready {
            ForkEntry {
                sandbox: Some(c.e2b_sandbox(child, snap.clone(), tokens)),
                error: None,
            }
        } else {
            ForkEntry {
                sandbox: None,
                error: Some(serde_json::json!({
                    "code": 500,
                    "message": format!(
                        "fork {} did not start: {}",
                        child.id,
                        child.status_message.clone().unwrap_or_else(|| child.status.as_str().to_owned())
                    ),
                })),
            }
        });
    }
    tracing::info!(sandbox = %parent.id, children = entries.len(), parent_pause_ms = forked.parent_pause_ms, "e2b fork");
    Ok((StatusCode::CREATED, Json(entries)).into_response())
}
