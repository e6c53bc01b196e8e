//! Sandbox records: insert (with quotas), lookup, list, optimistic and
//! fenced updates, and the queries the reapers and placement run.

use std::time::Duration;

use hearth_types::{ByteSize, HostId, MilliCpu, SandboxId, WorkspaceId};

use crate::error::{DbError, QuotaKind};
use crate::hosts::check_host_room;
use crate::model::{
    Backend, Page, SandboxFilter, SandboxRow, SandboxSort, SandboxStatus, StatusExtra,
};
use crate::page::{push_name_and_status, Key, KeyKind, Keyset, SortSpec};
use crate::quota::{
    check, check_live, check_storage, quota_and_usage, quota_usage_and_host, without,
};
use crate::sql::{int, RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

pub(crate) const SANDBOX_COLS: &str =
    "id, workspace_id, name, status, status_message, snapshot_id, \
     cpu_millicores, mem_bytes, fs_capacity_bytes, idle_ttl_seconds, delete_after_stop_seconds, \
     persistent, preserve_memory_on_stop, labels, run_config, spec, host_id, generation, \
     created_at, created_by, updated_at, updated_by, stopped_at, last_activity_at";

/// Moves `updated_at` strictly forward: to `$now`, or by one millisecond if
/// the clock has not passed the stored value (two writes in the same
/// millisecond must still look different to optimistic readers).
fn bump_updated_at(now: &str) -> String {
    format!("updated_at = CASE WHEN {now} > updated_at THEN {now} ELSE updated_at + 1 END")
}

pub(crate) fn decode_sandbox(r: &dyn RowExt) -> Result<SandboxRow, sqlx::Error> {
    Ok(SandboxRow {
        id: r.parse("id")?,
        workspace_id: r.parse("workspace_id")?,
        name: r.text("name")?,
        status: r.parse("status")?,
        status_message: r.opt_text("status_message")?,
        snapshot_id: r.parse("snapshot_id")?,
        cpu: MilliCpu(r.u32("cpu_millicores")?),
        mem: ByteSize(r.unsigned("mem_bytes")?),
        fs_capacity: ByteSize(r.unsigned("fs_capacity_bytes")?),
        idle_ttl: Duration::from_secs(r.unsigned("idle_ttl_seconds")?),
        delete_after_stop: Duration::from_secs(r.unsigned("delete_after_stop_seconds")?),
        persistent: r.flag("persistent")?,
        preserve_memory_on_stop: r.flag("preserve_memory_on_stop")?,
        labels: r.json("labels")?,
        run_config: r.json("run_config")?,
        spec: r.json("spec")?,
        host_id: r.opt_parse("host_id")?,
        generation: r.unsigned("generation")?,
        created_at: r.ts("created_at")?,
        created_by: r.text("created_by")?,
        updated_at: r.ts("updated_at")?,
        updated_by: r.text("updated_by")?,
        stopped_at: r.opt_ts("stopped_at")?,
        last_activity_at: r.ts("last_activity_at")?,
    })
}

fn json(op: &'static str, v: &impl serde::Serialize) -> Result<String, DbError> {
    serde_json::to_string(v).map_err(|e| DbError::Backend {
        op,
        source: sqlx::Error::Encode(e.into()),
    })
}

pub(crate) fn insert_sql(op: &'static str, s: &SandboxRow) -> Result<Sql, DbError> {
    Ok(Sql::new(&format!(
        "INSERT INTO sandboxes ({SANDBOX_COLS}, boot_heartbeat_at) VALUES ($1, $2, $3, $4, $5, \
         $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, \
         $24, $25)"
    ))
    .arg(s.id.to_string())
    .arg(s.workspace_id.to_string())
    .arg(s.name.as_str())
    .arg(s.status.as_str())
    .arg(s.status_message.as_deref())
    .arg(s.snapshot_id.to_string())
    .arg(i64::from(s.cpu.0))
    .arg(int(s.mem.bytes(), op, "mem_bytes")?)
    .arg(int(s.fs_capacity.bytes(), op, "fs_capacity_bytes")?)
    .arg(int(s.idle_ttl.as_secs(), op, "idle_ttl_seconds")?)
    .arg(int(
        s.delete_after_stop.as_secs(),
        op,
        "delete_after_stop_seconds",
    )?)
    .arg(s.persistent)
    .arg(s.preserve_memory_on_stop)
    .arg(json(op, &s.labels)?)
    .arg(json(op, &s.run_config)?)
    .arg(json(op, &s.spec)?)
    .arg(s.host_id.map(|h| h.to_string()))
    .arg(int(s.generation, op, "generation")?)
    .arg(s.created_at)
    .arg(s.created_by.as_str())
    .arg(s.updated_at)
    .arg(s.updated_by.as_str())
    .arg(s.stopped_at)
    .arg(s.last_activity_at)
    // A new boot is alive from its insert: its task stamps it from then
    // on (`Db::touch_boot`), so a replica dying at once is noticed too.
    .arg((s.status == SandboxStatus::Provisioning).then_some(s.updated_at)))
}

pub(crate) fn insert_error<'a>(
    op: &'static str,
    s: &'a SandboxRow,
) -> impl FnOnce(sqlx::Error) -> DbError + 'a {
    move |e| match e {
        sqlx::Error::Database(d) if d.is_foreign_key_violation() => {
            DbError::NotFound { what: "workspace" }
        }
        e => DbError::unique(op, || format!("sandbox {:?}", s.name))(e),
    }
}

