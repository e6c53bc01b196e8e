//! Sandbox deadlines (migration 16): a time at which the reaper leader
//! deletes a sandbox or stops it with its memory saved, whatever its
//! activity. E2B's `timeout` sets one at create and moves it with
//! `POST /sandboxes/{id}/timeout`; LangSmith's API sets none (it has idle
//! stops instead, which are the sandbox row's own).

use std::collections::HashMap;

use hearth_types::SandboxId;

use crate::error::DbError;
use crate::sql::{RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

pub use hearth_types::sandbox::OnExpiry;

fn on_expiry_str(e: OnExpiry) -> &'static str {
    match e {
        OnExpiry::Delete => "delete",
        OnExpiry::Pause => "pause",
    }
}

fn parse_on_expiry(s: &str) -> Result<OnExpiry, sqlx::Error> {
    match s {
        "delete" => Ok(OnExpiry::Delete),
        "pause" => Ok(OnExpiry::Pause),
        other => Err(sqlx::Error::Decode(
            format!("unknown on_expiry {other:?}").into(),
        )),
    }
}

/// A sandbox's deadline as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    pub sandbox_id: SandboxId,
    pub expires_at: Timestamp,
    pub on_expiry: OnExpiry,
}

fn decode(r: &dyn RowExt) -> Result<Deadline, sqlx::Error> {
    Ok(Deadline {
        sandbox_id: r.parse("sandbox_id")?,
        expires_at: r.ts("expires_at")?,
        on_expiry: parse_on_expiry(&r.text("on_expiry")?)?,
    })
}

/// Ids per statement of [`Db::deadlines_of`] (SQLite allows 32,766
/// parameters; a list page is at most 1,000 sandboxes).
pub(crate) const IDS_PER_READ: usize = 500;

impl Db {
    /// Sets (or replaces) the deadline of the sandbox `d.sandbox_id`;
    /// `NotFound` when there is no such sandbox.
    pub async fn set_deadline(&self, d: &Deadline) -> Result<(), DbError> {
        let op = "set deadline";
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let id = d.sandbox_id.to_string();
        tx.fetch_optional(
            &Sql::new("SELECT id FROM sandboxes WHERE id = $1").arg(id.as_str()),
            |r| r.text("id"),
        )
        .await
        .map_err(DbError::backend(op))?
        .ok_or(DbError::NotFound { what: "sandbox" })?;
        tx.execute(
            &Sql::new(
                "INSERT INTO sandbox_deadlines (sandbox_id, expires_at, on_expiry) \
                 VALUES ($1, $2, $3) ON CONFLICT (sandbox_id) DO UPDATE SET \
                 expires_at = excluded.expires_at, on_expiry = excluded.on_expiry",
            )
            .arg(id.as_str())
            .arg(d.expires_at)
            .arg(on_expiry_str(d.on_expiry)),
        )
        .await
        .map_err(DbError::backend(op))?;
        tx.commit().await.map_err(DbError::backend(op))
    }

    /// Removes the sandbox's deadline; whether it had one.
    pub async fn clear_deadline(&self, id: SandboxId) -> Result<bool, DbError> {
        self.delete_deadline(
            Sql::new("DELETE FROM sandbox_deadlines WHERE sandbox_id = $1").arg(id.to_string()),
        )
        .await
    }

    /// Removes the sandbox's deadline if it is still the one that ended
    /// at `expires_at` (one set meanwhile stays); whether it removed it.
    pub async fn clear_deadline_at(
        &self,
        id: SandboxId,
        expires_at: Timestamp,
    ) -> Result<bool, DbError> {
        self.delete_deadline(
            Sql::new("DELETE FROM sandbox_deadlines WHERE sandbox_id = $1 AND expires_at = $2")
                .arg(id.to_string())
                .arg(expires_at),
        )
        .await
    }

    /// Runs a deletion of deadlines; whether it removed one.
    async fn delete_deadline(&self, sql: Sql) -> Result<bool, DbError> {
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("clear deadline"))?;
        Ok(n > 0)
    }

    /// The deadlines of those of `ids` that have one (read in batches of
    /// [`IDS_PER_READ`]).
    pub async fn deadlines_of(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, Deadline>, DbError> {
        let mut found = HashMap::new();
        for batch in ids.chunks(IDS_PER_READ) {
            let mut sql = Sql::new(
                "SELECT sandbox_id, expires_at, on_expiry FROM sandbox_deadlines \
                 WHERE sandbox_id IN (",
            );
            for (i, id) in batch.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                sql.push_param(id.to_string());
            }
            sql.push(")");
            let rows = self
                .pool
                .fetch_all(&sql, decode)
                .await
                .map_err(DbError::backend("read deadlines"))?;
            found.extend(rows.into_iter().map(|d| (d.sandbox_id, d)));
        }
        Ok(found)
    }

    /// The earliest deadline of all, if any.
    pub async fn earliest_deadline(&self) -> Result<Option<Deadline>, DbError> {
        let sql = Sql::new(
            "SELECT sandbox_id, expires_at, on_expiry FROM sandbox_deadlines \
             ORDER BY expires_at LIMIT 1",
        );
        self.pool
            .fetch_optional(&sql, decode)
            .await
            .map_err(DbError::backend("read the earliest deadline"))
    }

    /// Deadlines passed at `now`, earliest first, at most `limit`.
    pub async fn expired_deadlines(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Deadline>, DbError> {
        let sql = Sql::new(
            "SELECT sandbox_id, expires_at, on_expiry FROM sandbox_deadlines \
             WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2",
        )
        .arg(now)
        .arg(i64::from(limit));
        self.pool
            .fetch_all(&sql, decode)
            .await
            .map_err(DbError::backend("read expired deadlines"))
    }
}
