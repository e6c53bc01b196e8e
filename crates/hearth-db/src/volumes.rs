//! Workspace volumes and their attachments to sandboxes (migration 19).
//!
//! A volume is a named disk of a fixed size that the workspace keeps until
//! it deletes it; its bytes are the store's (`volume-<id>`). Sandboxes
//! attach it at create: one writer at a time and any number of readers,
//! decided in the sandbox insert's transaction ([`Db::insert_sandbox_holding`])
//! so two creates cannot both become its writer. An attachment lasts as
//! long as its sandbox's row. A volume with attachments cannot be
//! deleted. Its size counts against the workspace's storage quota from
//! its create.

use std::collections::BTreeMap;

use hearth_types::{ByteSize, SandboxId, WorkspaceId};

use crate::error::DbError;
use crate::model::{Page, SortOrder};
use crate::page::{push_name_and_status, Key, KeyKind, Keyset, SortSpec};
use crate::quota::{check_storage, quota_and_usage};
use crate::sql::{decode_n, RowExt, Sql, Tx};
use crate::time::Timestamp;
use crate::Db;

/// At most this many volumes per workspace.
pub const MAX_VOLUMES: u64 = 100;

/// One volume as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRow {
    pub id: String,
    pub workspace_id: WorkspaceId,
    pub name: String,
    pub size: ByteSize,
    pub description: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Attachments ever made (the last one's `hold`).
    pub holds: u64,
    pub created_by: String,
    pub updated_by: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// What a new sandbox asks of a volume of its workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeAttach {
    pub volume_id: String,
    pub mount_path: String,
    pub read_only: bool,
}

/// A volume attached to a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub volume_id: String,
    pub sandbox_id: SandboxId,
    pub sandbox_name: String,
    pub mount_path: String,
    pub read_only: bool,
    /// Which attachment of the volume this is (see `VolumeMount::hold`).
    pub hold: u32,
}

const COLS: &str = "id, workspace_id, name, size_bytes, description, labels, holds, created_by, \
                    updated_by, created_at, updated_at";