fn sort_spec(s: SandboxSort) -> SortSpec {
    let (name, expr, kind) = match s {
        SandboxSort::Name => ("name", "name", KeyKind::Text),
        SandboxSort::Status => ("status", "status", KeyKind::Text),
        SandboxSort::CreatedAt => ("created_at", "created_at", KeyKind::Int),
        SandboxSort::StoppedAt => ("stopped_at", "COALESCE(stopped_at, 0)", KeyKind::Int),
        SandboxSort::IdleTtl => ("idle_ttl_seconds", "idle_ttl_seconds", KeyKind::Int),
        SandboxSort::DeleteAfterStop => (
            "delete_after_stop_seconds",
            "delete_after_stop_seconds",
            KeyKind::Int,
        ),
    };
    SortSpec { name, expr, kind }
}

/// The row's value of the sort expression, exactly as SQL computes it.
fn sort_key(sort: SandboxSort, s: &SandboxRow) -> (Key, String) {
    let secs = |d: Duration| Key::Int(i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let k = match sort {
        SandboxSort::Name => Key::Text(s.name.clone()),
        SandboxSort::Status => Key::Text(s.status.as_str().to_owned()),
        SandboxSort::CreatedAt => Key::Int(s.created_at.unix_ms()),
        SandboxSort::StoppedAt => Key::Int(s.stopped_at.map_or(0, Timestamp::unix_ms)),
        SandboxSort::IdleTtl => secs(s.idle_ttl),
        SandboxSort::DeleteAfterStop => secs(s.delete_after_stop),
    };
    (k, s.id.to_string())
}

impl Db {
    /// Inserts a sandbox. `Conflict` if its name is taken in the workspace;
    /// `NotFound` if the workspace does not exist.
    pub async fn insert_sandbox(&self, s: &SandboxRow) -> Result<(), DbError> {
        let op = "insert sandbox";
        self.pool
            .execute(&insert_sql(op, s)?)
            .await
            .map_err(insert_error(op, s))?;
        Ok(())
    }

    /// Inserts a sandbox only if the workspace stays within its quotas and,
    /// for a live sandbox placed on a host, the host has room for it,
    /// atomically with respect to other quota-checked writes and to every
    /// write to that host's load: the count of sandboxes not `deleting`,
    /// storage (their disks and the workspace's snapshots, one budget), and
    /// (for a live new sandbox) the CPU and memory of `provisioning`/`ready`
    /// ones. `NoRoom` when the host filled since its load was read.
    ///
    /// The insert comes first and the check after, on the counters it
    /// moved: its triggers lock the workspace's and the host's usage rows
    /// (PostgreSQL; SQLite's `BEGIN IMMEDIATE` serializes writers), so a
    /// concurrent insert of the same workspace or host waits for this one
    /// to end and then counts it, and a check that fails rolls the insert
    /// back. The locks are held for the insert, one read and the commit,
    /// not for every read before the insert as a lock taken first would:
    /// one workspace's creates queue on its row for that long.
    pub async fn insert_sandbox_within_quota(&self, s: &SandboxRow) -> Result<(), DbError> {
        self.insert_sandbox_holding(s, &[]).await
    }

    /// [`Self::insert_sandbox_within_quota`], attaching the volumes
    /// `volumes` to the new sandbox in the same transaction (see
    /// `volumes.rs`: one writer each, any number of readers).
    pub async fn insert_sandbox_holding(
        &self,
        s: &SandboxRow,
        volumes: &[crate::VolumeAttach],
    ) -> Result<(), DbError> {
        let op = "insert sandbox within quota";
        let insert = insert_sql(op, s)?;
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        tx.execute(&insert).await.map_err(insert_error(op, s))?;
        crate::volumes::attach(&mut tx, op, s.workspace_id, s.id, volumes).await?;
        let host = s.host_id.filter(|_| s.status.is_live());
        let (quotas, with_it, host_load) =
            quota_usage_and_host(&mut tx, op, s.workspace_id, host).await?;
        let usage = without(with_it, s);
        if s.status != SandboxStatus::Deleting {
            check(
                QuotaKind::Sandboxes,
                quotas.max_sandboxes,
                usage.sandboxes,
                1,
            )?;
            check_storage(&quotas, &usage, s.fs_capacity)?;
        }
        if s.status.is_live() {
            check_live(&quotas, &usage, s.cpu, s.mem)?;
            if let (Some(host), Some(load)) = (host, host_load) {
                load.without(s).check_room_for(host, s.cpu, s.mem)?;
            }
        }
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// A sandbox of the workspace, by id (any UUID spelling) or by name.
    /// Other workspaces' sandboxes are `NotFound`.
    pub async fn get_sandbox(
        &self,
        workspace_id: WorkspaceId,
        id_or_name: &str,
    ) -> Result<SandboxRow, DbError> {
        let as_id = id_or_name
            .parse::<SandboxId>()
            .map(|id| id.to_string())
            .unwrap_or_else(|_| id_or_name.to_owned());
        // A name could look like another sandbox's id; the id wins.
        let sql = Sql::new(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE workspace_id = $1 \
             AND (id = $2 OR name = $3) ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1"
        ))
        .arg(workspace_id.to_string())
        .arg(as_id)
        .arg(id_or_name);
        self.pool
            .fetch_optional(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend("get sandbox"))?
            .ok_or(DbError::NotFound { what: "sandbox" })
    }

    /// A sandbox of any workspace (internal callers: reapers, the data-plane
    /// gateway).
    pub async fn get_sandbox_by_id(&self, id: SandboxId) -> Result<SandboxRow, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE id = $1"
        ))
        .arg(id.to_string());
        self.pool
            .fetch_optional(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend("get sandbox"))?
            .ok_or(DbError::NotFound { what: "sandbox" })
    }

    /// One page of the workspace's sandboxes that match every filter.
    pub async fn list_sandboxes(
        &self,
        workspace_id: WorkspaceId,
        f: &SandboxFilter,
    ) -> Result<Page<SandboxRow>, DbError> {
        let ks = Keyset::new(
            sort_spec(f.sort_by),
            f.sort_order,
            f.page_size,
            f.cursor.as_deref(),
        )?;
        let mut sql = Sql::new(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE workspace_id = $1"
        ))
        .arg(workspace_id.to_string());
        push_name_and_status(
            &mut sql,
            f.name_contains.as_deref(),
            f.status.map(|s| s.as_str()),
        );
        if let Some(c) = &f.created_by {
            sql.push(" AND created_by = ");
            sql.push_param(c.as_str());
        }
        if let Some(id) = f.snapshot_id {
            sql.push(" AND snapshot_id = ");
            sql.push_param(id.to_string());
        }
        if let Some(t) = f.created_since {
            sql.push(" AND created_at >= ");
            sql.push_param(t);
        }
        for (key, value) in &f.labels {
            let k = sql.param(key.as_str());
            let v = value.as_ref().map(|v| sql.param(v.as_str()));
            // Labels are a JSON object of strings in a TEXT column; each
            // backend has its own JSON functions.
            let cond = match (self.backend(), v) {
                (Backend::Sqlite, None) => format!(
                    "EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l WHERE l.key = {k})"
                ),
                (Backend::Sqlite, Some(v)) => format!(
                    "EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l \
                     WHERE l.key = {k} AND l.value = {v})"
                ),
                (Backend::Postgres, None) => format!("(labels::jsonb ->> {k}) IS NOT NULL"),
                (Backend::Postgres, Some(v)) => format!("(labels::jsonb ->> {k}) = {v}"),
            };
            sql.push(" AND ");
            sql.push(&cond);
        }
        ks.push_where(&mut sql);
        ks.push_order_limit(&mut sql);
        let rows = self
            .pool
            .fetch_all(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend("list sandboxes"))?;
        Ok(ks.finish(rows, |s| sort_key(f.sort_by, s)))
    }

    /// Writes the user-editable fields of `s` (name, snapshot, sizes, TTLs,
    /// persistence flags, labels, run_config, spec, updated_by) if the
    /// stored row still has `updated_at == expected_updated_at`; else
    /// `Stale`. Status, placement and timestamps change only through
    /// [`Db::set_status`] and friends. Returns the stored row.
    pub async fn update_sandbox(
        &self,
        s: &SandboxRow,
        expected_updated_at: Timestamp,
    ) -> Result<SandboxRow, DbError> {
        let op = "update sandbox";
        let sql = Sql::new(&format!(
            "UPDATE sandboxes SET name = $3, snapshot_id = $4, cpu_millicores = $5, \
             mem_bytes = $6, fs_capacity_bytes = $7, idle_ttl_seconds = $8, \
             delete_after_stop_seconds = $9, persistent = $10, preserve_memory_on_stop = $11, \
             labels = $12, run_config = $13, spec = $14, updated_by = $15, {} \
             WHERE id = $1 AND updated_at = $2 RETURNING {SANDBOX_COLS}",
            bump_updated_at("$16")
        ))
        .arg(s.id.to_string())
        .arg(expected_updated_at)
        .arg(s.name.as_str())
        .arg(s.snapshot_id.to_string())
        .arg(i64::from(s.cpu.0))
        .arg(int(s.mem.bytes(), op, "mem_bytes")?)
        .arg(int(s.fs_capacity.bytes(), op, "fs_capacity_bytes")?)
        .arg(int(s.idle_ttl.as_secs(), op, "idle_ttl_seconds")?)
        .arg(int(
            s.delete_after_stop.as_secs(),
            op,
            "delete_after_stop_seconds",
        )?)
        .arg(s.persistent)
        .arg(s.preserve_memory_on_stop)
        .arg(json(op, &s.labels)?)
        .arg(json(op, &s.run_config)?)
        .arg(json(op, &s.spec)?)
        .arg(s.updated_by.as_str())
        .arg(Timestamp::now());
        let row = self
            .pool
            .fetch_optional(&sql, decode_sandbox)
            .await
            .map_err(DbError::unique(op, || format!("sandbox {:?}", s.name)))?;
        match row {
            Some(row) => Ok(row),
            None => Err(self.stale_or_missing(s.id).await?),
        }
    }

    /// Sets status and message (`None` clears the message), with the
    /// effects and fences in `extra`. Entering `ready` also restarts the
    /// idle clock (`last_activity_at = now`). `Stale` if a fence fails,
    /// `NotFound` if there is no such sandbox. Returns the stored row.
    pub async fn set_status(
        &self,
        id: SandboxId,
        status: SandboxStatus,
        message: Option<&str>,
        extra: StatusExtra,
    ) -> Result<SandboxRow, DbError> {
        let op = "set sandbox status";
        let sql = status_update(id, status, message, &extra, op)?;
        if !extra.within_quota && !extra.host_room && extra.saved_memory.is_none() {
            let row = self
                .pool
                .fetch_optional(&sql, decode_sandbox)
                .await
                .map_err(DbError::backend(op))?;
            return match row {
                Some(row) => Ok(row),
                None => Err(self.stale_or_missing(id).await?),
            };
        }
        // The sandbox becomes live again or lands on a host: check its
        // workspace's quotas and the host's room and update in one
        // transaction, serialized with quota-checked inserts and with
        // every other placement on that host.
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let current = tx
            .fetch_optional(
                &Sql::new(&format!(
                    "SELECT {SANDBOX_COLS} FROM sandboxes WHERE id = $1"
                ))
                .arg(id.to_string()),
                decode_sandbox,
            )
            .await
            .map_err(DbError::backend(op))?
            .ok_or(DbError::NotFound { what: "sandbox" })?;
        // The workspace's lock first, always (the order every writer takes).
        let (quotas, usage) =
            quota_and_usage(&mut tx, op, current.workspace_id, Some(&current)).await?;
        if extra.within_quota {
            check_live(&quotas, &usage, current.cpu, current.mem)?;
            // A start applies a disk PATCHed meanwhile: it must fit too.
            check_storage(&quotas, &usage, current.fs_capacity)?;
        }
        let host = match extra.host_id {
            Some(host) => host,
            None => current.host_id,
        };
        if let (true, true, Some(host)) = (extra.host_room, status.is_live(), host) {
            // What it holds there already (a live sandbox staying put) is
            // not asked for twice.
            let held = current.status.is_live() && current.host_id == Some(host);
            if !held {
                check_host_room(&mut tx, op, host, current.cpu, current.mem).await?;
            }
        }
        let row = tx
            .fetch_optional(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend(op))?;
        if let (Some(_), Some(volumes)) = (&row, &extra.saved_memory) {
            tx.execute(&saved_memory_upsert(id, volumes))
                .await
                .map_err(DbError::backend("record saved memory"))?;
        }
        tx.commit().await.map_err(DbError::backend(op))?;
        match row {
            Some(row) => Ok(row),
            None => Err(self.stale_or_missing(id).await?),
        }
    }
}

