//! E2B's template routes over snapshots: delete, aliases and tags (the
//! builds are `builds.rs`).

use std::sync::Arc;

use crate::domain::model::SnapshotRow;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::api::*;
use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::Control;

/// `DELETE /templates/{id}`: E2B deletes a snapshot (a template) by its
/// id or name; a snapshot a pool or a sandbox still needs is a 409.
pub async fn delete_template(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let who = who?;
    c.delete_snapshot(&who, &id).await.map_err(|e| {
        if matches!(e, DomainError::NotFound { .. }) {
            E2bError::not_found(format!("template {id} not found"))
        } else {
            e.into()
        }
    })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The snapshot name an E2B template key names: `base` is the default
/// snapshot; a template id, its snapshot's name; else the key itself.
async fn template_name(c: &Control, who: &Principal, key: &str) -> E2bResult<String> {
    c.template_snapshot_name(who, key)
        .await
        .map_err(|e| match e {
            DomainError::NotFound { .. } => {
                E2bError::not_found(format!("template {key} not found"))
            }
            other => other.into(),
        })
}

/// The snapshots of a template (its tags), or 404 in E2B's words.
async fn template_tags(c: &Control, who: &Principal, key: &str) -> E2bResult<Vec<SnapshotRow>> {
    let name = template_name(c, who, key).await?;
    c.snapshot_tags(who, &name).await.map_err(|e| match e {
        DomainError::NotFound { .. } => E2bError::not_found(format!("template {key} not found")),
        other => other.into(),
    })
}

/// E2B's `TemplateAliasResponse`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AliasBody {
    #[serde(rename = "templateID")]
    template_id: String,
    /// A built-in template is everyone's.
    public: bool,
}

/// `GET /templates/aliases/{alias}` (`Template.exists`,
/// `Template.alias_exists`): a template is a snapshot name of the
/// workspace or a built-in one; its id is its `latest` tag's (else its
/// first tag's).
pub async fn template_alias(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(alias): Path<String>,
) -> E2bResult<Response> {
    let who = who?;
    let tags = template_tags(&c, &who, &alias).await?;
    let snap = tags
        .iter()
        .find(|s| s.tag == "latest")
        .or(tags.first())
        .ok_or_else(|| E2bError::not_found(format!("template {alias} not found")))?;
    Ok(Json(AliasBody {
        template_id: snap.id.to_string(),
        public: snap.workspace_id.is_none(),
    })
    .into_response())
}

/// `POST /templates/tags`'s body (`Template.assign_tags`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignTags {
    /// `name:tag` (or `name`: its `latest`) of the build to tag.
    target: String,
    tags: Vec<String>,
}

/// E2B's `AssignedTemplateTags`.
#[derive(Serialize)]
struct AssignedBody {
    tags: Vec<String>,
    /// The snapshot the first tag names (each tag is a snapshot of its
    /// own, holding the same files and memory).
    #[serde(rename = "buildID")]
    build_id: String,
}

/// Most tags one call may assign or remove.
const MAX_TAGS: usize = 16;

fn check_tags(tags: &[String]) -> E2bResult<()> {
    if tags.is_empty() || tags.len() > MAX_TAGS {
        return Err(E2bError::bad_request(format!(
            "tags: 1 to {MAX_TAGS} tags, got {}",
            tags.len()
        )));
    }
    Ok(())
}

/// `POST /templates/tags`: more tags for a template's build; a tag that
/// named another build moves.
pub async fn assign_tags(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: AssignTags = json_body(&body?.0)?;
    check_tags(&req.tags)?;
    let target = match req.target.split_once(':') {
        Some((name, tag)) => format!("{}:{tag}", template_name(&c, &who, name).await?),
        None => template_name(&c, &who, &req.target).await?,
    };
    let made = c
        .tag_snapshot(&who, &target, &req.tags)
        .await
        .map_err(|e| match e {
            DomainError::NotFound { .. } => {
                E2bError::not_found(format!("template {} not found", req.target))
            }
            other => other.into(),
        })?;
    Ok((
        StatusCode::CREATED,
        Json(AssignedBody {
            build_id: made.first().map(|s| s.id.to_string()).unwrap_or_default(),
            tags: made.into_iter().map(|s| s.tag).collect(),
        }),
    )
        .into_response())
}

/// `DELETE /templates/tags`'s body (`Template.remove_tags`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags`: each tag's build removed (all or none).
pub async fn remove_tags(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<StatusCode> {
    let who = who?;
    let req: RemoveTags = json_body(&body?.0)?;
    check_tags(&req.tags)?;
    let name = template_name(&c, &who, &req.name).await?;
    c.untag_snapshot(&who, &name, &req.tags)
        .await
        .map_err(|e| match e {
            DomainError::NotFound { name, .. } => {
                E2bError::not_found(format!("template tag {name} not found"))
            }
            other => other.into(),
        })?;
    Ok(StatusCode::NO_CONTENT)
}

/// E2B's `TemplateTag`.
#[derive(Serialize)]
struct TagBody {
    tag: String,
    #[serde(rename = "buildID")]
    build_id: String,
    #[serde(rename = "createdAt")]
    created_at: String,
}

/// `GET /templates/{id or name}/tags` (`Template.get_tags`): each tag of
/// the template's name, its build the tagged snapshot.
pub async fn template_tags_list(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(key): Path<String>,
) -> E2bResult<Response> {
    let who = who?;
    let tags = template_tags(&c, &who, &key).await?;
    Ok(Json(
        tags.into_iter()
            .map(|s| TagBody {
                tag: s.tag,
                build_id: s.id.to_string(),
                created_at: s.created_at.to_rfc3339(),
            })
            .collect::<Vec<_>>(),
    )
    .into_response())
}
