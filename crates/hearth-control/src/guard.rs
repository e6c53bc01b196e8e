//! Limits on the request itself, answered in LangSmith's envelope before a
//! handler runs: an over-long target (414), too many or too large header
//! fields (431), and a path that cannot name anything because it is not
//! UTF-8, or holds NUL, once percent-decoded (400).
//!
//! hyper parses the request head before any of this runs and answers some
//! heads itself, with an empty body: a request target over 65,534 bytes
//! (414), a head larger than [`HEAD_BUFFER`] or with more than
//! [`HEAD_MAX_FIELDS`] header fields (431). [`crate::serve`] raises
//! hyper's limits well above the ones here, so every head between the two
//! gets the envelope; only those past hyper's hard limits are answered bare.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::domain::error::DomainError;
use crate::error::HttpError;

/// Longest request target (path and query) answered; longer is a 414.
/// Generous enough for a `PATH_MAX` (4096-byte) file path percent-encoded
/// three bytes a byte.
pub const MAX_TARGET_BYTES: usize = 16 * 1024;
/// Largest header block (each field's name, value and 4 bytes of `: ` and
/// CRLF) answered; larger is a 431.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most header fields answered; more is a 431.
pub const MAX_HEADER_FIELDS: usize = 100;
/// hyper's read buffer for a request head ([`crate::serve`]): a head
/// larger than this is answered 431 by hyper, without a body.
pub const HEAD_BUFFER: usize = 1 << 20;
/// Header fields hyper parses; more is answered 431 by hyper, without a
/// body.
pub const HEAD_MAX_FIELDS: usize = 512;

/// The middleware: refuses a request over a limit, else runs it.
pub async fn guard(State(c): State<Arc<crate::Control>>, req: Request, next: Next) -> Response {
    match check(&req) {
        Ok(()) => next.run(req).await,
        // E2B's door answers in its own shapes.
        Err(e) => match crate::e2b::door_of_request(&c, &req) {
            Some(door) => door.refuse(e),
            None => HttpError::from(e).into_response(),
        },
    }
}

fn check(req: &Request) -> Result<(), DomainError> {
    let uri = req.uri();
    let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len());
    if target > MAX_TARGET_BYTES {
        return Err(DomainError::UriTooLong(MAX_TARGET_BYTES));
    }
    let headers = req.headers();
    if headers.len() > MAX_HEADER_FIELDS {
        return Err(DomainError::HeadersTooLarge(format!(
            "{} header fields; at most {MAX_HEADER_FIELDS} are accepted",
            headers.len()
        )));
    }
    let size: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if size > MAX_HEADER_BYTES {
        return Err(DomainError::HeadersTooLarge(format!(
            "header fields of {size} bytes; at most {MAX_HEADER_BYTES} are accepted"
        )));
    }
    let path = percent_decode(uri.path().as_bytes());
    if path.contains(&0) {
        return Err(DomainError::BadRequest(
            "the request path contains a NUL byte".into(),
        ));
    }
    if std::str::from_utf8(&path).is_err() {
        return Err(DomainError::BadRequest(
            "the request path is not valid UTF-8 once percent-decoded".into(),
        ));
    }
    Ok(())
}

/// A path or query value with its `%XX` escapes decoded; a `%` not
/// followed by two hex digits stays as it is.
pub(crate) fn percent_decode(s: &[u8]) -> Vec<u8> {
    percent_encoding::percent_decode(s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"/a%20b"), b"/a b");
        assert_eq!(percent_decode(b"/%C3%28"), b"/\xc3(");
        assert_eq!(percent_decode(b"/%00"), b"/\0");
        assert_eq!(percent_decode(b"/100%"), b"/100%");
        assert_eq!(percent_decode(b"/%zz%4"), b"/%zz%4");
        assert_eq!(percent_decode(b"%41"), b"A");
    }
}
