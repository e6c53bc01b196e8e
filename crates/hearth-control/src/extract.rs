//! Request bodies with the size limit answered in LangSmith's envelope
//! (axum's own limit answers in plain text).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use hearth_api::ApiError;

use crate::error::HttpError;
use crate::Control;

/// A JSON request body of at most `ControlConfig::json_limit` bytes.
pub struct JsonBody(pub Bytes);

impl FromRequest<Arc<Control>> for JsonBody {
    type Rejection = HttpError;

    async fn from_request(req: Request, control: &Arc<Control>) -> Result<Self, HttpError> {
        let limit = control.cfg.json_limit;
        if let Some(len) = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > limit as u64 {
                return Err(ApiError::payload_too_large(limit as u64).into());
            }
        }
        match axum::body::to_bytes(req.into_body(), limit).await {
            Ok(b) => Ok(JsonBody(b)),
            Err(_) => Err(ApiError::payload_too_large(limit as u64).into()),
        }
    }
}
