//! How long a sandbox lives past a create: deadlines (E2B's `timeout`,
//! killed or paused at its end), and the pause that ends one. LangSmith's
//! door reaches the same rules through a create's lifetime and its
//! stops; E2B's through these commands.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hearth_db::{Deadline, OnExpiry, SandboxRow, SandboxStatus, Timestamp};
use hearth_types::SandboxId;

use super::state::{Move, Verdict};
use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::Control;

impl Control {
    /// The sandbox's deadline, if it has one.
    pub(crate) async fn deadline(&self, id: SandboxId) -> Result<Option<Deadline>, DomainError> {
        Ok(self.deadlines(&[id]).await?.remove(&id))
    }

    /// The deadlines of those of `ids` that have one.
    pub(crate) async fn deadlines(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, Deadline>, DomainError> {
        self.db.deadlines_of(ids).await.map_err(DomainError::from)
    }

    /// The sandbox now ends `timeout` from now, sooner or later than
    /// before, as its deadline already said it would end (killed unless it
    /// said paused).
    pub(crate) async fn end_in(
        &self,
        who: &Principal,
        row: &SandboxRow,
        timeout: Duration,
    ) -> Result<(), DomainError> {
        who.require("sandboxes:update")?;
        let on_expiry = self
            .deadline(row.id)
            .await?
            .map_or(OnExpiry::Delete, |d| d.on_expiry);
        self.db
            .set_deadline(&Deadline {
                sandbox_id: row.id,
                expires_at: Timestamp::now().plus(timeout),
                on_expiry,
            })
            .await
            .map_err(DomainError::from)
    }

    /// A stop that keeps the memory, asked for by the sandbox's user: only
    /// a running sandbox created to keep its memory pauses, and its
    /// deadline ends with it (a paused sandbox is kept as any stopped one).
    /// `healthy`: refused unless the guest answers now.
    pub(crate) async fn pause(
        &self,
        who: &Principal,
        row: &SandboxRow,
        healthy: bool,
        reason: &str,
    ) -> Result<(), DomainError> {
        who.require("sandboxes:update")?;
        match Move::Pause.verdict(row.status) {
            Verdict::Go => {}
            Verdict::Already => {
                return Err(DomainError::conflict(format!(
                    "sandbox {} is already paused",
                    row.id
                )))
            }
            Verdict::Refused => {
                return Err(DomainError::conflict(format!(
                    "sandbox {} is {}; only a running sandbox pauses",
                    row.id,
                    row.status.as_str()
                )))
            }
        }
        if !row.preserve_memory_on_stop {
            return Err(DomainError::conflict(format!(
                "sandbox {} was created without preserve_memory_on_stop: its memory cannot be kept; stop it through the LangSmith API",
                row.id
            )));
        }
        if healthy {
            // A ready sandbox's guest answered its host; one that does not
            // answer now cannot be paused healthy.
            self.ready_guest(row).await.map_err(|_| {
                DomainError::conflict(format!("sandbox {}'s guest does not answer", row.id))
            })?;
        }
        self.stop_row(row, Some(reason)).await?;
        self.db
            .clear_deadline(row.id)
            .await
            .map_err(DomainError::from)?;
        Ok(())
    }

    /// A connect: it is for using the sandbox (its answer is the runtime
    /// tokens), so it needs runtime access, checked before anything else;
    /// a paused sandbox resumes (an update), a running one is read. Its
    /// deadline then follows [`Control::extend_on_connect`]. Whether it
    /// resumed is the second value.
    pub(crate) async fn connect(
        self: &Arc<Self>,
        who: &Principal,
        row: SandboxRow,
        timeout: Option<Duration>,
    ) -> Result<(SandboxRow, bool), DomainError> {
        who.require_runtime(&row)?;
        let resumed = row.status != SandboxStatus::Ready;
        let row = if resumed {
            who.require("sandboxes:update")?;
            self.wake(row).await?.0
        } else {
            who.require("sandboxes:read")?;
            row
        };
        self.extend_on_connect(&row, timeout, resumed).await?;
        Ok((row, resumed))
    }

    /// The deadline after a connect with `timeout`: a resumed sandbox ends
    /// `timeout` from now; a running one's end moves later, never sooner;
    /// a sandbox that never had one (made through LangSmith's API with an
    /// idle stop) keeps none.
    pub(crate) async fn extend_on_connect(
        &self,
        row: &SandboxRow,
        timeout: Option<Duration>,
        resumed: bool,
    ) -> Result<(), DomainError> {
        let Some(t) = timeout else { return Ok(()) };
        let at = Timestamp::now().plus(t);
        let deadline = match self.deadline(row.id).await? {
            Some(d) => (resumed || at > d.expires_at).then_some(Deadline {
                expires_at: at,
                ..d
            }),
            None if resumed && row.idle_ttl.is_zero() => Some(Deadline {
                sandbox_id: row.id,
                expires_at: at,
                on_expiry: OnExpiry::Delete,
            }),
            None => None,
        };
        match deadline {
            Some(d) => self.db.set_deadline(&d).await.map_err(DomainError::from),
            None => Ok(()),
        }
    }
}
