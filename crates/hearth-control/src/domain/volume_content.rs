//! A volume's content, opened without a sandbox of the caller's (E2B's
//! volume content API): which VM serves it, and how long that VM lives.
//!
//! A volume is a disk that only a VM reads (the host never parses what a
//! guest wrote), so its content is always reached through a guest that
//! holds it as its writer:
//! - **the sandbox that holds it**, while it runs, when the caller may use
//!   that sandbox (runtime access); its writes are the content. A holder
//!   that does not run is a 409 naming it: its writes since its last
//!   commit are in it, and a second writer would lose them;
//! - else **a service sandbox**: the busybox image holding the volume at
//!   [`SERVICE_MOUNT`], with no network, labelled [`SERVICE_LABEL`], made
//!   in the caller's workspace as the caller (so it needs
//!   `sandboxes:create` and counts against the quota like any sandbox, and
//!   lists show it). It lives [`SERVICE_LIFETIME`] after the last call, and
//!   is deleted (its writes committed) by a create that attaches the
//!   volume ([`Control::end_volume_service`]), so that create sees them.
//!
//! Who may open a volume's content at all is [`Principal::may_open_volume`].

use std::sync::Arc;
use std::time::Duration;

use hearth_db::{SandboxRow, SandboxStatus, VolumeRow};
use hearth_hostapi::GuestClient;
use hearth_types::egress::{AccessSpec, EgressSpec};
use hearth_types::rules::{resolve_sizing, SizingRequest, SnapshotSelector};
use hearth_types::sandbox::{
    Lifetime, OnExpiry, RestoreMemory, SandboxPlan, SandboxSpec, VolumeRequest,
};

use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::Control;

/// The label of a service sandbox (no request may set it); its value is
/// the volume's id.
pub(crate) const SERVICE_LABEL: &str = hearth_types::rules::RESERVED_LABEL;
/// Where a service sandbox mounts its volume.
pub(crate) const SERVICE_MOUNT: &str = "/mnt/volume";
/// How long a service sandbox outlives the last call it served.
pub(crate) const SERVICE_LIFETIME: Duration = Duration::from_secs(60);
/// How long a call waits for a service sandbox to boot.
const SERVICE_BOOT_WAIT: Duration = Duration::from_secs(180);
/// How often opening retries when the volume changed hands meanwhile.
const OPEN_ATTEMPTS: usize = 3;

/// A guest that holds a volume as its writer, and where.
pub(crate) struct VolumeContent {
    pub guest: GuestClient,
    /// The volume's root in the guest.
    pub root: String,
}

/// Whether `row` is a volume's service sandbox.
pub(crate) fn is_service(row: &SandboxRow) -> bool {
    row.labels.contains_key(SERVICE_LABEL)
}

fn service_lifetime() -> Lifetime {
    Lifetime {
        timeout: SERVICE_LIFETIME,
        on_expiry: OnExpiry::Delete,
    }
}

