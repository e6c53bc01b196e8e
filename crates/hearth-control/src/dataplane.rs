//! The data plane at each sandbox's `dataplane_url`
//! (`{public_url}/dataplane/{sandbox_id}`): exec over WebSocket and HTTP,
//! file upload, download and search (glob, grep), and the TCP tunnel. Every request is
//! authenticated and authorized here, wakes a stopped sandbox, and counts as
//! activity for its idle timer.

use std::sync::Arc;
use std::time::Duration;

use crate::dp::RunConfig as HostRunConfig;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_api::{
    ApiError, ExecuteRequest, ExecuteResponse, GlobRequest, GlobResponse, GrepRequest, GrepResponse,
};
use hearth_db::Timestamp;
use hearth_guest_proto::ExecRequest;
use serde::Deserialize;

use crate::auth::Principal;
use crate::domain::queries::spec_of;
use crate::error::{HttpError, HttpResult};
use crate::extract::{Multipart, Path, Query};
use crate::service::vm_id;
use crate::Control;

/// While a WebSocket stays open, its sandbox counts as active this often.
const ACTIVITY_TICK: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
pub struct PathQuery {
    path: String,
}

fn ws_refused(e: axum::extract::ws::rejection::WebSocketUpgradeRejection) -> HttpError {
    ApiError::invalid_request(format!("expected a WebSocket upgrade: {e}")).into()
}

/// The sandbox's run config as the host's exec defaults.
fn run_defaults(row: &hearth_db::SandboxRow) -> HostRunConfig {
    let Ok(spec) = spec_of(row) else {
        return HostRunConfig::default();
    };
    HostRunConfig {
        user: spec.run.user.clone(),
        work_dir: spec.run.work_dir.clone(),
        env_vars: Some(spec.command_env()),
    }
}

/// Keeps the sandbox's idle clock moving while a long session is open.
fn keep_active(c: &Arc<Control>, id: hearth_types::SandboxId) -> tokio::task::JoinHandle<()> {
    let c = c.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(ACTIVITY_TICK).await;
            crate::service::touch_logged(&c.db, id, Timestamp::now()).await;
        }
    })
}

