//! envd's `/files`: downloads and uploads of a sandbox's files.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_hostapi::GuestClient;
use serde::Serialize;

use super::super::connect::ConnectError;
use super::super::{E2bError, E2bResult};
use super::*;
use crate::Control;

/// Files are read and written as root (as through LangSmith's data plane):
/// another user asked for is refused rather than silently not honoured.
pub(super) fn as_root_only(user: &str) -> ConnectError {
    ConnectError::invalid(format!(
        "user {user:?}: files are read and written as root in Hearth; omit the user"
    ))
}

#[derive(Default)]
pub(super) struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

pub(super) fn files_query(raw: Option<&str>) -> E2bResult<FilesQuery> {
    let mut q = FilesQuery::default();
    // A name that is not UTF-8 once decoded would reach the guest changed
    // (decoding replaces what is not): refused instead.
    for pair in raw.unwrap_or_default().split('&') {
        let value = pair.split_once('=').map_or("", |(_, v)| v);
        if std::str::from_utf8(
            &percent_encoding::percent_decode(value.as_bytes()).collect::<Vec<u8>>(),
        )
        .is_err()
        {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            return Err(E2bError::bad_request(format!(
                "{key}: not valid UTF-8 once percent-decoded"
            )));
        }
    }
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "path" => q.path = Some(v.into_owned()),
            "username" if v != "root" => return Err(as_root_only(&v).into()),
            "username" => q.username = Some(v.into_owned()),
            "signature" | "signature_expiration" => {
                return Err(E2bError::bad_request(format!(
                    "{k}: signed file URLs are not served; send the access token"
                )))
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of /files"
                )))
            }
        }
    }
    Ok(q)
}

/// `GET /files?path=`: the file's bytes, streamed.
pub async fn download(
    State(c): State<Arc<Control>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let q = files_query(raw.as_deref())?;
    let t = target(&c, &headers).await?;
    let path = t.path(
        q.path
            .as_deref()
            .ok_or_else(|| E2bError::bad_request("path is missing"))?,
        q.username.as_deref(),
    )?;
    let reader = t
        .guest
        .read_file(&path, 0, None)
        .await
        .map_err(|e| file_error(e, &path))?;
    let stream = file_stream(reader);
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/octet-stream")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// A file reader as a body stream (an error after the first bytes breaks
/// the body off, which the client sees as a short read).
pub(super) fn file_stream(
    reader: hearth_hostapi::FileReader,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures_util::stream::unfold(Some(reader), |state| async move {
        let mut r = state?;
        match r.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(r))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
        }
    })
}

#[derive(Serialize)]
pub(super) struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
}

pub(super) fn write_info(path: &str) -> WriteInfo {
    WriteInfo {
        name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        kind: "file",
        path: path.to_owned(),
    }
}

/// Makes the parent directories of `path` (E2B's write does).
pub(super) async fn parents(g: &GuestClient, path: &str) -> E2bResult<()> {
    if let Some((dir, _)) = path.rsplit_once('/') {
        if !dir.is_empty() {
            g.mkdir(dir, true).await.map_err(|e| file_error(e, dir))?;
        }
    }
    Ok(())
}

/// Streams `body` into the guest file `path`.
pub(super) async fn write_stream<S, E>(g: &GuestClient, path: &str, mut body: S) -> E2bResult<()>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures_util::StreamExt;
    parents(g, path).await?;
    let mut w = g
        .write_file(path, None)
        .await
        .map_err(|e| file_error(e, path))?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| E2bError::bad_request(format!("upload interrupted: {e}")))?;
        w.send(chunk).await.map_err(|e| file_error(e, path))?;
    }
    w.finish().await.map_err(|e| file_error(e, path))?;
    Ok(())
}

/// `POST /files`: `multipart/form-data` (each `file` part to the query's
/// `path`, or with one part and no `path`, to its file name) or
/// `application/octet-stream` to `path`; parent directories are made.
pub async fn upload(
    State(c): State<Arc<Control>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
    request: axum::extract::Request,
) -> E2bResult<Response> {
    let q = files_query(raw.as_deref())?;
    if let Some(enc) = header(&headers, "content-encoding").filter(|e| *e != "identity") {
        return Err(E2bError::bad_request(format!(
            "Content-Encoding {enc}: compressed uploads are not served; send the bytes as they are"
        )));
    }
    if headers
        .keys()
        .any(|k| k.as_str().starts_with("x-metadata-"))
    {
        return Err(E2bError::bad_request(
            "X-Metadata-*: file metadata is not served",
        ));
    }
    let t = target(&c, &headers).await?;
    let user = q.username.as_deref();
    let ct = header(&headers, "content-type")
        .unwrap_or_default()
        .to_owned();
    let mut written = Vec::new();
    if ct.starts_with("multipart/form-data") {
        use axum::extract::FromRequest;
        let mut form = axum::extract::Multipart::from_request(request, &())
            .await
            .map_err(|e| E2bError::bad_request(format!("malformed multipart body: {e}")))?;
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| E2bError::bad_request(format!("malformed multipart body: {e}")))?
        {
            if field.name() != Some("file") {
                continue;
            }
            let name = q
                .path
                .clone()
                .or_else(|| field.file_name().map(str::to_owned))
                .ok_or_else(|| E2bError::bad_request("path is missing"))?;
            let path = t.path(&name, user)?;
            write_stream(&t.guest, &path, Box::pin(field)).await?;
            written.push(write_info(&path));
        }
        if written.is_empty() {
            return Err(E2bError::bad_request("the form holds no `file` part"));
        }
    } else if ct.is_empty() || ct.starts_with("application/octet-stream") {
        let name = q
            .path
            .as_deref()
            .ok_or_else(|| E2bError::bad_request("path is missing"))?;
        let path = t.path(name, user)?;
        let body = request.into_body().into_data_stream();
        write_stream(&t.guest, &path, body).await?;
        written.push(write_info(&path));
    } else {
        return Err(E2bError::bad_request(format!(
            "Content-Type {ct}: send multipart/form-data or application/octet-stream"
        )));
    }
    c.touch(&t.row).await;
    Ok(axum::Json(written).into_response())
}
