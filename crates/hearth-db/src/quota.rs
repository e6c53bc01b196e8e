//! Workspace quotas, checked inside the write transaction that would
//! exceed them. [`quota_and_usage`] locks the workspace's row (PostgreSQL
//! `FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` already serializes writers)
//! and reads its usage counters (kept by triggers, migration 11), so every
//! quota-checked write of one workspace (sandbox inserts and starts,
//! snapshot inserts) sees the others'.
//!
//! Storage is one budget for everything the workspace keeps in the store:
//! the disks of its sandboxes not being deleted and its snapshots' logical
//! sizes (disk, plus saved memory when captured with it; a capture still
//! building charges the memory it may save). A snapshot counts from its
//! insert, in any status, until it is deleted: even a failed capture may
//! have written a manifest that pins chunks, and deleting it removes that.

use hearth_types::{ByteSize, MilliCpu, WorkspaceId};

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
    if let Some(s) = except {
        if s.status != SandboxStatus::Deleting {
            usage.sandboxes = usage.sandboxes.saturating_sub(1);
            usage.storage = usage.storage.saturating_sub(s.fs_capacity.bytes());
        }
        if s.status.is_live() {
            usage.cpu = usage.cpu.saturating_sub(u64::from(s.cpu.0));
            usage.mem = usage.mem.saturating_sub(s.mem.bytes());
        }
    }
    Ok((quotas, usage))
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
/// the count, then storage.
pub(crate) fn check_snapshot(
    quotas: &Quotas,
    usage: &Usage,
    size: ByteSize,
) -> Result<(), DbError> {
    check(
        QuotaKind::Snapshots,
        quotas.max_snapshots,
        usage.snapshots,
        1,
    )?;
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
}
