//! List queries: the API's query parameters to the database's filters, and
//! snapshot rows to the API's snapshot resource.

use hearth_api::boxes::{SandboxSortBy, SortOrder};
use hearth_api::{ApiError, ListSandboxesQuery, SnapshotResponse};
use hearth_db::{SandboxFilter, SandboxSort, SnapshotRow, SnapshotStatus};

use crate::auth::Principal;

pub fn sandbox_filter(q: &ListSandboxesQuery, who: &Principal) -> Result<SandboxFilter, ApiError> {
    let created_by = match q.created_by.as_deref() {
        None => None,
        Some("me") => Some(who.who()),
        Some(other) => {
            return Err(ApiError::invalid_query(
                "created_by",
                format!("only \"me\" is supported, not {other:?}"),
            ))
        }
    };
    let status = q
        .status
        .map(|s| hearth_db::SandboxStatus::parse(s.as_str()))
        .unwrap_or(None);
    let sort_by = match q.sort_by {
        None | Some(SandboxSortBy::CreatedAt) => SandboxSort::CreatedAt,
        Some(SandboxSortBy::Name) => SandboxSort::Name,
        Some(SandboxSortBy::Status) => SandboxSort::Status,
        Some(SandboxSortBy::StoppedAt) => SandboxSort::StoppedAt,
        Some(SandboxSortBy::IdleTtlSeconds) => SandboxSort::IdleTtl,
        Some(SandboxSortBy::DeleteAfterStopSeconds) => SandboxSort::DeleteAfterStop,
    };
    let sort_order = match q.sort_order.unwrap_or_default() {
        SortOrder::Asc => hearth_db::SortOrder::Asc,
        SortOrder::Desc => hearth_db::SortOrder::Desc,
    };
    Ok(SandboxFilter {
        name_contains: q.name_contains.clone(),
        status,
        labels: q
            .label_filters()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.map(str::to_owned)))
            .collect(),
        created_by,
        sort_by,
        sort_order,
        page_size: q
            .page_size
            .or(q.limit)
            .unwrap_or(hearth_api::boxes::DEFAULT_PAGE_SIZE),
        cursor: q.cursor.clone(),
        ..SandboxFilter::default()
    })
}

pub fn snapshot_response(s: &SnapshotRow, tags: Vec<String>) -> SnapshotResponse {
    use hearth_api::SnapshotStatus as A;
    SnapshotResponse {
        id: *s.id.as_uuid(),
        name: s.name.clone(),
        // A tag that moved to a newer snapshot leaves this one dangling.
        tags: tags
            .into_iter()
            .filter(|t| hearth_db::is_published_tag(t))
            .collect(),
        status: match s.status {
            SnapshotStatus::Building => A::Building,
            SnapshotStatus::Ready => A::Ready,
            SnapshotStatus::Failed => A::Failed,
            SnapshotStatus::Deleting => A::Deleting,
        },
        status_message: s.status_message.clone(),
        docker_image: s.docker_image.clone(),
        image_digest: s.image_digest.clone(),
        registry_id: s.registry_id.as_deref().and_then(|id| id.parse().ok()),
        source_sandbox_id: s.source_sandbox_id.map(|i| *i.as_uuid()),
        fs_capacity_bytes: s.fs_capacity.bytes(),
        fs_used_bytes: None,
        memory_snapshot_size_bytes: s.memory_bytes.map(|m| m.bytes()),
        labels: s.labels.clone(),
        description: match (&s.description, &s.volume) {
            (Some(d), _) => Some(d.clone()),
            (None, None) => Some(format!("Hearth built-in image `{}`", s.image)),
            (None, Some(_)) => None,
        },
        run_config: s
            .run_config
            .clone()
            .and_then(|v| serde_json::from_value(v).ok()),
        created_at: s.created_at.to_rfc3339(),
        created_by: None,
        updated_at: Some(s.updated_at.to_rfc3339()),
    }
}

/// Offset pagination over the database's cursor pages: walks past `offset`
/// items (in pages of at most the database's largest) and then reads one
/// page of `page_size`, whose cursor continues right after what it holds.
/// `offset` is bounded by the query's parser (`MAX_LIST_OFFSET`).
pub async fn skip_then_page<T, F, Fut>(
    offset: u64,
    page_size: u32,
    mut fetch: F,
) -> Result<hearth_db::Page<T>, hearth_db::DbError>
where
    F: FnMut(Option<String>, u32) -> Fut,
    Fut: std::future::Future<Output = Result<hearth_db::Page<T>, hearth_db::DbError>>,
{
    let mut cursor = None;
    let mut left = offset;
    while left > 0 {
        let n = left.min(u64::from(hearth_db::MAX_PAGE_SIZE)) as u32;
        let page = fetch(cursor, n).await?;
        match page.next_cursor {
            Some(next) if page.items.len() as u64 == u64::from(n) => {
                cursor = Some(next);
                left -= u64::from(n);
            }
            // Fewer items than the offset: an empty last page.
            _ => {
                return Ok(hearth_db::Page {
                    items: Vec::new(),
                    next_cursor: None,
                })
            }
        }
    }
    fetch(cursor, page_size).await
}
