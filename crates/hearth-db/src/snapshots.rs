//! Snapshots: built-in ones (no workspace, visible to all) and a
//! workspace's own, addressed by id or by `name:tag`.

use hearth_types::{ByteSize, MilliCpu, SnapshotId, WorkspaceId};

use crate::error::{is_unique_violation, DbError};
use crate::model::{Page, SnapshotFilter, SnapshotRow, SnapshotSort, SnapshotStatus};
use crate::page::{push_name_and_status, Key, KeyKind, Keyset, SortSpec};
use crate::quota::{check_snapshot, quota_and_usage};
use crate::sql::{int, RowExt, Sql, Tx};
use crate::time::Timestamp;
use crate::Db;

pub(crate) const SNAPSHOT_COLS: &str = "id, workspace_id, name, tag, status, status_message, image, \
                             fs_capacity_bytes, labels, run_config, docker_image, created_at, updated_at, \
                             volume, memory_bytes, source_sandbox_id, image_digest, description, \
                             memory_reserved_bytes, registry_id, cpu_millicores";

/// Rows a workspace may see: its own and the built-ins. `$1` is the
/// workspace id.
const VISIBLE: &str = "(workspace_id = $1 OR workspace_id IS NULL)";

pub(crate) fn decode_snapshot(r: &dyn RowExt) -> Result<SnapshotRow, sqlx::Error> {
    Ok(SnapshotRow {
        id: r.parse("id")?,
        workspace_id: r.opt_parse("workspace_id")?,
        name: r.text("name")?,
        tag: r.text("tag")?,
        status: r.parse("status")?,
        status_message: r.opt_text("status_message")?,
        image: r.text("image")?,
        fs_capacity: ByteSize(r.unsigned("fs_capacity_bytes")?),
        labels: r.json("labels")?,
        run_config: r.opt_json("run_config")?,
        docker_image: r.opt_text("docker_image")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
        volume: r.opt_text("volume")?,
        memory_bytes: r.opt_unsigned("memory_bytes")?.map(ByteSize),
        source_sandbox_id: r.opt_parse("source_sandbox_id")?,
        image_digest: r.opt_text("image_digest")?,
        description: r.opt_text("description")?,
        memory_reserved: r.opt_unsigned("memory_reserved_bytes")?.map(ByteSize),
        registry_id: r.opt_text("registry_id")?,
        cpu: r
            .opt_unsigned("cpu_millicores")?
            .map(|c| MilliCpu(u32::try_from(c).unwrap_or(u32::MAX))),
    })
}

fn snapshot_sql(
    op: &'static str,
    text: &str,
    s: &SnapshotRow,
    workspace: Option<WorkspaceId>,
) -> Result<Sql, DbError> {
    let encode = |e: serde_json::Error| DbError::Backend {
        op,
        source: sqlx::Error::Encode(e.into()),
    };
    let labels = serde_json::to_string(&s.labels).map_err(encode)?;
    let run_config = s
        .run_config
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(encode)?;
    Ok(Sql::new(text)
        .arg(s.id.to_string())
        .arg(workspace.map(|w| w.to_string()))
        .arg(s.name.as_str())
        .arg(s.tag.as_str())
        .arg(s.status.as_str())
        .arg(s.status_message.as_deref())
        .arg(s.image.as_str())
        .arg(int(s.fs_capacity.bytes(), op, "fs_capacity_bytes")?)
        .arg(labels)
        .arg(run_config)
        .arg(s.docker_image.as_deref())
        .arg(s.created_at)
        .arg(s.updated_at)
        .arg(s.volume.as_deref())
        .arg(
            s.memory_bytes
                .map(|m| int(m.bytes(), op, "memory_bytes"))
                .transpose()?,
        )
        .arg(s.source_sandbox_id.map(|i| i.to_string()))
        .arg(s.image_digest.as_deref())
        .arg(s.description.as_deref())
        .arg(
            s.memory_reserved
                .map(|m| int(m.bytes(), op, "memory_reserved_bytes"))
                .transpose()?,
        )
        .arg(s.registry_id.as_deref())
        .arg(s.cpu.map(|c| i64::from(c.0))))
}

/// What a snapshot charges against its workspace's storage quota: its
/// disk's logical size and its memory, saved or reserved.
pub fn snapshot_size(s: &SnapshotRow) -> ByteSize {
    let memory = s.memory_bytes.or(s.memory_reserved).unwrap_or(ByteSize(0));
    ByteSize(s.fs_capacity.bytes().saturating_add(memory.bytes()))
}

