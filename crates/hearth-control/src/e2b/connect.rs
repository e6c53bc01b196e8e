//! The Connect protocol with its JSON codec, as much of it as envd's
//! clients speak: unary calls (`application/json` both ways, errors as an
//! HTTP status and `{"code", "message"}`) and server streams
//! (`application/connect+json`: the request one enveloped message, the
//! answer enveloped messages then an end-of-stream envelope that carries
//! any error). An envelope is one flag byte, a 4-byte big-endian length
//! and the message.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

/// Flag of the envelope that ends a stream.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (never sent; refused when received).
const COMPRESSED: u8 = 0x01;

/// A Connect error: a code from the protocol's list and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }

    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new("unimplemented", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new("internal", message)
    }

    /// The HTTP status of a unary error (the protocol's table).
    pub fn status(&self) -> StatusCode {
        let code = match self.code {
            "canceled" => 499,
            "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
            "deadline_exceeded" => 504,
            "not_found" => 404,
            "already_exists" | "aborted" => 409,
            "permission_denied" => 403,
            "resource_exhausted" => 429,
            "unimplemented" => 501,
            "unavailable" => 503,
            "unauthenticated" => 401,
            _ => 500,
        };
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code, "message": self.message})
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.json())).into_response()
    }
}

/// A unary answer: the message as JSON.
pub fn unary<T: Serialize>(msg: &T) -> Response {
    axum::Json(msg).into_response()
}

/// Whether the request is a stream (`application/connect+json`), a unary
/// JSON call, or in a codec this server does not speak.
pub fn check_codec(headers: &HeaderMap, streaming: bool) -> Result<(), ConnectError> {
    let ct = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let ct = ct.split(';').next().unwrap_or_default().trim();
    let want = if streaming {
        "application/connect+json"
    } else {
        "application/json"
    };
    if ct == want {
        return Ok(());
    }
    Err(ConnectError::new(
        if streaming {
            "unimplemented"
        } else {
            "invalid_argument"
        },
        format!("content type {ct:?}: this server speaks Connect with the JSON codec ({want})"),
    ))
}

/// The one message of a streaming call's request body.
pub fn single_message(body: &[u8]) -> Result<&[u8], ConnectError> {
    let (flags, msg, rest) = split_envelope(body)?;
    if flags & COMPRESSED != 0 {
        return Err(ConnectError::invalid(
            "compressed messages are not accepted",
        ));
    }
    if !rest.is_empty() {
        return Err(ConnectError::invalid(
            "a server-streaming call's request holds exactly one message",
        ));
    }
    Ok(msg)
}

/// Reads a client stream's messages as they arrive (`StreamInput`): each
/// envelope whole, at most `max` bytes, never compressed.
pub struct EnvelopeReader {
    body: axum::body::BodyDataStream,
    buf: BytesMut,
    max: usize,
}

impl EnvelopeReader {
    pub fn new(body: axum::body::Body, max: usize) -> Self {
        Self {
            body: body.into_data_stream(),
            buf: BytesMut::new(),
            max,
        }
    }

    /// The next message, or `None` once the client ended the stream.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ConnectError> {
        use futures_util::StreamExt;
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf[0] & COMPRESSED != 0 {
                    return Err(ConnectError::invalid(
                        "compressed messages are not accepted",
                    ));
                }
                if len > self.max {
                    return Err(ConnectError::new(
                        "resource_exhausted",
                        format!("a message of {len} bytes, at most {} per message", self.max),
                    ));
                }
                if self.buf.len() >= 5 + len {
                    let mut whole = self.buf.split_to(5 + len);
                    return Ok(Some(whole.split_off(5).freeze()));
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        "canceled",
                        format!("the request stream broke: {e}"),
                    ))
                }
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(ConnectError::invalid(
                        "the request stream ended inside a message",
                    ))
                }
            }
        }
    }
}

fn split_envelope(body: &[u8]) -> Result<(u8, &[u8], &[u8]), ConnectError> {
    if body.len() < 5 {
        return Err(ConnectError::invalid(
            "the request is not an enveloped message",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let rest = &body[5..];
    if rest.len() < len {
        return Err(ConnectError::invalid(format!(
            "the envelope says {len} bytes, {} follow",
            rest.len()
        )));
    }
    Ok((body[0], &rest[..len], &rest[len..]))
}

fn envelope(flags: u8, msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(flags);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

/// One message of a server stream.
pub fn message<T: Serialize>(msg: &T) -> Bytes {
    envelope(
        0,
        &serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The end of a server stream, with its error if it failed.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        Some(e) => serde_json::json!({ "error": e.json() }),
        None => serde_json::json!({}),
    };
    envelope(END_STREAM, body.to_string().as_bytes())
}

/// A server stream's response around `body`.
pub fn stream_response(body: axum::body::Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/connect+json")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A stream that fails before its first message: the protocol still
/// answers 200 with only the end-of-stream envelope.
pub fn stream_error(e: ConnectError) -> Response {
    stream_response(axum::body::Body::from(end_stream(Some(&e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_stream_is_read_message_by_message_across_chunks() {
        let (a, b) = (
            message(&serde_json::json!({"n": 1})),
            message(&serde_json::json!({"n": 2})),
        );
        let whole = [a.clone(), b.clone()].concat();
        // Cut inside the first header and inside the second message.
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::copy_from_slice(&whole[..3])),
            Ok(Bytes::copy_from_slice(&whole[3..a.len() + 4])),
            Ok(Bytes::copy_from_slice(&whole[a.len() + 4..])),
        ];
        let body = axum::body::Body::from_stream(futures_util::stream::iter(chunks));
        let mut r = EnvelopeReader::new(body, 1024);
        assert_eq!(r.next().await.unwrap().unwrap(), &a[5..]);
        assert_eq!(r.next().await.unwrap().unwrap(), &b[5..]);
        assert!(r.next().await.unwrap().is_none());

        // Too large, or cut short: refused.
        let mut r = EnvelopeReader::new(axum::body::Body::from(whole.clone()), 3);
        assert_eq!(r.next().await.unwrap_err().code, "resource_exhausted");
        let cut = Bytes::copy_from_slice(&whole[..a.len() - 1]);
        let mut r = EnvelopeReader::new(axum::body::Body::from(cut), 1024);
        assert_eq!(r.next().await.unwrap_err().code, "invalid_argument");
    }

    #[test]
    fn envelopes_round_trip_and_bad_ones_are_refused() {
        let m = message(&serde_json::json!({"a": 1}));
        assert_eq!(&m[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(single_message(&m).unwrap(), br#"{"a":1}"#);
        // Short, truncated, two messages, compressed.
        assert!(single_message(&m[..4]).is_err());
        assert!(single_message(&m[..m.len() - 1]).is_err());
        let two = [m.clone(), m.clone()].concat();
        assert!(single_message(&two).is_err());
        let mut z = m.to_vec();
        z[0] = COMPRESSED;
        assert!(single_message(&z).is_err());
        let end = end_stream(Some(&ConnectError::not_found("gone")));
        assert_eq!(end[0], END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(&end_stream(None)[5..], b"{}");
    }

    #[test]
    fn codes_map_to_the_protocols_statuses() {
        let s = |c| ConnectError::new(c, "").status().as_u16();
        assert_eq!(s("not_found"), 404);
        assert_eq!(s("invalid_argument"), 400);
        assert_eq!(s("unimplemented"), 501);
        assert_eq!(s("already_exists"), 409);
        assert_eq!(s("unauthenticated"), 401);
        assert_eq!(s("anything else"), 500);
    }
}