pub async fn execute_ws(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> HttpResult<Response> {
    let ws = ws.map_err(ws_refused)?;
    let (row, guest) = c.runtime(&who, &id).await?;
    let defaults = run_defaults(&row);
    let vm = vm_id(row.id);
    let c2 = c.clone();
    let shutdown = c.shutdown_signal();
    Ok(ws
        .max_message_size(1 << 20)
        // Selected when offered (the console's WebSocket, whose key comes
        // as a second subprotocol); the SDK offers none.
        .protocols([crate::auth::WS_PROTOCOL])
        .on_upgrade(move |socket| async move {
            let ticker = keep_active(&c2, row.id);
            let started = std::time::Instant::now();
            crate::dp::exec_session(socket, guest, vm, defaults, Some(shutdown)).await;
            ticker.abort();
            if started.elapsed() > Duration::from_secs(5) {
                crate::service::touch_logged(&c2.db, row.id, Timestamp::now()).await;
            }
        }))
}

/// Aborts a task when dropped (with the response body it belongs to).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A streamed answer keeps its sandbox active for as long as it is read;
/// a refusal is answered as is.
fn active_while_streaming(
    c: &Arc<Control>,
    id: hearth_types::SandboxId,
    answer: Result<Response, crate::dp::ApiError>,
) -> Response {
    use futures_util::StreamExt;
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => return e.into_response(),
    };
    let guard = AbortOnDrop(keep_active(c, id));
    let (parts, body) = resp.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// `POST {dp}/execute/stream/start`: the SSE exec transport (opt-in in the
/// SDK); see [`crate::dp::sse_start`].
pub async fn execute_stream_start(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    crate::extract::JsonBody(body): crate::extract::JsonBody,
) -> HttpResult<Response> {
    let (row, guest) = c.runtime(&who, &id).await?;
    let defaults = run_defaults(&row);
    let shutdown = Some(c.shutdown_signal());
    let answer = crate::dp::sse_start(&guest, &defaults, &body, shutdown).await;
    Ok(active_while_streaming(&c, row.id, answer))
}

/// `POST {dp}/execute/stream/resume`: replay a command's output from the
/// client's offsets over SSE.
pub async fn execute_stream_resume(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    crate::extract::JsonBody(body): crate::extract::JsonBody,
) -> HttpResult<Response> {
    let (row, guest) = c.runtime(&who, &id).await?;
    let shutdown = Some(c.shutdown_signal());
    let answer = crate::dp::sse_resume(&guest, &body, shutdown).await;
    Ok(active_while_streaming(&c, row.id, answer))
}

/// `POST {dp}/execute`: blocking exec, the SDKs' fallback.
pub async fn execute(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    crate::extract::JsonBody(body): crate::extract::JsonBody,
) -> HttpResult<Response> {
    let req: ExecuteRequest = hearth_api::parse_body(&body)?;
    req.validate()?;
    let (row, guest) = c.runtime(&who, &id).await?;
    let d = run_defaults(&row);
    let mut env = d.env_vars.unwrap_or_default();
    env.extend(req.env.clone().unwrap_or_default());
    let timeout_ms = req.timeout.clamp(0, 3600) as u64 * 1000;
    let exec = ExecRequest {
        command: req.command.clone(),
        shell: Some(req.shell.clone()),
        env,
        cwd: req.cwd.clone().or(d.work_dir),
        user: d.user,
        timeout_ms,
        kill_on_disconnect: true,
        ttl_ms: 0,
        ..ExecRequest::default()
    };
    // A long command is activity: the idle reaper must not stop the
    // sandbox under it (a 10-minute exec once was).
    let _active = AbortOnDrop(keep_active(&c, row.id));
    let out = guest
        .run_capped(exec, c.cfg.exec_output_cap)
        .await
        .map_err(|e| {
            if let Some((size, max)) = e.request_too_large() {
                return ApiError::new(
                    413,
                    "PayloadTooLarge",
                    format!("the command and its environment take {size} bytes; at most {max} fit"),
                );
            }
            match e {
                hearth_hostapi::GuestError::Deadline(m) => ApiError::new(504, "GuestTimeout", m),
                e => ApiError::command_failed(e.to_string()),
            }
        })?;
    if let Some((t, message)) = out.error {
        return Err(crate::error::exec_failure(t, message).into());
    }
    Ok(Json(ExecuteResponse {
        stdout: utf8(out.stdout),
        stderr: utf8(out.stderr),
        exit_code: out.exit_code.unwrap_or(-1),
        truncated: out.truncated,
    })
    .into_response())
}

/// Output as text without a second copy when it is valid UTF-8 (the
/// common case; a capped answer is up to 2 × 16 MiB).
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `POST {dp}/upload?path=`: multipart field `file`, streamed into the guest.
pub async fn upload(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    Multipart(mut form): Multipart,
) -> HttpResult<Response> {
    hearth_api::files::check_query_path(&q.path)?;
    let (row, guest) = c.runtime(&who, &id).await?;
    let _active = AbortOnDrop(keep_active(&c, row.id));
    let write_err = |e: hearth_hostapi::GuestError| -> HttpError {
        use hearth_guest_proto::OpErrorKind as K;
        match e.op_kind() {
            Some(K::NotFound) => ApiError::file_not_found(&q.path),
            Some(K::PermissionDenied) => ApiError::new(403, "PermissionDenied", e.to_string()),
            // The path names something a file cannot be written over, or
            // runs through one (`AlreadyExists`: a file where a parent
            // directory should be).
            Some(
                K::IsADirectory
                | K::NotADirectory
                | K::NotAFile
                | K::AlreadyExists
                | K::InvalidPath
                | K::BadRequest,
            ) => ApiError::write_refused(e.to_string()),
            _ => ApiError::write_failed(e.to_string()),
        }
        .into()
    };
    loop {
        let field = form
            .next_field()
            .await
            .map_err(|e| ApiError::invalid_request(format!("malformed multipart body: {e}")))?;
        let Some(mut field) = field else {
            return Err(ApiError::validation("file", "multipart field `file` is missing").into());
        };
        if field.name() != Some("file") {
            continue;
        }
        let mut writer = guest.write_file(&q.path, None).await.map_err(write_err)?;
        while let Some(chunk) = field
            .chunk()
            .await
            .map_err(|e| ApiError::invalid_request(format!("upload interrupted: {e}")))?
        {
            writer.send(chunk).await.map_err(write_err)?;
        }
        let bytes = writer.finish().await.map_err(write_err)?;
        c.touch(&row).await;
        return Ok(Json(serde_json::json!({ "path": q.path, "bytes": bytes })).into_response());
    }
}

/// `GET|HEAD {dp}/download?path=`: the file's bytes, with `Range`, `ETag`
/// and the conditional headers (see [`crate::dp::serve_download`]).
pub async fn download(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    method: Method,
    headers: HeaderMap,
) -> HttpResult<Response> {
    hearth_api::files::check_query_path(&q.path)?;
    let (row, guest) = c.runtime(&who, &id).await?;
    let answer = crate::dp::serve_download(&guest, &q.path, &method, &headers).await;
    // A long download keeps its sandbox active while it is read.
    Ok(active_while_streaming(&c, row.id, answer))
}

/// A failed guest search as the API error the SDK expects: a missing path
/// is the file 404 (`ResourceNotFoundError`), a bad pattern or a path that
/// is not a directory is a 422 on that field.
fn search_error(e: hearth_hostapi::GuestError, path: &str, pattern_field: &str) -> HttpError {
    use hearth_guest_proto::OpErrorKind as K;
    match e.op_kind() {
        Some(K::NotFound) => ApiError::file_not_found(path),
        Some(K::NotADirectory) => {
            ApiError::validation("path", format!("{path} is not a directory"))
        }
        Some(K::BadRequest) => ApiError::validation(pattern_field, e.to_string()),
        Some(K::InvalidPath | K::NotAFile) => ApiError::validation("path", e.to_string()),
        Some(K::PermissionDenied) => ApiError::new(403, "PermissionDenied", e.to_string()),
        _ => ApiError::new(500, "SearchError", e.to_string()),
    }
    .into()
}

/// `POST {dp}/glob`: entries under a directory matching a glob.
pub async fn glob(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    crate::extract::JsonBody(body): crate::extract::JsonBody,
) -> HttpResult<Json<GlobResponse>> {
    let req: GlobRequest = hearth_api::parse_body(&body)?;
    let limit = req.validate()?;
    let (_row, guest) = c.runtime(&who, &id).await?;
    let (found, truncated) = guest
        .glob(&req.path, &req.pattern, limit)
        .await
        .map_err(|e| search_error(e, &req.path, "pattern"))?;
    let matches = found
        .into_iter()
        .map(|m| hearth_api::files::FileInfo {
            path: m.path,
            is_dir: m.is_dir,
            size_bytes: m.size,
            modified_at: Timestamp::from_unix_ms(m.mtime.saturating_mul(1000)).to_rfc3339(),
        })
        .collect();
    Ok(Json(GlobResponse { matches, truncated }))
}

/// `POST {dp}/grep`: lines holding a literal text under a path.
pub async fn grep(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    crate::extract::JsonBody(body): crate::extract::JsonBody,
) -> HttpResult<Json<GrepResponse>> {
    let req: GrepRequest = hearth_api::parse_body(&body)?;
    let limit = req.validate()?;
    let (_row, guest) = c.runtime(&who, &id).await?;
    let (found, truncated) = guest
        .grep(&req.path, &req.pattern, req.glob.as_deref(), limit)
        .await
        .map_err(|e| search_error(e, &req.path, "glob"))?;
    let matches = found
        .into_iter()
        .map(|m| hearth_api::files::GrepMatch {
            path: m.path,
            line: m.line,
            text: m.text,
        })
        .collect();
    Ok(Json(GrepResponse { matches, truncated }))
}

/// `GET {dp}/tunnel`: yamux over WebSocket to guest ports.
pub async fn tunnel(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(id): Path<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> HttpResult<Response> {
    let ws = ws.map_err(ws_refused)?;
    let (row, guest) = c.runtime(&who, &id).await?;
    let c2 = c.clone();
    Ok(ws.on_upgrade(move |socket| async move {
        let ticker = keep_active(&c2, row.id);
        crate::tunnel::serve(socket, guest).await;
        ticker.abort();
    }))
}
