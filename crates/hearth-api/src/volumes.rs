//! LangSmith's volume routes (`/api/v2/sandboxes/volumes`, the SDK's
//! `client.sandboxes.volumes`): their bodies and answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use crate::boxes::{check_offset_and_cursor, check_query_value, parse_page_size, unknown_query};
use crate::error::ApiError;

/// Body of `POST /volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// Unique in the workspace: 1–63 letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// Capacity, rounded up to a whole GiB (at most 1 TiB). It counts
    /// against the workspace's storage quota from the create.
    pub size_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Body of `POST /volumes/{volume}/clone`: the new volume, the source's
/// size, holding what the source last committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloneVolumeRequest {
    /// Unique in the workspace: 1–63 letters, digits, `.`, `_`, `-`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// None: the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Body of `PATCH /volumes/{volume}`: each field given replaces; `null`
/// or an empty value clears.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateVolumeRequest {
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub description: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub labels: Option<Option<BTreeMap<String, String>>>,
}

/// A field that is present (`Some`), its value `null` or not.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A sandbox that holds a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeAttachmentResponse {
    pub sandbox_id: uuid::Uuid,
    pub sandbox_name: String,
    pub mount_path: String,
    pub read_only: bool,
}

/// A volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeResponse {
    pub id: uuid::Uuid,
    pub name: String,
    pub size_bytes: u64,
    /// `ready`: Hearth makes a volume's filesystem at its first attach.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The sandboxes that hold it: one read-write at most, and readers.
    pub attachments: Vec<VolumeAttachmentResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_volume_id: Option<uuid::Uuid>,
    pub created_at: String,
    pub created_by: String,
    pub updated_at: String,
    pub updated_by: String,
}

/// One page of volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ListVolumesResponse {
    pub items: Vec<VolumeResponse>,
    pub next_cursor: Option<String>,
}

/// `GET /volumes`'s query.
#[derive(Debug, Clone, Default, PartialEq, Eq, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListVolumesQuery {
    /// Case-insensitive substring of the name.
    pub name_contains: Option<String>,
    /// 1..=500; absent: 500.
    pub page_size: Option<u32>,
    /// `next_cursor` of the page before.
    pub cursor: Option<String>,
}

impl ListVolumesQuery {
    /// Builds the query from decoded `key=value` pairs; an unknown key is
    /// a 422.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ApiError> {
        let mut q = Self::default();
        for (k, v) in pairs {
            check_query_value(k, v)?;
            match k {
                "name_contains" => q.name_contains = Some(v.to_owned()),
                "page_size" => q.page_size = Some(parse_page_size(k, v)?),
                "cursor" => q.cursor = Some(v.to_owned()),
                _ => return Err(unknown_query(k)),
            }
        }
        check_offset_and_cursor(None, q.cursor.as_deref())?;
        Ok(q)
    }
}
