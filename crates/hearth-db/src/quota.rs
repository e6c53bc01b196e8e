//! Workspace quotas, checked inside the write transaction that would
//! exceed them. [`quota_and_usage`] locks the workspace's row (PostgreSQL
//! `FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` already serializes writers)
//! and sums its rows, so every quota-checked write of one workspace
//! (sandbox inserts and starts, snapshot inserts) sees the others'.
//!
//! Storage is one budget for everything the workspace keeps in the store:
//! the disks of its sandboxes not being deleted and its snapshots' logical
//! sizes (disk, plus saved memory when captured with it; a capture still
//! building charges the memory it may save). A snapshot counts from its
//! insert, in any status, until it is deleted: even a failed capture may
//! have written a manifest that pins chunks, and deleting it removes that.

use hearth_types::{ByteSize, MilliCpu, SandboxId, WorkspaceId};

use crate::error::{DbError, QuotaKind};
use crate::model::{Backend, Quotas};
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

fn decode_sandbox_usage(r: &dyn RowExt) -> Result<(u64, u64, u64, u64), sqlx::Error> {
    Ok((
        r.unsigned("n")?,
        r.unsigned("cpu")?,
        r.unsigned("mem")?,
        r.unsigned("storage")?,
    ))
}

fn decode_snapshot_usage(r: &dyn RowExt) -> Result<(u64, u64), sqlx::Error> {
    Ok((r.unsigned("n")?, r.unsigned("storage")?))
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
/// `deleting`, CPU and memory of live ones, leaving out `except`.
/// Snapshots: all of the workspace's.
pub(crate) async fn quota_and_usage(
    tx: &mut Tx,
    op: &'static str,
    workspace: WorkspaceId,
    except: Option<SandboxId>,
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
    let except = except.map(|id| id.to_string()).unwrap_or_default();
    let (sandboxes, cpu, mem, disks) = tx
        .fetch_optional(
            &Sql::new(
                "SELECT COUNT(*) AS n, \
                   CAST(COALESCE(SUM(CASE WHEN status IN ('provisioning', 'ready') \
                     THEN cpu_millicores ELSE 0 END), 0) AS BIGINT) AS cpu, \
                   CAST(COALESCE(SUM(CASE WHEN status IN ('provisioning', 'ready') \
                     THEN mem_bytes ELSE 0 END), 0) AS BIGINT) AS mem, \
                   CAST(COALESCE(SUM(fs_capacity_bytes), 0) AS BIGINT) AS storage \
                 FROM sandboxes WHERE workspace_id = $1 AND status <> 'deleting' AND id <> $2",
            )
            .arg(ws.as_str())
            .arg(except.as_str()),
            decode_sandbox_usage,
        )
        .await
        .map_err(DbError::backend(op))?
        .unwrap_or((0, 0, 0, 0));
    let (snapshots, kept) = tx
        .fetch_optional(
            &Sql::new(
                "SELECT COUNT(*) AS n, \
                   CAST(COALESCE(SUM(fs_capacity_bytes \
                     + COALESCE(memory_bytes, memory_reserved_bytes, 0)), 0) AS BIGINT) AS storage \
                 FROM snapshots WHERE workspace_id = $1",
            )
            .arg(ws.as_str()),
            decode_snapshot_usage,
        )
        .await
        .map_err(DbError::backend(op))?
        .unwrap_or((0, 0));
    let usage = Usage {
        sandboxes,
        cpu,
        mem,
        storage: disks.saturating_add(kept),
        snapshots,
    };
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
