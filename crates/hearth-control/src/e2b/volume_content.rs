//! E2B's volume content API (`/volumecontent/{volume id}/…`, the e2b
//! SDKs' `Volume.list/make_dir/get_info/exists/update_metadata/read_file/
//! write_file/remove`): a volume's files, opened with the volume's token
//! (`Authorization: Bearer`, from `Volume.create`/`get_info`) through a
//! guest that holds the volume (`domain/volume_content.rs` decides which).
//!
//! Paths are the volume's: `/` (or empty) is its root, relative paths
//! start there, and `..` is refused. What a call makes is owned by `uid`
//! and `gid` (default 1000, the images' `user`, who owns the volume's
//! root) with `mode` (default 0644 for files, 0755 for directories).
//! `make_dir` without `force` refuses an existing directory and a missing
//! parent; with it, makes the parents (theirs as well). `write_file`
//! needs its directory; an existing file is replaced unless `force` is
//! `false` (a 409). `remove` removes a directory with its content.
//! `list` takes `depth` (1 by default, at most 16).

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_guest_proto::{FileKind, FileStat, OpErrorKind};
use hearth_hostapi::GuestError;
use serde::{Deserialize, Serialize};

use super::envd::{file_error, file_stream, header, MAX_LIST_DEPTH, MAX_LIST_ENTRIES, MAX_PATH};
use super::{E2bError, E2bResult};
use crate::domain::model::Timestamp;
use crate::domain::volume_content::VolumeContent;
use crate::Control;

/// Who owns what a call makes unless it says: the images' `user`.
const DEFAULT_OWNER: u32 = 1000;
const DEFAULT_FILE_MODE: u32 = 0o644;
const DEFAULT_DIR_MODE: u32 = 0o755;

/// E2B's `VolumeEntryStat`.
#[derive(Serialize)]
struct EntryStat {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    atime: String,
    mtime: String,
    ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

fn rfc3339(secs: i64) -> String {
    Timestamp::from_unix_ms(secs.saturating_mul(1000)).to_rfc3339()
}

/// A path in the volume: its segments, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
struct VolumePath(Vec<String>);

impl VolumePath {
    fn parse(path: &str) -> E2bResult<Self> {
        if path.contains('\0') {
            return Err(E2bError::bad_request("path: contains a NUL byte"));
        }
        if path.len() > MAX_PATH {
            return Err(E2bError::bad_request(format!(
                "path: {} bytes, at most {MAX_PATH}",
                path.len()
            )));
        }
        let mut segs = Vec::new();
        for s in path.split('/') {
            match s {
                "" | "." => {}
                ".." => {
                    return Err(E2bError::bad_request(format!(
                        "path {path:?}: '..' is refused (a path names a file of the volume)"
                    )))
                }
                s => segs.push(s.to_owned()),
            }
        }
        Ok(Self(segs))
    }

    /// As the volume's API shows it: `/a/b`.
    fn shown(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// In the guest, under the volume's `root`.
    fn in_guest(&self, root: &str) -> String {
        let root = root.trim_end_matches('/');
        if self.0.is_empty() {
            root.to_owned()
        } else {
            format!("{root}/{}", self.0.join("/"))
        }
    }

    fn parent(&self) -> Option<VolumePath> {
        let (_, rest) = self.0.split_last()?;
        Some(VolumePath(rest.to_vec()))
    }

    fn child(&self, name: &str) -> VolumePath {
        let mut segs = self.0.clone();
        segs.push(name.to_owned());
        VolumePath(segs)
    }
}

fn entry(s: &FileStat, at: &VolumePath) -> EntryStat {
    EntryStat {
        name: at.0.last().cloned().unwrap_or_else(|| "/".into()),
        kind: match s.kind {
            FileKind::File => "file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "unknown",
        },
        path: at.shown(),
        size: s.size,
        mode: s.mode & 0o7777,
        uid: s.uid,
        gid: s.gid,
        atime: rfc3339(s.atime),
        mtime: rfc3339(s.mtime),
        ctime: rfc3339(s.ctime),
        target: s.target.clone(),
    }
}

/// A call's query: `path` and what else the route takes, each once.
#[derive(Debug, Default)]
struct ContentQuery {
    path: Option<String>,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

impl ContentQuery {
    /// `allowed`: the parameters besides `path` this route takes.
    fn parse(raw: Option<&str>, route: &str, allowed: &[&str]) -> E2bResult<Self> {
        let mut q = ContentQuery::default();
        for (k, v) in crate::extract::query_pairs(raw) {
            if k != "path" && !allowed.contains(&k.as_str()) {
                return Err(E2bError::bad_request(format!(
                    "{k}: not a query parameter of {route}"
                )));
            }
            let number = |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| E2bError::bad_request(format!("{k}: a whole number, got {v:?}")))
            };
            match k.as_str() {
                "path" => q.path = Some(v),
                "depth" => q.depth = Some(number(&v)?),
                "uid" => q.uid = Some(number(&v)?),
                "gid" => q.gid = Some(number(&v)?),
                "mode" => q.mode = Some(number(&v)?),
                "force" => {
                    q.force = Some(match v.as_str() {
                        "true" | "True" | "1" => true,
                        "false" | "False" | "0" => false,
                        other => {
                            return Err(E2bError::bad_request(format!(
                                "force: true or false, got {other:?}"
                            )))
                        }
                    })
                }
                _ => {}
            }
        }
        if let Some(m) = q.mode.filter(|m| *m > 0o7777) {
            return Err(E2bError::bad_request(format!(
                "mode: permission bits are at most 0o7777, got {m:o}"
            )));
        }
        Ok(q)
    }