/// Checks, inside `tx` and under the workspace's lock, that one more
/// snapshot `s` fits the workspace's snapshot count and storage quotas.
async fn within_quota(
    tx: &mut Tx,
    op: &'static str,
    workspace: WorkspaceId,
    s: &SnapshotRow,
) -> Result<(), DbError> {
    let (quotas, usage) = quota_and_usage(tx, op, workspace, None).await?;
    // A template's build-cache layers take storage, not a place in the
    // count (migration 22 counts them so).
    let counts = !s.name.starts_with(hearth_types::rules::LAYER_PREFIX);
    check_snapshot(&quotas, &usage, snapshot_size(s), counts)
}

/// The insert of a workspace's snapshot.
fn insert_sql(op: &'static str, s: &SnapshotRow, workspace: WorkspaceId) -> Result<Sql, DbError> {
    snapshot_sql(
        op,
        &format!(
            "INSERT INTO snapshots ({SNAPSHOT_COLS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
             $19, $20, $21)"
        ),
        s,
        Some(workspace),
    )
}

fn sort_spec(s: SnapshotSort) -> SortSpec {
    match s {
        SnapshotSort::Name => SortSpec {
            name: "name",
            expr: "name",
            kind: KeyKind::Text,
        },
        SnapshotSort::Status => SortSpec {
            name: "status",
            expr: "status",
            kind: KeyKind::Text,
        },
        SnapshotSort::CreatedAt => SortSpec {
            name: "created_at",
            expr: "created_at",
            kind: KeyKind::Int,
        },
    }
}

fn sort_key(sort: SnapshotSort, s: &SnapshotRow) -> (Key, String) {
    let k = match sort {
        SnapshotSort::Name => Key::Text(s.name.clone()),
        SnapshotSort::Status => Key::Text(s.status.as_str().to_owned()),
        SnapshotSort::CreatedAt => Key::Int(s.created_at.unix_ms()),
    };
    (k, s.id.to_string())
}

