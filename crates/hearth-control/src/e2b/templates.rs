//! E2B's template routes over snapshots: delete, aliases and tags (the
//! builds are `builds.rs`).

use std::sync::Arc;

use crate::domain::model::{SnapshotRow, SnapshotStatus};
use crate::domain::templates::TemplateView;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::api::*;
use super::builds::{not_found_as_e2b, MAX_ENTRIES};
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
    c.delete_snapshot(&who, &id)
        .await
        .map_err(template_not_found(&id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A domain error in E2B's words: not found names the template as the
/// caller keyed it.
fn template_not_found(key: &str) -> impl Fn(DomainError) -> E2bError + '_ {
    move |e| match e {
        DomainError::NotFound { .. } => E2bError::not_found(format!("template {key} not found")),
        other => other.into(),
    }
}

/// The snapshot name an E2B template key names: `base` is the default
/// snapshot; a template id, its snapshot's name; else the key itself.
async fn template_name(c: &Control, who: &Principal, key: &str) -> E2bResult<String> {
    c.template_snapshot_name(who, key)
        .await
        .map_err(template_not_found(key))
}

/// The snapshots of a template (its tags), or 404 in E2B's words.
async fn template_tags(c: &Control, who: &Principal, key: &str) -> E2bResult<Vec<SnapshotRow>> {
    let name = template_name(c, who, key).await?;
    c.snapshot_tags(who, &name)
        .await
        .map_err(template_not_found(key))
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

/// One build in E2B's `TemplateWithBuilds` (its `TemplateBuild`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BuildBody {
    #[serde(rename = "buildID")]
    build_id: String,
    status: &'static str,
    created_at: String,
    updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<String>,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
}

/// E2B's `Template`, and with `builds` its `TemplateWithBuilds`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TemplateBody {
    #[serde(rename = "templateID")]
    template_id: String,
    /// The snapshot the template's `latest` tag (else its first) names.
    #[serde(rename = "buildID")]
    build_id: String,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    created_at: String,
    updated_at: String,
    /// Hearth records a key, not a team's user.
    created_by: Option<()>,
    /// Hearth does not count a template's sandboxes (0, and null).
    last_spawned_at: Option<String>,
    spawn_count: u64,
    build_count: u64,
    envd_version: &'static str,
    build_status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    /// Set on the built-in templates (`GET /default-templates`).
    #[serde(skip_serializing_if = "Option::is_none")]
    is_default: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    builds: Option<Vec<BuildBody>>,
}

const MIB: u64 = 1 << 20;

fn template_body(t: TemplateView, with_builds: Option<usize>) -> TemplateBody {
    let s = &t.snapshot;
    // What a create of it gets: the memory and CPUs it resumes, else the
    // default shape.
    let cpu = s.cpu.map_or(1, |c| c.0.div_ceil(1000).max(1));
    let memory = s
        .memory_bytes
        .map_or(hearth_types::rules::MEM_PER_VCPU.bytes(), |m| m.bytes());
    let status = match s.status {
        SnapshotStatus::Ready => "ready",
        SnapshotStatus::Building => "building",
        _ => "error",
    };
    let builds = with_builds.map(|limit| {
        t.builds
            .iter()
            .take(limit)
            .map(|b| BuildBody {
                build_id: b.id.clone(),
                status: b.status.as_str(),
                created_at: b.created_at.to_rfc3339(),
                updated_at: b.updated_at.to_rfc3339(),
                finished_at: b.status.is_final().then(|| b.updated_at.to_rfc3339()),
                cpu_count: b.cpu_count.unwrap_or(1),
                memory_mb: b.memory_mb.unwrap_or(2048),
            })
            .collect()
    });
    TemplateBody {
        template_id: t.name.clone(),
        build_id: s.id.to_string(),
        cpu_count: cpu,
        memory_mb: memory / MIB,
        disk_size_mb: s.fs_capacity.bytes() / MIB,
        public: false,
        aliases: vec![t.name.clone()],
        names: t
            .tags
            .iter()
            .map(|tag| format!("{}:{tag}", t.name))
            .collect(),
        created_at: s.created_at.to_rfc3339(),
        updated_at: s.updated_at.to_rfc3339(),
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        build_count: t.build_count,
        envd_version: super::ENVD_VERSION,
        build_status: status,
        description: s.description.clone(),
        is_default: None,
        builds,
    }
}

