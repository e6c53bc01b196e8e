//! envd's data plane: `/health`, `/files` and the Connect-RPC services
//! `process.Process` and `filesystem.Filesystem`, over the sandbox's held
//! guest stream like LangSmith's data plane.
//!
//! A call names its sandbox in `E2b-Sandbox-Id` and proves it may use it
//! with `X-Access-Token` (checked before the sandbox is looked up). Only a
//! running sandbox answers: a paused one is 502, as E2B's edge answers,
//! and is not resumed by a data-plane call (E2B resumes on `connect`).
//!
//! Served: `Process/Start` (streamed, with keepalives; the SDK's
//! `/bin/bash -l -c CMD` runs as a shell command, so an image without
//! bash runs it with `/bin/sh`; with `stdin: true` its stdin stays open
//! for `SendInput` and `CloseStdin`, else it is closed at once),
//! `Process/{SendSignal, SendInput, CloseStdin, List, Update, Connect}`
//! (by pid, through the guest's `Stdin`, `Commands`, `Resize` and
//! `Follow` requests, which reach a running command without taking its
//! stream over; the SDK's
//! `pty.create`, `bash -i -l`, is a login shell, `sh` without bash), and
//! `Filesystem/{Stat, ListDir, MakeDir, Remove, Move, CreateWatcher,
//! GetWatcherEvents, RemoveWatcher}` (watchers live in the guest, so any
//! replica can answer for one; `WatchDir` streams one), and the client
//! stream `StreamInput`. Nothing else is served: it answers `unimplemented`,
//! and a `tag` is refused: none of it is accepted and then ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::domain::model::{SandboxRow, SandboxStatus};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use hearth_guest_proto::ExecRequest;
use hearth_hostapi::{GuestClient, GuestError};
use hearth_types::SandboxId;

use super::connect::{self, ConnectError};
use super::{E2bError, E2bResult};
use crate::domain::queries::spec_of;
use crate::runtime_tokens::RuntimeKind;
use crate::Control;

mod files;
mod filesystem;
mod process;

pub(in crate::e2b) use files::file_stream;
pub use files::{download, upload};
pub use filesystem::filesystem;
pub use process::{process, stream_input};

pub(super) const B64: base64::engine::general_purpose::GeneralPurpose =
    base64::engine::general_purpose::STANDARD;

/// Largest request a Connect call may send (a command line and its
/// environment, or a path).
pub(super) const MAX_RPC_BODY: usize = 1 << 20;
/// Most entries a `ListDir` answers (past it: `resource_exhausted`).
pub(in crate::e2b) const MAX_LIST_ENTRIES: usize = 10_000;
/// Deepest `ListDir` walk.
pub(in crate::e2b) const MAX_LIST_DEPTH: u32 = 16;

/// A call's sandbox: its row, its guest, and who commands run as.
pub(super) struct Target {
    row: SandboxRow,
    guest: GuestClient,
    /// The sandbox's user (its run settings'), `None` = root: who a call
    /// that names nobody acts as (envd's default user).
    user: Option<String>,
    work_dir: Option<String>,
    env: BTreeMap<String, String>,
}

impl Target {
    /// Who a call acts as: the user it names, else the sandbox's (a
    /// `name:group` acts as the name).
    fn who<'a>(&'a self, user: Option<&'a str>) -> Option<&'a str> {
        user.or(self.user.as_deref())
            .map(|u| u.split(':').next().unwrap_or(u))
    }

    /// The guest with its file operations acting as the call's user.
    fn files_as(&self, user: Option<&str>) -> Result<GuestClient, ConnectError> {
        self.guest
            .acting_as(self.who(user))
            .map_err(|e| ConnectError::invalid(e.to_string()))
    }

    /// The home directory of `user` (or the sandbox's user), which E2B
    /// resolves relative paths against.
    fn home(&self, user: Option<&str>) -> String {
        match self.who(user) {
            None | Some("root") | Some("0") => "/root".into(),
            Some(u) => format!("/home/{u}"),
        }
    }

