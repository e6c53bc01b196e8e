//! API keys, managed through the API (`/api/v1/api-key`, LangSmith's
//! paths): a workspace's keys listed, created (the secret shown once) and
//! revoked by a key of that workspace that holds `*` or `keys:manage`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// One API key (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyResponse {
    pub id: Uuid,
    /// The secret's first characters, to recognise it by: `hth_1234…`.
    pub short_key: String,
    pub description: String,
    /// What the key may do (`sandboxes:read`, …, `*`).
    pub permissions: Vec<String>,
    /// RFC 3339.
    pub created_at: String,
}

/// Body of `POST /api/v1/api-key`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKeyRequest {
    #[serde(default)]
    pub description: String,
    /// What the new key may do; by default the same as the caller's key.
    /// None it does not hold itself (a key cannot grant more than it has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<Vec<String>>,
}

/// Answer of `POST /api/v1/api-key`: the key, with its secret, shown only
/// in this answer (only a hash of it is kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreatedApiKeyResponse {
    #[serde(flatten)]
    pub api_key: ApiKeyResponse,
    /// The secret, for `X-Api-Key`.
    pub key: String,
}