/// Records (replacing) where a sandbox's memory was saved.
fn saved_memory_upsert(id: SandboxId, volumes: &str) -> Sql {
    Sql::new(
        "INSERT INTO saved_memory (sandbox_id, volumes) VALUES ($1, $2) \
         ON CONFLICT (sandbox_id) DO UPDATE SET volumes = excluded.volumes",
    )
    .arg(id.to_string())
    .arg(volumes)
}

/// The fenced `UPDATE … RETURNING` of [`Db::set_status`].
fn status_update(
    id: SandboxId,
    status: SandboxStatus,
    message: Option<&str>,
    extra: &StatusExtra,
    op: &'static str,
) -> Result<Sql, DbError> {
    let now = Timestamp::now();
    let mut sql = Sql::new("UPDATE sandboxes SET status = $1, status_message = $2")
        .arg(status.as_str())
        .arg(message);
    let now_p = sql.param(now);
    sql.push(", ");
    sql.push(&bump_updated_at(&now_p));
    if let Some(stopped_at) = extra.stopped_at {
        sql.push(", stopped_at = ");
        sql.push_param(stopped_at);
    }
    if let Some(host) = extra.host_id {
        sql.push(", host_id = ");
        sql.push_param(host.map(|h| h.to_string()));
    }
    if extra.bump_generation {
        sql.push(", generation = generation + 1");
    }
    if status == SandboxStatus::Ready {
        sql.push(&format!(", last_activity_at = {now_p}"));
    }
    // A boot (a start, or a boot placed again) is alive from here, as a
    // new sandbox's is from its insert; other statuses keep the last stamp
    // (only `provisioning` rows are judged by it).
    if status == SandboxStatus::Provisioning {
        sql.push(&format!(", boot_heartbeat_at = {now_p}"));
    }
    sql.push(" WHERE id = ");
    sql.push_param(id.to_string());
    if let Some(g) = extra.expect_generation {
        sql.push(" AND generation = ");
        sql.push_param(int(g, op, "generation")?);
    }
    if !extra.expect_status.is_empty() {
        let list: Vec<String> = extra
            .expect_status
            .iter()
            .map(|s| sql.param(s.as_str()))
            .collect();
        sql.push(&format!(" AND status IN ({})", list.join(", ")));
    }
    sql.push(&format!(" RETURNING {SANDBOX_COLS}"));
    Ok(sql)
}