impl Control {
    /// A guest holding `volume` as its writer, for `who` (see the module's
    /// documentation).
    pub(crate) async fn open_volume_content(
        self: &Arc<Self>,
        who: &Principal,
        volume: VolumeRow,
    ) -> Result<VolumeContent, DomainError> {
        who.may_open_volume(&volume)?;
        for _ in 0..OPEN_ATTEMPTS {
            let held = self
                .db
                .volume_attachments(&[&volume.id])
                .await
                .map_err(DomainError::from)?;
            let Some(writer) = held.into_iter().find(|a| !a.read_only) else {
                match self.start_volume_service(who, &volume).await {
                    Ok((row, root)) => {
                        let guest = self.ready_guest(&row).await?;
                        return Ok(VolumeContent { guest, root });
                    }
                    // Another call or create took the writer's place first.
                    Err(DomainError::Conflict(_)) => continue,
                    Err(e) => return Err(e),
                }
            };
            let row = match self.db.get_sandbox_by_id(writer.sandbox_id).await {
                Ok(row) => row,
                Err(hearth_db::DbError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            if is_service(&row) {
                let row = if row.status == SandboxStatus::Provisioning {
                    let changed = self.changed.subscribe();
                    self.wait_while_provisioning(row.id, SERVICE_BOOT_WAIT, changed)
                        .await?
                } else {
                    row
                };
                if row.status != SandboxStatus::Ready {
                    // A service sandbox that failed: gone, then again.
                    self.delete_row(&row).await?;
                    continue;
                }
                self.set_lifetime_or_delete(&row, service_lifetime(), Duration::ZERO)
                    .await?;
                let guest = self.ready_guest(&row).await?;
                return Ok(VolumeContent {
                    guest,
                    root: writer.mount_path,
                });
            }
            who.require_runtime(&row).map_err(|_| {
                DomainError::Forbidden(format!(
                    "volume '{}' is attached to sandbox {}, which this key may not use; its \
                     content is reachable through that sandbox",
                    volume.name, row.name
                ))
            })?;
            if row.status != SandboxStatus::Ready {
                return Err(DomainError::conflict(format!(
                    "volume '{}' is attached to sandbox {}, which is {}: its content is \
                     reachable while that sandbox runs, or once it is deleted",
                    volume.name,
                    row.name,
                    row.status.as_str()
                )));
            }
            let guest = self.live_guest(&row).await?;
            self.touch(&row).await;
            return Ok(VolumeContent {
                guest,
                root: writer.mount_path,
            });
        }
        Err(DomainError::conflict(format!(
            "volume '{}' changed hands while being opened; try again",
            volume.name
        )))
    }

    /// Makes and boots a service sandbox holding `volume`; it and the
    /// volume's root in it.
    async fn start_volume_service(
        self: &Arc<Self>,
        who: &Principal,
        volume: &VolumeRow,
    ) -> Result<(SandboxRow, String), DomainError> {
        let busybox = SnapshotSelector::Ref("busybox:latest".parse().map_err(|e| {
            tracing::error!(error = %e, "the busybox reference does not parse");
            DomainError::Internal
        })?);
        let snap = self.resolve_snapshot(who.workspace_id, &busybox).await?;
        let sizing = resolve_sizing(&SizingRequest {
            vcpus: None,
            cpu_millicores: None,
            mem_bytes: None,
            fs_capacity_bytes: None,
            persistent: false,
            snapshot_fs_capacity: snap.fs_capacity,
        })?;
        let plan = SandboxPlan {
            spec: SandboxSpec {
                labels: [(SERVICE_LABEL.to_owned(), volume.id.clone())].into(),
                egress: Some(EgressSpec {
                    access: Some(AccessSpec::AllowList(Vec::new())),
                    ..EgressSpec::default()
                }),
                lifetime: Some(service_lifetime()),
                ..SandboxSpec::of_snapshot(snap.id, sizing, false)
            },
            restore_memory: RestoreMemory::Never,
            wait_for_ready: Some(SERVICE_BOOT_WAIT),
            volumes: vec![VolumeRequest {
                volume: volume.id.clone(),
                path: SERVICE_MOUNT.into(),
                read_only: false,
                field: "volume".into(),
            }],
        };
        let row = self.create_sandbox(who, &snap, plan).await?;
        if row.status != SandboxStatus::Ready {
            return Err(DomainError::NotReady { name: row.name });
        }
        tracing::info!(sandbox = %row.id, volume = %volume.id, "a service sandbox holds a volume for its content API");
        Ok((row, SERVICE_MOUNT.into()))
    }

    /// Ends the service sandbox holding the volume `id`, if one does: its
    /// writes committed, so that a create attaching the volume sees them.
    pub(crate) async fn end_volume_service(&self, id: &str) -> Result<(), DomainError> {
        let held = self
            .db
            .volume_attachments(&[id])
            .await
            .map_err(DomainError::from)?;
        for a in held.iter().filter(|a| !a.read_only) {
            let row = match self.db.get_sandbox_by_id(a.sandbox_id).await {
                Ok(row) => row,
                Err(hearth_db::DbError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            if is_service(&row) {
                tracing::info!(sandbox = %row.id, volume = %id, "a create attaches the volume: its service sandbox ends");
                self.delete_row(&row).await?;
            }
        }
        Ok(())
    }
}