impl Db {
    /// Creates or replaces a built-in snapshot (no workspace; visible to
    /// all), by id. `s.workspace_id` is ignored. `Conflict` if another
    /// built-in has the same `name:tag`, or a workspace snapshot this id.
    pub async fn upsert_builtin_snapshot(&self, s: &SnapshotRow) -> Result<(), DbError> {
        let op = "upsert built-in snapshot";
        let what = || format!("snapshot {}:{}", s.name, s.tag);
        let sql = snapshot_sql(
            op,
            &format!(
                "INSERT INTO snapshots ({SNAPSHOT_COLS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
             $19, $20, $21) \
                 ON CONFLICT (id) DO UPDATE SET name = excluded.name, tag = excluded.tag, \
                 status = excluded.status, status_message = excluded.status_message, \
                 image = excluded.image, fs_capacity_bytes = excluded.fs_capacity_bytes, \
                 labels = excluded.labels, run_config = excluded.run_config, \
                 docker_image = excluded.docker_image, updated_at = excluded.updated_at \
                 WHERE snapshots.workspace_id IS NULL"
            ),
            s,
            None,
        )?;
        // Two control-plane replicas starting together on a new database
        // insert the same built-in at once. PostgreSQL's ON CONFLICT
        // arbitrates only on `id`: the loser can trip the (name, tag)
        // index instead, and it reports that only after the winner
        // committed. Once again then finds the row by `id` and updates it;
        // a different snapshot holding the name conflicts again.
        let mut n = self.pool.execute(&sql).await;
        if matches!(&n, Err(e) if is_unique_violation(e)) {
            n = self.pool.execute(&sql).await;
        }
        let n = n.map_err(DbError::unique(op, what))?;
        if n == 0 {
            // The id belongs to a workspace's snapshot.
            return Err(DbError::Conflict { what: what() });
        }
        Ok(())
    }

    /// Stores a workspace's snapshot if the workspace stays within its
    /// quotas (see [`Db::publish_snapshot`]). `Conflict` if its `name:tag`
    /// is taken in the workspace.
    pub async fn insert_snapshot(
        &self,
        workspace_id: WorkspaceId,
        s: &SnapshotRow,
    ) -> Result<(), DbError> {
        let op = "insert snapshot";
        let sql = insert_sql(op, s, workspace_id)?;
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        within_quota(&mut tx, op, workspace_id, s).await?;
        tx.execute(&sql).await.map_err(DbError::unique(op, || {
            format!("snapshot {}:{}", s.name, s.tag)
        }))?;
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// Stores a workspace's snapshot under its `name:tag`, moving the tag
    /// (LangSmith's rule): a snapshot that held it stays addressable by id,
    /// untagged ("dangling": its tag becomes [`dangling_tag`] of its id).
    /// `Quota` if the workspace would pass its count of snapshots or its
    /// storage (sandboxes' disks and snapshots, one budget), checked in the
    /// same transaction under the workspace's lock, like sandbox inserts:
    /// the snapshot charges its disk, and its memory (recorded or
    /// reserved).
    pub async fn publish_snapshot(
        &self,
        workspace_id: WorkspaceId,
        s: &SnapshotRow,
    ) -> Result<(), DbError> {
        let op = "publish snapshot";
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        within_quota(&mut tx, op, workspace_id, s).await?;
        let untag = Sql::new(
            "UPDATE snapshots SET tag = '#' || id, updated_at = $4 \
             WHERE workspace_id = $1 AND name = $2 AND tag = $3",
        )
        .arg(workspace_id.to_string())
        .arg(s.name.as_str())
        .arg(s.tag.as_str())
        .arg(Timestamp::now());
        tx.execute(&untag).await.map_err(DbError::backend(op))?;
        let insert = insert_sql(op, s, workspace_id)?;
        tx.execute(&insert)
            .await
            .map_err(DbError::unique(op, || format!("snapshot {}", s.id)))?;
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// Sets a snapshot's build status (and message; `None` clears it).
    pub async fn set_snapshot_status(
        &self,
        id: SnapshotId,
        status: SnapshotStatus,
        message: Option<&str>,
    ) -> Result<(), DbError> {
        let sql = Sql::new(
            "UPDATE snapshots SET status = $2, status_message = $3, updated_at = $4 WHERE id = $1",
        )
        .arg(id.to_string())
        .arg(status.as_str())
        .arg(message)
        .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("set snapshot status"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "snapshot" });
        }
        Ok(())
    }

    /// Writes a workspace snapshot's mutable fields (status, message,
    /// capacity, run config, where its data is kept, memory saved and
    /// reserved) from `s`, by id. Not quota-checked: a build records what
    /// its insert reserved.
    pub async fn update_snapshot(&self, s: &SnapshotRow) -> Result<(), DbError> {
        let op = "update snapshot";
        let run_config = s
            .run_config
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| DbError::Backend {
                op,
                source: sqlx::Error::Encode(e.into()),
            })?;
        let sql = Sql::new(
            "UPDATE snapshots SET status = $2, status_message = $3, fs_capacity_bytes = $4, \
             run_config = $5, volume = $6, memory_bytes = $7, image_digest = $8, updated_at = $9, \
             memory_reserved_bytes = $10, cpu_millicores = $11 WHERE id = $1 AND workspace_id IS NOT NULL",
        )
        .arg(s.id.to_string())
        .arg(s.status.as_str())
        .arg(s.status_message.as_deref())
        .arg(int(s.fs_capacity.bytes(), op, "fs_capacity_bytes")?)
        .arg(run_config)
        .arg(s.volume.as_deref())
        .arg(
            s.memory_bytes
                .map(|m| int(m.bytes(), op, "memory_bytes"))
                .transpose()?,
        )
        .arg(s.image_digest.as_deref())
        .arg(Timestamp::now())
        .arg(
            s.memory_reserved
                .map(|m| int(m.bytes(), op, "memory_reserved_bytes"))
                .transpose()?,
        )
        .arg(s.cpu.map(|c| i64::from(c.0)));
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "snapshot" });
        }
        Ok(())
    }

    /// Deletes a workspace's snapshot. `Conflict` while a sandbox not being
    /// deleted was booted from it (LangSmith refuses those deletes), and for
    /// built-ins; `NotFound` if the workspace has no such snapshot.
    pub async fn delete_snapshot(
        &self,
        workspace_id: WorkspaceId,
        id: SnapshotId,
    ) -> Result<SnapshotRow, DbError> {
        let op = "delete snapshot";
        let snap = self.get_snapshot(workspace_id, id).await?;
        if snap.workspace_id.is_none() {
            return Err(DbError::Conflict {
                what: format!("built-in snapshot {}:{}", snap.name, snap.tag),
            });
        }
        let pools = self.snapshot_has_pools(id).await?;
        if !pools.is_empty() {
            return Err(DbError::Conflict {
                what: format!(
                    "snapshot {}:{} (warm pools keep VMs of it: {}; delete them first)",
                    snap.name,
                    snap.tag,
                    pools.join(", ")
                ),
            });
        }
        // One statement checks both, so a pool made meanwhile holds it too.
        let sql = Sql::new(
            "DELETE FROM snapshots WHERE id = $1 AND workspace_id = $2 AND NOT EXISTS \
             (SELECT 1 FROM sandboxes WHERE snapshot_id = $1 AND status <> 'deleting') \
             AND NOT EXISTS (SELECT 1 FROM sandbox_pools WHERE snapshot_id = $1)",
        )
        .arg(id.to_string())
        .arg(workspace_id.to_string());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        if n == 0 {
            return Err(DbError::Conflict {
                what: format!(
                    "snapshot {}:{} (sandboxes booted from it, or warm pools of it, still exist)",
                    snap.name, snap.tag
                ),
            });
        }
        Ok(snap)
    }

    /// A snapshot the workspace may see (its own or a built-in).
    pub async fn get_snapshot(
        &self,
        workspace_id: WorkspaceId,
        id: SnapshotId,
    ) -> Result<SnapshotRow, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE {VISIBLE} AND id = $2"
        ))
        .arg(workspace_id.to_string())
        .arg(id.to_string());
        self.pool
            .fetch_optional(&sql, decode_snapshot)
            .await
            .map_err(DbError::backend("get snapshot"))?
            .ok_or(DbError::NotFound { what: "snapshot" })
    }

    /// Resolves `name:tag`; the workspace's own snapshot wins over a
    /// built-in of the same reference.
    pub async fn find_snapshot_by_ref(
        &self,
        workspace_id: WorkspaceId,
        name: &str,
        tag: &str,
    ) -> Result<SnapshotRow, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE {VISIBLE} AND name = $2 AND tag = $3 \
             ORDER BY CASE WHEN workspace_id IS NULL THEN 1 ELSE 0 END LIMIT 1"
        ))
        .arg(workspace_id.to_string())
        .arg(name)
        .arg(tag);
        self.pool
            .fetch_optional(&sql, decode_snapshot)
            .await
            .map_err(DbError::backend("find snapshot"))?
            .ok_or(DbError::NotFound { what: "snapshot" })
    }

    /// Snapshots the workspace may see, one page.
    pub async fn list_snapshots(
        &self,
        workspace_id: WorkspaceId,
        f: &SnapshotFilter,
    ) -> Result<Page<SnapshotRow>, DbError> {
        let ks = Keyset::new(
            sort_spec(f.sort_by),
            f.sort_order,
            f.page_size,
            f.cursor.as_deref(),
        )?;
        // The template build cache's layers are Hearth's, never listed.
        let mut sql = Sql::new(&format!(
            "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE {VISIBLE} AND name NOT LIKE $2"
        ))
        .arg(workspace_id.to_string())
        .arg(format!("{}%", hearth_types::rules::LAYER_PREFIX));
        push_name_and_status(
            &mut sql,
            f.name_contains.as_deref(),
            f.status.map(|s| s.as_str()),
        );
        if f.captured_only || f.from_sandbox.is_some() {
            sql.push(" AND source_sandbox_id IS NOT NULL");
        }
        if let Some(id) = f.from_sandbox {
            sql.push(" AND source_sandbox_id = ");
            sql.push_param(id.to_string());
        }
        ks.push_where(&mut sql);
        ks.push_order_limit(&mut sql);
        let rows = self
            .pool
            .fetch_all(&sql, decode_snapshot)
            .await
            .map_err(DbError::backend("list snapshots"))?;
        Ok(ks.finish(rows, |s| sort_key(f.sort_by, s)))
    }

    /// The tags of `name` the workspace may see, as `(tag, snapshot id)`,
    /// sorted by tag; the workspace's own shadow built-ins.
    pub async fn snapshot_tags(
        &self,
        workspace_id: WorkspaceId,
        name: &str,
    ) -> Result<Vec<(String, SnapshotId)>, DbError> {
        fn decode(r: &dyn RowExt) -> Result<(String, SnapshotId), sqlx::Error> {
            Ok((r.text("tag")?, r.parse("id")?))
        }
        let sql = Sql::new(&format!(
            "SELECT tag, id FROM snapshots WHERE {VISIBLE} AND name = $2 AND tag NOT LIKE '#%' \
             ORDER BY tag, CASE WHEN workspace_id IS NULL THEN 1 ELSE 0 END"
        ))
        .arg(workspace_id.to_string())
        .arg(name);
        let mut tags = self
            .pool
            .fetch_all(&sql, decode)
            .await
            .map_err(DbError::backend("list snapshot tags"))?;
        tags.dedup_by(|later, first| later.0 == first.0);
        Ok(tags)
    }
}

/// The tag column of a snapshot whose tag moved to another ("dangling",
/// reachable by id only). API tags cannot contain `#`.
pub fn dangling_tag(id: SnapshotId) -> String {
    format!("#{id}")
}

/// Whether a stored tag is a real one (not [`dangling_tag`]).
pub fn is_published_tag(tag: &str) -> bool {
    !tag.starts_with('#')
}
