//! Warm pools (issue 18): a pool keeps `size` VMs of one snapshot and one
//! size booted and paused on hosts, so that a create of that shape claims
//! one instead of booting. Members are rows of their own: they count on
//! their host (`host_usage`, by trigger) and never in a workspace's quota.
//! A claim turns a member into a sandbox in one transaction: the member
//! row goes and the sandbox row comes under the member's id, host and
//! generation (see `migrations/*/0013_pools.sql`).

use hearth_types::{ByteSize, HostId, MilliCpu, PoolId, SandboxId, SnapshotId, WorkspaceId};

use crate::error::DbError;
use crate::hosts::check_host_room;
use crate::model::{Backend, SandboxRow, SandboxStatus};
use crate::quota::{check, check_live, check_storage, quota_and_usage};
use crate::sandboxes::{insert_error, insert_sql};
use crate::sql::{RowExt, Sql};
use crate::time::Timestamp;
use crate::{Db, QuotaKind};

/// Most members one pool may ask for.
pub const MAX_POOL_SIZE: u32 = 64;

/// A pool as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRow {
    pub id: PoolId,
    pub workspace_id: WorkspaceId,
    pub name: String,
    pub snapshot_id: SnapshotId,
    /// Members it keeps (warming or ready).
    pub size: u32,
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub fs_capacity: ByteSize,
    /// Creates that took a ready member.
    pub claims: u64,
    /// Creates of its shape that found no ready member and booted cold.
    pub misses: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Where a member is in its life: booting (`warming`), or paused and
/// claimable (`ready`). A claimed member is no longer a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberStatus {
    Warming,
    Ready,
}

impl MemberStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warming => "warming",
            Self::Ready => "ready",
        }
    }
}

/// One pool member: a VM on `host_id` whose id will be its sandbox's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    pub id: SandboxId,
    pub pool_id: PoolId,
    pub host_id: HostId,
    /// The placement generation its VM was created with (its fence).
    pub generation: u64,
    pub status: MemberStatus,
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub created_at: Timestamp,
}

const POOL_COLS: &str = "id, workspace_id, name, snapshot_id, size, cpu_millicores, mem_bytes, \
                         fs_capacity_bytes, claims, misses, created_at, updated_at";
const MEMBER_COLS: &str =
    "id, pool_id, host_id, generation, status, cpu_millicores, mem_bytes, created_at";

