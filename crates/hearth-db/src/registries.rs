//! Private image registries of a workspace: a name, a URL and credentials
//! (the password sealed by the control plane: this crate never sees a
//! plaintext) that a snapshot built from an OCI image pulls with.

use hearth_types::WorkspaceId;

use crate::error::DbError;
use crate::model::{Backend, Page, SortOrder};
use crate::page::{push_name_and_status, Key, KeyKind, Keyset, SortSpec};
use crate::sql::{decode_n, RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

/// At most this many registries per workspace.
pub const MAX_REGISTRIES: u64 = 100;

/// One registry as stored. `password` is sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryRow {
    pub id: String,
    pub workspace_id: WorkspaceId,
    pub name: String,
    pub url: String,
    pub auth_type: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

const COLS: &str = "id, workspace_id, name, url, auth_type, username, password, created_by, \
                    updated_by, created_at, updated_at";

fn decode(r: &dyn RowExt) -> Result<RegistryRow, sqlx::Error> {
    Ok(RegistryRow {
        id: r.text("id")?,
        workspace_id: r.parse("workspace_id")?,
        name: r.text("name")?,
        url: r.text("url")?,
        auth_type: r.text("auth_type")?,
        username: r.opt_text("username")?,
        password: r.opt_text("password")?,
        created_by: r.opt_text("created_by")?,
        updated_by: r.opt_text("updated_by")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

const BY_NAME: SortSpec = SortSpec {
    name: "name",
    expr: "name",
    kind: KeyKind::Text,
};

fn taken(name: &str) -> impl FnOnce() -> String + '_ {
    move || format!("registry {name:?}")
}

impl Db {
    /// Stores a new registry. Its name taken in the workspace is
    /// `Conflict`; past [`MAX_REGISTRIES`] it is `TooMany`; an unknown
    /// workspace is `NotFound`. The count and the insert share one write
    /// transaction holding the workspace row, so concurrent inserts cannot
    /// overshoot the limit together.
    pub async fn insert_registry(&self, r: &RegistryRow) -> Result<(), DbError> {
        let op = "insert registry";
        let ws = r.workspace_id.to_string();
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let lock = match tx.backend() {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR UPDATE",
        };
        tx.fetch_optional(
            &Sql::new(&format!("SELECT id FROM workspaces WHERE id = $1{lock}")).arg(ws.as_str()),
            |r| r.text("id"),
        )
        .await
        .map_err(DbError::backend(op))?
        .ok_or(DbError::NotFound { what: "workspace" })?;
        let n = tx
            .fetch_optional(
                &Sql::new("SELECT COUNT(*) AS n FROM registries WHERE workspace_id = $1")
                    .arg(ws.as_str()),
                decode_n,
            )
            .await
            .map_err(DbError::backend(op))?
            .unwrap_or(0);
        if u64::try_from(n).unwrap_or(0) >= MAX_REGISTRIES {
            return Err(DbError::TooMany {
                what: "registries",
                limit: MAX_REGISTRIES,
            });
        }
        tx.execute(
            &Sql::new(&format!(
                "INSERT INTO registries ({COLS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ))
            .arg(r.id.as_str())
            .arg(ws.as_str())
            .arg(r.name.as_str())
            .arg(r.url.as_str())
            .arg(r.auth_type.as_str())
            .arg(r.username.as_deref())
            .arg(r.password.as_deref())
            .arg(r.created_by.as_deref())
            .arg(r.updated_by.as_deref())
            .arg(r.created_at)
            .arg(r.updated_at),
        )
        .await
        .map_err(DbError::unique(op, taken(&r.name)))?;
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// Replaces every field of the registry `r.id` of `r.workspace_id`
    /// but its id, workspace, creator and creation time. `NotFound` when
    /// it is gone; `Conflict` when its new name is taken.
    pub async fn update_registry(&self, r: &RegistryRow) -> Result<(), DbError> {
        let op = "update registry";
        let sql = Sql::new(
            "UPDATE registries SET name = $3, url = $4, auth_type = $5, username = $6, \
             password = $7, updated_by = $8, updated_at = $9 \
             WHERE workspace_id = $1 AND id = $2",
        )
        .arg(r.workspace_id.to_string())
        .arg(r.id.as_str())
        .arg(r.name.as_str())
        .arg(r.url.as_str())
        .arg(r.auth_type.as_str())
        .arg(r.username.as_deref())
        .arg(r.password.as_deref())
        .arg(r.updated_by.as_deref())
        .arg(r.updated_at);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::unique(op, taken(&r.name)))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "registry" });
        }
        Ok(())
    }

    /// Forgets the registry `name` of `workspace`; whether it existed.
    pub async fn delete_registry(
        &self,
        workspace: WorkspaceId,
        name: &str,
    ) -> Result<bool, DbError> {
        let sql = Sql::new("DELETE FROM registries WHERE workspace_id = $1 AND name = $2")
            .arg(workspace.to_string())
            .arg(name);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("delete registry"))?;
        Ok(n > 0)
    }

    /// The registry `name` of `workspace`, if it exists.
    pub async fn registry_by_name(
        &self,
        workspace: WorkspaceId,
        name: &str,
    ) -> Result<Option<RegistryRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {COLS} FROM registries WHERE workspace_id = $1 AND name = $2"
        ))
        .arg(workspace.to_string())
        .arg(name);
        self.pool
            .fetch_optional(&sql, decode)
            .await
            .map_err(DbError::backend("read registry"))
    }

    /// The registry `id` of `workspace`, if it exists (another
    /// workspace's is `None`).
    pub async fn registry_by_id(
        &self,
        workspace: WorkspaceId,
        id: &str,
    ) -> Result<Option<RegistryRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {COLS} FROM registries WHERE workspace_id = $1 AND id = $2"
        ))
        .arg(workspace.to_string())
        .arg(id);
        self.pool
            .fetch_optional(&sql, decode)
            .await
            .map_err(DbError::backend("read registry"))
    }

    /// One page of the registries of `workspace` whose name contains
    /// `name_contains` (ASCII case-insensitively), by name, after
    /// `cursor` (keyset-paged, as every list).
    pub async fn list_registries(
        &self,
        workspace: WorkspaceId,
        name_contains: Option<&str>,
        page_size: u32,
        cursor: Option<&str>,
    ) -> Result<Page<RegistryRow>, DbError> {
        let ks = Keyset::new(BY_NAME, SortOrder::Asc, page_size, cursor)?;
        let mut sql = Sql::new(&format!(
            "SELECT {COLS} FROM registries WHERE workspace_id = $1"
        ))
        .arg(workspace.to_string());
        push_name_and_status(&mut sql, name_contains, None);
        ks.push_where(&mut sql);
        ks.push_order_limit(&mut sql);
        let rows = self
            .pool
            .fetch_all(&sql, decode)
            .await
            .map_err(DbError::backend("list registries"))?;
        Ok(ks.finish(rows, |r| (Key::Text(r.name.clone()), r.id.clone())))
    }
}
