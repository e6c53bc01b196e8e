//! A sandbox's status history (migration 17): every change of its status,
//! status message or host, recorded by trigger in the transaction that
//! made it, so no writer (a replica's create, a reaper, a claim, a
//! failover) can change a sandbox without leaving the change here.

use hearth_types::{HostId, SandboxId};

use crate::error::DbError;
use crate::model::SandboxStatus;
use crate::sql::{RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

/// How many changes are kept per sandbox (the migration's trigger drops
/// older ones).
pub const MAX_EVENTS_PER_SANDBOX: usize = 100;

/// One change of a sandbox, as it was after the change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxEvent {
    pub at: Timestamp,
    pub status: SandboxStatus,
    pub status_message: Option<String>,
    pub host_id: Option<HostId>,
}

fn decode(r: &dyn RowExt) -> Result<SandboxEvent, sqlx::Error> {
    Ok(SandboxEvent {
        at: r.ts("at")?,
        status: r.parse("status")?,
        status_message: r.opt_text("status_message")?,
        host_id: r.opt_parse("host_id")?,
    })
}

impl Db {
    /// The sandbox's changes, oldest first (at most
    /// [`MAX_EVENTS_PER_SANDBOX`]); empty for a sandbox that does not exist.
    pub async fn sandbox_events(&self, id: SandboxId) -> Result<Vec<SandboxEvent>, DbError> {
        let sql = Sql::new(
            "SELECT at, status, status_message, host_id FROM sandbox_events \
             WHERE sandbox_id = $1 ORDER BY id",
        )
        .arg(id.to_string());
        self.pool
            .fetch_all(&sql, decode)
            .await
            .map_err(DbError::backend("read sandbox events"))
    }
}
