//! Work a control-plane replica accepted and may not live to finish: the
//! queries the fleet's reaper (the holder of the `reaper` leader lease)
//! uses to find it and the fenced writes that end it.
//!
//! A row in an in-flight status whose `updated_at` is older than a bound
//! is work whose owner is presumed gone: a `deleting` sandbox (its replica
//! died between marking it and removing it), a `building` snapshot whose
//! builder stopped refreshing it ([`Db::touch_building_snapshot`], its
//! heartbeat), a `provisioning` sandbox whose boot stopped stamping it
//! ([`Db::touch_boot`]). Every write here is conditional on the status (and, for
//! snapshots, on the age) the reaper saw, so an owner that is alive after
//! all, or a second reaper, changes nothing twice.

use hearth_types::{SandboxId, SnapshotId};

use crate::error::DbError;
use crate::model::{SandboxRow, SnapshotRow};
use crate::sandboxes::{decode_sandbox, SANDBOX_COLS};
use crate::snapshots::{decode_snapshot, SNAPSHOT_COLS};
use crate::sql::Sql;
use crate::time::Timestamp;
use crate::Db;

impl Db {
    /// `deleting` sandboxes not updated since `before`: deletes whose
    /// replica went away before removing the row.
    pub async fn stale_deleting(&self, before: Timestamp) -> Result<Vec<SandboxRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes \
             WHERE status = 'deleting' AND updated_at < $1 ORDER BY id"
        ))
        .arg(before);
        self.pool
            .fetch_all(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend("stale deleting sandboxes"))
    }

    /// Workspace snapshots `building` and not refreshed since `before`.
    pub async fn stale_building_snapshots(
        &self,
        before: Timestamp,
    ) -> Result<Vec<SnapshotRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE status = 'building' \
             AND workspace_id IS NOT NULL AND updated_at < $1 ORDER BY id"
        ))
        .arg(before);
        self.pool
            .fetch_all(&sql, decode_snapshot)
            .await
            .map_err(DbError::backend("stale building snapshots"))
    }

    /// A build's heartbeat: says its builder is still at work at `now`.
    /// False when the snapshot is no longer `building` (finished, failed by
    /// the reaper, or deleted).
    /// Stamps a sandbox's boot as alive (its driving task still runs):
    /// only while the row is `provisioning` at `generation`. Whether it
    /// was.
    pub async fn touch_boot(
        &self,
        id: SandboxId,
        generation: u64,
        now: Timestamp,
    ) -> Result<bool, DbError> {
        let sql = Sql::new(
            "UPDATE sandboxes SET boot_heartbeat_at = $3 WHERE id = $1 AND generation = $2 \
             AND status = 'provisioning'",
        )
        .arg(id.to_string())
        .arg(i64::try_from(generation).unwrap_or(i64::MAX))
        .arg(now);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("stamp a boot"))?;
        Ok(n > 0)
    }

    /// Sandboxes `provisioning` whose boot stamped its row, last before
    /// `before`: the task driving it is gone (its replica died).
    pub async fn abandoned_boots(&self, before: Timestamp) -> Result<Vec<SandboxRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE status = 'provisioning' \
             AND boot_heartbeat_at IS NOT NULL AND boot_heartbeat_at < $1 ORDER BY id"
        ))
        .arg(before);
        self.pool
            .fetch_all(&sql, decode_sandbox)
            .await
            .map_err(DbError::backend("abandoned boots"))
    }

    pub async fn touch_building_snapshot(
        &self,
        id: SnapshotId,
        now: Timestamp,
    ) -> Result<bool, DbError> {
        let sql = Sql::new(
            "UPDATE snapshots SET updated_at = $2 WHERE id = $1 AND status = 'building' \
             AND updated_at < $2",
        )
        .arg(id.to_string())
        .arg(now);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("refresh a building snapshot"))?;
        Ok(n > 0)
    }

    /// Fails a build whose builder is gone: only while it is still
    /// `building` and was not refreshed since `before` (a heartbeat that
    /// landed after the reaper listed it wins). Its memory reservation is
    /// released. Whether it was failed here.
    pub async fn fail_stale_build(
        &self,
        id: SnapshotId,
        before: Timestamp,
        message: &str,
    ) -> Result<bool, DbError> {
        let sql = Sql::new(
            "UPDATE snapshots SET status = 'failed', status_message = $3, updated_at = $4, \
             memory_reserved_bytes = NULL \
             WHERE id = $1 AND status = 'building' AND updated_at < $2",
        )
        .arg(id.to_string())
        .arg(before)
        .arg(message)
        .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("fail a stale snapshot build"))?;
        Ok(n > 0)
    }
}
