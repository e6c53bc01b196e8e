//! envd's `/files`: downloads and uploads of a sandbox's files.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_hostapi::GuestClient;
use serde::Serialize;

use super::super::{E2bError, E2bResult};
use super::*;
use crate::Control;

#[derive(Default)]
pub(super) struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    /// Unix seconds.
    signature_expiration: Option<i64>,
}

impl FilesQuery {
    /// The request's target: by its access token, or its URL's signature
    /// for `op`.
    async fn target(
        &self,
        c: &Arc<Control>,
        headers: &HeaderMap,
        op: crate::runtime_tokens::FileOperation,
    ) -> E2bResult<Target> {
        let signed = self
            .signature
            .as_deref()
            .map(|s| (s, self.signature_expiration));
        file_target(
            c,
            headers,
            self.path.as_deref().unwrap_or_default(),
            self.username.as_deref(),
            signed,
            op,
        )
        .await
    }
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
            "username" => q.username = Some(v.into_owned()),
            "signature" => q.signature = Some(v.into_owned()),
            "signature_expiration" => {
                q.signature_expiration = Some(v.parse().map_err(|_| {
                    E2bError::bad_request(format!("signature_expiration: unix seconds, got {v:?}"))
                })?)
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
    let t = q
        .target(&c, &headers, crate::runtime_tokens::FileOperation::Read)
        .await?;
    let path = t.path(
        q.path
            .as_deref()
            .ok_or_else(|| E2bError::bad_request("path is missing"))?,
        q.username.as_deref(),
    )?;
    let reader = t
        .files_as(q.username.as_deref())?
        .read_file(&path, 0, None)
        .await
        .map_err(|e| file_error(e, &path))?;
    let stream = file_stream(reader);
    let response = Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/octet-stream");
    let response = if accepts_gzip(&headers) {
        response
            .header(axum::http::header::CONTENT_ENCODING, "gzip")
            .body(axum::body::Body::from_stream(gzip_stream(stream)))
    } else {
        response.body(axum::body::Body::from_stream(stream))
    };
    Ok(response.unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// Whether the client takes a gzip body (`Accept-Encoding` names it
/// without `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|e| {
            let mut parts = e.split(';').map(str::trim);
            parts.next().is_some_and(|c| c.eq_ignore_ascii_case("gzip"))
                && !parts.any(|p| p.replace(' ', "") == "q=0")
        })
}

/// `body` gzip-compressed as it streams (each chunk compressed as it
/// comes; the trailer at the end).
fn gzip_stream<S>(body: S) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    use flate2::write::GzEncoder;
    use futures_util::StreamExt;
    use std::io::Write;
    let enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    futures_util::stream::unfold((Box::pin(body), Some(enc)), |(mut body, enc)| async move {
        let mut enc = enc?;
        match body.next().await {
            Some(Ok(chunk)) => {
                let out = enc
                    .write_all(&chunk)
                    .map(|()| Bytes::from(std::mem::take(enc.get_mut())));
                let next = out.is_ok().then_some(enc);
                Some((out, (body, next)))
            }
            Some(Err(e)) => Some((Err(e), (body, None))),
            None => Some((enc.finish().map(Bytes::from), (body, None))),
        }
    })
}

/// Compressed bytes decompressed at a time: deflate expands at most about
/// 1,032 times, so what one step holds in memory stays near 4 MiB however
/// large the client's chunks are.
const GUNZIP_STEP: usize = 4096;