    /// The guest path a call names (relative to the user's home), or
    /// why it cannot name one.
    fn path(&self, path: &str, user: Option<&str>) -> Result<String, BadPath> {
        if path.contains('\0') {
            return Err(BadPath("path: contains a NUL byte".into()));
        }
        if path.len() > MAX_PATH {
            return Err(BadPath(format!(
                "path: {} bytes, at most {MAX_PATH}",
                path.len()
            )));
        }
        Ok(if path.starts_with('/') {
            path.to_owned()
        } else {
            let home = self.home(user);
            let rest = path.trim_start_matches("./");
            if rest.is_empty() || rest == "." {
                home
            } else {
                format!("{home}/{rest}")
            }
        })
    }
}

/// Longest path a data-plane call may name (Linux's `PATH_MAX`).
pub(in crate::e2b) const MAX_PATH: usize = 4096;

/// A path no file can have: refused before the guest sees it.
pub(super) struct BadPath(String);

impl From<BadPath> for ConnectError {
    fn from(e: BadPath) -> Self {
        ConnectError::invalid(e.0)
    }
}

impl From<BadPath> for E2bError {
    fn from(e: BadPath) -> Self {
        E2bError::bad_request(e.0)
    }
}

pub(in crate::e2b) fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// The sandbox a data-plane call is for, checked.
pub(super) async fn target(c: &Arc<Control>, headers: &HeaderMap) -> E2bResult<Target> {
    let id = sandbox_id(headers)?;
    let token = header(headers, "x-access-token")
        .ok_or_else(|| E2bError::new(401, "X-Access-Token is missing"))?;
    let checked = c.check_runtime_token(RuntimeKind::Envd, id, token).await?;
    target_of(c, id, checked).await
}

/// The sandbox a request names (`E2b-Sandbox-Id`, which its host name
/// sets when it came by name).
fn sandbox_id(headers: &HeaderMap) -> E2bResult<SandboxId> {
    let id = header(headers, "e2b-sandbox-id").ok_or_else(|| {
        E2bError::bad_request(
            "E2b-Sandbox-Id is missing: point the SDK's sandbox URL (E2B_SANDBOX_URL) at this server",
        )
    })?;
    id.parse()
        .map_err(|_| E2bError::new(401, "the access token does not open this sandbox"))
}

/// A `/files` request's target: by its access token when it sends one,
/// else by its URL's signature (E2B's signed file URLs: `signature`, and
/// `signature_expiration` in unix seconds), made for `op` on the URL's
/// `path` as its `username`.
pub(super) async fn file_target(
    c: &Arc<Control>,
    headers: &HeaderMap,
    path: &str,
    username: Option<&str>,
    signed: Option<(&str, Option<i64>)>,
    op: crate::runtime_tokens::FileOperation,
) -> E2bResult<Target> {
    let Some((signature, expiration)) =
        signed.filter(|_| header(headers, "x-access-token").is_none())
    else {
        return target(c, headers).await;
    };
    let id = sandbox_id(headers)?;
    let checked = c
        .check_file_signature(id, path, op, username.unwrap_or(""), signature, expiration)
        .await?;
    target_of(c, id, checked).await
}

/// The target of a request whose credential was checked: the sandbox
/// it opens, running (or resumed, with E2B's autoResume).
async fn target_of(
    c: &Arc<Control>,
    id: SandboxId,
    checked: Result<SandboxRow, crate::runtime_tokens::TokenRefusal>,
) -> E2bResult<Target> {
    let not_running = || E2bError::not_running(id);
    let row = match checked {
        Ok(row) => row,
        Err(crate::runtime_tokens::TokenRefusal::Gone) => return Err(not_running()),
        Err(refused) => return Err(E2bError::new(401, refused.to_string())),
    };
    let spec = spec_of(&row).ok();
    let resumes = spec.as_ref().is_some_and(|s| s.auto_resume);
    let (row, guest) = if resumes
        && matches!(row.status, SandboxStatus::Ready | SandboxStatus::Stopped)
    {
        // E2B's autoResume: the request resumes the paused sandbox (one
        // pausing at its deadline once its pause lands).
        c.wake(row).await.map_err(|e| {
            tracing::info!(sandbox = %id, error = %e, "an envd request could not resume its sandbox");
            not_running()
        })?
    } else if row.status == SandboxStatus::Ready {
        let guest = c.live_guest(&row).await.map_err(|_| not_running())?;
        c.touch(&row).await;
        (row, guest)
    } else {
        return Err(not_running());
    };
    Ok(Target {
        user: spec.as_ref().and_then(|s| s.run.user.clone()),
        work_dir: spec.as_ref().and_then(|s| s.run.work_dir.clone()),
        env: spec.as_ref().map(|s| s.command_env()).unwrap_or_default(),
        row,
        guest,
    })
}