    fn path(&self) -> E2bResult<VolumePath> {
        VolumePath::parse(
            self.path
                .as_deref()
                .ok_or_else(|| E2bError::bad_request("path is missing"))?,
        )
    }
}

/// The volume `id` opened with the request's bearer token.
async fn open(c: &Arc<Control>, headers: &HeaderMap, id: &str) -> E2bResult<VolumeContent> {
    let token = header(headers, "authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            E2bError::new(
                401,
                "Authorization: Bearer <the volume's token> is missing (Volume.connect gives it)",
            )
        })?;
    let (who, volume) = match c.check_volume_token(id, token).await? {
        Ok(found) => found,
        Err(crate::runtime_tokens::TokenRefusal::Gone) => {
            return Err(E2bError::not_found(format!("volume {id} not found")))
        }
        Err(crate::runtime_tokens::TokenRefusal::Invalid) => {
            return Err(E2bError::new(401, "the token does not open this volume"))
        }
        Err(crate::runtime_tokens::TokenRefusal::Expired) => {
            return Err(E2bError::new(
                401,
                "the volume's token has expired: Volume.connect gives a new one",
            ))
        }
        Err(crate::runtime_tokens::TokenRefusal::Revoked(why)) => {
            return Err(E2bError::new(
                401,
                format!("the volume's token was revoked: {why}"),
            ))
        }
    };
    Ok(c.open_volume_content(&who, volume).await?)
}

/// A guest failure about the volume path `at`.
fn failed(e: GuestError, at: &VolumePath) -> E2bError {
    file_error(e, &at.shown())
}

async fn stat(v: &VolumeContent, at: &VolumePath) -> E2bResult<FileStat> {
    v.guest
        .stat(&at.in_guest(&v.root))
        .await
        .map_err(|e| failed(e, at))
}

/// Gives what a call made its owner and mode; its stat.
async fn own(
    v: &VolumeContent,
    at: &VolumePath,
    q: &ContentQuery,
    mode: u32,
) -> E2bResult<FileStat> {
    v.guest
        .set_attrs(
            &at.in_guest(&v.root),
            Some(q.uid.unwrap_or(DEFAULT_OWNER)),
            Some(q.gid.unwrap_or(DEFAULT_OWNER)),
            Some(q.mode.unwrap_or(mode)),
        )
        .await
        .map_err(|e| failed(e, at))
}

/// `GET /volumecontent/{id}/dir?path=&depth=`: the entries under a
/// directory, `depth` levels down.
pub async fn list(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let q = ContentQuery::parse(raw.as_deref(), "GET /volumecontent/{id}/dir", &["depth"])?;
    let at = q.path()?;
    let depth = q.depth.unwrap_or(1);
    if depth == 0 || depth > MAX_LIST_DEPTH {
        return Err(E2bError::bad_request(format!(
            "depth: 1 to {MAX_LIST_DEPTH}, got {depth}"
        )));
    }
    let v = open(&c, &headers, &id).await?;
    let top = stat(&v, &at).await?;
    if top.kind != FileKind::Dir {
        return Err(E2bError::bad_request(format!(
            "{}: not a directory",
            at.shown()
        )));
    }
    let mut out = Vec::new();
    let mut level = vec![at];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            let entries = v
                .guest
                .list(&dir.in_guest(&v.root))
                .await
                .map_err(|e| failed(e, &dir))?;
            for s in entries {
                let child = dir.child(&s.name);
                if s.kind == FileKind::Dir {
                    next.push(child.clone());
                }
                out.push(entry(&s, &child));
                if out.len() > MAX_LIST_ENTRIES {
                    return Err(E2bError::bad_request(format!(
                        "more than {MAX_LIST_ENTRIES} entries: list a smaller depth"
                    )));
                }
            }
        }
        level = next;
    }
    Ok(Json(out).into_response())
}

