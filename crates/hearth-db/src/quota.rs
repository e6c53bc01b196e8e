//! Workspace quotas, checked inside the write transaction that would
//! exceed them. [`quota_and_usage`] locks the workspace's row (PostgreSQL
//! `FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` already serializes writers)
//! and reads its usage counters (kept by triggers, migration 11), so every
//! quota-checked write of one workspace (sandbox starts, snapshot inserts)
//! sees the others'. A sandbox insert, the hot path, writes first and
//! checks after with [`quota_usage_and_host`]: its triggers' updates hold
//! the workspace's and host's counter rows until it commits, so the lock
//! lasts one read and a commit instead of three reads, the insert and a
//! commit.
//!
//! Storage is one budget for everything the workspace keeps in the store:
//! the disks of its sandboxes not being deleted, its volumes' sizes and
//! its snapshots' logical sizes (disk, plus saved memory when captured with it; a capture still
//! building charges the memory it may save). A snapshot counts from its
//! insert, in any status, until it is deleted: even a failed capture may
//! have written a manifest that pins chunks, and deleting it removes that.

use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};

use crate::error::{DbError, QuotaKind};
use crate::model::{Backend, Quotas, SandboxRow, SandboxStatus};
use crate::sql::{RowExt, Sql, Tx};
use crate::workspaces::decode_quotas;

/// Current use of a workspace, read inside the quota transaction.
pub(crate) struct Usage {
    /// Sandboxes not `deleting`.
    pub sandboxes: u64,
    /// Millicores of `provisioning` and `ready` sandboxes.
    pub cpu: u64,
    /// Memory of `provisioning` and `ready` sandboxes.
    pub mem: u64,
    /// Disks of sandboxes not `deleting`, plus every snapshot's size.
    pub storage: u64,
    /// The workspace's snapshots.
    pub snapshots: u64,
}

fn decode_usage(r: &dyn RowExt) -> Result<Usage, sqlx::Error> {
    Ok(Usage {
        sandboxes: r.unsigned("sandboxes")?,
        cpu: r.unsigned("cpu_millicores")?,
        mem: r.unsigned("mem_bytes")?,
        storage: r
            .unsigned("disk_bytes")?
            .saturating_add(r.unsigned("snapshot_bytes")?),
        snapshots: r.unsigned("snapshots")?,
    })
}

/// Fails with `Quota` if `requested` more does not fit in `limit`.
pub(crate) fn check(
    kind: QuotaKind,
    limit: Option<u64>,
    used: u64,
    requested: u64,
) -> Result<(), DbError> {
    match limit {
        Some(limit) if used.saturating_add(requested) > limit => Err(DbError::Quota {
            kind,
            limit,
            used,
            requested,
        }),
        _ => Ok(()),
    }
}

/// A workspace's quotas and current usage, inside a write transaction,
/// holding the workspace's lock (see the module doc). Sandboxes: those not
/// `deleting`, CPU and memory of live ones, leaving out `except` (a
/// sandbox whose own use the caller is about to check again).
/// Snapshots: all of the workspace's. Usage comes from the counters the
/// database keeps with every write (migration 11): one row, not a sum.
pub(crate) async fn quota_and_usage(
    tx: &mut Tx,
    op: &'static str,
    workspace: WorkspaceId,
    except: Option<&SandboxRow>,
) -> Result<(Quotas, Usage), DbError> {
    let lock = match tx.backend() {
        Backend::Sqlite => "",
        Backend::Postgres => " FOR UPDATE",
    };
    let ws = workspace.to_string();
    let quotas = tx
        .fetch_optional(
            &Sql::new(&format!(
                "SELECT max_sandboxes, max_cpu_millicores, max_mem_bytes, max_storage_bytes, \
                 max_snapshots FROM workspaces WHERE id = $1{lock}"
            ))
            .arg(ws.as_str()),
            decode_quotas,
        )
        .await
        .map_err(DbError::backend(op))?
        .ok_or(DbError::NotFound { what: "workspace" })?;
    // Locked too: a trigger of a write that did not take the workspace's
    // lock (a stop, a delete) may hold it; its count is then read once it
    // commits.
    let mut usage = tx
        .fetch_optional(
            &Sql::new(&format!(
                "SELECT sandboxes, cpu_millicores, mem_bytes, disk_bytes, snapshots, \
                 snapshot_bytes FROM workspace_usage WHERE workspace_id = $1{lock}"
            ))
            .arg(ws.as_str()),
            decode_usage,
        )
        .await
        .map_err(DbError::backend(op))?
        .unwrap_or(Usage {
            sandboxes: 0,
            cpu: 0,
            mem: 0,
            storage: 0,
            snapshots: 0,
        });
    usage.storage = usage
        .storage
        .saturating_add(volume_bytes(tx, op, workspace).await?);
    if let Some(s) = except {
        usage = without(usage, s);
    }
    Ok((quotas, usage))
}

