//! Extractors whose every rejection answers in LangSmith's envelope
//! (axum's own answer in plain text): the JSON body with its size limit,
//! path parameters, query strings and multipart forms. Handlers use these,
//! never `axum::extract::{Path, Query, Multipart}` directly.

use std::sync::Arc;

use axum::extract::path::ErrorKind;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use futures_util::StreamExt;
use hearth_api::error::LocSegment;
use hearth_api::ApiError;
use serde::de::DeserializeOwned;

use crate::domain::error::DomainError;
use crate::error::{HttpError, Refusal};
use crate::Control;

/// A JSON request body of at most `ControlConfig::json_limit` bytes.
///
/// Only a body over the limit is a 413; one that cannot be read (a
/// malformed chunked encoding, a connection that breaks off) is a 400.
pub struct JsonBody(pub axum::body::Bytes);

impl FromRequest<Arc<Control>> for JsonBody {
    type Rejection = Refusal;

    async fn from_request(req: Request, control: &Arc<Control>) -> Result<Self, Refusal> {
        let limit = control.cfg.json_limit;
        if let Some(len) = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > limit as u64 {
                return Err(DomainError::TooLarge(limit as u64).into());
            }
        }
        let mut body = req.into_body().into_data_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                DomainError::BadRequest(format!("cannot read the request body: {e}"))
            })?;
            if buf.len() + chunk.len() > limit {
                return Err(DomainError::TooLarge(limit as u64).into());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(JsonBody(buf.into()))
    }
}

/// Path parameters; a value that cannot be decoded is a 422 at
/// `["path", <name>]`.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(path_rejection(e).into()),
        }
    }
}

fn path_rejection(e: PathRejection) -> ApiError {
    let message = e.body_text();
    let PathRejection::FailedToDeserializePathParams(failed) = e else {
        // A handler asking for parameters its route does not have: a bug.
        tracing::error!(%message, "path parameters missing");
        return ApiError::internal();
    };
    let key = match failed.into_kind() {
        ErrorKind::InvalidUtf8InPathParam { key }
        | ErrorKind::ParseErrorAtKey { key, .. }
        | ErrorKind::DeserializeError { key, .. } => Some(key),
        _ => None,
    };
    let mut loc: Vec<LocSegment> = vec!["path".into()];
    loc.extend(key.map(LocSegment::Key));
    ApiError::validation_at(loc, message)
}

/// A query string parsed as `T`; a missing, repeated or malformed
/// parameter is a 422 at `["query", <name>]`.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, HttpError> {
        match axum::extract::Query::<T>::try_from_uri(&parts.uri) {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(query_rejection(e).into()),
        }
    }
}

fn query_rejection(e: QueryRejection) -> ApiError {
    let text = e.body_text();
    let detail = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(&text);
    // serde names the field between backticks: "missing field `path`".
    let field = detail
        .split_once("field `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(name, _)| name.to_owned());
    let message = match (&field, detail) {
        (Some(f), d) if d.starts_with("missing field") => format!("{f}: field required"),
        (Some(f), d) if d.starts_with("duplicate field") => {
            format!("{f}: given more than once")
        }
        (Some(f), d) => format!("{f}: {d}"),
        (None, d) => format!("invalid query string: {d}"),
    };
    let mut loc: Vec<LocSegment> = vec!["query".into()];
    loc.extend(field.map(LocSegment::Key));
    ApiError::validation_at(loc, message)
}

/// A `multipart/form-data` body; any other body is a 422 at
/// `["body", "file"]` (the field the upload needs).
pub struct Multipart(pub axum::extract::Multipart);

impl<S: Send + Sync> FromRequest<S> for Multipart {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, HttpError> {
        axum::extract::Multipart::from_request(req, state)
            .await
            .map(Multipart)
            .map_err(|e| {
                ApiError::validation_at(
                    vec!["body".into(), "file".into()],
                    format!(
                        "expected a multipart/form-data body with a `file` field: {}",
                        e.body_text()
                    ),
                )
                .into()
            })
    }
}

/// A query string's `key=value` pairs, percent-decoded (`None`: none).
pub(crate) fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct P {
        path: String,
    }

    fn query(uri: &str) -> ApiError {
        let uri: axum::http::Uri = uri.parse().unwrap();
        query_rejection(axum::extract::Query::<P>::try_from_uri(&uri).unwrap_err())
    }

    #[test]
    fn query_errors_name_the_parameter() {
        for (uri, msg) in [
            ("/x", "path: field required"),
            ("/x?other=1", "path: field required"),
            ("/x?path=a&path=b", "path: given more than once"),
        ] {
            let e = query(uri);
            assert_eq!((e.status, e.field()), (422, Some("path")), "{uri}: {e:?}");
            assert_eq!(e.message, msg);
            assert_eq!(e.loc[0], LocSegment::from("query"));
        }
    }
}
