//! File routes: streamed upload and download (with single byte ranges),
//! stat, list, mkdir and remove. Paths are the guest's; relative paths
//! resolve from the default user's home.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{guest_call, ApiError};
use hearth_hostapi::guest::{FileReader, FileVersion};

/// A single range of a `Range: bytes=…` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ByteRange {
    /// `a-b`, both inclusive.
    Bounded(u64, u64),
    /// `a-`
    From(u64),
    /// `-n`: the last n bytes.
    Suffix(u64),
}

/// Parses a single byte range. Anything else (other units, several
/// ranges, bad syntax) is `None` and the whole file is served, as RFC 9110
/// lets a server ignore a Range it does not support.
fn parse_range(value: &str) -> Option<ByteRange> {
    let value = value.trim();
    let (unit, spec) = value.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return None;
    }
    let (a, b) = spec.trim().split_once('-')?;
    let num = |s: &str| {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            s.parse::<u64>().ok()
        }
    };
    match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, true) => None,
        (true, false) => Some(ByteRange::Suffix(num(b)?)),
        (false, true) => Some(ByteRange::From(num(a)?)),
        (false, false) => {
            let (a, b) = (num(a)?, num(b)?);
            (a <= b).then_some(ByteRange::Bounded(a, b))
        }
    }
}

fn unsatisfiable(size: u64) -> Response {
    let mut resp = ApiError::new(
        StatusCode::RANGE_NOT_SATISFIABLE,
        "RangeNotSatisfiable",
        format!("the requested range is outside the file ({size} bytes)"),
    )
    .into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
        resp.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    resp
}

/// Whether an `If-None-Match` / `If-Range` entity-tag list names `etag`
/// (`*` names any). Weak tags compare by their opaque part, as RFC 9110's
/// weak comparison does for `If-None-Match`.
fn etag_listed(list: &str, etag: &str) -> bool {
    list.split(',')
        .map(|t| t.trim())
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}

/// Whether an `If-Range` value still holds: a strong entity tag equal to
/// the current one, or an HTTP-date equal to its Last-Modified.
fn if_range_holds(value: &str, version: &FileVersion) -> bool {
    let value = value.trim();
    if value.starts_with('"') {
        value == version.etag()
    } else {
        value == version.last_modified()
    }
}

/// A file of the guest as an HTTP response, shared with the public data
/// plane's `/download`:
/// - `GET`: 200 with the whole file, or 206/416 for a single `Range`;
/// - `HEAD`: the headers of the 200 without the bytes;
/// - every answer carries `ETag` and `Last-Modified` for the version
///   served; `If-None-Match` naming the current version answers 304, and a
///   `Range` with an `If-Range` that no longer holds is ignored (200 with
///   the whole file: the client restarts instead of splicing versions).
pub async fn serve_download(
    guest: &hearth_hostapi::GuestClient,
    path: &str,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let if_none_match = text(header::IF_NONE_MATCH);
    let if_range = text(header::IF_RANGE);
    let head = method == Method::HEAD;
    let mut range = if head {
        None
    } else {
        text(header::RANGE).and_then(parse_range)
    };
    let open = |offset, length| guest_call(guest.read_file(path, offset, length));

    // Conditions need the current version before choosing what to send: a
    // zero-length read describes the file as a real read would.
    let mut expect = None;
    if head || if_none_match.is_some() || (range.is_some() && if_range.is_some()) {
        let probe = open(0, Some(0)).await?;
        let version = probe.version;
        if if_none_match.is_some_and(|l| etag_listed(l, &version.etag())) {
            return Ok(not_modified(&version));
        }
        if head {
            let mut resp = Response::new(Body::empty());
            file_headers(resp.headers_mut(), &version, probe.size);
            return Ok(resp);
        }
        if let Some(cond) = if_range {
            if if_range_holds(cond, &version) {
                expect = Some(version);
            } else {
                range = None;
            }
        }
    }

    let Some(r) = range else {
        return Ok(file_response(open(0, None).await?, None));
    };
    let (start, reader) = match r {
        ByteRange::Bounded(a, b) => (a, open(a, Some((b - a).saturating_add(1))).await?),
        ByteRange::From(a) => (a, open(a, None).await?),
        ByteRange::Suffix(n) => {
            let size = open(0, Some(0)).await?.size;
            if n == 0 {
                return Ok(unsatisfiable(size));
            }
            let start = size.saturating_sub(n);
            (start, open(start, None).await?)
        }
    };
    if expect.is_some_and(|v| v != reader.version) {
        // Replaced between the check and the read: the range no longer
        // belongs to the version the client holds.
        drop(reader);
        return Ok(file_response(open(0, None).await?, None));
    }
    if start >= reader.size || reader.length == 0 {
        return Ok(unsatisfiable(reader.size));
    }
    Ok(file_response(reader, Some(start)))
}

fn file_headers(h: &mut HeaderMap, version: &FileVersion, length: u64) {
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    validators(h, version);
}

fn validators(h: &mut HeaderMap, version: &FileVersion) {
    if let Ok(v) = HeaderValue::from_str(&version.etag()) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&version.last_modified()) {
        h.insert(header::LAST_MODIFIED, v);
    }
}

fn not_modified(version: &FileVersion) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::NOT_MODIFIED;
    validators(resp.headers_mut(), version);
    resp
}

/// A 200 (or 206 for a range starting at `start`) streaming the reader.
fn file_response(reader: FileReader, start: Option<u64>) -> Response {
    let (size, length, version) = (reader.size, reader.length, reader.version);
    let mut resp = Response::new(file_body(reader));
    file_headers(resp.headers_mut(), &version, length);
    if let Some(start) = start {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        let end = start + length - 1;
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{end}/{size}")) {
            resp.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    resp
}

/// The reader's chunks as a response body; a guest failure midway aborts
/// the response (the client sees a body shorter than its length).
fn file_body(reader: FileReader) -> Body {
    let chunks = futures_util::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match reader.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(reader))),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "file download failed midway");
                Some((Err(e), None))
            }
        }
    });
    Body::from_stream(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_or_are_ignored() {
        use ByteRange::*;
        assert_eq!(parse_range("bytes=0-99"), Some(Bounded(0, 99)));
        assert_eq!(parse_range("bytes=100-"), Some(From(100)));
        assert_eq!(parse_range("bytes=-5"), Some(Suffix(5)));
        assert_eq!(parse_range(" Bytes = 1 - 2 "), Some(Bounded(1, 2)));
        for ignored in [
            "bytes=5-1",
            "bytes=0-1,4-5",
            "items=0-1",
            "bytes=-",
            "bytes=x-1",
            "bytes=+1-2",
            "bytes=0-99999999999999999999999",
            "bytes",
        ] {
            assert_eq!(parse_range(ignored), None, "{ignored}");
        }
    }
}