fn decode_pool(r: &dyn RowExt) -> Result<PoolRow, sqlx::Error> {
    Ok(PoolRow {
        id: r.parse("id")?,
        workspace_id: r.parse("workspace_id")?,
        name: r.text("name")?,
        snapshot_id: r.parse("snapshot_id")?,
        size: r.u32("size")?,
        cpu: MilliCpu(r.u32("cpu_millicores")?),
        mem: ByteSize(r.unsigned("mem_bytes")?),
        fs_capacity: ByteSize(r.unsigned("fs_capacity_bytes")?),
        claims: r.unsigned("claims")?,
        misses: r.unsigned("misses")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

fn decode_member(r: &dyn RowExt) -> Result<MemberRow, sqlx::Error> {
    let status = match r.text("status")?.as_str() {
        "warming" => MemberStatus::Warming,
        "ready" => MemberStatus::Ready,
        other => {
            return Err(sqlx::Error::Decode(
                format!("unknown pool member status {other:?}").into(),
            ))
        }
    };
    Ok(MemberRow {
        id: r.parse("id")?,
        pool_id: r.parse("pool_id")?,
        host_id: r.parse("host_id")?,
        generation: r.unsigned("generation")?,
        status,
        cpu: MilliCpu(r.u32("cpu_millicores")?),
        mem: ByteSize(r.unsigned("mem_bytes")?),
        created_at: r.ts("created_at")?,
    })
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Db {
    /// Stores a new pool; its name taken in the workspace is `Conflict`.
    pub async fn create_pool(&self, p: &PoolRow) -> Result<(), DbError> {
        let op = "create pool";
        let sql = Sql::new(&format!(
            "INSERT INTO sandbox_pools ({POOL_COLS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ))
        .arg(p.id.to_string())
        .arg(p.workspace_id.to_string())
        .arg(p.name.as_str())
        .arg(p.snapshot_id.to_string())
        .arg(i64::from(p.size))
        .arg(i64::from(p.cpu.0))
        .arg(int(p.mem.bytes()))
        .arg(int(p.fs_capacity.bytes()))
        .arg(int(p.claims))
        .arg(int(p.misses))
        .arg(p.created_at)
        .arg(p.updated_at);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::unique(op, || format!("pool {:?}", p.name)))
            .map(drop)
    }

    /// The workspace's pool `name`.
    pub async fn get_pool(&self, ws: WorkspaceId, name: &str) -> Result<PoolRow, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {POOL_COLS} FROM sandbox_pools WHERE workspace_id = $1 AND name = $2"
        ))
        .arg(ws.to_string())
        .arg(name);
        self.pool
            .fetch_optional(&sql, decode_pool)
            .await
            .map_err(DbError::backend("get pool"))?
            .ok_or(DbError::NotFound { what: "pool" })
    }

    /// The workspace's pools by name; every pool with `None`.
    pub async fn list_pools(&self, ws: Option<WorkspaceId>) -> Result<Vec<PoolRow>, DbError> {
        let sql = match ws {
            Some(ws) => Sql::new(&format!(
                "SELECT {POOL_COLS} FROM sandbox_pools WHERE workspace_id = $1 ORDER BY name"
            ))
            .arg(ws.to_string()),
            None => Sql::new(&format!(
                "SELECT {POOL_COLS} FROM sandbox_pools ORDER BY workspace_id, name"
            )),
        };
        self.pool
            .fetch_all(&sql, decode_pool)
            .await
            .map_err(DbError::backend("list pools"))
    }

    /// The workspace's pool for sandboxes of this snapshot and size, if
    /// it has one (the oldest, should it have several).
    pub async fn find_pool(
        &self,
        ws: WorkspaceId,
        snapshot: SnapshotId,
        cpu: MilliCpu,
        mem: ByteSize,
        fs_capacity: ByteSize,
    ) -> Result<Option<PoolRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {POOL_COLS} FROM sandbox_pools WHERE workspace_id = $1 AND snapshot_id = $2 \
             AND cpu_millicores = $3 AND mem_bytes = $4 AND fs_capacity_bytes = $5 \
             ORDER BY created_at LIMIT 1"
        ))
        .arg(ws.to_string())
        .arg(snapshot.to_string())
        .arg(i64::from(cpu.0))
        .arg(int(mem.bytes()))
        .arg(int(fs_capacity.bytes()));
        self.pool
            .fetch_optional(&sql, decode_pool)
            .await
            .map_err(DbError::backend("find pool"))
    }

    /// Whether any pool keeps VMs of `snapshot` (which may then not be
    /// deleted).
    pub async fn snapshot_has_pools(&self, snapshot: SnapshotId) -> Result<Vec<String>, DbError> {
        let sql = Sql::new("SELECT name FROM sandbox_pools WHERE snapshot_id = $1 ORDER BY name")
            .arg(snapshot.to_string());
        self.pool
            .fetch_all(&sql, |r| r.text("name"))
            .await
            .map_err(DbError::backend("pools of snapshot"))
    }

    /// A new size for the workspace's pool `name`.
    pub async fn resize_pool(
        &self,
        ws: WorkspaceId,
        name: &str,
        size: u32,
    ) -> Result<PoolRow, DbError> {
        let sql = Sql::new(
            "UPDATE sandbox_pools SET size = $1, updated_at = $2 \
             WHERE workspace_id = $3 AND name = $4",
        )
        .arg(i64::from(size))
        .arg(Timestamp::now())
        .arg(ws.to_string())
        .arg(name);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("resize pool"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "pool" });
        }
        self.get_pool(ws, name).await
    }

    /// Removes the pool; its members stay until the refill loop removes
    /// them from their hosts (they then belong to no pool).
    pub async fn delete_pool(&self, ws: WorkspaceId, name: &str) -> Result<PoolRow, DbError> {
        let pool = self.get_pool(ws, name).await?;
        let sql = Sql::new("DELETE FROM sandbox_pools WHERE id = $1").arg(pool.id.to_string());
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("delete pool"))?;
        Ok(pool)
    }

    /// Counts a create that found no ready member.
    pub async fn record_pool_miss(&self, pool: PoolId) -> Result<(), DbError> {
        let sql = Sql::new("UPDATE sandbox_pools SET misses = misses + 1 WHERE id = $1")
            .arg(pool.to_string());
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("record pool miss"))
            .map(drop)
    }

    /// Every member (of every pool, and of none: a deleted pool's).
    pub async fn list_members(&self) -> Result<Vec<MemberRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {MEMBER_COLS} FROM pool_members ORDER BY created_at, id"
        ));
        self.pool
            .fetch_all(&sql, decode_member)
            .await
            .map_err(DbError::backend("list pool members"))
    }

    /// Stores a new (warming) member on its host if the host has room for
    /// it (`NoRoom` if not), in one transaction under the host's counter.
    pub async fn insert_member(&self, m: &MemberRow) -> Result<(), DbError> {
        let op = "insert pool member";
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        check_host_room(&mut tx, op, m.host_id, m.cpu, m.mem).await?;
        tx.execute(
            &Sql::new(&format!(
                "INSERT INTO pool_members ({MEMBER_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
            ))
            .arg(m.id.to_string())
            .arg(m.pool_id.to_string())
            .arg(m.host_id.to_string())
            .arg(int(m.generation))
            .arg(m.status.as_str())
            .arg(i64::from(m.cpu.0))
            .arg(int(m.mem.bytes()))
            .arg(m.created_at),
        )
        .await
        .map_err(DbError::backend(op))?;
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// A warming member's VM is paused and claimable; false if the member
    /// is gone (its pool shrank or was deleted meanwhile).
    pub async fn mark_member_ready(&self, id: SandboxId) -> Result<bool, DbError> {
        let sql =
            Sql::new("UPDATE pool_members SET status = 'ready' WHERE id = $1").arg(id.to_string());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("mark pool member ready"))?;
        Ok(n > 0)
    }

    /// Removes a member row (its VM is gone or going); whether it was
    /// there. Its host's counters drop with it.
    pub async fn delete_member(&self, id: SandboxId) -> Result<bool, DbError> {
        let sql = Sql::new("DELETE FROM pool_members WHERE id = $1").arg(id.to_string());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("delete pool member"))?;
        Ok(n > 0)
    }

    /// Claims a ready member of `pool` for the sandbox `s`: in one
    /// transaction, checks the workspace's quota as an insert does, takes
    /// the oldest ready member (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so
    /// replicas claiming at once take different members; SQLite: the write
    /// lock), deletes it, and inserts `s` under the member's id, host and
    /// generation, after `for_id` has made it the member's (a name derived
    /// from the id follows it). `None`: no ready member (nothing was
    /// written). The sandbox row inserted is returned.
    pub async fn claim_member(
        &self,
        pool: PoolId,
        s: &SandboxRow,
        for_id: impl FnOnce(&mut SandboxRow),
    ) -> Result<Option<SandboxRow>, DbError> {
        let op = "claim pool member";
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let (quotas, usage) = quota_and_usage(&mut tx, op, s.workspace_id, None).await?;
        check(
            QuotaKind::Sandboxes,
            quotas.max_sandboxes,
            usage.sandboxes,
            1,
        )?;
        check_storage(&quotas, &usage, s.fs_capacity)?;
        check_live(&quotas, &usage, s.cpu, s.mem)?;
        let lock = match tx.backend() {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR UPDATE SKIP LOCKED",
        };
        let member = tx
            .fetch_optional(
                &Sql::new(&format!(
                    "SELECT {MEMBER_COLS} FROM pool_members WHERE pool_id = $1 \
                     AND status = 'ready' ORDER BY created_at, id LIMIT 1{lock}"
                ))
                .arg(pool.to_string()),
                decode_member,
            )
            .await
            .map_err(DbError::backend(op))?;
        let Some(member) = member else {
            return Ok(None);
        };
        tx.execute(&Sql::new("DELETE FROM pool_members WHERE id = $1").arg(member.id.to_string()))
            .await
            .map_err(DbError::backend(op))?;
        let mut row = SandboxRow {
            id: member.id,
            host_id: Some(member.host_id),
            generation: member.generation,
            status: SandboxStatus::Provisioning,
            ..s.clone()
        };
        for_id(&mut row);
        tx.execute(&insert_sql(op, &row)?)
            .await
            .map_err(insert_error(op, &row))?;
        tx.execute(
            &Sql::new("UPDATE sandbox_pools SET claims = claims + 1 WHERE id = $1")
                .arg(pool.to_string()),
        )
        .await
        .map_err(DbError::backend(op))?;
        tx.commit().await.map_err(DbError::backend(op))?;
        Ok(Some(row))
    }
}
