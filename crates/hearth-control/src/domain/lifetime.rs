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
use crate::domain::queries::spec_of;
use crate::Control;

/// What a resumed sandbox's deadline allows for its boot, on top of its
/// lifetime, until it is ready (the longest a request waits for a wake).
pub(crate) const RESUME_ALLOWANCE: Duration = crate::service::WAKE_TIMEOUT;

/// The longest a request to a sandbox pausing at its deadline (E2B's
/// `autoResume`) waits for the pause to land before resuming it.
pub(crate) const PAUSE_WAIT: Duration = Duration::from_secs(60);

impl Control {
    /// Sets a sandbox's deadline, and wakes this replica's deadline timer
    /// (`reap.rs`'s `run_deadlines`), which may be sleeping past it.
    pub(crate) async fn put_deadline(&self, d: &Deadline) -> Result<(), DomainError> {
        self.db.set_deadline(d).await?;
        self.deadlines_changed.notify_one();
        Ok(())
    }

    /// Whether the sandbox has passed a deadline that ends it (the reaper
    /// has yet to act on it): such a sandbox is not running, whatever its
    /// row says, so that a deadline holds to the second.
    pub(crate) async fn past_deadline(&self, id: SandboxId) -> Result<bool, DomainError> {
        Ok(self
            .deadline(id)
            .await?
            .is_some_and(|d| d.expires_at <= Timestamp::now()))
    }

    /// The sandbox's deadline, if it has one.
    pub(crate) async fn deadline(&self, id: SandboxId) -> Result<Option<Deadline>, DomainError> {
        Ok(self.deadlines(&[id]).await?.remove(&id))
    }

    /// A sandbox made with a lifetime (E2B's timeout) that starts without
    /// a deadline (it was paused, by its user or at its end) gets its
    /// lifetime again from now, with the same end: it never runs without
    /// one. A connect's own timeout then moves it. A deadline already
    /// past counts as none: the pause that acted on it is about to clear
    /// it, and clears only that one (`clear_deadline_at`).
    ///
    /// Until the sandbox is ready the deadline also allows its boot
    /// ([`RESUME_ALLOWANCE`]); once ready, [`Self::lifetime_from_ready`]
    /// makes it count from then: a slow resume does not eat the lifetime.
    pub(crate) async fn rearm_lifetime(&self, row: &SandboxRow) {
        let Some(life) = spec_of(row).ok().and_then(|s| s.lifetime) else {
            return;
        };
        let result = match self.deadline(row.id).await {
            Ok(Some(d)) if d.expires_at > Timestamp::now() => return,
            Ok(_) => {
                self.put_deadline(&Deadline {
                    sandbox_id: row.id,
                    expires_at: Timestamp::now().plus(life.timeout + RESUME_ALLOWANCE),
                    on_expiry: life.on_expiry,
                })
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(sandbox = %row.id, error = %e, "cannot give a resumed sandbox its lifetime again; it runs without a deadline until its next start");
        }
    }

    /// A sandbox with a lifetime that became ready: its lifetime counts
    /// from now. Only a deadline that allowed the boot too (later than a
    /// whole lifetime from now) moves; one a caller set is left as set.
    pub(crate) async fn lifetime_from_ready(&self, row: &SandboxRow) {
        let Some(life) = spec_of(row).ok().and_then(|s| s.lifetime) else {
            return;
        };
        let from_now = Timestamp::now().plus(life.timeout);
        let result = match self.deadline(row.id).await {
            Ok(Some(d)) if d.expires_at > from_now => {
                self.put_deadline(&Deadline {
                    expires_at: from_now,
                    ..d
                })
                .await
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(sandbox = %row.id, error = %e, "cannot count a ready sandbox's lifetime from now; it keeps the boot's allowance");
        }
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
        self.put_deadline(&Deadline {
            sandbox_id: row.id,
            expires_at: Timestamp::now().plus(timeout),
            on_expiry,
        })
        .await
    }

    /// A pause asked for by the sandbox's user: a stop of a running
    /// sandbox that keeps its memory (only one created to keep it), or,
    /// without `keep_memory`, its disk alone (the next start boots it from
    /// the disk); its deadline ends with it (a paused sandbox is kept as
    /// any stopped one).
    pub(crate) async fn pause(
        &self,
        who: &Principal,
        row: &SandboxRow,
        how: Pause,
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
        if how.keep_memory && !row.preserve_memory_on_stop {
            return Err(DomainError::conflict(format!(
                "sandbox {} was created without preserve_memory_on_stop (E2B: autoPauseMemory false): its memory cannot be kept; pause it without memory, or stop it",
                row.id
            )));
        }
        if !row.persistent {
            return Err(DomainError::conflict(format!(
                "sandbox {} has no persistent disk: a pause would keep nothing",
                row.id
            )));
        }
        if how.healthy {
            // A ready sandbox's guest answered its host; one that does not
            // answer now cannot be paused healthy.
            self.ready_guest(row).await.map_err(|_| {
                DomainError::conflict(format!("sandbox {}'s guest does not answer", row.id))
            })?;
        }
        self.stop_keeping(row, Some(reason), how.keep_memory)
            .await?;
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
    /// a sandbox without one (made through LangSmith's API) is given one,
    /// ending it (killed) `timeout` from now, as the caller asked: its idle
    /// stop may still come first.
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
            None => Some(Deadline {
                sandbox_id: row.id,
                expires_at: at,
                on_expiry: OnExpiry::Delete,
            }),
        };
        match deadline {
            Some(d) => self.put_deadline(&d).await,
            None => Ok(()),
        }
    }
}

/// How a pause is asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pause {
    /// Refused unless the guest answers now.
    pub healthy: bool,
    /// The memory is saved (else only the disk is kept).
    pub keep_memory: bool,
}