/// `POST /volumecontent/{id}/dir?path=&uid=&gid=&mode=&force=`.
pub async fn make_dir(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let q = ContentQuery::parse(
        raw.as_deref(),
        "POST /volumecontent/{id}/dir",
        &["uid", "gid", "mode", "force"],
    )?;
    let at = q.path()?;
    if at.0.is_empty() {
        return Err(E2bError::new(409, "/: the volume's root exists"));
    }
    let v = open(&c, &headers, &id).await?;
    let force = q.force.unwrap_or(false);
    // Each missing directory on the way (with `force`), then the last.
    let mut made = VolumePath(Vec::new());
    for (i, seg) in at.0.iter().enumerate() {
        made = made.child(seg);
        let last = i + 1 == at.0.len();
        let exists = match v.guest.stat(&made.in_guest(&v.root)).await {
            Ok(s) if s.kind == FileKind::Dir => true,
            Ok(_) => {
                return Err(E2bError::new(
                    409,
                    format!("{}: exists and is not a directory", made.shown()),
                ))
            }
            Err(e) if e.op_kind() == Some(OpErrorKind::NotFound) => false,
            Err(e) => return Err(failed(e, &made)),
        };
        match (exists, last, force) {
            (true, false, _) => continue,
            (true, true, false) => {
                return Err(E2bError::new(
                    409,
                    format!("{}: the directory exists", made.shown()),
                ))
            }
            (true, true, true) => {}
            (false, false, false) => {
                return Err(E2bError::not_found(format!(
                    "{}: no such directory (force makes the parents)",
                    made.shown()
                )))
            }
            (false, _, _) => {
                v.guest
                    .mkdir(&made.in_guest(&v.root), false)
                    .await
                    .map_err(|e| failed(e, &made))?;
                own(&v, &made, &q, DEFAULT_DIR_MODE).await?;
            }
        }
    }
    let s = stat(&v, &at).await?;
    Ok((StatusCode::CREATED, Json(entry(&s, &at))).into_response())
}

/// `GET /volumecontent/{id}/path?path=`: an entry's stat.
pub async fn get_info(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let q = ContentQuery::parse(raw.as_deref(), "GET /volumecontent/{id}/path", &[])?;
    let at = q.path()?;
    let v = open(&c, &headers, &id).await?;
    let s = stat(&v, &at).await?;
    Ok(Json(entry(&s, &at)).into_response())
}

/// `PATCH /volumecontent/{id}/path`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttrsBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// `PATCH /volumecontent/{id}/path?path=`: a new owner, group or mode.
pub async fn update_metadata(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let q = ContentQuery::parse(raw.as_deref(), "PATCH /volumecontent/{id}/path", &[])?;
    let at = q.path()?;
    let attrs: AttrsBody = super::api::json_body(&body)?;
    if let Some(m) = attrs.mode.filter(|m| *m > 0o7777) {
        return Err(E2bError::bad_request(format!(
            "mode: permission bits are at most 0o7777, got {m:o}"
        )));
    }
    let v = open(&c, &headers, &id).await?;
    let s = v
        .guest
        .set_attrs(&at.in_guest(&v.root), attrs.uid, attrs.gid, attrs.mode)
        .await
        .map_err(|e| failed(e, &at))?;
    Ok(Json(entry(&s, &at)).into_response())
}