/// The sizes of the workspace's volumes, which storage counts whole from
/// their create (a volume is as large as it may become) until deleted.
pub(crate) async fn volume_bytes(
    tx: &mut Tx,
    op: &'static str,
    workspace: WorkspaceId,
) -> Result<u64, DbError> {
    let n = tx
        .fetch_optional(
            &Sql::new(
                "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS n FROM volumes \
                 WHERE workspace_id = $1",
            )
            .arg(workspace.to_string()),
            crate::sql::decode_n,
        )
        .await
        .map_err(DbError::backend(op))?
        .unwrap_or(0);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// `usage` less what the sandbox `s` counts in it.
pub(crate) fn without(mut usage: Usage, s: &SandboxRow) -> Usage {
    if s.status != SandboxStatus::Deleting {
        usage.sandboxes = usage.sandboxes.saturating_sub(1);
        usage.storage = usage.storage.saturating_sub(s.fs_capacity.bytes());
    }
    if s.status.is_live() {
        usage.cpu = usage.cpu.saturating_sub(u64::from(s.cpu.0));
        usage.mem = usage.mem.saturating_sub(s.mem.bytes());
    }
    usage
}

/// A host's capacity and what its live sandboxes (and pool members) hold.
pub(crate) struct HostRoom {
    pub cap_cpu: u64,
    pub cap_mem: u64,
    pub used_cpu: u64,
    pub used_mem: u64,
}

impl HostRoom {
    /// This load less the live sandbox `s`, which it counts.
    pub(crate) fn without(self, s: &SandboxRow) -> Self {
        Self {
            used_cpu: self.used_cpu.saturating_sub(u64::from(s.cpu.0)),
            used_mem: self.used_mem.saturating_sub(s.mem.bytes()),
            ..self
        }
    }

    /// `NoRoom` unless `cpu` and `mem` more fit on `host`.
    pub(crate) fn check_room_for(
        &self,
        host: HostId,
        cpu: MilliCpu,
        mem: ByteSize,
    ) -> Result<(), DbError> {
        let fits = self.used_cpu.saturating_add(u64::from(cpu.0)) <= self.cap_cpu
            && self.used_mem.saturating_add(mem.bytes()) <= self.cap_mem;
        if fits {
            Ok(())
        } else {
            Err(DbError::NoRoom { host })
        }
    }
}

/// In one read, inside a write transaction: the workspace's quotas and
/// usage and, for `host`, its load (a workspace or host that holds
/// nothing counts zero). Takes no lock of its own: the caller wrote
/// first, so its triggers hold the usage rows this reads (see
/// `Db::insert_sandbox_within_quota`). `NotFound` for a missing workspace
/// or host.
pub(crate) async fn quota_usage_and_host(
    tx: &mut Tx,
    op: &'static str,
    workspace: WorkspaceId,
    host: Option<HostId>,
) -> Result<(Quotas, Usage, Option<HostRoom>), DbError> {
    let sql = Sql::new(
        "SELECT w.max_sandboxes, w.max_cpu_millicores, w.max_mem_bytes, w.max_storage_bytes, \
           w.max_snapshots, \
           COALESCE(u.sandboxes, 0) AS sandboxes, COALESCE(u.cpu_millicores, 0) AS cpu_millicores, \
           COALESCE(u.mem_bytes, 0) AS mem_bytes, COALESCE(u.disk_bytes, 0) AS disk_bytes, \
           COALESCE(u.snapshots, 0) AS snapshots, \
           COALESCE(u.snapshot_bytes, 0) AS snapshot_bytes, \
           h.capacity_millicores AS host_cap_cpu, h.capacity_mem_bytes AS host_cap_mem, \
           COALESCE(hu.cpu_millicores, 0) AS host_cpu, COALESCE(hu.mem_bytes, 0) AS host_mem \
         FROM workspaces w \
         LEFT JOIN workspace_usage u ON u.workspace_id = w.id \
         LEFT JOIN hosts h ON h.id = $2 \
         LEFT JOIN host_usage hu ON hu.host_id = h.id \
         WHERE w.id = $1",
    )
    .arg(workspace.to_string())
    .arg(host.map(|h| h.to_string()));
    let (quotas, usage, load) = tx
        .fetch_optional(&sql, |r| {
            let load = match (
                r.opt_unsigned("host_cap_cpu")?,
                r.opt_unsigned("host_cap_mem")?,
            ) {
                (Some(cap_cpu), Some(cap_mem)) => Some(HostRoom {
                    cap_cpu,
                    cap_mem,
                    used_cpu: r.unsigned("host_cpu")?,
                    used_mem: r.unsigned("host_mem")?,
                }),
                _ => None,
            };
            Ok((decode_quotas(r)?, decode_usage(r)?, load))
        })
        .await
        .map_err(DbError::backend(op))?
        .ok_or(DbError::NotFound { what: "workspace" })?;
    if host.is_some() && load.is_none() {
        return Err(DbError::NotFound { what: "host" });
    }
    let mut usage = usage;
    usage.storage = usage
        .storage
        .saturating_add(volume_bytes(tx, op, workspace).await?);
    Ok((quotas, usage, load))
}

/// Fails with `Quota` if a live sandbox of `cpu` and `mem` does not fit.
pub(crate) fn check_live(
    quotas: &Quotas,
    usage: &Usage,
    cpu: MilliCpu,
    mem: ByteSize,
) -> Result<(), DbError> {
    let max_cpu = quotas.max_cpu.map(|c| u64::from(c.0));
    check(QuotaKind::Cpu, max_cpu, usage.cpu, u64::from(cpu.0))?;
    let max_mem = quotas.max_mem.map(ByteSize::bytes);
    check(QuotaKind::Memory, max_mem, usage.mem, mem.bytes())
}

/// Fails with `Quota` if `more` bytes kept in the store (a sandbox's disk,
/// a snapshot) do not fit.
pub(crate) fn check_storage(quotas: &Quotas, usage: &Usage, more: ByteSize) -> Result<(), DbError> {
    let max = quotas.max_storage.map(ByteSize::bytes);
    check(QuotaKind::Storage, max, usage.storage, more.bytes())
}

/// Fails with `Quota` if one more snapshot of `size` does not fit: first
/// the count (when it `counts`: a template's build-cache layer does not),
/// then storage.
pub(crate) fn check_snapshot(
    quotas: &Quotas,
    usage: &Usage,
    size: ByteSize,
    counts: bool,
) -> Result<(), DbError> {
    if counts {
        check(
            QuotaKind::Snapshots,
            quotas.max_snapshots,
            usage.snapshots,
            1,
        )?;
    }
    check_storage(quotas, usage, size)
}

impl crate::Db {
    /// What the workspace holds now, as its quotas count it (zero for a
    /// workspace that never held anything).
    pub async fn workspace_usage(
        &self,
        workspace: WorkspaceId,
    ) -> Result<crate::model::WorkspaceUsage, DbError> {
        let sql = Sql::new(
            "SELECT sandboxes, cpu_millicores, mem_bytes, disk_bytes, snapshots, snapshot_bytes \
             FROM workspace_usage WHERE workspace_id = $1",
        )
        .arg(workspace.to_string());
        let got = self
            .pool
            .fetch_optional(&sql, |r| {
                Ok(crate::model::WorkspaceUsage {
                    sandboxes: r.unsigned("sandboxes")?,
                    cpu: MilliCpu(r.u32("cpu_millicores")?),
                    mem: ByteSize(r.unsigned("mem_bytes")?),
                    disk: ByteSize(r.unsigned("disk_bytes")?),
                    snapshots: r.unsigned("snapshots")?,
                    snapshot_bytes: ByteSize(r.unsigned("snapshot_bytes")?),
                })
            })
            .await
            .map_err(DbError::backend("read workspace usage"))?;
        Ok(got.unwrap_or_default())
    }

    /// What a workspace holds, counted: its sandboxes by status, and its
    /// pools, their members, registries and volumes.
    pub async fn workspace_counts(
        &self,
        workspace: WorkspaceId,
    ) -> Result<crate::model::WorkspaceCounts, DbError> {
        let op = "count a workspace's resources";
        let ws = workspace.to_string();
        let by_status = self
            .pool
            .fetch_all(
                &Sql::new(
                    "SELECT status, COUNT(*) AS n FROM sandboxes WHERE workspace_id = $1 \
                     GROUP BY status",
                )
                .arg(ws.as_str()),
                |r| Ok((r.text("status")?, r.unsigned("n")?)),
            )
            .await
            .map_err(DbError::backend(op))?
            .into_iter()
            .collect();
        let count = |table: &str| {
            Sql::new(&format!(
                "SELECT COUNT(*) AS n FROM {table} WHERE workspace_id = $1"
            ))
            .arg(ws.as_str())
        };
        let mut n = Vec::new();
        for sql in [
            count("sandbox_pools"),
            count("registries"),
            count("volumes"),
            Sql::new(
                "SELECT COUNT(*) AS n FROM pool_members m JOIN sandbox_pools p ON p.id = m.pool_id \
                 WHERE p.workspace_id = $1",
            )
            .arg(ws.as_str()),
        ] {
            n.push(
                self.pool
                    .fetch_optional(&sql, |r| r.unsigned("n"))
                    .await
                    .map_err(DbError::backend(op))?
                    .unwrap_or(0),
            );
        }
        Ok(crate::model::WorkspaceCounts {
            by_status,
            pools: n[0],
            registries: n[1],
            volumes: n[2],
            pool_members: n[3],
        })
    }
}
