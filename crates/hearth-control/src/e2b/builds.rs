//! E2B's template build API (`Template.build`, `build_in_background`,
//! `get_build_status` of the e2b SDKs): request a build, upload its files
//! by hash, start it with its steps, poll its status and logs. This door
//! parses E2B's wire shapes into the domain's [`Recipe`] and renders the
//! build's status; what a build does is `domain/templates/`'s.
//!
//! A template's id is its name (its snapshots' name): `templateID` in
//! every answer, and what `Sandbox.create` takes.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::api::json_body;
use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::domain::model::{BuildLogLine, TemplateBuildRow};
use crate::domain::templates::{BuildRequest, Recipe, Step, StepKind, TemplateBase};
use crate::error::Refusal;
use crate::extract::JsonBody;
use crate::Control;

/// `POST /v3/templates`'s body (E2B's `TemplateBuildRequestV3`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BuildRequestBody {
    name: Option<String>,
    /// The older name of `name`.
    alias: Option<String>,
    tags: Option<Vec<String>>,
    #[serde(rename = "teamID")]
    team_id: Option<String>,
    cpu_count: Option<i64>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<i64>,
    #[serde(rename = "minFreeDiskMB")]
    min_free_disk_mb: Option<i64>,
}

/// E2B's `TemplateRequestResponseV3`.
#[derive(Serialize)]
struct BuildRequested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

/// `POST /v3/templates`: a new build of a template, waiting for its files
/// and its start.
pub async fn request(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<Response> {
    let who = who?;
    let req: BuildRequestBody = json_body(&body?.0)?;
    if req.team_id.is_some() {
        return Err(E2bError::bad_request(
            "teamID: a key builds in its own workspace; omit teamID",
        ));
    }
    let name = req
        .name
        .or(req.alias)
        .ok_or_else(|| E2bError::bad_request("name: the template's name is required"))?;
    let row = c
        .request_template_build(
            &who,
            &BuildRequest {
                name,
                tags: req.tags.unwrap_or_default(),
                cpu_count: req.cpu_count,
                memory_mb: req.memory_mb,
                min_free_disk_mb: req.min_free_disk_mb,
            },
        )
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(BuildRequested {
            template_id: row.name.clone(),
            build_id: row.id.clone(),
            public: false,
            names: vec![row.name.clone()],
            tags: row.tags.clone(),
            aliases: vec![row.name],
        }),
    )
        .into_response())
}

/// E2B's `TemplateBuildFileUpload`.
#[derive(Serialize)]
struct FileUpload {
    present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

/// `GET /templates/{id}/files/{hash}`: whether the files are uploaded,
/// and where to upload them if not (a URL good for an hour, opening this
/// upload only).
pub async fn files(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path((template, hash)): Path<(String, String)>,
) -> E2bResult<Response> {
    let who = who?;
    if !c.has_template_builds(&who, &template).await? {
        return Err(E2bError::not_found(format!(
            "template {template} not found"
        )));
    }
    let (present, token) = c.template_files(&who, &hash).await?;
    Ok((
        StatusCode::CREATED,
        Json(FileUpload {
            present,
            url: Some(format!(
                "{}/template-files/{token}",
                c.cfg.public_url.trim_end_matches('/')
            )),
        }),
    )
        .into_response())
}

/// `PUT /template-files/{token}`: the upload an upload URL opens (no API
/// key: the token is the credential). The body is the SDK's tar archive
/// (gzipped or not), stored as it comes.
pub async fn upload(
    State(c): State<Arc<Control>>,
    Path(token): Path<String>,
    body: Body,
) -> E2bResult<StatusCode> {
    let (who, hash) = match c.check_upload_token(&token).await? {
        Ok(opened) => opened,
        Err(why) => return Err(E2bError::new(401, format!("upload URL: {why}"))),
    };
    c.put_template_files(&who, &hash, body.into_data_stream())
        .await?;
    Ok(StatusCode::OK)
}

/// E2B's `FromImageRegistry`: credentials for the base image's registry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryBody {
    #[serde(rename = "type")]
    kind: String,
    username: Option<String>,
    password: Option<String>,
}

/// One of `steps` (E2B's `TemplateStep`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StepBody {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
    #[serde(default)]
    force: bool,
    /// The SDK's own: whether it uploaded the files again (it did, or
    /// not, before this call).
    #[allow(dead_code)]
    force_upload: Option<bool>,
}