/// `DELETE /volumecontent/{id}/path?path=`: a file, or a directory and
/// all it holds.
pub async fn remove(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<StatusCode> {
    let q = ContentQuery::parse(raw.as_deref(), "DELETE /volumecontent/{id}/path", &[])?;
    let at = q.path()?;
    if at.0.is_empty() {
        return Err(E2bError::bad_request(
            "/: the volume's root cannot be removed (Volume.destroy removes the volume)",
        ));
    }
    let v = open(&c, &headers, &id).await?;
    v.guest
        .remove(&at.in_guest(&v.root), true)
        .await
        .map_err(|e| failed(e, &at))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /volumecontent/{id}/file?path=`: the file's bytes, streamed.
pub async fn read_file(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let q = ContentQuery::parse(raw.as_deref(), "GET /volumecontent/{id}/file", &[])?;
    let at = q.path()?;
    let v = open(&c, &headers, &id).await?;
    let reader = v
        .guest
        .read_file(&at.in_guest(&v.root), 0, None)
        .await
        .map_err(|e| failed(e, &at))?;
    Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/octet-stream")
        .body(axum::body::Body::from_stream(file_stream(reader)))
        .map_err(|e| E2bError::new(500, format!("cannot answer: {e}")))
}

/// `PUT /volumecontent/{id}/file?path=&uid=&gid=&mode=&force=`: the body
/// becomes the file.
pub async fn write_file(
    State(c): State<Arc<Control>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
    request: axum::extract::Request,
) -> E2bResult<Response> {
    use futures_util::StreamExt;
    let q = ContentQuery::parse(
        raw.as_deref(),
        "PUT /volumecontent/{id}/file",
        &["uid", "gid", "mode", "force"],
    )?;
    let at = q.path()?;
    let Some(dir) = at.parent() else {
        return Err(E2bError::bad_request("/: the volume's root is a directory"));
    };
    let v = open(&c, &headers, &id).await?;
    match v.guest.stat(&dir.in_guest(&v.root)).await {
        Ok(s) if s.kind == FileKind::Dir => {}
        Ok(_) => {
            return Err(E2bError::bad_request(format!(
                "{}: not a directory",
                dir.shown()
            )))
        }
        Err(e) if e.op_kind() == Some(OpErrorKind::NotFound) => {
            return Err(E2bError::not_found(format!(
                "{}: no such directory (make_dir makes it)",
                dir.shown()
            )))
        }
        Err(e) => return Err(failed(e, &dir)),
    }
    if q.force == Some(false) {
        match v.guest.stat(&at.in_guest(&v.root)).await {
            Ok(_) => {
                return Err(E2bError::new(
                    409,
                    format!("{}: exists (force replaces it)", at.shown()),
                ))
            }
            Err(e) if e.op_kind() == Some(OpErrorKind::NotFound) => {}
            Err(e) => return Err(failed(e, &at)),
        }
    }
    let path = at.in_guest(&v.root);
    let mut w = v
        .guest
        .write_file(&path, Some(q.mode.unwrap_or(DEFAULT_FILE_MODE)))
        .await
        .map_err(|e| failed(e, &at))?;
    let mut body = request.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| E2bError::bad_request(format!("upload interrupted: {e}")))?;
        w.send(chunk).await.map_err(|e| failed(e, &at))?;
    }
    w.finish().await.map_err(|e| failed(e, &at))?;
    let s = own(&v, &at, &q, DEFAULT_FILE_MODE).await?;
    Ok((StatusCode::CREATED, Json(entry(&s, &at))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_path_stays_in_the_volume() {
        let p = VolumePath::parse("/a//./b/").unwrap();
        assert_eq!(p.shown(), "/a/b");
        assert_eq!(p.in_guest("/mnt/volume/"), "/mnt/volume/a/b");
        assert_eq!(VolumePath::parse("a/b").unwrap(), p);
        assert_eq!(VolumePath::parse("/").unwrap().in_guest("/mnt/v"), "/mnt/v");
        assert_eq!(VolumePath::parse("").unwrap().shown(), "/");
        for bad in ["../etc", "/a/../../etc", "a/..", "a\0b"] {
            assert!(VolumePath::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(p.parent().unwrap().shown(), "/a");
        assert!(VolumePath::parse("/").unwrap().parent().is_none());
    }

    #[test]
    fn a_query_takes_only_its_routes_parameters() {
        let q = ContentQuery::parse(Some("path=%2Fa&uid=5&force=true"), "r", &["uid", "force"])
            .unwrap();
        assert_eq!(q.path.as_deref(), Some("/a"));
        assert_eq!((q.uid, q.force), (Some(5), Some(true)));
        let e = ContentQuery::parse(Some("path=a&depth=2"), "GET /x", &[]).unwrap_err();
        assert!(
            e.message.contains("depth: not a query parameter of GET /x"),
            "{}",
            e.message
        );
        let e = ContentQuery::parse(Some("path=a&mode=99999"), "r", &["mode"]).unwrap_err();
        assert!(e.message.contains("mode"), "{}", e.message);
        let e = ContentQuery::parse(Some("path=a&force=yes"), "r", &["force"]).unwrap_err();
        assert!(e.message.contains("force"), "{}", e.message);
    }
}