fn decode(r: &dyn RowExt) -> Result<VolumeRow, sqlx::Error> {
    Ok(VolumeRow {
        id: r.text("id")?,
        workspace_id: r.parse("workspace_id")?,
        name: r.text("name")?,
        size: ByteSize(r.unsigned("size_bytes")?),
        description: r.opt_text("description")?,
        labels: r.json("labels")?,
        holds: r.unsigned("holds")?,
        created_by: r.text("created_by")?,
        updated_by: r.text("updated_by")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

fn decode_attachment(r: &dyn RowExt) -> Result<Attachment, sqlx::Error> {
    Ok(Attachment {
        volume_id: r.text("volume_id")?,
        sandbox_id: r.parse("sandbox_id")?,
        sandbox_name: r.text("sandbox_name")?,
        mount_path: r.text("mount_path")?,
        read_only: r.flag("read_only")?,
        hold: r.u32("hold")?,
    })
}

const BY_NAME: SortSpec = SortSpec {
    name: "name",
    expr: "name",
    kind: KeyKind::Text,
};

const ATTACHMENTS: &str =
    "SELECT a.volume_id, a.sandbox_id, s.name AS sandbox_name, a.mount_path, \
                           a.read_only, a.hold \
                           FROM volume_attachments a JOIN sandboxes s ON s.id = a.sandbox_id";

fn labels_json(labels: &BTreeMap<String, String>, op: &'static str) -> Result<String, DbError> {
    serde_json::to_string(labels).map_err(|e| DbError::Backend {
        op,
        source: sqlx::Error::Encode(Box::new(e)),
    })
}

impl Db {
    /// Stores a new volume within the workspace's storage quota and
    /// [`MAX_VOLUMES`]. Its name taken is `Conflict`; an unknown workspace
    /// `NotFound`. The check and the insert share one write transaction
    /// holding the workspace's row.
    pub async fn insert_volume(&self, v: &VolumeRow) -> Result<(), DbError> {
        let op = "insert volume";
        let ws = v.workspace_id.to_string();
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let (quotas, usage) = quota_and_usage(&mut tx, op, v.workspace_id, None).await?;
        let n = tx
            .fetch_optional(
                &Sql::new("SELECT COUNT(*) AS n FROM volumes WHERE workspace_id = $1")
                    .arg(ws.as_str()),
                decode_n,
            )
            .await
            .map_err(DbError::backend(op))?
            .unwrap_or(0);
        if u64::try_from(n).unwrap_or(0) >= MAX_VOLUMES {
            return Err(DbError::TooMany {
                what: "volumes",
                limit: MAX_VOLUMES,
            });
        }
        check_storage(&quotas, &usage, v.size)?;
        tx.execute(
            &Sql::new(&format!(
                "INSERT INTO volumes ({COLS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ))
            .arg(v.id.as_str())
            .arg(ws.as_str())
            .arg(v.name.as_str())
            .arg(crate::sql::int(v.size.bytes(), op, "size_bytes")?)
            .arg(v.description.as_deref())
            .arg(labels_json(&v.labels, op)?)
            .arg(0i64)
            .arg(v.created_by.as_str())
            .arg(v.updated_by.as_str())
            .arg(v.created_at)
            .arg(v.updated_at),
        )
        .await
        .map_err(DbError::unique(op, || format!("volume {:?}", v.name)))?;
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// Replaces the description and labels of volume `v.id` (and its
    /// `updated_*`). `NotFound` when it is gone.
    pub async fn update_volume(&self, v: &VolumeRow) -> Result<(), DbError> {
        let op = "update volume";
        let sql = Sql::new(
            "UPDATE volumes SET description = $3, labels = $4, updated_by = $5, updated_at = $6 \
             WHERE workspace_id = $1 AND id = $2",
        )
        .arg(v.workspace_id.to_string())
        .arg(v.id.as_str())
        .arg(v.description.as_deref())
        .arg(labels_json(&v.labels, op)?)
        .arg(v.updated_by.as_str())
        .arg(v.updated_at);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "volume" });
        }
        Ok(())
    }

    /// Forgets volume `id` of `workspace`; whether it existed. One that a
    /// sandbox holds is `InUse`, naming the sandbox.
    pub async fn delete_volume(&self, workspace: WorkspaceId, id: &str) -> Result<bool, DbError> {
        let op = "delete volume";
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let held = tx
            .fetch_all(
                &Sql::new(&format!("{ATTACHMENTS} WHERE a.volume_id = $1")).arg(id),
                decode_attachment,
            )
            .await
            .map_err(DbError::backend(op))?;
        if let Some(a) = held.first() {
            return Err(DbError::InUse {
                what: format!(
                    "volume {id} is attached to sandbox '{}' at {}; delete the sandbox first",
                    a.sandbox_name, a.mount_path
                ),
            });
        }
        let n = tx
            .execute(
                &Sql::new("DELETE FROM volumes WHERE workspace_id = $1 AND id = $2")
                    .arg(workspace.to_string())
                    .arg(id),
            )
            .await
            .map_err(DbError::backend(op))?;
        tx.commit().await.map_err(DbError::backend(op))?;
        Ok(n > 0)
    }

    /// Volume `key` of `workspace`, by id or by name (another workspace's
    /// is `None`).
    pub async fn volume(
        &self,
        workspace: WorkspaceId,
        key: &str,
    ) -> Result<Option<VolumeRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {COLS} FROM volumes WHERE workspace_id = $1 AND (id = $2 OR name = $2)"
        ))
        .arg(workspace.to_string())
        .arg(key);
        let mut rows = self
            .pool
            .fetch_all(&sql, decode)
            .await
            .map_err(DbError::backend("read volume"))?;
        // An id wins over another volume's name that spells it.
        rows.sort_by_key(|v| v.id != key);
        Ok(rows.into_iter().next())
    }

    /// One page of the volumes of `workspace` whose name contains
    /// `name_contains`, by name, after `cursor`.
    pub async fn list_volumes(
        &self,
        workspace: WorkspaceId,
        name_contains: Option<&str>,
        page_size: u32,
        cursor: Option<&str>,
    ) -> Result<Page<VolumeRow>, DbError> {
        let ks = Keyset::new(BY_NAME, SortOrder::Asc, page_size, cursor)?;
        let mut sql = Sql::new(&format!(
            "SELECT {COLS} FROM volumes WHERE workspace_id = $1"
        ))
        .arg(workspace.to_string());
        push_name_and_status(&mut sql, name_contains, None);
        ks.push_where(&mut sql);
        ks.push_order_limit(&mut sql);
        let rows = self
            .pool
            .fetch_all(&sql, decode)
            .await
            .map_err(DbError::backend("list volumes"))?;
        Ok(ks.finish(rows, |r| (Key::Text(r.name.clone()), r.id.clone())))
    }

    /// The attachments of the volumes `ids`.
    pub async fn volume_attachments(&self, ids: &[&str]) -> Result<Vec<Attachment>, DbError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut sql = Sql::new(&format!("{ATTACHMENTS} WHERE a.volume_id IN ("));
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.push_param(*id);
        }
        sql.push(") ORDER BY a.volume_id, s.name");
        self.pool
            .fetch_all(&sql, decode_attachment)
            .await
            .map_err(DbError::backend("read volume attachments"))
    }

    /// The volumes sandbox `id` holds.
    pub async fn sandbox_attachments(&self, id: SandboxId) -> Result<Vec<Attachment>, DbError> {
        self.pool
            .fetch_all(
                &Sql::new(&format!("{ATTACHMENTS} WHERE a.sandbox_id = $1")).arg(id.to_string()),
                decode_attachment,
            )
            .await
            .map_err(DbError::backend("read a sandbox's volumes"))
    }
}