/// A request body gzip-decompressed as it streams, [`GUNZIP_STEP`]
/// compressed bytes a step. What it expands to in all is bounded by where
/// it goes (the sandbox's disk).
fn gunzip_stream<S, E>(
    body: S,
) -> impl futures_util::Stream<Item = Result<Bytes, String>> + Send + Unpin
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    use flate2::write::GzDecoder;
    use futures_util::StreamExt;
    use std::io::Write;
    let dec = GzDecoder::new(Vec::new());
    Box::pin(futures_util::stream::unfold(
        (body, Some(dec), Bytes::new()),
        |(mut body, dec, mut pending)| async move {
            let mut dec = dec?;
            if pending.is_empty() {
                match body.next().await {
                    Some(Ok(chunk)) => pending = chunk,
                    Some(Err(e)) => return Some((Err(e.to_string()), (body, None, pending))),
                    None => {
                        let end = dec
                            .finish()
                            .map(Bytes::from)
                            .map_err(|e| format!("the gzip body ends early: {e}"));
                        return Some((end, (body, None, pending)));
                    }
                }
            }
            let step = pending.split_to(pending.len().min(GUNZIP_STEP));
            let out = dec
                .write_all(&step)
                .map(|()| Bytes::from(std::mem::take(dec.get_mut())))
                .map_err(|e| format!("the gzip body does not decompress: {e}"));
            let next = out.is_ok().then_some(dec);
            Some((out, (body, next, pending)))
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use std::io::Write;

    /// A body that expands a thousandfold, sent as one large chunk, comes
    /// out whole in steps that each hold a few MiB at most.
    #[tokio::test]
    async fn a_gzip_body_decompresses_in_bounded_steps() {
        let plain = vec![0u8; 64 << 20];
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&plain).unwrap();
        let gz = Bytes::from(enc.finish().unwrap());
        assert!(gz.len() < 1 << 20, "{}", gz.len());
        let body = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(gz)]);
        let mut out = gunzip_stream(body);
        let (mut total, mut largest) = (0usize, 0usize);
        while let Some(piece) = out.next().await {
            let piece = piece.unwrap();
            total += piece.len();
            largest = largest.max(piece.len());
        }
        assert_eq!(total, plain.len());
        assert!(largest <= GUNZIP_STEP * 1100, "a step held {largest} bytes");
        // A broken body is an error, not a panic.
        let bad = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
            Bytes::from_static(b"not gzip at all"),
        )]);
        let results: Vec<_> = gunzip_stream(bad).collect().await;
        assert!(results.iter().any(Result::is_err), "{results:?}");
    }
}

/// The metadata of an upload: its `X-Metadata-<key>` headers, keys
/// lowercased (as envd's), held to the guest's rule.
fn upload_metadata(headers: &HeaderMap) -> E2bResult<std::collections::BTreeMap<String, String>> {
    let mut m = std::collections::BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("x-metadata-") {
            let value = value.to_str().map_err(|_| {
                E2bError::bad_request(format!("X-Metadata-{key}: printable US-ASCII only"))
            })?;
            m.insert(key.to_owned(), value.to_owned());
        }
    }
    hearth_guest_proto::check_metadata(&m).map_err(E2bError::bad_request)?;
    Ok(m)
}

/// A file reader as a body stream (an error after the first bytes breaks
/// the body off, which the client sees as a short read).
pub(in crate::e2b) fn file_stream(
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
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metadata: std::collections::BTreeMap<String, String>,
}

pub(super) fn write_info(
    path: &str,
    metadata: &std::collections::BTreeMap<String, String>,
) -> WriteInfo {
    WriteInfo {
        name: path.rsplit('/').next().unwrap_or(path).to_owned(),
        kind: "file",
        path: path.to_owned(),
        metadata: metadata.clone(),
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

/// Streams `body` into the guest file `path`, which carries `metadata`.
pub(super) async fn write_stream<S, E>(
    g: &GuestClient,
    path: &str,
    metadata: &std::collections::BTreeMap<String, String>,
    mut body: S,
) -> E2bResult<()>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures_util::StreamExt;
    parents(g, path).await?;
    let mut w = g
        .write_file_with(path, None, metadata.clone())
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
    let gzip = match header(&headers, "content-encoding") {
        None | Some("identity") => false,
        Some(e) if e.eq_ignore_ascii_case("gzip") => true,
        Some(enc) => {
            return Err(E2bError::bad_request(format!(
                "Content-Encoding {enc}: send gzip or the bytes as they are"
            )))
        }
    };
    let metadata = upload_metadata(&headers)?;
    let t = q
        .target(&c, &headers, crate::runtime_tokens::FileOperation::Write)
        .await?;
    let user = q.username.as_deref();
    let guest = t.files_as(user)?;
    let ct = header(&headers, "content-type")
        .unwrap_or_default()
        .to_owned();
    let mut written = Vec::new();
    if ct.starts_with("multipart/form-data") {
        if gzip {
            return Err(E2bError::bad_request(
                "Content-Encoding gzip: send a gzip upload as application/octet-stream (as envd)",
            ));
        }
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
            write_stream(&guest, &path, &metadata, Box::pin(field)).await?;
            written.push(write_info(&path, &metadata));
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
        if gzip {
            write_stream(&guest, &path, &metadata, gunzip_stream(body)).await?;
        } else {
            write_stream(&guest, &path, &metadata, body).await?;
        }
        written.push(write_info(&path, &metadata));
    } else {
        return Err(E2bError::bad_request(format!(
            "Content-Type {ct}: send multipart/form-data or application/octet-stream"
        )));
    }
    c.touch(&t.row).await;
    Ok(axum::Json(written).into_response())
}