impl From<E2bError> for ConnectError {
    fn from(e: E2bError) -> Self {
        let code = match e.status {
            400 => "invalid_argument",
            401 => "unauthenticated",
            403 => "permission_denied",
            404 => "not_found",
            409 => "already_exists",
            502 | 503 => "unavailable",
            _ => "internal",
        };
        ConnectError::new(code, e.message)
    }
}

impl From<ConnectError> for E2bError {
    fn from(e: ConnectError) -> Self {
        E2bError::new(e.status().as_u16(), e.message)
    }
}

/// A guest failure as a Connect error about `path`.
pub(super) fn fs_error(e: GuestError, path: &str) -> ConnectError {
    use hearth_guest_proto::OpErrorKind as K;
    match e.op_kind() {
        Some(K::NotFound) => ConnectError::not_found(format!("{path}: no such file or directory")),
        Some(K::AlreadyExists) => ConnectError::new("already_exists", format!("{path}: {e}")),
        Some(K::PermissionDenied) => ConnectError::new("permission_denied", format!("{path}: {e}")),
        Some(K::Unsupported) => ConnectError::unimplemented(format!("{path}: {e}")),
        Some(K::NotADirectory | K::IsADirectory | K::NotAFile | K::InvalidPath | K::BadRequest) => {
            ConnectError::invalid(format!("{path}: {e}"))
        }
        _ => ConnectError::internal(format!("{path}: {e}")),
    }
}

/// A guest failure as E2B's JSON error about `path`.
pub(in crate::e2b) fn file_error(e: GuestError, path: &str) -> E2bError {
    fs_error(e, path).into()
}

/// `GET /health`: 204 while the sandbox runs, 502 when it does not.
pub async fn health(State(c): State<Arc<Control>>, headers: HeaderMap) -> E2bResult<StatusCode> {
    target(&c, &headers).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Reads a Connect call's body (at most [`MAX_RPC_BODY`]).
pub(super) fn rpc_body(body: &Bytes) -> Result<(), ConnectError> {
    if body.len() > MAX_RPC_BODY {
        return Err(ConnectError::new(
            "resource_exhausted",
            format!(
                "the request holds {} bytes; at most {MAX_RPC_BODY}",
                body.len()
            ),
        ));
    }
    Ok(())
}

/// The message of a unary call in the JSON codec.
pub(super) fn unary_request<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ConnectError> {
    connect::check_codec(headers, false)?;
    rpc_body(body)?;
    parse(body)
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(msg: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(msg).map_err(|e| ConnectError::invalid(format!("bad request: {e}")))
}

/// The user a process call runs as: `Authorization: Basic base64("user:")`.
pub(super) fn basic_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(v) = header(headers, "authorization") else {
        return Ok(None);
    };
    let enc = v
        .strip_prefix("Basic ")
        .ok_or_else(|| ConnectError::invalid("Authorization: only Basic names a user"))?;
    let raw = B64
        .decode(enc.trim())
        .map_err(|_| ConnectError::invalid("Authorization: not base64"))?;
    let text =
        String::from_utf8(raw).map_err(|_| ConnectError::invalid("Authorization: not UTF-8"))?;
    let user = text.split(':').next().unwrap_or_default();
    Ok((!user.is_empty()).then(|| user.to_owned()))
}

/// A command Hearth runs in the guest for a call (as root, ended with
/// the call, forgotten once done, at most `secs` long).
pub(super) fn helper(argv: Vec<String>, secs: u64) -> ExecRequest {
    ExecRequest {
        argv: Some(argv),
        timeout_ms: secs * 1000,
        kill_on_disconnect: true,
        ttl_ms: 0,
        ..ExecRequest::default()
    }
}