/// Attaches the volumes `attach` of `workspace` to the sandbox `sandbox`
/// just inserted in `tx`: each must be the workspace's (`NotFound`), a
/// writer only where no other sandbox writes (`InUse`, naming it). Each
/// attachment takes the volume's next hold.
pub(crate) async fn attach(
    tx: &mut Tx,
    op: &'static str,
    workspace: WorkspaceId,
    sandbox: SandboxId,
    attach: &[VolumeAttach],
) -> Result<(), DbError> {
    let lock = match tx.backend() {
        crate::model::Backend::Sqlite => "",
        crate::model::Backend::Postgres => " FOR UPDATE",
    };
    for a in attach {
        let name = tx
            .fetch_optional(
                &Sql::new(&format!(
                    "SELECT name FROM volumes WHERE workspace_id = $1 AND id = $2{lock}"
                ))
                .arg(workspace.to_string())
                .arg(a.volume_id.as_str()),
                |r| r.text("name"),
            )
            .await
            .map_err(DbError::backend(op))?
            .ok_or(DbError::NotFound { what: "volume" })?;
        if !a.read_only {
            let writer = tx
                .fetch_optional(
                    &Sql::new(&format!(
                        "{ATTACHMENTS} WHERE a.volume_id = $1 AND a.read_only = $2"
                    ))
                    .arg(a.volume_id.as_str())
                    .arg(false),
                    decode_attachment,
                )
                .await
                .map_err(DbError::backend(op))?;
            if let Some(w) = writer {
                return Err(DbError::InUse {
                    what: format!(
                        "volume '{name}' is mounted read-write by sandbox '{}' (one writer at a \
                         time; mount it read-only, or delete that sandbox first)",
                        w.sandbox_name
                    ),
                });
            }
        }
        tx.execute(
            &Sql::new("UPDATE volumes SET holds = holds + 1 WHERE id = $1")
                .arg(a.volume_id.as_str()),
        )
        .await
        .map_err(DbError::backend(op))?;
        let hold = tx
            .fetch_optional(
                &Sql::new("SELECT holds AS n FROM volumes WHERE id = $1").arg(a.volume_id.as_str()),
                decode_n,
            )
            .await
            .map_err(DbError::backend(op))?
            .unwrap_or(0);
        let hold = u32::try_from(hold).map_err(|_| DbError::TooMany {
            what: "attachments of one volume",
            limit: u64::from(u32::MAX),
        })?;
        tx.execute(
            &Sql::new(
                "INSERT INTO volume_attachments (volume_id, sandbox_id, mount_path, read_only, \
                 hold) VALUES ($1, $2, $3, $4, $5)",
            )
            .arg(a.volume_id.as_str())
            .arg(sandbox.to_string())
            .arg(a.mount_path.as_str())
            .arg(a.read_only)
            .arg(i64::from(hold)),
        )
        .await
        .map_err(DbError::unique(op, || {
            format!("attachment of volume '{name}' to this sandbox")
        }))?;
    }
    Ok(())
}
