//! What a caller may read, for both doors: pages of the workspace's
//! sandboxes and snapshots, behind the read permission.

use hearth_db::{
    Page, Quotas, SandboxFilter, SandboxRow, SnapshotFilter, SnapshotRow, WorkspaceCounts,
    WorkspaceUsage,
};

use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::list::skip_then_page;
use crate::Control;

/// What a workspace holds and may hold (LangSmith's `/usage`).
#[derive(Debug, Clone)]
pub(crate) struct UsageView {
    pub quotas: Quotas,
    pub usage: WorkspaceUsage,
    pub counts: WorkspaceCounts,
}

/// The most sandboxes one batch delete names.
pub(crate) const MAX_BATCH_DELETE: usize = 100;

/// What a batch delete did: the names deleted, and each one skipped with
/// why.
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchDeleted {
    pub deleted: Vec<String>,
    pub skipped: Vec<(String, String)>,
}

impl Control {
    /// The page of the caller's workspace's sandboxes that `filter` asks
    /// for, after skipping `offset` of them. A cursor the list did not
    /// give is invalid at `cursor`.
    pub(crate) async fn sandbox_page(
        &self,
        who: &Principal,
        filter: &SandboxFilter,
        offset: u64,
    ) -> Result<Page<SandboxRow>, DomainError> {
        let ws = who.workspace_id;
        self.page(who, offset, filter.page_size, |cursor, page_size| {
            let f = SandboxFilter {
                cursor: cursor.or_else(|| filter.cursor.clone()),
                page_size,
                ..filter.clone()
            };
            let db = self.db.clone();
            async move { db.list_sandboxes(ws, &f).await }
        })
        .await
    }

    /// The page of the caller's workspace's snapshots that `filter` asks
    /// for, after skipping `offset` of them.
    pub(crate) async fn snapshot_page(
        &self,
        who: &Principal,
        filter: &SnapshotFilter,
        offset: u64,
    ) -> Result<Page<SnapshotRow>, DomainError> {
        let ws = who.workspace_id;
        self.page(who, offset, filter.page_size, |cursor, page_size| {
            let f = SnapshotFilter {
                cursor: cursor.or_else(|| filter.cursor.clone()),
                page_size,
                ..filter.clone()
            };
            let db = self.db.clone();
            async move { db.list_snapshots(ws, &f).await }
        })
        .await
    }

    /// A page of a list the caller may read, `fetch` reading one page
    /// from a cursor.
    async fn page<T, F, Fut>(
        &self,
        who: &Principal,
        offset: u64,
        page_size: u32,
        fetch: F,
    ) -> Result<Page<T>, DomainError>
    where
        F: FnMut(Option<String>, u32) -> Fut,
        Fut: std::future::Future<Output = Result<Page<T>, hearth_db::DbError>>,
    {
        who.require("sandboxes:read")?;
        skip_then_page(offset, page_size, fetch)
            .await
            .map_err(DomainError::from)
    }

    /// One of the caller's workspace's (or the built-in) snapshots, by id
    /// or `name[:tag]`, in any status.
    pub(crate) async fn snapshot(
        &self,
        who: &Principal,
        reference: &str,
    ) -> Result<SnapshotRow, DomainError> {
        who.require("sandboxes:read")?;
        self.resolve_any_snapshot(who.workspace_id, reference).await
    }

    /// The tags of the snapshot name `name` in the caller's workspace (or
    /// the built-in ones), each its snapshot, by tag; not found when there
    /// are none.
    pub(crate) async fn snapshot_tags(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<Vec<SnapshotRow>, DomainError> {
        who.require("sandboxes:read")?;
        let tags = self
            .db
            .snapshot_tags(who.workspace_id, name)
            .await
            .map_err(DomainError::from)?;
        let mut out = Vec::with_capacity(tags.len());
        for (_, id) in tags {
            match self.db.get_snapshot(who.workspace_id, id).await {
                Ok(s) => out.push(s),
                // Deleted meanwhile.
                Err(hearth_db::DbError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if out.is_empty() {
            return Err(DomainError::snapshot_not_found(name));
        }
        Ok(out)
    }

    /// A sandbox of the caller's workspace that is not being deleted, by
    /// id (another workspace's is not found, as one that never was).
    pub(crate) async fn live_sandbox(
        &self,
        who: &Principal,
        id: hearth_types::SandboxId,
    ) -> Result<SandboxRow, DomainError> {
        let row = self.find(who.workspace_id, &id.to_string()).await?;
        if row.status == hearth_db::SandboxStatus::Deleting {
            return Err(DomainError::sandbox_not_found(&id.to_string()));
        }
        Ok(row)
    }

    /// The snapshot a sandbox was made from, while it exists (it may have
    /// been deleted since; a failure to read it is logged).
    pub(crate) async fn made_from(&self, row: &SandboxRow) -> Option<SnapshotRow> {
        match self
            .db
            .get_snapshot(row.workspace_id, row.snapshot_id)
            .await
        {
            Ok(s) => Some(s),
            Err(hearth_db::DbError::NotFound { .. }) => None,
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "cannot read the snapshot the sandbox was made from");
                None
            }
        }
    }
}

/// The run configuration a snapshot gives its sandboxes (entrypoint, user,
/// working directory, environment), as stored with it; a stored value that
/// does not read is logged and none is used.
pub(crate) fn snapshot_run(snap: &SnapshotRow) -> Option<hearth_api::RunConfig> {
    let v = snap.run_config.clone()?;
    match serde_json::from_value(v) {
        Ok(run) => Some(run),
        Err(e) => {
            tracing::warn!(snapshot = %snap.id, error = %e, "the snapshot's stored run configuration does not read; its sandboxes run without it");
            None
        }
    }
}

/// The resolved spec stored with a sandbox (Hearth's own, whichever API
/// created it).
pub(crate) fn spec_of(row: &SandboxRow) -> Result<hearth_types::sandbox::SandboxSpec, DomainError> {
    hearth_api::read_stored_spec(&row.spec).map_err(|e| {
        tracing::error!(sandbox = %row.id, error = %e, "stored sandbox spec does not parse");
        DomainError::Internal
    })
}

impl Control {
    /// The workspace's use and limits (`sandboxes:read`).
    pub(crate) async fn usage(&self, who: &Principal) -> Result<UsageView, DomainError> {
        who.require("sandboxes:read")?;
        let ws = who.workspace_id;
        Ok(UsageView {
            quotas: self.db.get_workspace(ws).await?.quotas,
            usage: self.db.workspace_usage(ws).await?,
            counts: self.db.workspace_counts(ws).await?,
        })
    }

    /// Deletes each named sandbox (by name or id) the caller may delete;
    /// one that cannot be is skipped with the reason, the others go on.
    pub(crate) async fn delete_many(
        &self,
        who: &Principal,
        names: &[String],
    ) -> Result<BatchDeleted, DomainError> {
        who.require("sandboxes:delete")?;
        if names.len() > MAX_BATCH_DELETE {
            return Err(DomainError::invalid(
                "names",
                format!(
                    "names: at most {MAX_BATCH_DELETE} sandboxes per batch, got {}",
                    names.len()
                ),
            ));
        }
        let mut out = BatchDeleted::default();
        for name in names {
            match self.delete(who, name).await {
                Ok(()) => out.deleted.push(name.clone()),
                Err(e) => out.skipped.push((name.clone(), e.to_string())),
            }
        }
        Ok(out)
    }
}