/// `GET /templates`: the workspace's templates (its snapshot names).
pub async fn list(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(query): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    if let Some((k, _)) = form_urlencoded::parse(query.unwrap_or_default().as_bytes()).next() {
        return Err(E2bError::bad_request(format!(
            "{k}: not a query parameter of /templates (a key lists its own workspace's)"
        )));
    }
    let all = c.templates(&who).await?;
    Ok(Json(
        all.into_iter()
            .map(|t| template_body(t, None))
            .collect::<Vec<_>>(),
    )
    .into_response())
}

/// `GET /v2/templates?limit=&nextToken=`: the workspace's templates by
/// name, a page at a time (the next page's token, the last name given, in
/// `x-next-token`).
pub async fn list_v2(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(query): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let (mut limit, mut after) = (100usize, None::<String>);
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => limit = page_limit(&v)? as usize,
            "nextToken" => after = Some(v.into_owned()),
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of /v2/templates (limit, nextToken; a key lists its own workspace's)"
                )))
            }
        }
    }
    let all = c.templates(&who).await?;
    let mut page: Vec<TemplateView> = all
        .into_iter()
        .filter(|t| after.as_ref().is_none_or(|a| t.name.as_str() > a.as_str()))
        .take(limit.saturating_add(1))
        .collect();
    let next = (page.len() > limit).then(|| {
        page.truncate(limit);
        page.last().map(|t| t.name.clone())
    });
    let items = page.into_iter().map(|t| template_body(t, None)).collect();
    Ok(page_response(items, next.flatten()))
}

/// `GET /default-templates`: the built-in templates, everyone's; the one
/// E2B's `base` names has that alias too.
pub async fn default_templates(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(query): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    if let Some((k, _)) = form_urlencoded::parse(query.unwrap_or_default().as_bytes()).next() {
        return Err(E2bError::bad_request(format!(
            "{k}: not a query parameter of /default-templates"
        )));
    }
    let base = c
        .template_snapshot_name(&who, hearth_types::rules::BASE_TEMPLATE)
        .await?;
    let all = c.builtin_templates(&who).await?;
    let bodies: Vec<TemplateBody> = all
        .into_iter()
        .map(|t| {
            let is_base = t.name == base;
            let mut b = template_body(t, None);
            b.public = true;
            b.is_default = Some(true);
            if is_base {
                b.aliases
                    .push(hearth_types::rules::BASE_TEMPLATE.to_owned());
            }
            b
        })
        .collect();
    Ok(Json(bodies).into_response())
}

/// E2B's `TemplateUpdateRequest`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    public: Option<bool>,
}

/// `PATCH /templates/{id}` (an empty 200) and `PATCH /v2/templates/{id}`
/// (its names): whether the template is public; Hearth's are their
/// workspace's alone (see [`Control::update_template`]).
async fn update(
    c: &Control,
    who: Result<Principal, Refusal>,
    id: &str,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Vec<String>> {
    let who = who?;
    let req: UpdateBody = json_body(&body?.0)?;
    c.update_template(&who, id, req.public)
        .await
        .map_err(not_found_as_e2b)
}

pub async fn update_v1(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<StatusCode> {
    update(&c, who, &id, body).await?;
    Ok(StatusCode::OK)
}

pub async fn update_v2(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let names = update(&c, who, &id, body).await?;
    Ok(Json(serde_json::json!({ "names": names })).into_response())
}

/// `GET /templates/{id}`: a template and its builds, newest first (at most
/// `limit`, 100).
pub async fn get(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let mut limit = MAX_ENTRIES;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse::<u64>()
                    .map_err(|_| {
                        E2bError::bad_request(format!("limit: a whole number, got {v:?}"))
                    })?
                    .clamp(1, MAX_ENTRIES)
            }
            "nextToken" => {
                return Err(E2bError::bad_request(
                    "nextToken: Hearth answers a template's builds in one page",
                ))
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "unknown query parameter {other:?} (limit)"
                )))
            }
        }
    }
    let t = c.template(&who, &id).await.map_err(not_found_as_e2b)?;
    Ok(Json(template_body(
        t,
        Some(usize::try_from(limit).unwrap_or(usize::MAX)),
    ))
    .into_response())
}