/// `POST /v2/templates/{id}/builds/{build}`'s body (E2B's
/// `TemplateBuildStartV2`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StartBody {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<RegistryBody>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<StepBody>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// The mode of a `COPY` step (octal text, as the SDK pads it).
fn copy_mode(i: usize, text: &str) -> E2bResult<Option<u32>> {
    if text.is_empty() {
        return Ok(None);
    }
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .map(Some)
        .ok_or_else(|| {
            E2bError::bad_request(format!("steps[{i}]: mode {text:?} is not an octal mode"))
        })
}

/// A step of the wire as the domain's.
fn step(i: usize, s: StepBody) -> E2bResult<Step> {
    let bad = |why: &str| E2bError::bad_request(format!("steps[{i}] ({}): {why}", s.kind));
    let arg = |n: usize| s.args.get(n).cloned().filter(|a| !a.is_empty());
    let kind = match s.kind.as_str() {
        "RUN" => {
            let command = arg(0).ok_or_else(|| bad("args: [command, user?]"))?;
            if s.args.len() > 2 {
                return Err(bad("args: [command, user?]"));
            }
            StepKind::Run {
                command,
                user: arg(1),
            }
        }
        "COPY" => {
            if s.args.len() < 2 || s.args.len() > 4 {
                return Err(bad("args: [src, dest, user?, mode?]"));
            }
            let files_hash = s
                .files_hash
                .clone()
                .ok_or_else(|| bad("filesHash: a copy names its uploaded files"))?;
            StepKind::Copy {
                src: arg(0).ok_or_else(|| bad("args: src is empty"))?,
                dest: arg(1).ok_or_else(|| bad("args: dest is empty"))?,
                owner: arg(2),
                mode: copy_mode(i, s.args.get(3).map(String::as_str).unwrap_or(""))?,
                files_hash,
            }
        }
        "ENV" => {
            if s.args.is_empty() || !s.args.len().is_multiple_of(2) {
                return Err(bad("args: [name, value, …] in pairs"));
            }
            let vars: Vec<(String, String)> = s
                .args
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            let map = vars.iter().cloned().collect();
            hearth_types::rules::check_env_vars(&format!("steps[{i}]"), &map)?;
            StepKind::Env(vars)
        }
        "WORKDIR" => match s.args.as_slice() {
            [d] if !d.is_empty() => StepKind::Workdir(d.clone()),
            _ => return Err(bad("args: [directory]")),
        },
        "USER" => match s.args.as_slice() {
            [u] if !u.is_empty() => StepKind::User(u.clone()),
            _ => return Err(bad("args: [user]")),
        },
        other => {
            return Err(E2bError::bad_request(format!(
                "steps[{i}]: unknown step type {other:?} (RUN, COPY, ENV, WORKDIR, USER)"
            )))
        }
    };
    if s.files_hash.is_some() && s.kind != "COPY" {
        return Err(bad("filesHash: only a COPY step has files"));
    }
    Ok(Step {
        kind,
        force: s.force,
    })
}

/// The recipe a start body describes.
fn recipe(body: StartBody) -> E2bResult<Recipe> {
    let base = match (body.from_image, body.from_template) {
        (Some(_), Some(_)) => {
            return Err(E2bError::bad_request(
                "fromImage and fromTemplate: a template has one base",
            ))
        }
        (Some(reference), None) => {
            let auth = match body.from_image_registry {
                None => None,
                Some(r) if r.kind == "registry" => match (r.username, r.password) {
                    (Some(u), Some(p)) => Some((u, p)),
                    _ => {
                        return Err(E2bError::bad_request(
                            "fromImageRegistry: a registry's username and password",
                        ))
                    }
                },
                Some(r) => {
                    return Err(E2bError::new(
                        501,
                        format!(
                            "fromImageRegistry: type {:?} is not served by Hearth; give the \
                             registry's username and password (type \"registry\")",
                            r.kind
                        ),
                    ))
                }
            };
            TemplateBase::Image { reference, auth }
        }
        (None, Some(t)) => {
            if body.from_image_registry.is_some() {
                return Err(E2bError::bad_request(
                    "fromImageRegistry: only with fromImage",
                ));
            }
            // E2B's `base`: the default snapshot, as an empty name says.
            TemplateBase::Snapshot(if t == hearth_types::rules::BASE_TEMPLATE {
                String::new()
            } else {
                t
            })
        }
        (None, None) => {
            return Err(E2bError::bad_request(
                "fromImage or fromTemplate: the template's base",
            ))
        }
    };
    let steps = body
        .steps
        .into_iter()
        .enumerate()
        .map(|(i, s)| step(i, s))
        .collect::<E2bResult<Vec<_>>>()?;
    Ok(Recipe {
        base,
        steps,
        force: body.force,
        start_cmd: body.start_cmd.filter(|c| !c.trim().is_empty()),
        ready_cmd: body.ready_cmd.filter(|c| !c.trim().is_empty()),
    })
}

