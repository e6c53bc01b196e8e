//! envd's `filesystem.Filesystem` service: stat, list, make, remove,
//! move, and watchers (polled and streamed).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use hearth_guest_proto::{FileKind, FileStat, OpErrorKind};
use hearth_hostapi::{GuestClient, GuestError};
use serde::Deserialize;
use serde_json::json;

use super::super::connect::{self, ConnectError};
use super::process::keepalive;
use super::*;
use crate::Control;

/// E2B's `EntryInfo` of a guest file.
pub(super) fn entry(s: &FileStat) -> serde_json::Value {
    let kind = match s.kind {
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::File => "FILE_TYPE_FILE",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    json!({
        "name": s.name,
        "type": kind,
        "path": s.path,
        "size": s.size.to_string(),
        "mode": s.mode & 0o7777,
        "permissions": permissions(s),
        "owner": s.owner,
        "group": s.group,
        "metadata": s.metadata,
        "modifiedTime": crate::domain::model::Timestamp::from_unix_ms(s.mtime.saturating_mul(1000)).to_rfc3339(),
    })
}

/// `ls -l`'s mode string.
pub(super) fn permissions(s: &FileStat) -> String {
    let t = match s.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    };
    let mut out = String::with_capacity(10);
    out.push(t);
    for shift in [6, 3, 0] {
        let bits = (s.mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PathRequest {
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CreateWatcherRequest {
    path: String,
    recursive: Option<bool>,
    include_entry: Option<bool>,
    allow_network_mounts: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct WatcherRequest {
    watcher_id: String,
}

/// How often a streamed watch asks the guest for what it saw.
pub(super) const WATCH_POLL: Duration = Duration::from_millis(200);

/// A `CreateWatcher` or `WatchDir` request's refusals, and its path as the
/// guest names it.
pub(super) fn watched_path(
    t: &Target,
    req: &CreateWatcherRequest,
    user: Option<&str>,
) -> Result<String, ConnectError> {
    if req.allow_network_mounts == Some(true) {
        return Err(ConnectError::unimplemented(
            "allowNetworkMounts: Hearth's sandboxes have no network mounts to watch",
        ));
    }
    Ok(t.path(&req.path, user)?)
}

/// `Filesystem/WatchDir` (the JS SDK's `files.watchDir`): the changes
/// under a directory as a server stream (start, each change, keepalives:
/// `WatchDirResponse`'s oneof, so at the top of each message),
/// over a guest watcher asked every [`WATCH_POLL`] and stopped when the
/// client goes away.
pub(super) async fn watch_dir(
    c: &Arc<Control>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ConnectError> {
    connect::check_codec(headers, true)?;
    rpc_body(body)?;
    let req: CreateWatcherRequest = parse(connect::single_message(body)?)?;
    let user = basic_user(headers)?;
    let every = keepalive(headers);
    let t = target(c, headers).await?;
    let path = watched_path(&t, &req, user.as_deref())?;
    let guest = t.guest.clone();
    let id = guest
        .watch_start(
            &path,
            req.recursive.unwrap_or(false),
            req.include_entry.unwrap_or(false),
        )
        .await
        .map_err(|e| fs_error(e, &path))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let sandbox = t.row.id;
    tokio::spawn(async move {
        let ended = async {
            if tx.send(connect::message(&json!({"start": {}}))).await.is_err() {
                return None;
            }
            let mut quiet = Duration::ZERO;
            loop {
                tokio::time::sleep(WATCH_POLL).await;
                let events = match guest.watch_events(&id).await {
                    Ok((events, lost)) => {
                        if lost {
                            tracing::warn!(sandbox = %sandbox, "a streamed watcher's guest dropped events");
                        }
                        events
                    }
                    Err(e) => {
                        return Some(ConnectError::new(
                            "unavailable",
                            format!("the watch of {path} ended: {e}"),
                        ))
                    }
                };
                quiet = if events.is_empty() { quiet + WATCH_POLL } else { Duration::ZERO };
                for e in &events {
                    let m = json!({ "filesystem": event(e) });
                    if tx.send(connect::message(&m)).await.is_err() {
                        return None;
                    }
                }
                if quiet >= every {
                    quiet = Duration::ZERO;
                    if tx.send(connect::message(&json!({"keepalive": {}}))).await.is_err() {
                        return None;
                    }
                }
            }
        }
        .await;
        if let Some(e) = &ended {
            if tx.send(connect::end_stream(Some(e))).await.is_err() {
                tracing::debug!(sandbox = %sandbox, "a watch stream ended with nobody reading");
            }
        }
        if let Err(e) = guest.watch_stop(&id).await {
            tracing::debug!(sandbox = %sandbox, error = %e, "cannot stop a streamed watcher; the guest drops it when unasked");
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Ok(connect::stream_response(axum::body::Body::from_stream(
        stream,
    )))
}

/// envd's `FilesystemEvent` of a guest watch event (with its entry when
/// the watcher was asked for entries).
pub(super) fn event(e: &hearth_guest_proto::WatchEvent) -> serde_json::Value {
    let mut v = json!({"name": e.name, "type": event_type(e.kind)});
    if let Some(s) = &e.entry {
        v["entry"] = entry(s);
    }
    v
}

/// envd's `EventType` of a guest watch event.
pub(super) fn event_type(k: hearth_guest_proto::WatchKind) -> &'static str {
    use hearth_guest_proto::WatchKind as K;
    match k {
        K::Create => "EVENT_TYPE_CREATE",
        K::Write => "EVENT_TYPE_WRITE",
        K::Remove => "EVENT_TYPE_REMOVE",
        K::Rename => "EVENT_TYPE_RENAME",
        K::Chmod => "EVENT_TYPE_CHMOD",
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MoveRequest {
    source: String,
    destination: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn filesystem(
    State(c): State<Arc<Control>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = async {
        if method == "WatchDir" {
            return Ok(match watch_dir(&c, &headers, &body).await {
                Ok(r) => r,
                Err(e) => connect::stream_error(e),
            });
        }
        connect::check_codec(&headers, false)?;
        rpc_body(&body)?;
        let user = basic_user(&headers)?;
        let user = user.as_deref();
        match method.as_str() {
            "Stat" | "ListDir" | "MakeDir" | "Remove" => {
                let req: PathRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let path = t.path(&req.path, user)?;
                let g = &t.files_as(user)?;
                match method.as_str() {
                    "Stat" => {
                        let s = g.stat(&path).await.map_err(|e| fs_error(e, &path))?;
                        Ok(connect::unary(&json!({"entry": entry(&s)})))
                    }
                    "ListDir" => {
                        let depth = req.depth.unwrap_or(1).clamp(1, MAX_LIST_DEPTH);
                        let entries = list_dir(g, &path, depth).await?;
                        Ok(connect::unary(&json!({"entries": entries})))
                    }
                    "MakeDir" => {
                        if g.stat(&path).await.is_ok() {
                            return Err(ConnectError::new(
                                "already_exists",
                                format!("{path} already exists"),
                            ));
                        }
                        g.mkdir(&path, true).await.map_err(|e| fs_error(e, &path))?;
                        let s = g.stat(&path).await.map_err(|e| fs_error(e, &path))?;
                        Ok(connect::unary(&json!({"entry": entry(&s)})))
                    }
                    _ => {
                        // As envd's (`os.RemoveAll`): a path that is not
                        // there is removed already.
                        match g.remove(&path, true).await {
                            Err(e) if e.op_kind() != Some(OpErrorKind::NotFound) => {
                                return Err(fs_error(e, &path));
                            }
                            Ok(()) | Err(_) => {}
                        }
                        Ok(connect::unary(&json!({})))
                    }
                }
            }
            "Move" => {
                let req: MoveRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let (from, to) = (t.path(&req.source, user)?, t.path(&req.destination, user)?);
                let g = t.files_as(user)?;
                g.stat(&from).await.map_err(|e| fs_error(e, &from))?;
                let mv = ExecRequest {
                    user: t.who(user).map(str::to_owned),
                    ..helper(
                        vec![
                            "mv".into(),
                            "-f".into(),
                            "--".into(),
                            from.clone(),
                            to.clone(),
                        ],
                        60,
                    )
                };
                let out = t
                    .guest
                    .run(mv)
                    .await
                    .map_err(|e| ConnectError::internal(format!("move {from}: {e}")))?;
                if out.exit_code != Some(0) {
                    return Err(ConnectError::invalid(format!(
                        "move {from} to {to}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                let s = g.stat(&to).await.map_err(|e| fs_error(e, &to))?;
                Ok(connect::unary(&json!({"entry": entry(&s)})))
            }
            "CreateWatcher" => {
                let req: CreateWatcherRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let path = watched_path(&t, &req, user)?;
                let id = t
                    .guest
                    .watch_start(
                        &path,
                        req.recursive.unwrap_or(false),
                        req.include_entry.unwrap_or(false),
                    )
                    .await
                    .map_err(|e| fs_error(e, &path))?;
                Ok(connect::unary(&json!({ "watcherId": id })))
            }
            "GetWatcherEvents" | "RemoveWatcher" => {
                let req: WatcherRequest = parse(&body)?;
                let t = target(&c, &headers).await?;
                let g = &t.guest;
                let not_found = |e: GuestError| match e.op_kind() {
                    Some(hearth_guest_proto::OpErrorKind::NotFound) => {
                        ConnectError::not_found(format!("watcher {} not found", req.watcher_id))
                    }
                    _ => ConnectError::internal(format!("watcher {}: {e}", req.watcher_id)),
                };
                if method == "RemoveWatcher" {
                    g.watch_stop(&req.watcher_id).await.map_err(not_found)?;
                    return Ok(connect::unary(&json!({})));
                }
                let (events, lost) = g.watch_events(&req.watcher_id).await.map_err(not_found)?;
                if lost {
                    tracing::warn!(sandbox = %t.row.id, watcher = %req.watcher_id, "a watcher's guest dropped events nobody asked for in time");
                }
                let events: Vec<_> = events.iter().map(event).collect();
                Ok(connect::unary(&json!({ "events": events })))
            }
            other => Err(ConnectError::unimplemented(format!(
                "filesystem.Filesystem/{other} is not served by Hearth yet"
            ))),
        }
    };
    match answer.await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The entries under `dir`, `depth` levels down (breadth first), at most
/// [`MAX_LIST_ENTRIES`].
pub(super) async fn list_dir(
    g: &GuestClient,
    dir: &str,
    depth: u32,
) -> Result<Vec<serde_json::Value>, ConnectError> {
    let top = g.stat(dir).await.map_err(|e| fs_error(e, dir))?;
    if top.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!("{dir} is not a directory")));
    }
    let mut out = Vec::new();
    let mut level = vec![dir.to_owned()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for d in level {
            let entries = match g.list(&d).await {
                Ok(e) => e,
                // A directory that went away or cannot be read below the
                // top is left out, as `find` would go on.
                Err(e) if d != dir => {
                    tracing::debug!(dir = %d, error = %e, "ListDir: skipping a directory");
                    continue;
                }
                Err(e) => return Err(fs_error(e, &d)),
            };
            for s in entries {
                if out.len() >= MAX_LIST_ENTRIES {
                    return Err(ConnectError::new(
                        "resource_exhausted",
                        format!(
                            "{dir} holds more than {MAX_LIST_ENTRIES} entries at depth {depth}"
                        ),
                    ));
                }
                if s.kind == FileKind::Dir {
                    next.push(s.path.clone());
                }
                out.push(entry(&s));
            }
        }
        level = next;
    }
    Ok(out)
}