impl Db {
    /// Records activity (exec, file I/O) for the idle reaper. Never moves
    /// the clock backwards.
    pub async fn touch_activity(&self, id: SandboxId, now: Timestamp) -> Result<(), DbError> {
        let sql = Sql::new(
            "UPDATE sandboxes SET last_activity_at = \
             CASE WHEN $2 > last_activity_at THEN $2 ELSE last_activity_at END WHERE id = $1",
        )
        .arg(id.to_string())
        .arg(now);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("touch sandbox activity"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "sandbox" });
        }
        Ok(())
    }

    /// Removes and returns the record of the sandbox's saved memory (a
    /// start consumes it: resumed or not, it no longer matches the disk).
    pub async fn take_saved_memory(&self, id: SandboxId) -> Result<Option<String>, DbError> {
        let sql = Sql::new("DELETE FROM saved_memory WHERE sandbox_id = $1 RETURNING volumes")
            .arg(id.to_string());
        self.pool
            .fetch_optional(&sql, |r| r.text("volumes"))
            .await
            .map_err(DbError::backend("take saved memory"))
    }

    pub async fn delete_sandbox(&self, id: SandboxId) -> Result<(), DbError> {
        for table in ["saved_memory", "sandbox_deadlines", "volume_attachments"] {
            let forget =
                Sql::new(&format!("DELETE FROM {table} WHERE sandbox_id = $1")).arg(id.to_string());
            self.pool
                .execute(&forget)
                .await
                .map_err(DbError::backend("delete sandbox"))?;
        }
        let sql = Sql::new("DELETE FROM sandboxes WHERE id = $1").arg(id.to_string());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("delete sandbox"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "sandbox" });
        }
        Ok(())
    }

    /// `ready` sandboxes with an idle TTL whose last activity is more than
    /// the TTL before `now`: the idle reaper stops them.
    pub async fn sandboxes_idle_since(&self, now: Timestamp) -> Result<Vec<SandboxRow>, DbError> {
        self.sandboxes_where(
            "idle sandboxes",
            "status = 'ready' AND idle_ttl_seconds > 0 \
             AND last_activity_at + idle_ttl_seconds * 1000 < $1",
            now,
        )
        .await
    }

    /// `stopped` sandboxes with a delete-after-stop delay that has passed
    /// by `now`: the deletion reaper removes them.
    pub async fn sandboxes_to_delete(&self, now: Timestamp) -> Result<Vec<SandboxRow>, DbError> {
        self.sandboxes_where(
            "sandboxes to delete",
            "status = 'stopped' AND delete_after_stop_seconds > 0 AND stopped_at IS NOT NULL \
             AND stopped_at + delete_after_stop_seconds * 1000 < $1",
            now,
        )
        .await
    }

    /// `provisioning` sandboxes not updated since `before`: stuck
    /// placements to fail.
    pub async fn stale_provisioning(&self, before: Timestamp) -> Result<Vec<SandboxRow>, DbError> {
        self.sandboxes_where(
            "stale provisioning sandboxes",
            // A stamped boot is judged by its stamps (`abandoned_boots`):
            // one still stamping is alive, however long it takes.
            "status = 'provisioning' AND updated_at < $1 AND boot_heartbeat_at IS NULL",
            before,
        )
        .await
    }

    /// Every sandbox placed on the host, in any status.
    /// The sandboxes placed on a host, as briefly as reconciling it with
    /// the host's VMs needs (every few seconds, over every sandbox there).
    pub async fn sandbox_briefs_on_host(
        &self,
        host_id: HostId,
    ) -> Result<Vec<SandboxBrief>, DbError> {
        let sql = Sql::new(
            "SELECT id, status, generation, status_message FROM sandboxes \
             WHERE host_id = $1 ORDER BY id",
        )
        .arg(host_id.to_string());
        self.briefs(&sql).await
    }

    /// The briefs of those of `ids` placed on `host_id` (read in batches
    /// of [`crate::deadlines::IDS_PER_READ`]): a reconcile of what changed
    /// on the host.
    pub async fn sandbox_briefs_among(
        &self,
        host_id: HostId,
        ids: &[SandboxId],
    ) -> Result<Vec<SandboxBrief>, DbError> {
        let mut found = Vec::new();
        for batch in ids.chunks(crate::deadlines::IDS_PER_READ) {
            let mut sql = Sql::new(
                "SELECT id, status, generation, status_message FROM sandboxes \
                 WHERE host_id = $1 AND id IN (",
            )
            .arg(host_id.to_string());
            for (i, id) in batch.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                sql.push_param(id.to_string());
            }
            sql.push(") ORDER BY id");
            found.extend(self.briefs(&sql).await?);
        }
        Ok(found)
    }

    async fn briefs(&self, sql: &Sql) -> Result<Vec<SandboxBrief>, DbError> {
        self.pool
            .fetch_all(sql, |r| {
                Ok(SandboxBrief {
                    id: r.parse("id")?,
                    status: r.parse("status")?,
                    generation: r.unsigned("generation")?,
                    status_message: r.opt_text("status_message")?,
                })
            })
            .await
            .map_err(DbError::backend("sandboxes on host"))
    }

    pub async fn sandboxes_on_host(&self, host_id: HostId) -> Result<Vec<SandboxRow>, DbError> {
        self.sandboxes_where("sandboxes on host", "host_id = $1", host_id.to_string())
            .await
    }

    async fn sandboxes_where(
        &self,
        op: &'static str,
        cond: &str,
        arg: impl Into<crate::sql::Arg>,
    ) -> Result<Vec<SandboxRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE {cond} ORDER BY id"
        ))
        .arg(arg);
        self.pool
            .fetch_all(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend(op))
    }

    /// After a fenced write matched no row: `Stale` if the sandbox exists,
    /// `NotFound` if not.
    async fn stale_or_missing(&self, id: SandboxId) -> Result<DbError, DbError> {
        let sql = Sql::new("SELECT COUNT(*) AS n FROM sandboxes WHERE id = $1").arg(id.to_string());
        let n = self
            .pool
            .fetch_optional(&sql, crate::sql::decode_n)
            .await
            .map_err(DbError::backend("check sandbox exists"))?
            .unwrap_or(0);
        Ok(if n > 0 {
            DbError::Stale { what: "sandbox" }
        } else {
            DbError::NotFound { what: "sandbox" }
        })
    }
}

/// A sandbox's id and status, as a reconciliation reads them
/// ([`Db::sandbox_briefs_on_host`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxBrief {
    pub id: SandboxId,
    pub status: SandboxStatus,
    pub generation: u64,
    pub status_message: Option<String>,
}