/// `POST /v2/templates/{id}/builds/{build}`: starts the build with its
/// recipe.
pub async fn start(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path((template, build)): Path<(String, String)>,
    body: Result<JsonBody, Refusal>,
) -> E2bResult<StatusCode> {
    let who = who?;
    let body: StartBody = json_body(&body?.0)?;
    let mut recipe = recipe(body)?;
    if let TemplateBase::Snapshot(t) = &mut recipe.base {
        if t.is_empty() {
            let (name, tag) = &c.cfg.default_snapshot;
            *t = format!("{name}:{tag}");
        }
    }
    c.start_template_build(&who, &template, &build, recipe)
        .await
        .map_err(not_found_as_e2b)?;
    Ok(StatusCode::ACCEPTED)
}

pub(super) fn not_found_as_e2b(e: DomainError) -> E2bError {
    match e {
        DomainError::NotFound { kind, name } => {
            E2bError::not_found(format!("{kind} {name} not found"))
        }
        other => other.into(),
    }
}

/// E2B's `BuildLogEntry`.
#[derive(Serialize)]
struct LogEntry {
    timestamp: String,
    message: String,
    level: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

fn entry(l: BuildLogLine) -> LogEntry {
    LogEntry {
        timestamp: l.at.to_rfc3339(),
        message: l.message,
        level: l.level,
        step: l.step,
    }
}

/// E2B's `BuildStatusReason`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    log_entries: Vec<LogEntry>,
}

/// E2B's `TemplateBuildInfo`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BuildInfo {
    logs: Vec<String>,
    log_entries: Vec<LogEntry>,
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

/// The rank of a log level, for `level`'s filter.
fn rank(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        _ => 3,
    }
}

/// Most log entries one status call answers (E2B's).
pub(super) const MAX_ENTRIES: u64 = 100;

/// `GET /templates/{id}/builds/{build}/status`: where the build is, and
/// its log from `logsOffset` (at most `limit`, 100, entries; at least
/// `level`).
pub async fn status(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path((template, build)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let (mut offset, mut limit, mut level) = (0u64, MAX_ENTRIES, None::<String>);
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| E2bError::bad_request(format!("{k}: a whole number, got {v:?}")))
        };
        match k.as_ref() {
            "logsOffset" => offset = number(&v)?,
            "limit" => limit = number(&v)?.min(MAX_ENTRIES),
            "level" => {
                if !matches!(v.as_ref(), "debug" | "info" | "warn" | "error") {
                    return Err(E2bError::bad_request(format!(
                        "level: debug, info, warn or error, got {v:?}"
                    )));
                }
                level = Some(v.into_owned());
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "unknown query parameter {other:?} (logsOffset, limit, level)"
                )))
            }
        }
    }
    let row: TemplateBuildRow = c
        .template_build(&who, &template, &build)
        .await
        .map_err(not_found_as_e2b)?;
    let lines = c.template_build_log(&row, offset, limit).await?;
    let min = level.as_deref().map_or(0, rank);
    let reason = match (&row.reason, row.status.as_str()) {
        (Some(message), _) => Some(Reason {
            message: message.clone(),
            step: row.reason_step.clone(),
            log_entries: c
                .template_build_failure(&row)
                .await?
                .into_iter()
                .map(entry)
                .collect(),
        }),
        _ => None,
    };
    Ok(Json(BuildInfo {
        logs: Vec::new(),
        log_entries: lines
            .into_iter()
            .filter(|l| rank(&l.level) >= min)
            .map(entry)
            .collect(),
        template_id: row.name.clone(),
        build_id: row.id.clone(),
        status: row.status.as_str(),
        reason,
    })
    .into_response())
}

/// E2B's `TemplateBuildLogsResponse`.
#[derive(Serialize)]
struct LogsBody {
    logs: Vec<LogEntry>,
}

/// `GET /templates/{id}/builds/{build}/logs`: the build's log by time:
/// from `cursor` (unix milliseconds) `forward` (the default) or back to it
/// `backward` (newest first), at most `limit` (100) entries of at least
/// `level`. `source` may name either of E2B's stores: a build has one log.
pub async fn logs(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path((template, build)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let (mut cursor, mut limit, mut backward, mut level) = (None::<i64>, MAX_ENTRIES, false, 0u8);
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let bad = |what: &str| E2bError::bad_request(format!("{k}: {what}, got {v:?}"));
        match k.as_ref() {
            "cursor" => cursor = Some(v.parse().map_err(|_| bad("unix milliseconds"))?),
            "limit" => {
                limit = v
                    .parse::<u64>()
                    .map_err(|_| bad("a whole number"))?
                    .min(MAX_ENTRIES)
            }
            "direction" => match v.as_ref() {
                "forward" => backward = false,
                "backward" => backward = true,
                _ => return Err(bad("forward or backward")),
            },
            "level" => match v.as_ref() {
                "debug" | "info" | "warn" | "error" => level = rank(&v),
                _ => return Err(bad("debug, info, warn or error")),
            },
            "source" => {
                if !matches!(v.as_ref(), "temporary" | "persistent") {
                    return Err(bad("temporary or persistent"));
                }
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "unknown query parameter {other:?} (cursor, limit, direction, level, source)"
                )))
            }
        }
    }
    let row = c
        .template_build(&who, &template, &build)
        .await
        .map_err(not_found_as_e2b)?;
    let all = c.template_build_log(&row, 0, u64::MAX).await?;
    let kept = all.into_iter().filter(|l| rank(&l.level) >= level);
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let logs: Vec<LogEntry> = if backward {
        let until = cursor.unwrap_or(i64::MAX);
        let mut picked: Vec<BuildLogLine> = kept.filter(|l| l.at.unix_ms() <= until).collect();
        picked.reverse();
        picked.into_iter().take(limit).map(entry).collect()
    } else {
        let from = cursor.unwrap_or(0);
        kept.filter(|l| l.at.unix_ms() >= from)
            .take(limit)
            .map(entry)
            .collect()
    };
    Ok(Json(LogsBody { logs }).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(body: serde_json::Value) -> E2bResult<Recipe> {
        recipe(serde_json::from_value(body).map_err(|e| E2bError::bad_request(e.to_string()))?)
    }

    #[test]
    fn the_sdks_steps_parse_into_a_recipe() {
        let r = start(serde_json::json!({
            "fromImage": "127.0.0.1:5000/debian:t",
            "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"},
            "force": true,
            "steps": [
                {"type": "RUN", "args": ["echo hi", "root"], "force": false},
                {"type": "COPY", "args": ["app", "/srv/", "app", "0755"],
                 "filesHash": "ab".repeat(32), "force": false, "forceUpload": true},
                {"type": "ENV", "args": ["A", "1", "B", "2"]},
                {"type": "WORKDIR", "args": ["/srv"]},
                {"type": "USER", "args": ["app"], "force": true},
            ],
            "startCmd": "server",
            "readyCmd": "",
        }))
        .unwrap();
        assert_eq!(
            r.base,
            TemplateBase::Image {
                reference: "127.0.0.1:5000/debian:t".into(),
                auth: Some(("u".into(), "p".into()))
            }
        );
        assert!(r.force && r.steps[4].force && !r.steps[0].force);
        assert_eq!(
            r.steps[1].kind,
            StepKind::Copy {
                src: "app".into(),
                dest: "/srv/".into(),
                owner: Some("app".into()),
                mode: Some(0o755),
                files_hash: "ab".repeat(32),
            }
        );
        assert_eq!(r.start_cmd.as_deref(), Some("server"));
        // An empty ready command is none.
        assert_eq!(r.ready_cmd, None);
    }

    #[test]
    fn what_a_recipe_cannot_be_is_named() {
        for (body, says) in [
            (
                serde_json::json!({"steps": []}),
                "fromImage or fromTemplate",
            ),
            (
                serde_json::json!({"fromTemplate": "t", "fromImageRegistry": {"type": "registry"}}),
                "only with fromImage",
            ),
            (
                serde_json::json!({"fromImage": "x", "fromImageRegistry": {"type": "aws"}}),
                "not served",
            ),
            (
                serde_json::json!({"fromImage": "x", "fromImageRegistry": {"type": "registry", "username": "u"}}),
                "username and password",
            ),
            (
                serde_json::json!({"fromTemplate": "t", "steps": [{"type": "COPY", "args": ["a", "b"]}]}),
                "filesHash",
            ),
            (
                serde_json::json!({"fromTemplate": "t", "steps": [{"type": "COPY", "args": ["a", "b", "", "999"], "filesHash": "x"}]}),
                "octal",
            ),
            (
                serde_json::json!({"fromTemplate": "t", "steps": [{"type": "RUN", "args": ["a"], "filesHash": "x"}]}),
                "only a COPY",
            ),
            (
                serde_json::json!({"fromTemplate": "t", "steps": [{"type": "ENV", "args": ["A=B", "1"]}]}),
                "steps[0]",
            ),
            (
                serde_json::json!({"fromTemplate": "t", "steps": [{"type": "WORKDIR", "args": ["a", "b"]}]}),
                "[directory]",
            ),
        ] {
            let e = start(body.clone())
                .err()
                .unwrap_or_else(|| panic!("{body} parsed"));
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
    }
}
